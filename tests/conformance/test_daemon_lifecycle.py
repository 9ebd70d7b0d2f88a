"""`vgpud run` as the DaemonSet runs it, against a real kube-apiserver, probed by grpcio.

Mock GPUs, every path under a short temp root, unprivileged-safe flags: health goes SERVING on ''
and 'liveness' once the kubelet sockets answer and the ResourceSlice is published, an unknown
service is NOT_FOUND, and SIGTERM exits 0 leaving no socket behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.kubeapi import ApiServer, api_request, free_port
from tests.stdproto import message_class

NODE = "test-node"
DRIVER = "manager.nvidia.com"


@pytest.fixture(scope="module")
def api(kube_apiserver: ApiServer) -> ApiServer:
    """The API server with this node's Node object (it owns the ResourceSlice)."""
    try:
        api_request(kube_apiserver, "POST", "/api/v1/nodes", {"metadata": {"name": NODE}})
    except urllib.error.HTTPError as err:
        if err.code != 409:
            raise
    return kube_apiserver


def _slices(api: ApiServer) -> list[dict]:
    selector = urllib.parse.quote(f"spec.driver={DRIVER},spec.nodeName={NODE}")
    return api_request(api, "GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector={selector}")[
        "items"
    ]


class Daemon:
    def __init__(self, root: Path, port: int, kubeconfig: Path, prefix: tuple[str, ...] = ()) -> None:
        self.root, self.port = root, port
        self.log = root / "vgpud.log"
        argv = [
            *prefix,
            sys.executable,
            "-m",
            "vgpud",
            "run",
            "--gpu-backend",
            "mock",
            "--gpu-profile",
            "a100-40gb-x2",
            "--root-prefix",
            str(root),
            "--node-name",
            NODE,
            "--kubeconfig",
            str(kubeconfig),
            "--healthcheck-address",
            "127.0.0.1",
            "--healthcheck-port",
            str(port),
        ]
        self.proc = subprocess.Popen(
            argv,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def output(self) -> str:
        return self.log.read_text()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)


@pytest.fixture
def daemon(short_tmp: Path, api: ApiServer) -> Iterator[Daemon]:
    d = Daemon(short_tmp, free_port(), api.kubeconfig)
    try:
        yield d
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


SERVING = 1
NOBODY = 65534


def _check(port: int, service: str) -> int:
    """Health.Check through grpcio with protoc-built classes; returns the status number."""
    request_cls = message_class("grpc.health.v1.HealthCheckRequest")
    response_cls = message_class("grpc.health.v1.HealthCheckResponse")
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=request_cls.SerializeToString,
            response_deserializer=response_cls.FromString,
        )
        return call(request_cls(service=service), timeout=2).status


def _wait_serving(d: Daemon, deadline: float = 30) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        assert d.proc.poll() is None, f"vgpud exited early:\n{d.output()}"
        try:
            if _check(d.port, "liveness") == SERVING:
                return
        except grpc.RpcError:
            pass
        time.sleep(0.1)
    pytest.fail(f"vgpud never became SERVING:\n{d.output()}")


def test_health_serving_then_sigterm_exits_zero_without_sockets(daemon: Daemon, api: ApiServer) -> None:
    _wait_serving(daemon)
    assert _check(daemon.port, "") == SERVING
    sockets = {p.name for p in daemon.root.rglob("*") if p.is_socket()}
    assert sockets == {"dra.sock", f"{DRIVER}-reg.sock"}
    (published,) = _slices(api)
    assert [d["name"] for d in published["spec"]["devices"]] == ["vgpu-0", "vgpu-1"]
    assert published["metadata"]["ownerReferences"][0]["name"] == NODE
    with pytest.raises(grpc.RpcError) as info:
        _check(daemon.port, "no-such-service")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND

    assert daemon.stop(signal.SIGTERM) == 0, daemon.output()
    out = daemon.output()
    assert "SIGTERM received" in out
    assert [p for p in daemon.root.rglob("*") if p.is_socket()] == []
    with pytest.raises(grpc.RpcError):
        _check(daemon.port, "")


def test_runs_unprivileged(short_tmp: Path, api: ApiServer) -> None:
    """As the DaemonSet's dev mode promises: no root needed with mock GPUs and a temp root."""
    prefix: tuple[str, ...] = ()
    kubeconfig = short_tmp / "kubeconfig"
    shutil.copy(api.kubeconfig, kubeconfig)
    if os.geteuid() == 0:
        for path in (short_tmp, kubeconfig):
            os.chown(path, NOBODY, NOBODY)
        prefix = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
    d = Daemon(short_tmp, free_port(), kubeconfig, prefix)
    try:
        _wait_serving(d)
        assert d.stop() == 0, d.output()
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()
    assert [p for p in short_tmp.rglob("*") if p.is_socket()] == []


def test_sigint_also_stops_cleanly(daemon: Daemon) -> None:
    _wait_serving(daemon)
    assert daemon.stop(signal.SIGINT) == 0, daemon.output()
    assert "SIGINT received" in daemon.output()


def test_gpu_discovery_failure_exits_1_with_reason(short_tmp: Path) -> None:
    missing = short_tmp / "libnvidia-ml.so.1"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "vgpud",
            "run",
            "--root-prefix",
            str(short_tmp),
            "--nvml-library",
            str(missing),
            "--healthcheck-port",
            "-1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "GPU discovery failed" in result.stderr
    assert str(missing) in result.stderr


def test_no_kubernetes_api_exits_1_with_reason(short_tmp: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "vgpud",
            "run",
            "--root-prefix",
            str(short_tmp),
            "--gpu-backend",
            "mock",
            "--gpu-profile",
            "a100-40gb-x2",
            "--kubeconfig",
            str(short_tmp / "missing-kubeconfig"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if k not in {"KUBECONFIG", "KUBERNETES_SERVICE_HOST"}},
    )
    assert result.returncode == 1
    assert "no Kubernetes API" in result.stderr
    assert "missing-kubeconfig" in result.stderr
