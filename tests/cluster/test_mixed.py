"""A mixed cluster on this machine (tests/e2e/cluster.py): node-0 in NRI mode beside node-1 in eager
mode, one control plane, vgpud on each node (issue 35, item 2).

- A claim that selects NRI nodes (the `nriMode` selector) is allocated on the NRI node only, and its pod
  runs there with its limits.
- A plain vGPU claim works on either node: a pod placed on each runs with its limits.
- The webhook relaxations (both switches on): the shapes they allow (two claims in one container,
  one claim across two pods), with claims that select NRI nodes, are admitted, scheduled on the NRI
  node and run there; the eager node's Prepare never refuses anything in this normal operation.
  Without the selector the pod is denied with the documented message. Forced onto the eager node by
  hand (claims allocated to its devices, pods bound to it), its Prepare refuses each claim.
- XID 79 on both GPUs of the NRI node: its devices are tainted, new claims are allocated on the other
  node and their pods run there; the NRI node's running pod keeps running and its status says
  Unhealthy; once the XIDs stop both GPUs are untainted.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e import test_node_relaxations as relaxations
from tests.e2e import workload as w
from tests.e2e.cluster import LocalCluster, NodeSpec, started
from tests.e2e.node import HEALTH_RECOVERY_S, LocalNode, node_available
from tests.e2e.test_node_health import (
    TAINT_WITHIN_S,
    XID_FALLEN_OFF_THE_BUS,
    container_health,
    faulty_gpu,
    taints,
)
from tests.e2e.test_node_relaxations import Relaxed, cleanup, create_pod, pod_body, two_claims
from tests.support import require
from vgpud.partition.nrionly import RefusalReason
from vgpud.relaxations import Relaxation

NRI_NODE, EAGER_NODE = "node-0", "node-1"


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require(node_available(), "the local node's runtime", "run make node-deps (the test command does)")
    with started([NodeSpec(NRI_NODE, nri=True), NodeSpec(EAGER_NODE, nri=False)]) as local:
        yield local


def api(cluster: LocalCluster) -> LocalNode:
    """Any node: every node talks to the one API server."""
    return cluster.nodes[NRI_NODE]


def pod_on(node: LocalNode, ns: str, name: str, claim: str, host: str | None = None) -> None:
    """Pod `name` whose container `main` uses claim `claim`; on `host` when given."""
    w.create_pod(node, ns, name, [w.container("main", [("gpu", None)])], {"gpu": claim}, host=host)


def test_a_claim_selecting_nri_nodes_runs_on_the_nri_node(cluster: LocalCluster) -> None:
    node = api(cluster)
    ns = w.namespace(node)
    for i in range(2):  # twice: the scheduler is not merely lucky
        claim = f"nri-{i}"
        w.create_claim(node, ns, claim, [w.nri_only(w.vgpu_request("gpu", "1Gi", "10"))])
        pod_on(node, ns, claim, claim)
        pod = w.wait_running(node, ns, claim)
        assert pod["spec"]["nodeName"] == NRI_NODE, pod["spec"]
        allocation = w.get_claim(node, ns, claim)["status"]["allocation"]
        assert {r["pool"] for r in allocation["devices"]["results"]} == {NRI_NODE}, allocation
        cid = w.container_id(pod, "main")
        env = w.container_env(cluster.nodes[NRI_NODE], cid)
        assert "1024m" in w.vgpu_limits(env).values(), env


def test_a_plain_claim_works_on_either_node(cluster: LocalCluster) -> None:
    node = api(cluster)
    ns = w.namespace(node)
    for host in (NRI_NODE, EAGER_NODE):
        w.create_claim(node, ns, host, [w.vgpu_request("gpu", "2Gi", "20")])
        pod_on(node, ns, host, host, host=host)
    for host in (NRI_NODE, EAGER_NODE):
        pod = w.wait_running(node, ns, host)
        assert pod["spec"]["nodeName"] == host
        env = w.container_env(cluster.nodes[host], w.container_id(pod, "main"))
        assert "2048m" in w.vgpu_limits(env).values(), (host, env)


@pytest.fixture(scope="module")
def relaxed(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relaxed]:
    """The relaxing webhook in front of the cluster's API server, for its own namespace; the
    Relaxed's node is the NRI node (`on` gives the same namespace seen from another node)."""
    node = api(cluster)
    ns = w.namespace(node, "relax")
    with relaxations.relaxing_webhook(node, tmp_path_factory.mktemp("webhook"), ns) as webhook:
        yield Relaxed(node, ns, webhook)


def on(cluster: LocalCluster, relaxed: Relaxed, host: str) -> Relaxed:
    return Relaxed(cluster.nodes[host], relaxed.ns, relaxed.webhook)


def all_refusals(node: LocalNode) -> float:
    return sum(relaxations.refusals(node, reason) for reason in RefusalReason)


def test_the_relaxed_shapes_select_the_nri_node_and_run_there(
    cluster: LocalCluster, relaxed: Relaxed
) -> None:
    node, ns = relaxed.node, relaxed.ns
    eager_refusals = all_refusals(cluster.nodes[EAGER_NODE])
    two = w.unique("two")
    claims = two_claims(relaxed, two, (0, 1), selected=True)
    create_pod(relaxed, pod_body(two, {"a": f"{two}-a", "b": f"{two}-b"}, [("main", ["a", "b"])]))
    across = w.unique("across")
    requests = [w.nri_only(w.on_gpu(w.vgpu_request(r, "1Gi", "10"), i)) for i, r in enumerate(("r0", "r1"))]
    claims[across] = w.create_claim(node, ns, across, requests)["metadata"]["uid"]
    pods = [f"{across}-{r}" for r in ("r0", "r1")]
    for pod, request in zip(pods, ("r0", "r1"), strict=True):
        create_pod(relaxed, pod_body(pod, {"gpu": across}, [("main", ["gpu"])], requests={"gpu": request}))
    try:
        running = {name: w.wait_running(node, ns, name) for name in (two, *pods)}
        assert {name: p["spec"]["nodeName"] for name, p in running.items()} == dict.fromkeys(
            running, NRI_NODE
        )
        limits = w.vgpu_limits(w.container_env(node, w.container_id(running[two], "main")))
        assert (limits["CUDA_MEM_LIMIT_0"], limits["CUDA_MEM_LIMIT_1"]) == ("1024m", "2048m"), limits
        for pod in pods:
            limits = w.vgpu_limits(w.container_env(node, w.container_id(running[pod], "main")))
            assert list(limits.values()).count("1024m") == 1, (pod, limits)
        for name in claims:
            allocation = w.get_claim(node, ns, name)["status"]["allocation"]
            assert {r["pool"] for r in allocation["devices"]["results"]} == {NRI_NODE}, (name, allocation)
        # the scheduler kept every one of these claims away from the eager node
        assert all_refusals(cluster.nodes[EAGER_NODE]) == eager_refusals
    finally:
        cleanup(relaxed, [two, *pods], claims)


def test_without_the_selector_the_pod_is_denied(relaxed: Relaxed) -> None:
    relaxations.test_without_the_selector_the_pod_is_denied(relaxed)


@pytest.mark.parametrize("shape", list(Relaxation))
def test_forced_onto_the_eager_node_its_prepare_refuses(
    cluster: LocalCluster, relaxed: Relaxed, shape: Relaxation
) -> None:
    """Claims allocated by hand to the eager node's devices, the pods bound to it by name."""
    relaxations.test_forced_onto_a_node_the_eager_prepare_refuses(on(cluster, relaxed, EAGER_NODE), shape)


def test_an_xid_79_on_a_nodes_gpus_sends_new_claims_to_the_other_node(cluster: LocalCluster) -> None:
    sick = cluster.nodes[NRI_NODE]
    ns = w.namespace(sick)
    w.create_claim(sick, ns, "running", [w.vgpu_request("gpu", "1Gi", "10")])
    pod_on(sick, ns, "running", "running", host=NRI_NODE)
    w.wait_running(sick, ns, "running")
    with faulty_gpu(sick, 0, XID_FALLEN_OFF_THE_BUS), faulty_gpu(sick, 1, XID_FALLEN_OFF_THE_BUS):
        w.wait_for(
            lambda: taints(sick, "vgpu-0") and taints(sick, "vgpu-1"),
            timeout=TAINT_WITHIN_S,
            what=f"both GPUs of {NRI_NODE} tainted",
        )
        w.wait_for(
            lambda: container_health(sick, ns, "running") == ["Unhealthy"],
            what="the running pod's device Unhealthy in its status",
        )
        for i in range(2):
            claim = f"new-{i}"
            w.create_claim(sick, ns, claim, [w.vgpu_request("gpu", "1Gi", "10")])
            pod_on(sick, ns, claim, claim)
            pod = w.wait_running(sick, ns, claim)
            assert pod["spec"]["nodeName"] == EAGER_NODE, pod["spec"]
        assert w.get_pod(sick, ns, "running")["status"]["phase"] == "Running"
    w.wait_for(
        lambda: not taints(sick, "vgpu-0") and not taints(sick, "vgpu-1"),
        timeout=HEALTH_RECOVERY_S + 30,
        what=f"{NRI_NODE}'s GPUs untainted once the XIDs stop",
    )
