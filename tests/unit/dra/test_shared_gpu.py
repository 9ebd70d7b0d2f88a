"""NRI (lazy) mode: Prepare refuses a vGPU claim one container uses together with another vGPU claim
on the same GPU (one limit per GPU reaches the container), per claim, before any side effect, counted
under vgpu-claims-share-a-gpu; in either order (one NodePrepareResources call, or the other claim
prepared before); a lookup it cannot make is a retryable per-claim error, never an accept; and no pod
is read unless another claim of the namespace is on one of the claim's GPUs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests import objects as o
from tests.draharness import GPUS, REF, Harness
from vgpud.dra.claimindex import ClaimRef
from vgpud.kube import JsonObject, KubeError
from vgpud.kube.fake import FakeKube
from vgpud.partition.nrionly import RefusalReason

SECOND_UID = "9d8c7b6a-5f4e-4d3c-8b2a-190817263544"
SECOND = ClaimRef(o.NAMESPACE, SECOND_UID, "second")
SHARE = RefusalReason.CLAIMS_SHARE_A_GPU.value
GPU0 = f"vgpu-0 ({GPUS[0].uuid}, host index {GPUS[0].index})"
MESSAGE = (
    "claim default/{claim}: container main of pod default/train also uses vGPU claim default/{other} "
    "(pod claim {pod_claim}) on the same GPU " + GPU0 + " (vgpu-claims-share-a-gpu): a container gets one "
    "limit per GPU (the per-GPU env names are applied replace-by-name), so the later claim's limits "
    "would replace the earlier's; give the requests different GPUs (a CEL selector on "
    "device.attributes['manager.nvidia.com'].minor or .uuid) or use one request with the summed capacity"
)
FIRST_REFUSED = MESSAGE.format(claim="gpu-claim", other="second", pod_claim="more")
SECOND_REFUSED = MESSAGE.format(claim="second", other="gpu-claim", pod_claim="gpu")


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return Harness(tmp_path, lazy=True)


def pod_of(*containers: dict[str, Any], name: str = "train", namespace: str = o.NAMESPACE) -> dict[str, Any]:
    return o.pod(
        name,
        o.POD1_UID,
        containers=list(containers) or [o.container("main", o.ref("gpu"), o.ref("more"))],
        claims={"gpu": "gpu-claim", "more": "second"},
        namespace=namespace,
    )


def add_claims(
    h: Harness, pod: dict[str, Any], *, second_on: str = "vgpu-0", second_ns: str = o.NAMESPACE
) -> None:
    """gpu-claim (r1 on vgpu-0) and second (r2 on `second_on`, in `second_ns`), both reserved for `pod`."""
    h.kube.add_claim(
        o.claim(requests=[o.exactly("r1")], results=[o.result("r1")], reserved_for=o.reserved(pod))
    )
    h.kube.add_claim(
        o.claim(
            name="second",
            uid=SECOND_UID,
            requests=[o.exactly("r2")],
            results=[o.result("r2", second_on)],
            reserved_for=o.reserved(pod),
            namespace=second_ns,
        )
    )


def nothing_prepared(h: Harness, uid: str) -> bool:
    """No directory and no checkpoint entry (no checkpoint at all when the lock was never taken)."""
    written = (h.plugin_dir / "checkpoint.json").exists()
    return not h.claim_dir(uid).exists() and (not written or uid not in h.checkpoint())


async def test_two_claims_of_one_call_on_one_gpu_are_both_refused_and_counted(h: Harness) -> None:
    pod = pod_of()
    h.kube.add_pod(pod)
    add_claims(h, pod)
    out = await h.driver.prepare([REF, SECOND])
    assert out[o.CLAIM_UID].error == FIRST_REFUSED
    assert out[SECOND_UID].error == SECOND_REFUSED
    assert dict(h.driver.refusals) == {SHARE: 2}
    assert nothing_prepared(h, o.CLAIM_UID) and nothing_prepared(h, SECOND_UID)
    assert sorted(
        (c.claim_uid, str(c.outcome), c.detail) for c in h.recorder.recent(component="dra")
    ) == sorted([(o.CLAIM_UID, "error", FIRST_REFUSED), (SECOND_UID, "error", SECOND_REFUSED)])


@pytest.mark.parametrize("first", ["gpu-claim", "second"])
async def test_the_claim_prepared_second_is_refused_whichever_it_is(h: Harness, first: str) -> None:
    """The kubelet prepared one claim for an earlier pod, or before a restart: the one that comes later
    finds it prepared here, reads it through the API and is refused; the first stays prepared."""
    pod = pod_of()
    h.kube.add_pod(pod)
    add_claims(h, pod)
    earlier, later = (REF, SECOND) if first == "gpu-claim" else (SECOND, REF)
    assert (await h.driver.prepare([earlier]))[earlier.uid].error == ""
    reads = h.kube.calls["get_resource_claim"]
    out = await h.driver.prepare([later])
    assert out[later.uid].error == (FIRST_REFUSED if later is REF else SECOND_REFUSED)
    assert h.kube.calls["get_resource_claim"] - reads == 2, "the claim, then the prepared one again"
    assert dict(h.driver.refusals) == {SHARE: 1}
    assert nothing_prepared(h, later.uid)
    assert h.checkpoint()[earlier.uid]["checkpointState"] == "PrepareCompleted"


@pytest.mark.parametrize(
    ("second_on", "second_ns", "containers", "pod_reads"),
    [
        ("vgpu-1", o.NAMESPACE, [], 0),
        ("vgpu-0", "other", [], 0),
        ("vgpu-0", o.NAMESPACE, [o.container("main", o.ref("gpu")), o.container("side", o.ref("more"))], 2),
    ],
    ids=["different GPUs", "another namespace", "another container of the pod"],
)
async def test_claims_that_share_no_gpu_in_one_container_are_prepared(
    h: Harness, second_on: str, second_ns: str, containers: list[dict[str, Any]], pod_reads: int
) -> None:
    """Only a neighbour on the same GPU in the namespace makes Prepare read the pod (once per claim)."""
    pod = pod_of(*containers)
    h.kube.add_pod(pod)
    add_claims(h, pod, second_on=second_on, second_ns=second_ns)
    second = ClaimRef(second_ns, SECOND_UID, "second")
    out = await h.driver.prepare([REF, second])
    assert {uid: outcome.error for uid, outcome in out.items()} == {o.CLAIM_UID: "", SECOND_UID: ""}
    assert h.kube.calls["get_pod"] == pod_reads
    assert not h.driver.refusals


class FlakyClaims(FakeKube):
    """Fails the reads of the claim named `failing` (none while it is None) with an API error."""

    failing: str | None = None

    async def get_resource_claim(self, namespace: str, name: str) -> JsonObject:
        if name == self.failing:
            raise KubeError("etcdserver: request timed out")
        return await super().get_resource_claim(namespace, name)


@pytest.mark.parametrize(
    ("failing", "message"),
    [
        ("pod", "pod default/train: API error: etcdserver: request timed out"),
        (
            "claim",
            "claim default/gpu-claim: container main of pod default/train also uses claim default/second: "
            "API error: etcdserver: request timed out",
        ),
    ],
)
async def test_a_lookup_that_fails_is_a_per_claim_error_never_an_accept(
    tmp_path: Path, failing: str, message: str
) -> None:
    """`second` is prepared; the next Prepare of gpu-claim cannot read the pod, or `second` again."""
    h = Harness(tmp_path, lazy=True)
    h.kube = kube = FlakyClaims()
    kube.add_node({"metadata": {"name": "node-a"}})
    h.driver = h.new_driver()
    pod = pod_of()
    kube.add_pod(pod)
    add_claims(h, pod)
    assert (await h.driver.prepare([SECOND]))[SECOND_UID].error == ""
    if failing == "pod":
        kube.fail_next("get_pod", KubeError("etcdserver: request timed out"))
    else:
        kube.failing = "second"
    out = await h.driver.prepare([REF])
    assert out[o.CLAIM_UID].error == message
    assert not h.driver.refusals, "not a refusal: the kubelet retries"
    assert nothing_prepared(h, o.CLAIM_UID)


async def test_a_replay_makes_no_lookup_and_an_unprepare_meanwhile_is_an_error(tmp_path: Path) -> None:
    """The kubelet asks again for a prepared claim (after its restart): the recorded devices, with no
    read that could fail it; should the claim be unprepared before the lock, it was not checked, so
    it fails (the kubelet retries) rather than be prepared unchecked."""
    h = Harness(tmp_path, lazy=True)
    h.kube = kube = FlakyClaims()
    kube.add_node({"metadata": {"name": "node-a"}})
    h.driver = h.new_driver()
    pod = pod_of(o.container("main", o.ref("gpu")), o.container("side", o.ref("more")))
    kube.add_pod(pod)
    add_claims(h, pod)
    assert (await h.driver.prepare([SECOND]))[SECOND_UID].error == ""
    first = await h.driver.prepare([REF])
    assert first[o.CLAIM_UID].error == ""
    assert kube.calls["get_pod"] == 1, "a neighbour on vgpu-0: the pod was read"
    kube.failing = "second"
    kube.fail_next("get_pod", KubeError("etcdserver: request timed out"))
    again = await h.driver.prepare([REF])
    assert again[o.CLAIM_UID] == first[o.CLAIM_UID]
    assert kube.calls["get_pod"] == 1
    store = h.driver.ctx.store
    store.save(store.load().without_claim(o.CLAIM_UID))  # an Unprepare the index has not seen yet
    out = await h.driver.prepare([REF])
    assert out[o.CLAIM_UID].error == (
        "claim default/gpu-claim was unprepared while this Prepare ran, before its use was checked: try again"
    )
    assert not h.driver.refusals
