"""An eager Prepare refuses a claim whose use needs NRI mode (issue 22, defence in depth): per claim,
before any side effect, with a message that names the claim, the pod, the container, the reason and
the fix, counted by reason; a lookup it cannot make is a retryable per-claim error, never an accept.
NRI (lazy) mode refuses neither."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests import objects as o
from tests.draharness import REF, Harness
from tests.events import recording
from vgpud.dra.claimindex import ClaimRef
from vgpud.dra.prepare import REPLAYED
from vgpud.kube import JsonObject, KubeError
from vgpud.kube.fake import FakeKube
from vgpud.relaxations import Relaxation

FIX = "needs a node in NRI mode: select devices with device.attributes['manager.nvidia.com'].nriMode == true"
UNSURE = "cannot tell whether it is a vGPU claim"
SECOND_UID = "9d8c7b6a-5f4e-4d3c-8b2a-190817263544"
SECOND = ClaimRef(o.NAMESPACE, SECOND_UID, "second")
ACROSS, MULTIPLE = Relaxation.CLAIM_ACROSS_PODS.value, Relaxation.MULTIPLE_CLAIMS_PER_CONTAINER.value


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return Harness(tmp_path)


def nothing_prepared(h: Harness, *uids: str) -> bool:
    """No directory, and no checkpoint entry (no checkpoint at all when the lock was never taken)."""
    written = (h.plugin_dir / "checkpoint.json").exists()
    return not any(h.claim_dir(uid).exists() for uid in uids) and (not written or h.checkpoint() == {})


def two_claim_pod(**kwargs: Any) -> dict[str, Any]:
    claims = kwargs.pop("claims", {"gpu": "gpu-claim", "more": "second"})
    return o.pod(
        "train",
        o.POD1_UID,
        containers=[o.container("main", o.ref("gpu"), o.ref("more"))],
        claims=claims,
        **kwargs,
    )


def second_claim(pod: dict[str, Any], *, driver: str = o.DRIVER, allocated: bool = True) -> dict[str, Any]:
    claim = o.claim(
        name="second",
        uid=SECOND_UID,
        requests=[o.exactly("r2")],
        results=[o.result("r2", "vgpu-1", driver=driver)],
        reserved_for=o.reserved(pod),
    )
    if not allocated:
        del claim["status"]["allocation"]
    return claim


def first_claim(*pods: dict[str, Any]) -> dict[str, Any]:
    return o.claim(requests=[o.exactly("r1")], results=[o.result("r1")], reserved_for=o.reserved(*pods))


def setup(h: Harness, pod: dict[str, Any], *, second: dict[str, Any] | None = None) -> None:
    h.kube.add_pod(pod)
    h.kube.add_claim(first_claim(pod))
    if second is not None:
        h.kube.add_claim(second)


MULTIPLE_MESSAGE = (
    "claim default/{claim}: container main of pod default/train also uses vGPU claim default/{other} "
    "(pod claim {pod_claim}): several vGPU claims in one container (multiple-vgpu-claims-per-container) "
    + FIX
    + " (on an eager node their partitions would mount at the same paths)"
)


async def test_two_vgpu_claims_in_one_container_are_both_refused_and_counted(h: Harness) -> None:
    pod = two_claim_pod()
    setup(h, pod, second=second_claim(pod))
    out = await h.driver.prepare([REF, SECOND])
    assert out[o.CLAIM_UID].error == MULTIPLE_MESSAGE.format(
        claim="gpu-claim", other="second", pod_claim="more"
    )
    assert out[SECOND_UID].error == MULTIPLE_MESSAGE.format(
        claim="second", other="gpu-claim", pod_claim="gpu"
    )
    assert dict(h.driver.refusals) == {MULTIPLE: 2}
    assert nothing_prepared(h, o.CLAIM_UID, SECOND_UID)
    calls = h.recorder.recent(component="dra")
    assert sorted((c.claim_uid, str(c.outcome)) for c in calls) == [
        (o.CLAIM_UID, "error"),
        (SECOND_UID, "error"),
    ]
    assert {c.detail for c in calls} == {out[o.CLAIM_UID].error, out[SECOND_UID].error}


async def test_a_template_claim_is_looked_up_through_the_pod_status(h: Harness) -> None:
    pod = two_claim_pod(claims={"gpu": "gpu-claim"}, templates={"more": "second"})
    setup(h, pod, second=second_claim(pod))
    out = await h.driver.prepare([REF])
    assert "also uses vGPU claim default/second (pod claim more)" in out[o.CLAIM_UID].error
    assert dict(h.driver.refusals) == {MULTIPLE: 1}


async def test_a_claim_reserved_for_two_pods_is_refused_and_counted(h: Harness) -> None:
    pods = [
        o.pod(f"p{i}", uid, containers=[o.container("main", o.ref("gpu"))])
        for i, uid in enumerate((o.POD1_UID, o.POD2_UID))
    ]
    for pod in pods:
        h.kube.add_pod(pod)
    h.kube.add_claim(first_claim(*pods))
    out = await h.driver.prepare([REF])
    assert out[o.CLAIM_UID].error == (
        "claim default/gpu-claim is reserved for 2 pods (default/p0, default/p1) (containers p1/main, "
        "p0/main use it): a vGPU claim used across pods (vgpu-claim-across-pods) "
        + FIX
        + " (an eager node's partitions cannot span pods safely)"
    )
    assert dict(h.driver.refusals) == {ACROSS: 1}
    assert nothing_prepared(h, o.CLAIM_UID)


async def test_each_reserved_pod_is_told_why_its_claim_was_refused(tmp_path: Path) -> None:
    """The kubelet's own Event says only that Prepare failed; vgpud's says why, on every pod the
    claim is reserved for, and a retried Prepare counts on the same Event."""
    pods = [
        o.pod(f"p{i}", uid, containers=[o.container("main", o.ref("gpu"))])
        for i, uid in enumerate((o.POD1_UID, o.POD2_UID))
    ]
    async with recording() as record:
        h = Harness(tmp_path, events=record.recorder)
        for pod in pods:
            h.kube.add_pod(pod)
        h.kube.add_claim(first_claim(*pods))
        for _ in range(2):  # the kubelet retries
            out = await h.driver.prepare([REF])
        events = await record.events(o.NAMESPACE)
    told = {(e["involvedObject"]["name"], e["involvedObject"]["uid"]): e for e in events}
    assert sorted(told) == [("p0", o.POD1_UID), ("p1", o.POD2_UID)]
    for event in told.values():
        assert (event["type"], event["reason"], event["count"]) == ("Warning", "VGPUClaimRefused", 2)
        assert event["message"] == out[o.CLAIM_UID].error
    assert dict(h.driver.refusals) == {ACROSS: 2}


async def test_another_drivers_claim_in_the_container_is_accepted(h: Harness) -> None:
    pod = two_claim_pod()
    setup(h, pod, second=second_claim(pod, driver=o.OTHER_DRIVER))
    out = await h.driver.prepare([REF])
    assert out[o.CLAIM_UID].error == ""
    assert not h.driver.refusals


class FlakyClaims(FakeKube):
    """Fails the reads of one claim (by name) with an API error."""

    def __init__(self, failing: str) -> None:
        super().__init__()
        self.failing = failing

    async def get_resource_claim(self, namespace: str, name: str) -> JsonObject:
        if name == self.failing:
            raise KubeError("etcdserver: request timed out")
        return await super().get_resource_claim(namespace, name)


@pytest.mark.parametrize(
    ("case", "fragment"),
    [
        (
            "missing",
            "also uses claim default/second, which is not found: " + UNSURE,
        ),
        (
            "unallocated",
            "also uses claim default/second, which is not allocated yet: " + UNSURE,
        ),
        (
            "not generated",
            "uses pod claim more, whose ResourceClaim is not generated yet: " + UNSURE,
        ),
        ("api error", "also uses claim default/second: API error: etcdserver: request timed out"),
    ],
)
async def test_a_lookup_that_fails_is_a_per_claim_error_never_an_accept(
    tmp_path: Path, case: str, fragment: str
) -> None:
    h = Harness(tmp_path)
    if case == "api error":
        h.kube = FlakyClaims("second")
        h.kube.add_node({"metadata": {"name": "node-a"}})
        h.driver = h.new_driver()
    pod = two_claim_pod(
        **({"claims": {"gpu": "gpu-claim"}, "templates": {"more": None}} if case == "not generated" else {})
    )
    second = (
        None if case in ("missing", "not generated") else second_claim(pod, allocated=case != "unallocated")
    )
    setup(h, pod, second=second)
    out = await h.driver.prepare([REF])
    assert (
        out[o.CLAIM_UID].error == f"claim default/gpu-claim: container main of pod default/train {fragment}"
    )
    assert not h.driver.refusals, "not a refusal: the kubelet retries"
    assert nothing_prepared(h, o.CLAIM_UID)


async def test_lazy_mode_refuses_neither(tmp_path: Path) -> None:
    h = Harness(tmp_path, lazy=True)
    pod = two_claim_pod()
    other = o.pod("p2", o.POD2_UID, containers=[o.container("main", o.ref("gpu"))])
    h.kube.add_pod(pod)
    h.kube.add_pod(other)
    h.kube.add_claim(first_claim(pod, other))  # across pods too
    h.kube.add_claim(second_claim(pod))
    out = await h.driver.prepare([REF, SECOND])
    assert {uid: outcome.error for uid, outcome in out.items()} == {o.CLAIM_UID: "", SECOND_UID: ""}
    assert not h.driver.refusals


async def test_a_claim_prepared_already_replays(h: Harness) -> None:
    """The kubelet asks again after its restart: a prepared claim keeps its devices, even when a pod
    that joined it since would be refused."""
    pod = o.pod("train", o.POD1_UID, containers=[o.container("main", o.ref("gpu"))])
    setup(h, pod)
    first = await h.driver.prepare([REF])
    assert first[o.CLAIM_UID].error == ""
    h.kube.remove_pod(o.NAMESPACE, "train")
    pod = two_claim_pod()
    h.kube.add_pod(pod)
    h.kube.add_claim(second_claim(pod))
    again = await h.driver.prepare([REF])
    assert again[o.CLAIM_UID] == first[o.CLAIM_UID]
    assert h.recorder.recent(component="dra")[-1].detail == REPLAYED
    assert not h.driver.refusals
