"""Prepare's reads, before the node lock (as the Go helper reads): every fact `vgpud.dra.decide` needs
of the API, read once per NodePrepareResources call into `ClaimFacts`.

Per claim: the claim (its UID must match and it must be allocated) and, in eager mode, its reserved
pods; then, unless the claim index has it prepared (a replay reads nothing more, so an API error
cannot fail it), the other claims the use rule judges it with (`vgpud.dra.nrionly`): eager, every
other claim its containers use; NRI, only when another vGPU claim of its namespace is on one of its
GPUs (`vgpud.partition.nrionly.gpu_neighbours`), its reserved pods and the neighbours they use. A read
that fails is the claim's `PrepareError`: the kubelet retries, and no rule ever accepts what could not
be read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vgpud.dra.claimedits import PrepareError
from vgpud.dra.claimindex import ClaimIndex, ClaimRef
from vgpud.dra.decide import ClaimFacts
from vgpud.dra.nrionly import neighbour_claims, used_claims
from vgpud.kube import KubeApi, KubeError, NotFound
from vgpud.partition.assigner import Mode
from vgpud.partition.model import ClaimView, ModelError, PodView, parse_claim, parse_pod
from vgpud.partition.nrionly import GpuClaims, PreparedClaim, gpu_claims, gpu_neighbours


@dataclass(frozen=True)
class Gathered:
    """A call's facts: the claims read, in request order, and those whose reads failed (the claim
    reads' failures first, then the lookups', each in request order)."""

    claims: tuple[ClaimFacts, ...]
    failures: tuple[tuple[ClaimRef, PrepareError], ...]


async def gather(
    kube: KubeApi, refs: Sequence[ClaimRef], *, mode: Mode, node: str, driver: str, index: ClaimIndex
) -> Gathered:
    """The facts of the claims `refs` names, for a node named `node` running in `mode`."""
    failures: list[tuple[ClaimRef, PrepareError]] = []
    read: list[tuple[ClaimRef, ClaimView, tuple[PodView, ...]]] = []
    for ref in refs:
        try:
            claim = await read_claim(kube, driver, ref)
            pods = tuple(await reserved_pods(kube, claim)) if mode is Mode.EAGER else ()
        except PrepareError as err:
            failures.append((ref, err))
            continue
        read.append((ref, claim, pods))
    on = gpu_claims([c for _, c, _ in read], prepared_claims(index), node) if mode is Mode.LAZY else None
    found = []
    for ref, claim, pods in read:
        if index.prepared_claim(ref.uid) is not None:  # a replay: no lookups, which could fail it
            found.append(ClaimFacts(ref, claim, pods, replay=True))
            continue
        try:
            found.append(await _lookups(kube, ref, claim, pods, driver=driver, node=node, on=on))
        except PrepareError as err:
            failures.append((ref, err))
    return Gathered(tuple(found), tuple(failures))


async def _lookups(
    kube: KubeApi,
    ref: ClaimRef,
    claim: ClaimView,
    pods: tuple[PodView, ...],
    *,
    driver: str,
    node: str,
    on: GpuClaims | None,
) -> ClaimFacts:
    """The claim's facts with the other claims its use rule needs (`on` given: NRI mode)."""
    if not claim.devices:
        return ClaimFacts(ref, claim, pods)
    if on is None:
        return ClaimFacts(ref, claim, pods, await used_claims(kube, driver, claim, pods))
    near = gpu_neighbours(claim, on, node)
    if not near:
        return ClaimFacts(ref, claim, pods)
    pods = tuple(await reserved_pods(kube, claim))
    others = await neighbour_claims(kube, driver, claim, pods, near)
    return ClaimFacts(ref, claim, pods, others, frozenset(near))


def prepared_claims(index: ClaimIndex) -> list[PreparedClaim]:
    """The vGPU claims prepared here, with their devices, as the index has them now."""
    found = []
    for uid, namespace in index.vgpu_claim_namespaces().items():
        ref = index.prepared_claim(uid)
        if ref is not None:
            found.append(PreparedClaim(uid, namespace, ref.name, index.prepared_devices(uid)))
    return found


async def read_claim(kube: KubeApi, driver: str, ref: ClaimRef) -> ClaimView:
    """The claim with the kubelet's UID, allocated; PrepareError."""
    if not (ref.namespace and ref.name and ref.uid):
        raise PrepareError(f"claim reference {ref} lacks a namespace, name or UID")
    try:
        obj = await kube.get_resource_claim(ref.namespace, ref.name)
    except NotFound:
        raise PrepareError(f"claim {ref.namespace}/{ref.name} not found") from None
    except KubeError as err:
        raise PrepareError(f"claim {ref.namespace}/{ref.name}: API error: {err}") from None
    uid = obj.get("metadata", {}).get("uid")
    if uid != ref.uid:
        raise PrepareError(
            f"claim {ref.namespace}/{ref.name} has UID {uid}, not {ref.uid} (it was deleted and re-created)"
        )
    try:
        claim = parse_claim(obj, driver)
    except ModelError as err:
        raise PrepareError(str(err)) from None
    if not claim.allocated:
        raise PrepareError(f"claim {ref.namespace}/{ref.name} is not allocated")
    return claim


async def reserved_pods(kube: KubeApi, claim: ClaimView) -> list[PodView]:
    """The pods the claim is reserved for that still exist with the reserved UID; PrepareError."""
    pods = []
    for reserved in claim.reserved_for:
        try:
            obj = await kube.get_pod(claim.namespace, reserved.name)
        except NotFound:
            continue
        except KubeError as err:
            raise PrepareError(f"pod {claim.namespace}/{reserved.name}: API error: {err}") from None
        try:
            pod = parse_pod(obj)
        except ModelError as err:
            raise PrepareError(str(err)) from None
        if pod.uid == reserved.uid:
            pods.append(pod)
    return pods
