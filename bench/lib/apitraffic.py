"""What one client sends to and receives from a real API server: bytes through a counting TCP proxy, and
requests from the server's audit log, for a user of its own (a client certificate).

`CountingProxy` listens on 127.0.0.1 and relays each connection to the API server unchanged (TLS passes
through: the server's certificate names 127.0.0.1, the proxy's address too), counting the bytes each
way. `ClientCa` makes a CA for the server's `--client-ca-file` and client certificates under it, so a
process gets a user name of its own in a group the audit policy (`audit_policy`) logs at Metadata level
while everything else goes unlogged; `audit_requests` counts that user's requests (a watch once) by verb
and resource between two moments.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import subprocess
import threading
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import yaml

#: the group every bench client certificate carries besides system:masters; the audit policy logs it
AUDITED_GROUP = "vgpud-bench"
CHUNK = 256 * 1024


@dataclass(frozen=True)
class Traffic:
    """Bytes through the proxy: `up` from the client to the server, `down` back."""

    up: int = 0
    down: int = 0

    @property
    def total(self) -> int:
        return self.up + self.down

    def __sub__(self, other: Traffic) -> Traffic:
        return Traffic(self.up - other.up, self.down - other.down)


class CountingProxy:
    """A TCP relay 127.0.0.1:port -> `target`, a thread per direction per connection, counting bytes."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._lock = threading.Lock()
        self._up = self._down = 0
        self._sockets: set[socket.socket] = set()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._closed = False
        self.connections = 0
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def traffic(self) -> Traffic:
        with self._lock:
            return Traffic(self._up, self._down)

    def close(self) -> None:
        """Stop accepting and cut every relayed connection."""
        self._closed = True
        self._listener.close()
        with self._lock:
            sockets, self._sockets = list(self._sockets), set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=10)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets |= {client, server}
                self.connections += 1
            pair = _Pair(client, server)
            threading.Thread(target=self._pump, args=(pair, client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(pair, server, client, False), daemon=True).start()

    def _pump(self, pair: _Pair, source: socket.socket, sink: socket.socket, up: bool) -> None:
        try:
            while data := source.recv(CHUNK):
                sink.sendall(data)
                with self._lock:
                    if up:
                        self._up += len(data)
                    else:
                        self._down += len(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)
        if pair.one_done():  # both directions ended: the connection is over
            with self._lock:
                self._sockets -= {pair.client, pair.server}
            pair.client.close()
            pair.server.close()


class _Pair:
    """One relayed connection; the second direction to end closes both sockets."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client, self.server = client, server
        self._lock = threading.Lock()
        self._ended = 0

    def one_done(self) -> bool:
        with self._lock:
            self._ended += 1
            return self._ended == 2


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {result.stderr.strip()}")


def _ec_key(name: str, cwd: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", name, cwd=cwd)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class ClientCa:
    """A CA for the API server's --client-ca-file, and client certificates it signs."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.cert = workdir / "client-ca.crt"
        _ec_key("client-ca.key", workdir)
        ca_ext = ["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign"]
        subject = "/CN=vgpud-bench-client-ca"
        _openssl("req", "-x509", "-new", "-key", "client-ca.key", "-subj", subject, "-days", "2", *ca_ext,
                 "-out", self.cert.name, cwd=workdir)  # fmt: skip
        (workdir / "client.ext").write_text(
            "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n"
        )

    def client(self, user: str) -> tuple[bytes, bytes]:
        """(certificate PEM, key PEM) for `user` in groups system:masters and AUDITED_GROUP."""
        subject = f"/O=system:masters/O={AUDITED_GROUP}/CN={user}"
        _ec_key(f"{user}.key", self.dir)
        _openssl("req", "-new", "-key", f"{user}.key", "-subj", subject, "-out", f"{user}.csr", cwd=self.dir)
        signed_by = ["-CA", self.cert.name, "-CAkey", "client-ca.key", "-CAcreateserial"]
        _openssl("x509", "-req", "-in", f"{user}.csr", *signed_by, "-days", "2", "-extfile", "client.ext",
                 "-out", f"{user}.crt", cwd=self.dir)  # fmt: skip
        return (self.dir / f"{user}.crt").read_bytes(), (self.dir / f"{user}.key").read_bytes()

    def kubeconfig(self, path: Path, *, server: str, server_ca: bytes, user: str) -> Path:
        """A kubeconfig for `user` (a client certificate of this CA) against `server`."""
        cert, key = self.client(user)
        cluster = {"server": server, "certificate-authority-data": _b64(server_ca)}
        credentials = {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)}
        document = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "bench", "cluster": cluster}],
            "users": [{"name": user, "user": credentials}],
            "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": user}}],
            "current-context": "bench",
        }
        path.write_text(yaml.safe_dump(document))
        path.chmod(0o600)
        return path


def audit_policy(path: Path) -> Path:
    """Metadata for the bench's audited group (each request once: its RequestReceived stage omitted),
    nothing for anyone else (the admin filling the server, the server's own loopback client)."""
    policy = {
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata", "userGroups": [AUDITED_GROUP]}, {"level": "None"}],
    }
    path.write_text(yaml.safe_dump(policy))
    return path


def audit_args(policy: Path, log: Path) -> list[str]:
    """kube-apiserver flags: the policy, the log (never rotated)."""
    return [f"--audit-policy-file={policy}", f"--audit-log-path={log}", "--audit-log-maxsize=0"]


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def audit_requests(log: Path, user: str, since: float, until: float) -> Counter[str]:
    """`user`'s requests received in [since, until) (epoch seconds), by "verb resource[/sub]": each
    audit ID once (a watch logs ResponseStarted and later ResponseComplete)."""
    seen: set[str] = set()
    counts: Counter[str] = Counter()
    try:
        lines = log.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return counts
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a line being written
        if (event.get("user") or {}).get("username") != user or event.get("auditID") in seen:
            continue
        received = _epoch(event["requestReceivedTimestamp"])
        if not since <= received < until:
            continue
        seen.add(event["auditID"])
        ref = event.get("objectRef") or {}
        what = ref.get("resource") or event.get("requestURI", "?").split("?")[0]
        if ref.get("subresource"):
            what += "/" + ref["subresource"]
        counts[f"{event.get('verb', '?')} {what}"] += 1
    return counts
