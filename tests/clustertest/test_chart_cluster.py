"""vgpud installed by the chart across a cluster (issue 35, items 1 and 3): one `helm install` on two
nodes, NRI on node-0 and off on node-1, gives one DaemonSet whose pod on each node reaches that node's
own paths (`hostPaths.nodeRoot`); then `helm upgrade` to a new image tag while vGPU pods are created
on both nodes.

- One vgpud pod per node, Ready; node-0 publishes nriMode true, node-1 (whose runtime has no NRI
  socket) false: the same DaemonSet runs eager there. A vGPU pod runs on each node with its limits.
- The upgrade rolls one node at a time: at no moment are both nodes without a Ready vgpud pod, and
  the second node's old pod goes only after the first node's new one is Ready.
- Every pod created during the roll runs with its injection (vgpud's config mount and limits, one
  directory on its node), or, created while its node's NRI plugin was down, is reported not injected
  (VGPUNotInjected); each claim is prepared once, on its pod's node only (the nodes' checkpoints).
"""

from __future__ import annotations

import threading
import time
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.e2e import chart
from tests.e2e import workload as w
from tests.e2e.cluster import LocalCluster, NodeSpec, started
from tests.e2e.node import LocalNode, node_available
from tests.e2e.test_node_containers import injected
from tests.kubeapi import log_tail
from tests.support import require
from vgpud.kube.events import Reason
from vgpud.relaxations import NRI_MODE_ATTRIBUTE

NRI_NODE, EAGER_NODE = "node-0", "node-1"
#: a claim and pod every this many seconds while the DaemonSet rolls, alternating nodes
CREATE_EVERY_S = 1.0
ROLLOUT_TIMEOUT_S = 240.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require(node_available(), "the local node's runtime", "run make node-deps (make cluster-test does)")
    require(chart.chart_available(), "helm and the vgpud image", chart.INSTALL_HINT)
    with started([NodeSpec(NRI_NODE, nri=True), NodeSpec(EAGER_NODE, nri=False)], chart=True) as local:
        yield local


def api(cluster: LocalCluster) -> LocalNode:
    return cluster.nodes[NRI_NODE]


def ready_daemon_pods(node: LocalNode) -> dict[str, str]:
    """Node -> image of its Ready, not terminating vgpud pod."""
    out = {}
    for pod in chart.daemon_pods(node):
        conditions = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
        if conditions.get("Ready") == "True" and not pod["metadata"].get("deletionTimestamp"):
            out[pod["spec"]["nodeName"]] = pod["spec"]["containers"][0]["image"]
    return out


def vgpu_pod(node: LocalNode, ns: str, name: str, host: str) -> None:
    w.create_claim(node, ns, name, [w.vgpu_request("gpu", "1Gi", "10")])
    w.create_pod(node, ns, name, [w.container("main", [("gpu", None)])], {"gpu": name}, host=host)


def test_one_daemonset_serves_every_node_in_its_own_mode(cluster: LocalCluster) -> None:
    node = api(cluster)
    images = ready_daemon_pods(node)
    assert set(images) == set(cluster.nodes), images
    for host, local in cluster.nodes.items():
        modes = {
            d["attributes"][NRI_MODE_ATTRIBUTE]["bool"] for s in local.slices() for d in s["spec"]["devices"]
        }
        assert modes == {local.nri}, (host, modes)
    ns = w.namespace(node, "daemonset")
    for host in cluster.nodes:
        vgpu_pod(node, ns, host, host)
    for host in cluster.nodes:
        pod = w.wait_running(node, ns, host)
        env = w.container_env(cluster.nodes[host], w.container_id(pod, "main"))
        assert "1024m" in w.vgpu_limits(env).values(), (host, env)


@dataclass
class DuringTheRoll:
    """While inside: a vGPU pod created every CREATE_EVERY_S on each node in turn, and each node's
    Ready vgpud pod noted every 0.2 s."""

    node: LocalNode
    ns: str
    hosts: list[str]
    created: list[str] = field(default_factory=list)
    #: pods the API server refused: "name: code body"
    refused: list[str] = field(default_factory=list)
    #: node -> image of its Ready vgpud pod, in each snapshot
    seen: list[dict[str, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> DuringTheRoll:
        for target in (self._create_pods, self._watch_daemon_pods):
            self._threads.append(threading.Thread(target=target, daemon=True))
            self._threads[-1].start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def _create_pods(self) -> None:
        while not self._stop.is_set():
            name = f"r{len(self.created) + len(self.refused):02d}"
            try:
                vgpu_pod(self.node, self.ns, name, self.hosts[len(self.created) % len(self.hosts)])
                self.created.append(name)
            except urllib.error.HTTPError as err:
                self.refused.append(f"{name}: {err.code} {err.read().decode(errors='replace')}")
            self._stop.wait(CREATE_EVERY_S)

    def _watch_daemon_pods(self) -> None:
        while not self._stop.is_set():
            self.seen.append(ready_daemon_pods(self.node))
            self._stop.wait(0.2)


def test_helm_upgrade_rolls_one_node_at_a_time_while_pods_are_created(cluster: LocalCluster) -> None:
    node, nodes = api(cluster), list(cluster.nodes.values())
    (old,) = set(ready_daemon_pods(node).values())
    tag = f"roll-{time.monotonic_ns()}"
    (new,) = {chart.import_image(local, tag) for local in nodes}
    started = time.monotonic()
    with DuringTheRoll(node, w.namespace(node, "roll"), list(cluster.nodes)) as roll:
        chart.upgrade_cluster(nodes, cluster.workdir, tag)
        w.wait_for(
            lambda: ready_daemon_pods(node) == dict.fromkeys(cluster.nodes, new),
            timeout=ROLLOUT_TIMEOUT_S,
            what="every node on the new vgpud",
        )
        rolled = time.monotonic() - started
        time.sleep(3 * CREATE_EVERY_S)  # and a few pods after the roll
    assert not roll.refused, roll.refused
    assert all(roll.seen), "a moment when no node had a Ready vgpud pod"
    first_new = {n: next(i for i, s in enumerate(roll.seen) if s.get(n) == new) for n in cluster.nodes}
    last_old = {n: max(i for i, s in enumerate(roll.seen) if s.get(n) == old) for n in cluster.nodes}
    first, second = sorted(cluster.nodes, key=first_new.__getitem__)
    # one node at a time: the second node's old pod was still Ready when the first node's new one
    # became Ready (in that snapshot or the one before: the controller deletes it within the poll)
    assert last_old[second] >= first_new[first] - 1, (first_new, last_old)
    not_injected = [name for name in roll.created if not injected_once(cluster, roll.ns, name)]
    print(
        f"\nhelm upgrade on 2 nodes: rolled in {rolled:.1f} s ({first} first, then {second}); "
        f"{len(roll.created)} pods created during and after the roll, all Running; "
        f"{len(not_injected)} reported not injected {not_injected}",
        flush=True,
    )


def injected_once(cluster: LocalCluster, ns: str, name: str) -> bool:
    """Once pod `name` runs: asserts its claim is prepared on its own node only (in that node's
    checkpoint, not the other's); whether its container was created with vgpud's config mount (then
    with its limits, and its directory on that node only), and if not, asserts vgpud reported it not
    injected (a container created while its node's NRI plugin was down: the CDI edits of Prepare
    still gave it its limits' environment)."""
    node = api(cluster)
    pod = w.wait_running(node, ns, name)
    host = pod["spec"]["nodeName"]
    local = cluster.nodes[host]
    uid = w.get_claim(node, ns, name)["metadata"]["uid"]
    prepared = {n: uid in w.checkpoint_claims(each) for n, each in cluster.nodes.items()}
    assert prepared == {n: n == host for n in cluster.nodes}, (name, prepared)
    cid = w.container_id(pod, "main")
    if injected(local, cid):
        assert "1024m" in w.vgpu_limits(w.container_env(local, cid)).values(), name
        dirs = {n: len(w.claim_subdirs(each, uid)) for n, each in cluster.nodes.items()}
        assert dirs == {n: int(n == host) for n in cluster.nodes}, (name, dirs)
        return True
    try:
        w.wait_for(
            lambda: Reason.VGPU_NOT_INJECTED in {e["reason"] for e in w.pod_events(node, ns, name)},
            what=f"pod {name} on {host}: its container reported not injected",
        )
    except AssertionError as err:
        raise AssertionError(
            f"{err}\n{w.events(node, ns)}\n--- vgpud on {host}:\n{log_tail(local.vgpud_log())}"
        ) from None
    return False
