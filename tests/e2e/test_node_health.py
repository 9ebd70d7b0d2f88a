"""Device health end to end on the local node: vgpud watches the (fake) NVML for XIDs, taints the sick
GPU in its ResourceSlice so the scheduler leaves it alone, and streams its health to the kubelet, which
shows it in the status of every container using it; once the GPU is quiet for the recovery time
(HEALTH_RECOVERY_SECONDS on this node) all of it is undone.

The GPU keeps raising its XID while the test looks (a faulty GPU repeats it), and "clearing" it means
the XIDs stop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.e2e import workload as w
from tests.e2e.node import HEALTH_RECOVERY_S, LocalNode
from tests.fakegpu_state import raise_xid
from tests.kubeapi import described_events

#: the NVRM XID a GPU that fell off the bus raises: fatal, never ignored
XID_FALLEN_OFF_THE_BUS = 79
#: the issue's bound: the slice shows the taint within this many seconds of the XID
TAINT_WITHIN_S = 10.0
REPEAT_XID_S = 2.0

pytestmark = pytest.mark.parametrize("node", ["nri-fakegpu"], indirect=True)


def pinned(name: str, minor: int) -> dict[str, Any]:
    return w.on_gpu(w.vgpu_request(name, "1Gi", "5"), minor)


def device(node: LocalNode, name: str) -> dict[str, Any]:
    devices = {d["name"]: d for s in node.slices() for d in s["spec"]["devices"]}
    return devices[name]


def taints(node: LocalNode, name: str) -> list[dict[str, Any]]:
    return device(node, name).get("taints", [])


def container_health(node: LocalNode, ns: str, pod: str) -> list[str]:
    """The health the kubelet shows for the devices of the pod's containers."""
    status = w.get_pod(node, ns, pod)["status"]
    return [
        resource.get("health", "")
        for container in status.get("containerStatuses", [])
        for claim in container.get("allocatedResourcesStatus", [])
        for resource in claim.get("resources", [])
    ]


@contextmanager
def faulty_gpu(node: LocalNode, index: int, xid: int) -> Iterator[None]:
    """GPU `index` raises `xid` now and every REPEAT_XID_S until the block ends."""
    stop = threading.Event()

    def repeat() -> None:
        while not stop.wait(REPEAT_XID_S):
            raise_xid(node.fake_gpu_state, index, xid)

    raise_xid(node.fake_gpu_state, index, xid)
    thread = threading.Thread(target=repeat, name="faulty-gpu", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def node_events(node: LocalNode, reason: str) -> dict[tuple[str, int], dict[str, Any]]:
    """vgpud's Events of `reason` that `kubectl describe node` shows, by (name, count): a repeat of
    one is a new key."""
    assert node.api is not None
    events = described_events(node.api, "Node", node.name, node.name, reason=reason)
    return {(e["metadata"]["name"], e["count"]): e for e in events if e["source"]["component"] == "vgpud"}


def new_node_event(node: LocalNode, reason: str, before: dict[tuple[str, int], Any]) -> dict[str, Any]:
    """The Event of `reason` on the node that was not there `before` (a node runs many tests)."""
    found = w.wait_for(
        lambda: [e for key, e in node_events(node, reason).items() if key not in before],
        timeout=10,
        what=f"a new {reason} Event on the node",
    )
    return found[0]


def test_a_fatal_xid_taints_the_gpu_and_the_pods_see_it_until_it_recovers(node: LocalNode) -> None:
    ns = w.namespace(node)
    unhealthy_before, healthy_before = node_events(node, "GPUUnhealthy"), node_events(node, "GPUHealthy")
    w.create_claim(node, ns, "gpu0", [pinned("gpu", 0)])
    w.create_pod(node, ns, "running", [w.container("main", [("gpu0", None)])], {"gpu0": "gpu0"})
    w.wait_running(node, ns, "running")
    w.wait_for(
        lambda: container_health(node, ns, "running") == ["Healthy"], what="the device Healthy in the pod"
    )
    assert taints(node, "vgpu-0") == []

    with faulty_gpu(node, 0, XID_FALLEN_OFF_THE_BUS):
        raised = time.monotonic()
        tainted = w.wait_for(lambda: taints(node, "vgpu-0"), timeout=TAINT_WITHIN_S, what="vgpu-0 tainted")
        print(f"vgpu-0 tainted {time.monotonic() - raised:.1f} s after the XID: {tainted}")
        assert [t["effect"] for t in tainted] == ["NoSchedule"], tainted
        assert str(XID_FALLEN_OFF_THE_BUS) in tainted[0].get("value", ""), tainted
        assert taints(node, "vgpu-1") == []
        w.wait_for(
            lambda: container_health(node, ns, "running") == ["Unhealthy"],
            what="the device Unhealthy in the running pod's container status",
        )
        # a new vGPU pod that needs GPU 0 is not scheduled while it is tainted
        w.create_claim(node, ns, "next", [pinned("gpu", 0)])
        w.create_pod(node, ns, "next", [w.container("main", [("next", None)])], {"next": "next"})
        w.wait_for(
            lambda: any(e["reason"] == "FailedScheduling" for e in w.pod_events(node, ns, "next")),
            what="the scheduler to refuse the new pod",
        )
        assert w.get_pod(node, ns, "next")["spec"].get("nodeName") is None
        assert node.metric("vgpud_device_healthy") == 1  # GPU 1 healthy, GPU 0 not
        sick = new_node_event(node, "GPUUnhealthy", unhealthy_before)
        assert sick["type"] == "Warning" and sick["message"].startswith("GPU 0 (GPU-"), sick
        assert f"XID {XID_FALLEN_OFF_THE_BUS}" in sick["message"], sick

    # the XIDs stop: after the recovery time the GPU is healthy again everywhere
    w.wait_for(lambda: not taints(node, "vgpu-0"), timeout=HEALTH_RECOVERY_S + 30, what="vgpu-0 untainted")
    w.wait_for(lambda: container_health(node, ns, "running") == ["Healthy"], what="the device Healthy again")
    recovered = new_node_event(node, "GPUHealthy", healthy_before)
    assert recovered["type"] == "Normal" and recovered["message"].startswith("GPU 0 (GPU-"), recovered
    assert "healthy again" in recovered["message"], recovered
    w.wait_running(node, ns, "next")  # the waiting pod gets GPU 0 now
    for pod, claim in (("next", "next"), ("running", "gpu0")):
        w.delete_pod(node, ns, pod)
        w.release_claim(node, ns, claim)
