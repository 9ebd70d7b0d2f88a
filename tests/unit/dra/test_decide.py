"""`vgpud.dra.decide`: one decision per claim from the facts Prepare gathered and the checkpoint, with
no I/O: replays, refusals before any side effect, and the plans (partitions, CDI spec, entries) of the
claims to start, in request order."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from tests import objects as o
from tests.draharness import GPUS, NODE
from tests.purity import run_without_io
from vgpud.dra.checkpoint import Checkpoint, ClaimEntry, PreparedDevice, PrepareState
from vgpud.dra.claimedits import NodeFacts, PrepareError
from vgpud.dra.claimindex import ClaimRef
from vgpud.dra.decide import ClaimFacts, Refuse, Replay, Start, decide
from vgpud.gpu.exclusion import shared_gpus
from vgpud.gpu.mock import load_profile, shipped_profiles
from vgpud.node.build import excluded_by_minor
from vgpud.partition.assigner import PartitionAssigner
from vgpud.partition.eager import EagerAssigner
from vgpud.partition.layout import Layout
from vgpud.partition.lazy import LazyAssigner
from vgpud.partition.model import ClaimView, PodView
from vgpud.partition.nrionly import NriOnlyUse, PrepareRefusal, RefusalReason
from vgpud.relaxations import Relaxation

LAYOUT = Layout("/etc/vgpu-manager")
NAMES = {"vgpu-0": "vgpu-0 (GPU-0, host index 0)", "vgpu-1": "vgpu-1 (GPU-1, host index 1)"}
SECOND_UID = "9d8c7b6a-5f4e-4d3c-8b2a-190817263544"
FACTS = NodeFacts(
    driver=o.DRIVER,
    node_name=NODE,
    layout=LAYOUT,
    gpus_by_minor={g.minor: g for g in GPUS},
    client_mode=False,
    cgroup_v2=False,
    memory_ratio=100,
    library_version="1.0",
)
EAGER = EagerAssigner(LAYOUT, driver=o.DRIVER, client_mode=False)
LAZY = LazyAssigner(LAYOUT, driver=o.DRIVER)
EMPTY = Checkpoint(boot_id="boot-1")


def pod(*containers: dict[str, Any], uid: str = o.POD1_UID, name: str = "train") -> dict[str, Any]:
    return o.pod(
        name,
        uid,
        containers=list(containers) or [o.container("main", o.ref("gpu"))],
        claims={"gpu": "gpu-claim", "more": "second"},
    )


def claim(*pods: dict[str, Any], name: str = "gpu-claim", uid: str = o.CLAIM_UID, **result: Any) -> ClaimView:
    request = "r1" if name == "gpu-claim" else "r2"
    return ClaimView.from_dict(
        o.claim(
            name=name,
            uid=uid,
            requests=[o.exactly(request)],
            results=[o.result(request, **result)],
            reserved_for=o.reserved(*pods),
        ),
        o.DRIVER,
    )


def facts(view: ClaimView, *pods: dict[str, Any], **kwargs: Any) -> ClaimFacts:
    return ClaimFacts(
        ClaimRef(view.namespace, view.uid, view.name),
        view,
        tuple(PodView.from_dict(p) for p in pods),
        **kwargs,
    )


def one(
    claim_facts: ClaimFacts, checkpoint: Checkpoint = EMPTY, assigner: PartitionAssigner = EAGER
) -> Replay | Refuse | Start:
    (decision,) = decide([claim_facts], checkpoint, FACTS, assigner, NAMES)
    return decision


def entry(state: PrepareState, *devices: PreparedDevice, name: str = "gpu-claim") -> ClaimEntry:
    return ClaimEntry(state=state, name=name, namespace=o.NAMESPACE, prepared_devices=devices)


DEVICE = PreparedDevice(("r1",), NODE, "vgpu-0", (f"{o.DRIVER}/claim=x",), share_id="r1-vgpu-0-share")


def test_a_claim_to_prepare_gets_its_plan_and_both_entries() -> None:
    p = pod()
    decision = one(facts(claim(p), p))
    assert isinstance(decision, Start)
    assert (decision.rollback_first, decision.failure) == (False, None)
    assert decision.started == ClaimEntry(
        state=PrepareState.STARTED, name="gpu-claim", namespace=o.NAMESPACE, vgpu=True, mode="eager"
    )
    plan = decision.plan
    assert plan is not None
    assert [(d.device, d.share_id, d.request_names) for d in plan.devices] == [
        ("vgpu-0", "r1-vgpu-0-share", ("r1",))
    ]
    (spec_device,) = plan.spec["devices"]
    assert plan.devices[0].cdi_device_ids == (f"{plan.spec['kind']}={spec_device['name']}",)
    (key,) = plan.result.record.request_partitions.values()
    partition = f"/etc/vgpu-manager/claims/{o.CLAIM_UID}/{key}"
    assert [str(paths.base) for paths in plan.result.partition_dirs] == [partition]
    mounts = spec_device["containerEdits"]["mounts"]
    assert mounts and all(m["hostPath"].startswith(f"{partition}/") for m in mounts)
    completed = plan.completed
    assert (completed.state, completed.mode, completed.prepared_devices) == (
        PrepareState.COMPLETED,
        "eager",
        plan.devices,
    )
    assert completed.status == {"reservedFor": [{"resource": "pods", "name": "train", "uid": o.POD1_UID}]}
    assert completed.partition == plan.result.record.to_dict()


def test_a_completed_claim_replays_its_recorded_devices_whatever_its_facts() -> None:
    p = pod(o.container("main", o.ref("gpu"), o.ref("more")))
    second = claim(p, name="second", uid=SECOND_UID, device="vgpu-1")
    refused = facts(claim(p), p, others={"second": second})
    done = Checkpoint("boot-1", {o.CLAIM_UID: entry(PrepareState.COMPLETED, DEVICE)})
    assert one(refused, done) == Replay(refused.ref, (DEVICE,))
    assert one(facts(claim(p), p, replay=True), done) == Replay(refused.ref, (DEVICE,))


def test_a_replay_that_the_checkpoint_no_longer_has_is_an_error_not_an_unchecked_prepare() -> None:
    decision = one(facts(claim(pod()), pod(), replay=True))
    assert isinstance(decision, Refuse)
    assert type(decision.error) is PrepareError
    assert str(decision.error) == (
        "claim default/gpu-claim was unprepared while this Prepare ran, before its use was checked: try again"
    )


def test_eager_refuses_a_container_with_two_vgpu_claims_before_any_side_effect() -> None:
    p = pod(o.container("main", o.ref("gpu"), o.ref("more")))
    second = claim(p, name="second", uid=SECOND_UID, device="vgpu-1")
    decision = one(facts(claim(p), p, others={"second": second}))
    assert isinstance(decision, Refuse)
    assert isinstance(decision.error, NriOnlyUse)
    assert decision.error.relaxation is Relaxation.MULTIPLE_CLAIMS_PER_CONTAINER
    assert str(decision.error).startswith(
        "claim default/gpu-claim: container main of pod default/train also uses vGPU claim default/second"
    )
    # NRI mode serves it (the claims are on different GPUs)
    lazy = one(facts(claim(p), p, others={"second": second}, neighbours=frozenset()), assigner=LAZY)
    assert isinstance(lazy, Start) and lazy.plan is not None


def test_nri_mode_refuses_only_a_neighbour_on_the_same_gpu() -> None:
    p = pod(o.container("main", o.ref("gpu"), o.ref("more")))
    second = claim(p, name="second", uid=SECOND_UID)  # vgpu-0 too
    decision = one(
        facts(claim(p), p, others={"second": second}, neighbours=frozenset({"second"})), assigner=LAZY
    )
    assert isinstance(decision, Refuse)
    assert isinstance(decision.error, PrepareRefusal)
    assert decision.error.reason is RefusalReason.CLAIMS_SHARE_A_GPU
    assert "on the same GPU vgpu-0 (GPU-0, host index 0)" in str(decision.error)
    not_near = one(facts(claim(p), p, others={"second": second}), assigner=LAZY)
    assert isinstance(not_near, Start), "not a neighbour: not judged"


def test_a_claim_reserved_for_two_pods_fails_after_prepare_started_in_eager_mode() -> None:
    """The eager assigner refuses it while planning: the shell records PrepareStarted and rolls it back."""
    pods = [pod(uid=o.POD1_UID, name="p0"), pod(uid=o.POD2_UID, name="p1")]
    decision = one(facts(claim(*pods), *pods))
    assert isinstance(decision, Start)
    assert decision.plan is None
    assert isinstance(decision.failure, NriOnlyUse)
    assert decision.failure.relaxation is Relaxation.CLAIM_ACROSS_PODS
    assert decision.started.state is PrepareState.STARTED


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (
            {"share_id": "taken"},
            f"device vgpu-0 (share taken) is already prepared for claim default/other ({SECOND_UID})",
        ),
        ({"device": "vgpu-7"}, f"device 'vgpu-7' is not a GPU of node {NODE}"),
    ],
    ids=["share prepared for another claim", "no GPU of this node"],
)
def test_a_device_this_node_cannot_prepare_is_refused(result: dict[str, Any], message: str) -> None:
    taken = PreparedDevice(("r1",), NODE, "vgpu-0", ("x",), share_id="taken")
    checkpoint = Checkpoint("boot-1", {SECOND_UID: entry(PrepareState.COMPLETED, taken, name="other")})
    decision = one(facts(claim(pod(), **result), pod()), checkpoint)
    assert isinstance(decision, Refuse)
    assert str(decision.error) == message


def test_a_device_of_a_mig_gpu_is_refused_with_why() -> None:
    """The MIG GPU is not in the slice, so no scheduler allocates it; a hand-made allocation naming it
    is refused with the reason, while the node's other GPU prepares."""
    gpus = load_profile(shipped_profiles()["a100-40gb-x2-mig"])
    node = replace(
        FACTS,
        gpus_by_minor={g.minor: g for g in shared_gpus(gpus)},
        excluded_by_minor=excluded_by_minor(gpus),
    )
    p = pod()
    (refused,) = decide([facts(claim(p, device="vgpu-0"), p)], EMPTY, node, EAGER, NAMES)
    assert isinstance(refused, Refuse)
    assert str(refused.error) == (
        f"device 'vgpu-0' is GPU {gpus[0].uuid} (host index 0), in MIG mode (4 MIG devices): vgpud does "
        f"not share MIG GPUs; node {NODE} does not publish it"
    )
    (started,) = decide([facts(claim(p, device="vgpu-1"), p)], EMPTY, node, EAGER, NAMES)
    assert isinstance(started, Start) and started.failure is None


def test_an_interrupted_prepare_is_rolled_back_first_and_a_repeated_uid_too() -> None:
    p = pod()
    interrupted = Checkpoint("boot-1", {o.CLAIM_UID: entry(PrepareState.STARTED)})
    decision = one(facts(claim(p), p), interrupted)
    assert isinstance(decision, Start) and decision.rollback_first
    twice = decide([facts(claim(p), p), facts(claim(p), p)], EMPTY, FACTS, EAGER, NAMES)
    assert [(type(d), getattr(d, "rollback_first", None)) for d in twice] == [(Start, False), (Start, True)]


def test_decisions_keep_the_request_order() -> None:
    p = pod()
    second = claim(p, name="second", uid=SECOND_UID, device="vgpu-1")
    on_gpu1 = PreparedDevice(("r2",), NODE, "vgpu-1", ("x",), share_id="r2-vgpu-1-share")
    done = Checkpoint("boot-1", {SECOND_UID: entry(PrepareState.COMPLETED, on_gpu1, name="second")})
    decisions = decide([facts(second, p), facts(claim(p), p)], done, FACTS, EAGER, NAMES)
    assert [(type(d), d.ref.uid) for d in decisions] == [(Replay, SECOND_UID), (Start, o.CLAIM_UID)]


def test_decide_does_no_io() -> None:
    """Imported and run where the filesystem and the network raise, and without Trio or the API."""
    done = run_without_io(
        """
        import types

        from tests import objects as o
        from vgpud.dra.checkpoint import Checkpoint
        from vgpud.dra.claimedits import NodeFacts
        from vgpud.dra.decide import ClaimFacts, Start, decide
        from vgpud.gpu.model import GpuInfo
        from vgpud.partition.eager import EagerAssigner
        from vgpud.partition.layout import Layout
        from vgpud.partition.model import ClaimView, PodView

        layout = Layout("/etc/vgpu-manager")
        gpu = GpuInfo("GPU-0", 0, 0, "A100", "Tesla", "Ampere", 40 << 30, "0000:07:00.0", None, "8.0",
                      "550.54.15", "12.4", None)
        node = NodeFacts(driver=o.DRIVER, node_name="node-a", layout=layout, gpus_by_minor={0: gpu},
                         client_mode=True, cgroup_v2=True, memory_ratio=100, library_version="1.0")
        pod = o.pod("train", o.POD1_UID, containers=[o.container("main", o.ref("gpu"))])
        claim = ClaimView.from_dict(o.claim(requests=[o.exactly("r1")], results=[o.result("r1")],
                                            reserved_for=o.reserved(pod)), o.DRIVER)
        # a ClaimRef's shape: its module (the claim index) imports Trio
        ref = types.SimpleNamespace(namespace="default", uid=claim.uid, name=claim.name)
        facts = ClaimFacts(ref, claim, (PodView.from_dict(pod),))
        assigner = EagerAssigner(layout, driver=o.DRIVER, client_mode=True)
        (decision,) = decide([facts], Checkpoint("boot"), node, assigner, {})
        assert isinstance(decision, Start) and decision.plan is not None, decision
        io = ("trio", "vgpud.kube", "vgpud.dra.gather", "vgpud.dra.claimindex")
        loaded = [m for m in set(sys.modules) - before if m.startswith(io)]
        assert not loaded, loaded
        print("pure", decision.plan.devices[0].device)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "pure vgpu-0\n"
