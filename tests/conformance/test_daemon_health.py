"""`vgpud run` on the fake NVML (the nvml backend's real path) against a real kube-apiserver: an XID or a
lost GPU raised through the fake's state file shows as one WARNING line, in the metrics, in the debug
state and as a taint on its device in the ResourceSlice, and the GPU comes back after the recovery
time; with the gate off nothing watches, the slice is never tainted and the kubelet's health stream
stays UNIMPLEMENTED (a grpcio client on the DRA socket)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from tests.conformance.grpcio_calls import get_info, watch_resources
from tests.fakedriver import build_driver_root
from tests.fakegpu_state import raise_xid, set_lost
from tests.kubeapi import ApiServer, free_port
from tests.support import built, require
from tests.unit.fakes.gpu import UUID_A, UUID_B, profile_text
from tests.vgpudproc import Vgpud, ensure_node, node_slices

NODE = "health-node"
DEADLINE = 15.0  # seconds for a change to reach the metrics (an event wait, or a 5 s check)


@pytest.fixture(scope="module")
def api(kube_apiserver: ApiServer) -> ApiServer:
    ensure_node(kube_apiserver, NODE)
    return kube_apiserver


class FakeNode:
    """vgpud on the fake NVML named by path (its profile and state by env), and a driver root laid out
    for the same GPUs, which the nvml backend requires (the GPUs' device nodes, the driver files)."""

    def __init__(self, root: Path, api: ApiServer, *flags: str) -> None:
        require(os.geteuid() == 0, "root (mknod of the driver root's device nodes)", "run the tests as root")
        self.api = api
        profile = root / "profile.yaml"
        profile.write_text(profile_text())
        self.state_file = root / "gpu.state"
        self.metrics_port = free_port()
        (root / "driver").mkdir()
        driver = build_driver_root(root / "driver", profile).root
        library = str(built("fakenvml/libnvidia-ml.so.1"))
        self.vgpud = Vgpud(
            root,
            node=NODE,
            port=free_port(),
            kubeconfig=api.kubeconfig,
            gpus=("--gpu-backend", "nvml", "--nvml-library", library, "--driver-root", str(driver)),
            env={"FAKE_NVML_PROFILE": str(profile), "FAKE_GPU_STATE": str(self.state_file)},
            extra=["--metrics-address", f"127.0.0.1:{self.metrics_port}", *flags],
        )

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read().decode()

    def until(self, what: str, check: Callable[[str], bool]) -> str:
        """The metrics once `check` holds (polled; fails with the log after DEADLINE)."""
        end = time.monotonic() + DEADLINE
        while time.monotonic() < end:
            text = self.metrics()
            if check(text):
                return text
            time.sleep(0.1)
        raise AssertionError(f"{what} not in the metrics in {DEADLINE}s:\n{self.vgpud.output()}")

    def debug_state(self) -> dict:
        socket = self.vgpud.root / "var/lib/kubelet/plugins/manager.nvidia.com/debug.sock"
        out = subprocess.run(
            [sys.executable, "-m", "vgpud", "debug", "state", "--socket", str(socket)],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return json.loads(out.stdout)

    def taints(self) -> dict[str, list[dict]]:
        """Device name -> its taints in this node's ResourceSlice."""
        devices = [d for s in node_slices(self.api, NODE) for d in s["spec"]["devices"]]
        return {d["name"]: d.get("taints", []) for d in devices}

    def warnings(self) -> list[str]:
        return [
            line for line in self.vgpud.output().splitlines() if "healthwatch" in line and "WARNING" in line
        ]


@pytest.fixture
def node(short_tmp: Path, api: ApiServer, request: pytest.FixtureRequest) -> Iterator[FakeNode]:
    n = FakeNode(short_tmp, api, *getattr(request, "param", ()))
    try:
        n.vgpud.wait_serving()
        yield n
    finally:
        n.vgpud.kill()


def healthy(uuid: str, index: int, value: int) -> Callable[[str], bool]:
    return lambda text: f'vgpud_device_healthy{{index="{index}",uuid="{uuid}"}} {value}.0' in text


@pytest.mark.parametrize("node", [("--health-recovery-seconds", "2")], indirect=True)
def test_an_xid_and_a_lost_gpu_reach_the_log_metrics_and_state_and_recover(node: FakeNode) -> None:
    node.until("both GPUs healthy", lambda t: healthy(UUID_A, 0, 1)(t) and healthy(UUID_B, 1, 1)(t))
    raise_xid(node.state_file, 0, 31)  # ignored: an application's error
    raise_xid(node.state_file, 0, 79)
    text = node.until("GPU 0 unhealthy", healthy(UUID_A, 0, 0))
    assert healthy(UUID_B, 1, 1)(text)
    assert f'vgpud_device_xid_events_total{{kind="ignored",uuid="{UUID_A}",xid="31"}} 1.0' in text
    assert f'vgpud_device_xid_events_total{{kind="fatal",uuid="{UUID_A}",xid="79"}} 1.0' in text
    taints = node.taints()
    assert [(t["key"], t["value"], t["effect"]) for t in taints["vgpu-0"]] == [
        ("manager.nvidia.com/unhealthy", "xid-79", "NoSchedule")
    ], taints
    assert taints["vgpu-1"] == []
    device = node.debug_state()["device_health"]["devices"][UUID_A]
    assert (device["healthy"], device["reason"], device["xid"]) == (
        False,
        "XID 79 (GPU has fallen off the bus)",
        79,
    )
    node.until("GPU 0 healthy again", healthy(UUID_A, 0, 1))
    wait_for(lambda: node.taints()["vgpu-0"] == [], "vgpu-0's taint removed")

    set_lost(node.state_file, 1, True)
    try:
        node.until("GPU 1 lost", healthy(UUID_B, 1, 0))
        assert node.debug_state()["device_health"]["devices"][UUID_B]["reason"].startswith("GPU lost: ")
    finally:
        set_lost(node.state_file, 1, False)
    node.until("GPU 1 healthy again", healthy(UUID_B, 1, 1))

    lines = node.warnings()
    assert len(lines) == 4, lines  # one per change
    assert re.search(
        rf"{UUID_A} \(0\) unhealthy: XID 79 \(GPU has fallen off the bus\): marked unhealthy for the "
        "scheduler and the kubelet",
        lines[0],
    )
    assert f"{UUID_A} (0) healthy again" in lines[1]
    assert f"{UUID_B} (1) unhealthy: GPU lost: " in lines[2]
    assert f"{UUID_B} (1) healthy again" in lines[3]
    assert node.vgpud.stop() == 0


@pytest.mark.parametrize("node", [("--feature-gates", "NVMLDeviceHealthCheck=false")], indirect=True)
def test_with_the_gate_off_nothing_watches(node: FakeNode) -> None:
    assert "NVMLDeviceHealthCheck is off" in node.vgpud.output()
    assert node.debug_state()["device_health"] is None
    assert "vgpud_device_healthy{" not in node.metrics()
    assert "device-health" not in node.debug_state()["components"]
    raise_xid(node.state_file, 0, 79)
    set_lost(node.state_file, 1, True)
    try:
        # the watcher, were it on, reacts within one 5 s check: look for longer than that
        end = time.monotonic() + 7
        while time.monotonic() < end:
            assert node.taints() == {"vgpu-0": [], "vgpu-1": []}
            time.sleep(0.5)
    finally:
        set_lost(node.state_file, 1, False)
    with pytest.raises(grpc.RpcError) as info:
        next(watch_resources(node.vgpud.dra_socket))
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    versions = get_info(node.vgpud.root / REGISTRATION_SOCKET).supported_versions
    assert "v1alpha1.DRAResourceHealth" not in versions
    assert node.vgpud.stop() == 0


REGISTRATION_SOCKET = "var/lib/kubelet/plugins_registry/manager.nvidia.com-reg.sock"


def wait_for(check: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + DEADLINE
    while not check():
        assert time.monotonic() < end, f"{what}: not in {DEADLINE}s"
        time.sleep(0.2)
