"""A real etcd + kube-apiserver for tests, bound to 127.0.0.1 only, everything under one directory.

The binaries come from `hack/install-kube.sh` (the test command runs it), which writes
`${VGPUD_CACHE:-~/.cache/vgpud}/kube.env` (helm too, for the chart tests). `start_apiserver(workdir)`
starts both and returns once `/readyz` answers ok; `ApiServer.stop()` stops both by PID. The session
fixture `kube_apiserver` shares one server across a test session: tests isolate themselves by
namespace or object names.

The `kube_apiserver` fixture's control plane is deliberately minimal: no controller-manager (so no
namespace deletion finalizer, no garbage collection, no service-account controller: the ServiceAccount
admission plugin is off, so pods need no `default` service account), no scheduler, and the
`kubernetes` Service gets no endpoints (`--endpoint-reconciler-type=none`, loopback addresses are
invalid endpoints). `start_apiserver(..., controllers=True)` is the local node's: a
kube-controller-manager runs beside it (tests/e2e/node.py), so the ServiceAccount admission plugin is on
(pods get their service account's token, as in a real cluster) and `--enable-aggregator-routing` makes
the server reach a webhook Service at its endpoints' pod IPs (there is no kube-proxy to route a cluster
IP). The admin token is in group system:masters; authorization is Node,RBAC as on a real cluster.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import require

INSTALL_HINT = "run hack/install-kube.sh (the test command does it)"
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0
LOG_TAIL_LINES = 40
PORT_ATTEMPTS = 3


def cache_dir() -> Path:
    """The machine-wide cache hack/install-kube.sh installs into."""
    return Path(os.environ.get("VGPUD_CACHE") or Path.home() / ".cache" / "vgpud")


def cache_env(name: str) -> dict[str, str]:
    """`<cache>/<name>`, the KEY=value file an install script writes, as a dict; {} if absent."""
    try:
        text = (cache_dir() / name).read_text()
    except OSError:
        return {}
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def kube_env() -> dict[str, str]:
    """`<cache>/kube.env` as a dict (KUBE_VERSION, KUBE_BIN_DIR, ETCD_BIN, ETCD_VERSION); {} if absent."""
    return cache_env("kube.env")


def binary(name: str) -> Path | None:
    """Path of `etcd`, `kube-apiserver`, `kube-scheduler` or `kubelet` as installed; None if absent."""
    env = kube_env()
    if name == "etcd":
        path = Path(env["ETCD_BIN"]) if "ETCD_BIN" in env else None
    else:
        path = Path(env["KUBE_BIN_DIR"]) / name if "KUBE_BIN_DIR" in env else None
    return path if path is not None and os.access(path, os.X_OK) else None


def helm_binary() -> Path | None:
    """Path of `helm` as hack/install-kube.sh installs it (HELM_BIN in kube.env); None if absent."""
    path = kube_env().get("HELM_BIN")
    return Path(path) if path and os.access(path, os.X_OK) else None


def apiserver_available() -> bool:
    """True when etcd and kube-apiserver are installed (after hack/install-kube.sh)."""
    return binary("etcd") is not None and binary("kube-apiserver") is not None


def free_port() -> int:
    """A TCP port on 127.0.0.1 free right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file, for error messages."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<{path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if the test process dies, so no server outlives it."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


@dataclass
class ApiServer:
    """A running etcd + kube-apiserver pair."""

    kubeconfig: Path
    url: str
    token: str
    logs: dict[str, Path]
    ca_file: Path
    workdir: Path
    etcd_url: str
    #: a kubeconfig for user "tester" (group "testers"), who has no rights until a test binds some:
    #: a client the server does not exempt from its limits, as it exempts system:masters
    tester_kubeconfig: Path | None = None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context that trusts this server's self-signed serving certificate."""
        return ssl.create_default_context(cafile=str(self.ca_file))

    def stop(self) -> None:
        """Stop kube-apiserver, then etcd, by PID: SIGTERM, wait, SIGKILL. Idempotent."""
        for name in ("kube-apiserver", "etcd"):
            proc = self.procs.pop(name, None)
            if proc is not None:
                _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _spawn(argv: list[str], log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    # The death signal follows the spawning *thread*: tie it to the main thread only, since a worker
    # thread (trio.to_thread) may exit while its server is still in use.
    on_main_thread = threading.current_thread() is threading.main_thread()
    with log.open("ab") as out:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            preexec_fn=_die_with_parent if on_main_thread else None,  # noqa: PLW1509 - only a prctl
        )


def _write_sa_key(path: Path) -> None:
    """An RSA key that signs and verifies service-account tokens."""
    subprocess.run(
        ["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(path)],
        check=True,
        capture_output=True,
    )


def _etcd_argv(etcd: Path, workdir: Path, client_port: int, peer_port: int) -> list[str]:
    client = f"http://127.0.0.1:{client_port}"
    peer = f"http://127.0.0.1:{peer_port}"
    return [
        str(etcd),
        "--name=vgpud-test",
        f"--data-dir={workdir / 'etcd-data'}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=vgpud-test={peer}",
        "--initial-cluster-state=new",
        "--unsafe-no-fsync",  # throwaway data: skip fsync, much faster on a VM disk
        "--log-level=warn",
    ]


def _apiserver_argv(
    apiserver: Path,
    workdir: Path,
    etcd_url: str,
    port: int,
    controllers: bool,
    *,
    gates: Sequence[str] = (),
    extra_args: Sequence[str] = (),
) -> list[str]:
    sa_key = workdir / "sa.key"
    if controllers:
        cluster = ["--enable-aggregator-routing=true"]
    else:
        cluster = ["--disable-admission-plugins=ServiceAccount"]
    return [
        str(apiserver),
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={workdir / 'certs'}",
        f"--token-auth-file={workdir / 'tokens.csv'}",
        "--authorization-mode=Node,RBAC",
        f"--service-account-key-file={sa_key}",
        f"--service-account-signing-key-file={sa_key}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        "--service-cluster-ip-range=10.0.0.0/24",
        "--endpoint-reconciler-type=none",
        *cluster,
        "--allow-privileged=true",
        "--runtime-config=resource.k8s.io/v1=true",
        "--feature-gates=" + ",".join(["DRAConsumableCapacity=true", *gates]),
        "--profiling=false",
        "--v=1",
        *extra_args,
    ]


def _kubeconfig(url: str, ca_pem: bytes, token: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "vgpud-test",
                "cluster": {
                    "server": url,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "vgpud-test", "context": {"cluster": "vgpud-test", "user": "admin"}}],
        "current-context": "vgpud-test",
    }


class StartError(RuntimeError):
    """etcd or kube-apiserver did not come up; the message carries both logs' tails."""

    def __init__(self, message: str, port_taken: bool = False) -> None:
        super().__init__(message)
        self.port_taken = port_taken


def _start_error(what: str, server: ApiServer) -> StartError:
    tails = {name: log_tail(path) for name, path in server.logs.items()}
    text = "\n".join(
        f"--- {name} log ({server.logs[name]}), last lines:\n{tail}" for name, tail in tails.items()
    )
    return StartError(
        f"{what}\n{text}", port_taken=any("address already in use" in t for t in tails.values())
    )


def _wait_ready(server: ApiServer, deadline: float) -> None:
    request = urllib.request.Request(
        f"{server.url}/readyz", headers={"Authorization": f"Bearer {server.token}"}
    )
    last = "no answer yet"
    context: ssl.SSLContext | None = None
    while time.monotonic() < deadline:
        for name, proc in server.procs.items():
            if proc.poll() is not None:
                raise _start_error(f"{name} exited with status {proc.returncode} during startup", server)
        if server.ca_file.exists():
            try:
                context = context or server.ssl_context()  # may catch the file half written
                with urllib.request.urlopen(request, timeout=5, context=context) as response:
                    if response.status == 200:
                        return
                    last = f"HTTP {response.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}: {exc.read(2000).decode(errors='replace')}"
            except (OSError, ssl.SSLError) as exc:
                last = repr(exc)
        time.sleep(0.2)
    raise _start_error(f"kube-apiserver not ready at {server.url}/readyz in time; last: {last}", server)


def start_apiserver(
    workdir: Path,
    timeout_s: float = READY_TIMEOUT_S,
    *,
    controllers: bool = False,
    feature_gates: Sequence[str] = (),
    extra_args: Sequence[str] = (),
) -> ApiServer:
    """Start etcd and kube-apiserver with all state under `workdir`; return once /readyz is ok.

    `controllers`: a kube-controller-manager will run beside it (see the module docstring).
    `feature_gates`: `Name=value` items added to the server's gates (a server without one feature).
    `extra_args`: more kube-apiserver flags, after the defaults (a later flag wins: e.g. a server that
    admits one request at a time, or one that writes an audit log).

    Raises StartError (with the tail of both logs) if either exits or /readyz is not ok in `timeout_s`.
    Ports are the kernel's free picks; if another process takes one first, it retries with new ones.
    """
    etcd, apiserver = binary("etcd"), binary("kube-apiserver")
    if etcd is None or apiserver is None:
        raise FileNotFoundError(f"etcd or kube-apiserver is not installed: {INSTALL_HINT}")
    workdir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    token = secrets.token_hex(16)
    tester_token = secrets.token_hex(16)
    (workdir / "tokens.csv").write_text(
        f'{token},admin,admin-uid,"system:masters"\n{tester_token},tester,tester-uid,"testers"\n'
    )
    (workdir / "tokens.csv").chmod(0o600)
    _write_sa_key(workdir / "sa.key")
    for attempt in range(1, PORT_ATTEMPTS + 1):
        try:
            return _start_once(
                etcd,
                apiserver,
                workdir,
                (token, tester_token),
                deadline,
                controllers=controllers,
                gates=feature_gates,
                extra_args=extra_args,
            )
        except StartError as exc:
            if attempt == PORT_ATTEMPTS or not exc.port_taken:
                raise
            for name in ("etcd.log", "kube-apiserver.log"):  # keep the failed attempt's logs
                if (workdir / name).exists():
                    (workdir / name).rename(workdir / f"{name}.{attempt}")
            shutil.rmtree(workdir / "etcd-data", ignore_errors=True)
    raise AssertionError("unreachable")


def _start_once(
    etcd: Path,
    apiserver: Path,
    workdir: Path,
    tokens: tuple[str, str],
    deadline: float,
    *,
    controllers: bool,
    gates: Sequence[str],
    extra_args: Sequence[str] = (),
) -> ApiServer:
    client_port, peer_port, port = free_port(), free_port(), free_port()
    token, tester_token = tokens
    server = ApiServer(
        kubeconfig=workdir / "kubeconfig",
        url=f"https://127.0.0.1:{port}",
        token=token,
        logs={"etcd": workdir / "etcd.log", "kube-apiserver": workdir / "kube-apiserver.log"},
        ca_file=workdir / "certs" / "apiserver.crt",
        workdir=workdir,
        etcd_url=f"http://127.0.0.1:{client_port}",
    )
    try:
        server.procs["etcd"] = _spawn(
            _etcd_argv(etcd, workdir, client_port, peer_port), server.logs["etcd"], workdir
        )
        server.procs["kube-apiserver"] = _spawn(
            _apiserver_argv(
                apiserver, workdir, server.etcd_url, port, controllers, gates=gates, extra_args=extra_args
            ),
            server.logs["kube-apiserver"],
            workdir,
        )
        _wait_ready(server, deadline)
        # The self-signed bundle holds the serving certificate and the CA that signed it.
        ca_pem = server.ca_file.read_bytes()
        server.tester_kubeconfig = workdir / "tester.kubeconfig"
        for path, secret in ((server.kubeconfig, token), (server.tester_kubeconfig, tester_token)):
            path.write_text(yaml.safe_dump(_kubeconfig(server.url, ca_pem, secret)))
            path.chmod(0o600)
    except BaseException:
        server.stop()
        raise
    return server


def api_request(
    server: ApiServer,
    method: str,
    path: str,
    body: object | None = None,
    content_type: str = "application/json",
) -> dict[str, Any]:
    """One authenticated JSON request to the API server; raises urllib.error.HTTPError on 4xx/5xx."""
    data = None
    if body is not None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    request = urllib.request.Request(
        f"{server.url}{path}",
        data=data,
        method=method,
        headers={
            "Authorization": f"Bearer {server.token}",
            "Accept": "application/json",
            "Content-Type": content_type,
        },
    )
    with urllib.request.urlopen(request, timeout=30, context=server.ssl_context()) as response:
        return json.loads(response.read() or b"{}")


def described_events(
    server: ApiServer, kind: str, name: str, uid: str, *, namespace: str = "default", reason: str = ""
) -> list[dict[str, Any]]:
    """The Events `kubectl describe` shows for an object (its field selector: the object's kind,
    name, namespace and uid; a cluster-scoped object's Events are in `default`), of `reason` if given."""
    fields = {
        "involvedObject.kind": kind,
        "involvedObject.name": name,
        "involvedObject.uid": uid,
        "involvedObject.namespace": "" if kind == "Node" else namespace,
    }
    if reason:
        fields["reason"] = reason
    selector = urllib.parse.quote(",".join(f"{key}={value}" for key, value in fields.items()))
    path = f"/api/v1/namespaces/{namespace}/events?fieldSelector={selector}"
    return api_request(server, "GET", path)["items"]


@pytest.fixture(scope="session")
def kube_apiserver() -> Iterator[ApiServer]:
    """One real etcd + kube-apiserver for the test session (skip locally, fail under CI, if not installed)."""
    require(apiserver_available(), "etcd + kube-apiserver", INSTALL_HINT)
    workdir = Path(tempfile.mkdtemp(prefix="vgk", dir="/tmp"))
    server = start_apiserver(workdir)
    try:
        yield server
    finally:
        server.stop()
        if os.environ.get("VGPUD_KEEP_KUBE"):
            print(f"kube_apiserver: kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


__all__ = [
    "ApiServer",
    "StartError",
    "api_request",
    "apiserver_available",
    "binary",
    "helm_binary",
    "kube_apiserver",
    "kube_env",
    "start_apiserver",
]
