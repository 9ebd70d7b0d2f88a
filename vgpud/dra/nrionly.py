"""An eager Prepare's lookups for the NRI-only rules (`vgpud.partition.nrionly`): the other claims
the containers of a claim's reserved pods use, read through the API before the node lock."""

from __future__ import annotations

from collections.abc import Sequence

from vgpud.dra.claimedits import PrepareError
from vgpud.dra.context import DraContext
from vgpud.kube import KubeError, NotFound
from vgpud.partition.model import ClaimView, ModelError, PodView, parse_claim
from vgpud.partition.nrionly import NriOnlyUse, OtherClaim, multiple_claims, other_claims


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
