"""Prepare's lookups for the rules of `vgpud.partition.nrionly`: the other claims the containers of
a claim's reserved pods use, read through the API before the node lock. Eager mode reads every one
(`nri_only_refusal`); NRI mode only those that could share a GPU with the claim (`gpu_neighbours`,
`shared_gpu_refusal`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vgpud.dra.claimedits import PrepareError
from vgpud.dra.context import DraContext
from vgpud.dra.slices import device_name
from vgpud.kube import KubeError, NotFound
from vgpud.partition.model import ClaimView, ModelError, PodView, parse_claim
from vgpud.partition.nrionly import (
    NriOnlyUse,
    OtherClaim,
    PrepareRefusal,
    claims_share_a_gpu,
    multiple_claims,
    other_claims,
)


async def nri_only_refusal(ctx: DraContext, claim: ClaimView, pods: Sequence[PodView]) -> NriOnlyUse | None:
    """The refusal of a container that uses this vGPU claim and another vGPU claim, or None. Every
    other claim such a container references is read (none for the usual one-claim container); one
    that cannot be read, or is not allocated yet, is a PrepareError (the kubelet retries): the rule
    never accepts what it could not check."""
    uses = other_claims(claim, pods)
    others: dict[str, ClaimView] = {}
    for use in uses:
        if use.claim_name is None:
            raise PrepareError(
                f"{_who(claim, use)} uses pod claim {use.pod_claim}, whose ResourceClaim is not generated "
                "yet: cannot tell whether it is a vGPU claim"
            )
        if use.claim_name not in others:
            others[use.claim_name] = await _read_other(ctx, claim, use, use.claim_name)
    return multiple_claims(claim, uses, others, ctx.driver)


def gpu_neighbours(
    ctx: DraContext, claim: ClaimView, batch: Sequence[ClaimView]
) -> dict[str, ClaimView | None]:
    """NRI mode: the other vGPU claims of the claim's namespace with a device on one of its GPUs, by
    name: those of this NodePrepareResources call (their view, read already) and those prepared here
    before (None: to be read). Empty in the common case, and then no pod is read. The kubelet sends
    every unprepared claim of a pod in one call, so of two claims one container uses, the later one
    to arrive finds the other here, whichever order they come in."""
    node = ctx.facts.node_name
    mine = {d.device for d in claim.devices if d.pool == node}
    found: dict[str, ClaimView | None] = {}
    for uid, namespace in ctx.index.vgpu_claim_namespaces().items():
        ref = ctx.index.prepared_claim(uid)
        if ref is None or uid == claim.uid or namespace != claim.namespace:
            continue
        if mine & set(ctx.index.prepared_devices(uid)):
            found[ref.name] = None
    for other in batch:
        same = other.uid != claim.uid and other.namespace == claim.namespace
        if same and mine & {d.device for d in other.devices if d.pool == node}:
            found[other.name] = other
    return found


async def shared_gpu_refusal(
    ctx: DraContext, claim: ClaimView, pods: Sequence[PodView], neighbours: Mapping[str, ClaimView | None]
) -> PrepareRefusal | None:
    """NRI mode: the refusal of a container of the claim's reserved `pods` whose vGPU requests of it
    and of a neighbour (`gpu_neighbours`) it also uses are on the same GPU, or None. A neighbour
    prepared before is read again through the API (its allocation as the pod sees it); one that
    cannot be read is a PrepareError (the kubelet retries), never an accept."""
    uses = [use for use in other_claims(claim, pods) if use.claim_name in neighbours]
    others: dict[str, ClaimView] = {}
    for use in uses:
        assert use.claim_name is not None  # a neighbour has a name
        if use.claim_name not in others:
            known = neighbours[use.claim_name]
            if known is None:
                known = await _read_other(ctx, claim, use, use.claim_name)
            others[use.claim_name] = known
    names = {
        device_name(gpu): f"{device_name(gpu)} ({gpu.uuid}, host index {gpu.index})"
        for gpu in ctx.facts.gpus_by_minor.values()
    }
    return claims_share_a_gpu(claim, uses, others, ctx.driver, names)


def _who(claim: ClaimView, use: OtherClaim) -> str:
    return (
        f"claim {claim.namespace}/{claim.name}: container {use.container.name} of pod "
        f"{use.pod.namespace}/{use.pod.name}"
    )


async def _read_other(ctx: DraContext, claim: ClaimView, use: OtherClaim, name: str) -> ClaimView:
    where = f"{_who(claim, use)} also uses claim {claim.namespace}/{name}"
    try:
        obj = await ctx.kube.get_resource_claim(claim.namespace, name)
    except NotFound:
        raise PrepareError(f"{where}, which is not found: cannot tell whether it is a vGPU claim") from None
    except KubeError as err:
        raise PrepareError(f"{where}: API error: {err}") from None
    try:
        other = parse_claim(obj, ctx.driver)
    except ModelError as err:
        raise PrepareError(f"{where}: {err}") from None
    if not other.allocated:
        raise PrepareError(f"{where}, which is not allocated yet: cannot tell whether it is a vGPU claim")
    return other
