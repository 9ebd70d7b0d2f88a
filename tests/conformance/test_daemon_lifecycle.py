"""`vgpud run` as a node daemon runs it, against a real kube-apiserver, probed by grpcio.

Mock GPUs, every path under a short temp root, unprivileged-safe flags: health goes SERVING on ''
and 'liveness' once the kubelet sockets answer and the ResourceSlice is published, an unknown
service is NOT_FOUND, and SIGTERM exits 0 leaving no socket behind (the debug socket included).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tests.kubeapi import ApiServer, free_port
from tests.vgpudproc import DRIVER, SERVING, Vgpud, ensure_node, node_slices

NODE = "test-node"
NOBODY = 65534


@pytest.fixture(scope="module")
def api(kube_apiserver: ApiServer) -> ApiServer:
    ensure_node(kube_apiserver, NODE)
    return kube_apiserver


@pytest.fixture
def vgpud(short_tmp: Path, api: ApiServer) -> Iterator[Vgpud]:
    d = Vgpud(short_tmp, node=NODE, port=free_port(), kubeconfig=api.kubeconfig)
    try:
        yield d
    finally:
        d.kill()


def _sockets(root: Path) -> set[str]:
    return {p.name for p in root.rglob("*") if p.is_socket()}


def test_health_serving_then_sigterm_exits_zero_without_sockets(vgpud: Vgpud, api: ApiServer) -> None:
    vgpud.wait_serving()
    assert vgpud.health("") == SERVING
    with pytest.raises(grpc.RpcError) as info:
        vgpud.health("no-such-service")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert _sockets(vgpud.root) == {"dra.sock", f"{DRIVER}-reg.sock", "debug.sock"}
    (published,) = node_slices(api, NODE)
    assert [d["name"] for d in published["spec"]["devices"]] == ["vgpu-0", "vgpu-1"]
    assert published["metadata"]["ownerReferences"][0]["name"] == NODE

    assert vgpud.stop(signal.SIGTERM) == 0, vgpud.output()
    assert "SIGTERM received" in vgpud.output()
    assert _sockets(vgpud.root) == set()
    with pytest.raises(grpc.RpcError):
        vgpud.health("")


def test_runs_unprivileged(short_tmp: Path, api: ApiServer) -> None:
    """No root needed with mock GPUs and a temp root."""
    prefix: tuple[str, ...] = ()
    kubeconfig = short_tmp / "kubeconfig"
    shutil.copy(api.kubeconfig, kubeconfig)
    if os.geteuid() == 0:
        for path in (short_tmp, kubeconfig):
            os.chown(path, NOBODY, NOBODY)
        prefix = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
    d = Vgpud(short_tmp, node=NODE, port=free_port(), kubeconfig=kubeconfig, prefix=prefix)
    try:
        d.wait_serving()
        assert d.stop() == 0, d.output()
    finally:
        d.kill()
    assert _sockets(short_tmp) == set()


def test_sigint_also_stops_cleanly(vgpud: Vgpud) -> None:
    vgpud.wait_serving()
    assert vgpud.stop(signal.SIGINT) == 0, vgpud.output()
    assert "SIGINT received" in vgpud.output()


def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vgpud", "run", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def test_gpu_discovery_failure_exits_1_with_reason(short_tmp: Path) -> None:
    missing = short_tmp / "libnvidia-ml.so.1"
    result = _run("--root-prefix", str(short_tmp), "--nvml-library", str(missing), "--healthcheck-port", "-1")
    assert result.returncode == 1
    assert "GPU discovery failed" in result.stderr
    assert str(missing) in result.stderr


def test_no_kubernetes_api_exits_1_with_reason(short_tmp: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in {"KUBECONFIG", "KUBERNETES_SERVICE_HOST"}}
    result = _run(
        "--root-prefix",
        str(short_tmp),
        "--gpu-backend",
        "mock",
        "--gpu-profile",
        "a100-40gb-x2",
        "--kubeconfig",
        str(short_tmp / "missing-kubeconfig"),
        env=env,
    )
    assert result.returncode == 1
    assert "no Kubernetes API" in result.stderr
    assert "missing-kubeconfig" in result.stderr
