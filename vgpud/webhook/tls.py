"""The serving certificate: loaded from files, reloaded when they change, or made up for development.

Reload without restart: every accepted connection is wrapped with whatever `ssl.SSLContext` is current
at that moment. A poll of the two files' stat (mtime, size, inode: a Kubernetes Secret volume swaps a
symlink, cert-manager rewrites in place) notices a change; a complete new context is then built from
the files and swapped in, so a half-written pair (new certificate, old key) fails to load, is logged
and counted, and the previous context keeps serving until the next change loads cleanly. Connections
already open keep the certificate they were established with.

`--self-signed DIR` is for development and tests: a CA and a serving certificate signed by it (EC
P-256; SANs localhost, 127.0.0.1, the Service's DNS names and any extra hosts) made with the `openssl`
command (the `cryptography` package is not a dependency); ca.crt, tls.crt and tls.key are written to
DIR, the CA's key is discarded, and files already there are reused so that a restart keeps the CA
the webhook configuration trusts.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import os
import secrets
import shutil
import ssl
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from vgpud.webhook.metrics import WebhookMetrics

log = logging.getLogger("vgpud.webhook.tls")

CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "tls.crt", "tls.key"
CA_DAYS, CERT_DAYS = 3650, 825
OPENSSL_TIMEOUT_S = 60


class TlsError(RuntimeError):
    """A certificate or key that cannot be loaded or made; the message names the files."""


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A TLS server context for HTTP/1.1 (ALPN), TLS 1.2 or newer."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as err:
        raise TlsError(f"cannot load certificate {cert} with key {key}: {err}") from None
    context.set_alpn_protocols(["http/1.1"])
    return context


def _signature(paths: Sequence[Path]) -> tuple[tuple[int, ...], ...]:
    """What changes when a file is replaced or rewritten; a missing file reads as zeros."""
    out = []
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            out.append((0, 0, 0, 0))
        else:
            out.append((st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev))
    return tuple(out)


class ReloadingTls:
    """The current server context for a certificate/key file pair."""

    def __init__(self, cert: Path, key: Path, metrics: WebhookMetrics | None = None) -> None:
        self.cert, self.key = cert, key
        self._metrics = metrics
        self._context: ssl.SSLContext | None = None
        self._seen: tuple[tuple[int, ...], ...] | None = None
        self.loads = 0  # successful loads, the first included

    @property
    def context(self) -> ssl.SSLContext:
        if self._context is None:
            raise RuntimeError("ReloadingTls.load() has not succeeded yet")
        return self._context

    def load(self) -> None:
        """Load the pair now; TlsError (and the old context kept) when it cannot be loaded."""
        self._seen = _signature((self.cert, self.key))
        context = server_context(self.cert, self.key)
        self._context = context
        self.loads += 1
        if self._metrics is not None:
            self._metrics.tls_loaded.set(time.time())

    def reload_if_changed(self) -> bool:
        """Blocking (stat and read): True when changed files were loaded and are now in use."""
        if _signature((self.cert, self.key)) == self._seen:
            return False
        try:
            self.load()
        except TlsError as err:
            log.warning("serving certificate changed but does not load; keeping the previous one: %s", err)
            if self._metrics is not None:
                self._metrics.tls_reload_failures.inc()
            return False
        log.info("serving certificate %s reloaded", self.cert)
        return True

    async def watch(self, interval: float, ready: Callable[[], None] | None = None) -> None:
        """Poll the files every `interval` seconds forever (a supervised component)."""
        if ready is not None:
            ready()
        while True:
            await trio.sleep(interval)
            await trio.to_thread.run_sync(self.reload_if_changed)


# --------------------------------------------------------------------------------------------------
# Self-signed (development)


@dataclass(frozen=True)
class SelfSigned:
    ca: Path
    cert: Path
    key: Path

    def ca_bundle(self) -> str:
        """The CA certificate as a webhook configuration's `clientConfig.caBundle` wants it."""
        return base64.b64encode(self.ca.read_bytes()).decode()


def _san(hosts: Sequence[str]) -> str:
    entries = []
    for host in dict.fromkeys(hosts):
        try:
            entries.append(f"IP:{ipaddress.ip_address(host)}")
        except ValueError:
            entries.append(f"DNS:{host}")
    return ",".join(entries)


_OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
prompt = no
[dn]
CN = vgpud-webhook
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
[serving]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
subjectAltName = {san}
"""


def _openssl(*args: str, cwd: Path) -> None:
    if shutil.which("openssl") is None:
        raise TlsError("--self-signed needs the openssl command, which is not on PATH")
    try:
        subprocess.run(
            ["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=OPENSSL_TIMEOUT_S
        )
    except subprocess.CalledProcessError as err:
        detail = err.stderr.decode(errors="replace").strip().splitlines()
        raise TlsError(f"openssl {args[0]} failed: {detail[-1] if detail else err}") from None
    except subprocess.TimeoutExpired:
        raise TlsError(f"openssl {args[0]} did not finish in {OPENSSL_TIMEOUT_S}s") from None


def ensure_self_signed(
    directory: Path, hosts: Sequence[str], common_name: str = "vgpud-webhook"
) -> SelfSigned:
    """ca.crt, tls.crt and tls.key in `directory`: the ones there, or new ones for `hosts`."""
    files = SelfSigned(directory / CA_FILE, directory / CERT_FILE, directory / KEY_FILE)
    if files.ca.is_file() and files.cert.is_file() and files.key.is_file():
        log.info("reusing the self-signed CA and certificate in %s", directory)
        return files
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".selfsigned-", dir=directory))
    except OSError as err:
        raise TlsError(f"cannot write to {directory}: {err}") from None
    try:
        (work / "openssl.cnf").write_text(_OPENSSL_CONFIG.format(san=_san(hosts)))
        ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
        _openssl(
            "req", "-x509", "-config", "openssl.cnf", "-extensions", "ca", *ec,
            "-keyout", "ca.key", "-out", CA_FILE, "-days", str(CA_DAYS), "-subj", f"/CN={common_name}-ca",
            cwd=work,
        )  # fmt: skip
        _openssl(
            "req", "-new", "-config", "openssl.cnf", *ec,
            "-keyout", KEY_FILE, "-out", "tls.csr", "-subj", f"/CN={common_name}",
            cwd=work,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", "tls.csr", "-CA", CA_FILE, "-CAkey", "ca.key",
            "-set_serial", f"0x{secrets.token_hex(16)}", "-days", str(CERT_DAYS),
            "-extfile", "openssl.cnf", "-extensions", "serving", "-out", CERT_FILE,
            cwd=work,
        )  # fmt: skip
        os.chmod(work / KEY_FILE, 0o600)
        for name in (KEY_FILE, CERT_FILE, CA_FILE):  # the CA last: its presence means a complete set
            os.replace(work / name, directory / name)
    except OSError as err:
        raise TlsError(f"cannot write the self-signed certificate to {directory}: {err}") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the CA key goes with it: nothing more can be signed
    log.info("self-signed CA and serving certificate for %s written to %s", ", ".join(hosts), directory)
    return files
