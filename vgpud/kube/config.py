"""Where the API server is and how vgpud authenticates to it: in-cluster, or a kubeconfig file.

In a pod: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, the service account's CA, and its
projected token, re-read from the file (the kubelet rotates it) at most a minute after the last read,
as client-go does. From a kubeconfig: the current context's cluster (server, CA as file or data,
insecure-skip-tls-verify) and user (bearer token or token file, client certificate and key as files or
data, `as` impersonation). Anything else that changes how to connect or authenticate (exec and
auth-provider plugins, basic auth, proxies, ...) is refused with a KubeError naming it, rather than
connecting without it. Relative paths in a kubeconfig are relative to the file, as kubectl reads them.
"""

from __future__ import annotations

import base64
import binascii
import os
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vgpud.kube.api import KubeError

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: how long a token read from a file is used before the file is read again
TOKEN_REREAD_S = 60.0

_CLUSTER_KEYS = {"server", "certificate-authority", "certificate-authority-data", "insecure-skip-tls-verify"}
_USER_KEYS = {"token", "tokenFile", "client-certificate", "client-certificate-data", "client-key"}
_USER_KEYS |= {"client-key-data", "as"}
_CONTEXT_KEYS = {"cluster", "user", "namespace"}
#: informational maps other tools keep in a kubeconfig; they change nothing about the connection
_IGNORED_KEYS = {"extensions"}


class TokenFile:
    """A bearer token read from a file, read again once it is TOKEN_REREAD_S old (thread-safe)."""

    def __init__(self, path: Path, *, clock: Any = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._token = ""
        self._read_at = float("-inf")
        self.token()  # a missing or empty file is refused now, not at the first call

    def token(self) -> str:
        with self._lock:
            now = self._clock()
            if now - self._read_at >= TOKEN_REREAD_S:
                self._token = _read_token(self.path)
                self._read_at = now
            return self._token


@dataclass(frozen=True)
class ApiConfig:
    """One API server and the credentials to present to it."""

    server: str
    #: PEM of the certificate authorities to trust; None: the system's
    ca_pem: str | None = None
    insecure_skip_tls_verify: bool = False
    #: PEM of the client certificate and its key (mutual TLS)
    client_cert_pem: bytes | None = None
    client_key_pem: bytes | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    token_file: TokenFile | None = None
    #: Impersonate-User: act as this user (kubeconfig `as`)
    impersonate: str | None = None

    def headers(self) -> dict[str, str]:
        """The per-request headers: the current bearer token and the impersonation."""
        headers = {}
        token = self.token_file.token() if self.token_file else self.token
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if self.impersonate:
            headers["Impersonate-User"] = self.impersonate
        return headers

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for an https server (None for http)."""
        if not self.server.startswith("https://"):
            return None
        context = (
            ssl.create_default_context(cadata=self.ca_pem) if self.ca_pem else ssl.create_default_context()
        )
        if self.insecure_skip_tls_verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.client_cert_pem is not None and self.client_key_pem is not None:
            _load_cert_chain(context, self.client_cert_pem, self.client_key_pem)
        return context


def in_cluster(environ: Mapping[str, str] = os.environ, account: Path = SERVICE_ACCOUNT) -> ApiConfig:
    """The pod's own API access; KubeError saying what is missing when not in a pod."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise KubeError("KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not set")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    ca = _read_text(account / "ca.crt", "service account CA")
    return ApiConfig(server=f"https://{host}:{port}", ca_pem=ca, token_file=TokenFile(account / "token"))


def from_kubeconfig(path: Path) -> ApiConfig:
    """The current context of the kubeconfig at `path`; KubeError naming what is wrong or unsupported."""
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as e:
        raise KubeError(f"cannot read {path}: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        raise KubeError(f"{path} is not YAML: {e}") from e
    if not isinstance(document, dict):
        raise KubeError(f"{path} is not a kubeconfig (no mapping at the top)")
    name = document.get("current-context")
    if not name:
        raise KubeError(f"{path} has no current-context")
    context = _named(document, "contexts", "context", name, path)
    _refuse_unknown(context, _CONTEXT_KEYS, f"context {name!r}", path)
    cluster = _named(document, "clusters", "cluster", context.get("cluster"), path)
    user = _named(document, "users", "user", context.get("user"), path) if context.get("user") else {}
    _refuse_unknown(cluster, _CLUSTER_KEYS, f"cluster {context.get('cluster')!r}", path)
    _refuse_unknown(user, _USER_KEYS, f"user {context.get('user')!r}", path)
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith(("https://", "http://")):
        raise KubeError(f"{path}: cluster {context.get('cluster')!r} has no http(s) server URL")
    base = path.parent
    ca = _file_or_data(cluster, "certificate-authority", base, path)
    cert = _file_or_data(user, "client-certificate", base, path)
    key = _file_or_data(user, "client-key", base, path)
    if (cert is None) != (key is None):
        raise KubeError(
            f"{path}: user {context.get('user')!r} has a client certificate or key without the other"
        )
    token = user.get("token")
    token_file = TokenFile(_resolve(base, user["tokenFile"])) if user.get("tokenFile") and not token else None
    return ApiConfig(
        server=server.rstrip("/"),
        ca_pem=ca.decode() if ca is not None else None,
        insecure_skip_tls_verify=bool(cluster.get("insecure-skip-tls-verify")),
        client_cert_pem=cert,
        client_key_pem=key,
        token=token,
        token_file=token_file,
        impersonate=user.get("as"),
    )


def _named(document: dict[str, Any], section: str, key: str, name: Any, path: Path) -> dict[str, Any]:
    for entry in document.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(key) or {}
            if not isinstance(value, dict):
                raise KubeError(f"{path}: {section} entry {name!r} is not a mapping")
            return value
    raise KubeError(f"{path}: no {key} named {name!r}")


def _refuse_unknown(entry: dict[str, Any], known: set[str], what: str, path: Path) -> None:
    unknown = sorted(set(entry) - known - _IGNORED_KEYS)
    if unknown:
        raise KubeError(f"{path}: {what} uses {', '.join(unknown)}, which vgpud's client does not support")


def _file_or_data(entry: dict[str, Any], key: str, base: Path, path: Path) -> bytes | None:
    """`key-data` (base64) or `key` (a file); data wins, as in client-go."""
    if entry.get(f"{key}-data"):
        try:
            return base64.b64decode(entry[f"{key}-data"], validate=True)
        except (binascii.Error, TypeError) as e:
            raise KubeError(f"{path}: {key}-data is not base64: {e}") from e
    if entry.get(key):
        file = _resolve(base, entry[key])
        try:
            return file.read_bytes()
        except OSError as e:
            raise KubeError(f"{path}: cannot read {key} {file}: {e.strerror or e}") from e
    return None


def _resolve(base: Path, name: str) -> Path:
    file = Path(os.path.expanduser(name))
    return file if file.is_absolute() else base / file


def _read_text(path: Path, what: str) -> str:
    try:
        text = path.read_text()
    except OSError as e:
        raise KubeError(f"cannot read the {what} {path}: {e.strerror or e}") from e
    if not text.strip():
        raise KubeError(f"the {what} {path} is empty")
    return text


def _read_token(path: Path) -> str:
    return _read_text(path, "token file").strip()


def _load_cert_chain(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl loads a certificate chain only from files: hand it two memory files, never the disk."""
    fds = [os.memfd_create("vgpud-client-cert"), os.memfd_create("vgpud-client-key")]
    try:
        for fd, data in zip(fds, (cert, key), strict=True):
            os.write(fd, data)
        context.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
    except (ssl.SSLError, OSError) as e:
        raise KubeError(f"the client certificate or key is not usable: {e}") from e
    finally:
        for fd in fds:
            os.close(fd)
