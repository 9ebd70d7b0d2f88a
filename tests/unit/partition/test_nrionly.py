"""The rules of `vgpud.partition.nrionly`, as tables with the exact messages: every refusal and every
accept of each relaxation on an eager node, and of vGPU claims that share a GPU in one container on an
NRI node."""

from __future__ import annotations

from typing import Any

import pytest

from tests import objects as o
from vgpud.partition.assigner import Mode
from vgpud.partition.model import ClaimView, PodView
from vgpud.partition.nrionly import (
    NriOnlyUse,
    PreparedClaim,
    PrepareRefusal,
    RefusalReason,
    claim_across_pods,
    claims_share_a_gpu,
    gpu_claims,
    gpu_neighbours,
    multiple_claims,
    other_claims,
    use_refusal,
)
from vgpud.relaxations import Relaxation

FIX = "needs a node in NRI mode: select devices with device.attributes['manager.nvidia.com'].nriMode == true"
OTHER_UID = "9d8c7b6a-5f4e-4d3c-8b2a-190817263544"


def view(claim: dict[str, Any]) -> ClaimView:
    return ClaimView.from_dict(claim, o.DRIVER)


def vgpu_claim(*pods: dict[str, Any], name: str = "gpu-claim", uid: str = o.CLAIM_UID) -> ClaimView:
    return view(
        o.claim(
            name=name,
            uid=uid,
            requests=[o.exactly("r1")],
            results=[o.result("r1")],
            reserved_for=o.reserved(*pods),
        )
    )


def pod_of(
    *containers: dict[str, Any], claims: dict[str, str] | None = None, **kwargs: Any
) -> dict[str, Any]:
    return o.pod("train", o.POD1_UID, containers=list(containers), claims=claims, **kwargs)


# --- claim across pods -----------------------------------------------------------------------------


def test_a_vgpu_claim_reserved_for_two_pods_is_refused_with_its_pods_and_containers() -> None:
    pods = [
        o.pod(f"p{i}", uid, containers=[o.container("main", o.ref("gpu"))])
        for i, uid in enumerate((o.POD1_UID, o.POD2_UID))
    ]
    claim = vgpu_claim(*pods)
    refused = claim_across_pods(claim, [PodView.from_dict(p) for p in pods], o.DRIVER)
    assert isinstance(refused, NriOnlyUse)
    assert refused.relaxation is Relaxation.CLAIM_ACROSS_PODS
    assert str(refused) == (
        "claim default/gpu-claim is reserved for 2 pods (default/p0, default/p1) (containers p1/main, "
        "p0/main use it): a vGPU claim used across pods (vgpu-claim-across-pods) "
        + FIX
        + " (an eager node's partitions cannot span pods safely)"
    )


@pytest.mark.parametrize(
    ("reserved", "driver"),
    [(1, o.DRIVER), (0, o.DRIVER), (2, o.OTHER_DRIVER)],
    ids=["one pod", "no pod yet", "two pods, no vGPU device"],
)
def test_a_claim_across_pods_is_accepted(reserved: int, driver: str) -> None:
    pods = [
        o.pod(f"p{i}", uid, containers=[o.container("main", o.ref("gpu"))])
        for i, uid in enumerate((o.POD1_UID, o.POD2_UID))
    ][:reserved]
    claim = view(
        o.claim(
            requests=[o.exactly("r1")],
            results=[o.result("r1", driver=driver)],
            reserved_for=o.reserved(*pods),
        )
    )
    assert claim_across_pods(claim, [PodView.from_dict(p) for p in pods], o.DRIVER) is None


# --- several claims in one container ---------------------------------------------------------------

BOTH = {"gpu": "gpu-claim", "more": "second"}


def judge(pod: dict[str, Any], others: dict[str, ClaimView]) -> NriOnlyUse | None:
    claim = vgpu_claim(pod)
    return multiple_claims(claim, other_claims(claim, [PodView.from_dict(pod)]), others, o.DRIVER)


def test_a_container_with_two_vgpu_claims_is_refused_naming_pod_container_and_claims() -> None:
    pod = pod_of(o.container("main", o.ref("gpu"), o.ref("more")), claims=BOTH)
    refused = judge(pod, {"second": second_on(pod, "vgpu-1")})
    assert isinstance(refused, NriOnlyUse)
    assert refused.relaxation is Relaxation.MULTIPLE_CLAIMS_PER_CONTAINER
    assert str(refused) == (
        "claim default/gpu-claim: container main of pod default/train also uses vGPU claim default/second "
        "(pod claim more): several vGPU claims in one container (multiple-vgpu-claims-per-container) "
        + FIX
        + " (on an eager node their partitions would mount at the same paths)"
    )


def test_a_template_claim_is_found_through_the_pod_status() -> None:
    pod = pod_of(
        o.container("main", o.ref("gpu"), o.ref("more")),
        claims={"gpu": "gpu-claim"},
        templates={"more": "second"},
    )
    (use,) = other_claims(vgpu_claim(pod), [PodView.from_dict(pod)])
    assert (use.pod_claim, use.claim_name, use.container.name) == ("more", "second", "main")
    assert judge(pod, {"second": second_on(pod, "vgpu-1")}) is not None


def test_an_init_container_with_two_vgpu_claims_is_refused() -> None:
    pod = pod_of(
        o.container("main", o.ref("gpu")),
        init=[o.container("setup", o.ref("gpu"), o.ref("more"))],
        claims=BOTH,
    )
    refused = judge(pod, {"second": second_on(pod, "vgpu-1")})
    assert refused is not None and "container setup of pod default/train" in str(refused)


@pytest.mark.parametrize(
    ("containers", "driver", "nic_too"),
    [
        ([o.container("main", o.ref("gpu"))], o.DRIVER, False),
        ([o.container("main", o.ref("gpu"), o.ref("more"))], o.OTHER_DRIVER, False),
        ([o.container("main", o.ref("gpu"), o.ref("more", "nic"))], o.DRIVER, True),
        ([o.container("main", o.ref("gpu")), o.container("side", o.ref("more"))], o.DRIVER, False),
        (
            [o.container("main", o.ref("gpu")), o.container("side", o.ref("gpu", "nic"), o.ref("more"))],
            o.DRIVER,
            False,
        ),
    ],
    ids=[
        "one claim",
        "the other claim is another driver's",
        "only the other claim's non-vGPU request",
        "the other vGPU claim is another container's",
        "the two-claim container uses none of this claim's vGPU requests",
    ],
)
def test_a_container_without_a_second_vgpu_claim_is_accepted(
    containers: list[dict[str, Any]], driver: str, nic_too: bool
) -> None:
    pod = pod_of(*containers, claims=BOTH)
    assert judge(pod, {"second": second_on(pod, "vgpu-1", driver=driver, nic_too=nic_too)}) is None


def test_only_the_containers_of_this_claim_name_other_claims_to_look_up() -> None:
    pod = pod_of(
        o.container("main", o.ref("gpu"), o.ref("more"), o.ref("more", "r2")),
        o.container("side", o.ref("more"), o.ref("third")),
        claims={**BOTH, "third": "third-claim"},
    )
    uses = other_claims(vgpu_claim(pod), [PodView.from_dict(pod)])
    assert [(u.container.name, u.pod_claim, u.claim_name) for u in uses] == [("main", "more", "second")]


def test_a_claim_not_generated_yet_is_named_for_the_caller_and_never_judged() -> None:
    pod = pod_of(
        o.container("main", o.ref("gpu"), o.ref("more")),
        claims={"gpu": "gpu-claim"},
        templates={"more": None},
    )
    (use,) = other_claims(vgpu_claim(pod), [PodView.from_dict(pod)])
    assert use.claim_name is None
    assert judge(pod, {}) is None  # the DRA side refuses to judge before it exists (tests/unit/dra)


def test_a_pod_the_claim_is_not_reserved_for_is_not_looked_at() -> None:
    pod = pod_of(o.container("main", o.ref("gpu"), o.ref("more")), claims=BOTH)
    claim = vgpu_claim()  # reserved for no pod
    assert other_claims(claim, [PodView.from_dict(pod)]) == []


# --- NRI mode: a container's vGPU claims on the same GPU -------------------------------------------

SHARED = (
    "claim default/gpu-claim: container main of pod default/{pod} also uses vGPU claim default/second "
    "(pod claim more) on the same GPU {gpu} (vgpu-claims-share-a-gpu): a container gets one limit per "
    "GPU (the per-GPU env names are applied replace-by-name), so the later claim's limits would replace "
    "the earlier's; give the requests different GPUs (a CEL selector on "
    "device.attributes['manager.nvidia.com'].minor or .uuid) or use one request with the summed capacity"
)


def claim_on(
    *pods: dict[str, Any], devices: dict[str, str], name: str = "gpu-claim", uid: str = o.CLAIM_UID
) -> ClaimView:
    """A vGPU claim with one request per entry of `devices` (request -> device), reserved for `pods`."""
    return view(
        o.claim(
            name=name,
            uid=uid,
            requests=[o.exactly(r) for r in devices],
            results=[o.result(r, d) for r, d in devices.items()],
            reserved_for=o.reserved(*pods),
        )
    )


def second_on(
    pod: dict[str, Any], device: str, *, driver: str = o.DRIVER, nic_too: bool = False
) -> ClaimView:
    """`second`: request r2 on `device` of `driver`, and with `nic_too` a request `nic` of another driver."""
    requests, results = [o.exactly("r2")], [o.result("r2", device, driver=driver)]
    if nic_too:
        requests.append(o.exactly("nic", "nic-class"))
        results.append(o.result("nic", "eth0", driver=o.OTHER_DRIVER))
    return view(
        o.claim(
            name="second", uid=OTHER_UID, requests=requests, results=results, reserved_for=o.reserved(pod)
        )
    )


def share(
    claim: ClaimView, pods: list[dict[str, Any]], other: ClaimView, gpu_names: dict[str, str] | None = None
) -> PrepareRefusal | None:
    views = [PodView.from_dict(p) for p in pods]
    return claims_share_a_gpu(claim, other_claims(claim, views), {"second": other}, o.DRIVER, gpu_names)


def test_two_vgpu_claims_of_one_container_on_the_same_gpu_are_refused_naming_the_gpu() -> None:
    pod = pod_of(o.container("main", o.ref("gpu"), o.ref("more")), claims=BOTH)
    refused = share(claim_on(pod, devices={"r1": "vgpu-0"}), [pod], second_on(pod, "vgpu-0"))
    assert isinstance(refused, PrepareRefusal) and not isinstance(refused, NriOnlyUse)
    assert refused.reason is RefusalReason.CLAIMS_SHARE_A_GPU
    assert str(refused) == SHARED.format(pod="train", gpu="vgpu-0")
    named = share(
        claim_on(pod, devices={"r1": "vgpu-0"}),
        [pod],
        second_on(pod, "vgpu-0"),
        {"vgpu-0": "vgpu-0 (GPU-0a, host index 3)"},
    )
    assert str(named) == SHARED.format(pod="train", gpu="vgpu-0 (GPU-0a, host index 3)")


def test_a_claim_shared_by_two_pods_is_refused_for_the_pod_whose_container_also_uses_the_other() -> None:
    alone = o.pod("alone", o.POD1_UID, containers=[o.container("main", o.ref("gpu"))], claims=BOTH)
    both = o.pod(
        "both", o.POD2_UID, containers=[o.container("main", o.ref("gpu"), o.ref("more"))], claims=BOTH
    )
    refused = share(claim_on(alone, both, devices={"r1": "vgpu-0"}), [alone, both], second_on(both, "vgpu-0"))
    assert str(refused) == SHARED.format(pod="both", gpu="vgpu-0")


@pytest.mark.parametrize(
    ("containers", "mine", "theirs", "driver", "nic_too"),
    [
        ([o.container("main", o.ref("gpu"), o.ref("more"))], {"r1": "vgpu-0"}, "vgpu-1", o.DRIVER, False),
        (
            [o.container("main", o.ref("gpu")), o.container("side", o.ref("more"))],
            {"r1": "vgpu-0"},
            "vgpu-0",
            o.DRIVER,
            False,
        ),
        (
            [o.container("main", o.ref("gpu"), o.ref("more", "nic"))],
            {"r1": "vgpu-0"},
            "vgpu-0",
            o.DRIVER,
            True,
        ),
        (
            [o.container("main", o.ref("gpu"), o.ref("more"))],
            {"r1": "vgpu-0"},
            "vgpu-0",
            o.OTHER_DRIVER,
            False,
        ),
        (
            [o.container("main", o.ref("gpu", "r1"), o.ref("more")), o.container("side", o.ref("gpu", "r3"))],
            {"r1": "vgpu-1", "r3": "vgpu-0"},
            "vgpu-0",
            o.DRIVER,
            False,
        ),
    ],
    ids=[
        "different GPUs",
        "another container uses the other claim",
        "only the other claim's non-vGPU request",
        "the other claim is another driver's",
        "the container's request of this claim is on another GPU",
    ],
)
def test_vgpu_claims_of_one_container_not_on_one_gpu_are_accepted(
    containers: list[dict[str, Any]], mine: dict[str, str], theirs: str, driver: str, nic_too: bool
) -> None:
    pod = pod_of(*containers, claims=BOTH)
    assert (
        share(claim_on(pod, devices=mine), [pod], second_on(pod, theirs, driver=driver, nic_too=nic_too))
        is None
    )


def test_a_claim_shared_by_two_pods_whose_other_pod_uses_the_second_claim_elsewhere_is_accepted() -> None:
    alone = o.pod("alone", o.POD1_UID, containers=[o.container("main", o.ref("gpu"))], claims=BOTH)
    apart = o.pod(
        "apart",
        o.POD2_UID,
        containers=[o.container("main", o.ref("gpu")), o.container("side", o.ref("more"))],
        claims=BOTH,
    )
    claim = claim_on(alone, apart, devices={"r1": "vgpu-0"})
    assert share(claim, [alone, apart], second_on(apart, "vgpu-0")) is None


def test_a_claim_the_caller_did_not_look_up_is_not_judged() -> None:
    pod = pod_of(o.container("main", o.ref("gpu"), o.ref("more")), claims=BOTH)
    claim = claim_on(pod, devices={"r1": "vgpu-0"})
    uses = other_claims(claim, [PodView.from_dict(pod)])
    assert claims_share_a_gpu(claim, uses, {}, o.DRIVER) is None


# --- Prepare's one verdict, and the neighbours it is judged against ---------------------------------


def verdict(mode: Mode, neighbours: frozenset[str], theirs: str = "vgpu-0") -> PrepareRefusal | None:
    pod = pod_of(o.container("main", o.ref("gpu"), o.ref("more")), claims=BOTH)
    return use_refusal(
        claim_on(pod, devices={"r1": "vgpu-0"}),
        [PodView.from_dict(pod)],
        {"second": second_on(pod, theirs)},
        mode=mode,
        neighbours=neighbours,
        driver=o.DRIVER,
    )


def test_use_refusal_judges_by_the_nodes_mode() -> None:
    eager = verdict(Mode.EAGER, frozenset())
    assert isinstance(eager, NriOnlyUse) and eager.relaxation is Relaxation.MULTIPLE_CLAIMS_PER_CONTAINER
    assert verdict(Mode.EAGER, frozenset(), theirs="vgpu-1") is not None, "eager: whatever the GPU"
    lazy = verdict(Mode.LAZY, frozenset({"second"}))
    assert lazy is not None and lazy.reason is RefusalReason.CLAIMS_SHARE_A_GPU
    assert str(lazy) == SHARED.format(pod="train", gpu="vgpu-0")
    assert verdict(Mode.LAZY, frozenset({"second"}), theirs="vgpu-1") is None
    assert verdict(Mode.LAZY, frozenset()) is None, "NRI: only a neighbour is judged"


def test_the_neighbours_of_a_claim_are_the_namespaces_claims_on_its_gpus() -> None:
    """Prepared before (no view: to be read) and of the call (their view); another namespace, another
    GPU or another node's pool is no neighbour, nor the claim itself."""
    mine = claim_on(devices={"r1": "vgpu-0", "r3": "vgpu-1"})
    same_call = claim_on(devices={"r2": "vgpu-1"}, name="second", uid=OTHER_UID)
    prepared = [
        PreparedClaim("u-before", o.NAMESPACE, "before", ("vgpu-0",)),
        PreparedClaim("u-elsewhere", "other", "elsewhere", ("vgpu-0",)),
        PreparedClaim("u-apart", o.NAMESPACE, "apart", ("vgpu-2",)),
        PreparedClaim(o.CLAIM_UID, o.NAMESPACE, "gpu-claim", ("vgpu-0",)),
    ]
    on = gpu_claims([mine, same_call], prepared, "node-a")
    assert gpu_neighbours(mine, on, "node-a") == {"before": None, "second": same_call}
    assert gpu_neighbours(same_call, on, "node-a") == {"gpu-claim": mine}
    assert gpu_neighbours(mine, on, "node-b") == {}, "no device in that node's pool"


def test_a_neighbour_read_in_the_call_wins_over_its_prepared_entry() -> None:
    mine = claim_on(devices={"r1": "vgpu-0"})
    again = claim_on(devices={"r2": "vgpu-0"}, name="second", uid=OTHER_UID)
    on = gpu_claims([mine, again], [PreparedClaim("u-old", o.NAMESPACE, "second", ("vgpu-0",))], "node-a")
    assert gpu_neighbours(mine, on, "node-a") == {"second": again}
