"""One node lost for good (issue 35, item 3): node-1's vgpud, kubelet and containerd are killed
(SIGKILL, as a power cut would) and never come back.

- The node goes NotReady; its pod, deleted by hand (force: no kubelet is left to confirm), is gone and
  its claim is deallocated by the control plane, free for another pod.
- node-0 is untouched: its pod keeps running in the same container, its vgpud is the same process and
  serving, and the freed claim runs there without anything done to it.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e import workload as w
from tests.e2e.cluster import LocalCluster, NodeSpec, started
from tests.e2e.node import LocalNode, node_available
from tests.support import require

KEPT, LOST = "node-0", "node-1"
#: the controller manager's node-monitor-grace-period (50 s by default) and then some
NOT_READY_WITHIN_S = 120.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require(node_available(), "the local node's runtime", "run make node-deps (make cluster-test does)")
    with started([NodeSpec(KEPT), NodeSpec(LOST)]) as local:
        yield local


def ready(node: LocalNode, name: str) -> str:
    conditions = node.get(f"/api/v1/nodes/{name}")["status"].get("conditions", [])
    return next((c["status"] for c in conditions if c["type"] == "Ready"), "")


def test_a_lost_nodes_claims_are_freed_and_the_other_node_needs_nothing(cluster: LocalCluster) -> None:
    kept, lost = cluster.nodes[KEPT], cluster.nodes[LOST]
    ns = w.namespace(kept, "lost")
    for host in (KEPT, LOST):
        w.create_claim(kept, ns, host, [w.vgpu_request("gpu", "2Gi", "20")])
        w.create_pod(kept, ns, host, [w.container("main", [("gpu", None)])], {"gpu": host}, host=host)
    before = {host: w.wait_running(kept, ns, host) for host in (KEPT, LOST)}
    kept_allocation = w.get_claim(kept, ns, KEPT)["status"]["allocation"]
    vgpud = kept.procs["vgpud"].pid

    for stop in (lost.stop_vgpud, lost.stop_kubelet, lost.stop_containerd):
        stop(signal.SIGKILL)
    killed = time.monotonic()
    w.wait_for(
        lambda: ready(kept, LOST) not in ("True", ""), timeout=NOT_READY_WITHIN_S, what=f"{LOST} NotReady"
    )

    not_ready = time.monotonic() - killed
    w.delete_pod(kept, ns, LOST, force=True)
    deleted = time.monotonic()
    claim = w.wait_for(lambda: deallocated(w.get_claim(kept, ns, LOST)), what=f"claim {LOST} deallocated")
    assert not claim["status"].get("reservedFor"), claim["status"]
    freed = time.monotonic() - deleted

    pod = w.get_pod(kept, ns, KEPT)
    assert w.container_id(pod, "main") == w.container_id(before[KEPT], "main")
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    assert w.get_claim(kept, ns, KEPT)["status"]["allocation"] == kept_allocation
    assert kept.procs["vgpud"].pid == vgpud and kept.procs["vgpud"].poll() is None
    assert kept.vgpud_health() == 1

    w.create_pod(kept, ns, "again", [w.container("main", [("gpu", None)])], {"gpu": LOST})
    again = w.wait_running(kept, ns, "again")
    assert again["spec"]["nodeName"] == KEPT, again["spec"]
    env = w.container_env(kept, w.container_id(again, "main"))
    assert "2048m" in w.vgpu_limits(env).values(), env
    print(
        f"\nnode lost: {LOST} NotReady {not_ready:.1f} s after its kubelet, containerd and vgpud were "
        f"killed; its pod's claim deallocated {freed:.1f} s after the pod's forced deletion, then Running "
        f"on {KEPT}",
        flush=True,
    )


def deallocated(claim: dict[str, Any]) -> dict[str, Any] | None:
    return claim if not claim.get("status", {}).get("allocation") else None
