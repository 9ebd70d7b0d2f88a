"""Prepare's lookups for the rules of `vgpud.partition.nrionly`: the other claims the containers of a
claim's reserved pods use, read through the API before the node lock. Eager mode reads every one
(`used_claims`); NRI mode only the neighbours on the claim's GPUs that were not read in this call
(`neighbour_claims`). Only reads: the rules judge in `vgpud.dra.decide`, from what these return."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vgpud.dra.claimedits import PrepareError
from vgpud.kube import KubeApi, KubeError, NotFound
from vgpud.partition.model import ClaimView, ModelError, PodView, parse_claim
from vgpud.partition.nrionly import OtherClaim, other_claims


async def used_claims(
    kube: KubeApi, driver: str, claim: ClaimView, pods: Sequence[PodView]
) -> dict[str, ClaimView]:
    """Eager: every other claim a container that uses this vGPU claim references, by name (none for
    the usual one-claim container). One that cannot be read, or is not allocated yet, is a
    PrepareError (the kubelet retries): the rule never accepts what it could not check."""
    others: dict[str, ClaimView] = {}
    for use in other_claims(claim, pods):
        if use.claim_name is None:
            raise PrepareError(
                f"{_who(claim, use)} uses pod claim {use.pod_claim}, whose ResourceClaim is not generated "
                "yet: cannot tell whether it is a vGPU claim"
            )
        if use.claim_name not in others:
            others[use.claim_name] = await _read_other(kube, driver, claim, use, use.claim_name)
    return others


async def neighbour_claims(
    kube: KubeApi,
    driver: str,
    claim: ClaimView,
    pods: Sequence[PodView],
    neighbours: Mapping[str, ClaimView | None],
) -> dict[str, ClaimView]:
    """NRI mode: the `neighbours` (`gpu_neighbours`) a container of the claim's reserved `pods` also
    uses, by name. A neighbour prepared before (None) is read again through the API (its allocation
    as the pod sees it); one that cannot be read is a PrepareError (the kubelet retries), never an
    accept."""
    others: dict[str, ClaimView] = {}
    for use in other_claims(claim, pods):
        if use.claim_name not in neighbours or use.claim_name in others:
            continue
        known = neighbours[use.claim_name]
        if known is None:
            known = await _read_other(kube, driver, claim, use, use.claim_name)
        others[use.claim_name] = known
    return others


def _who(claim: ClaimView, use: OtherClaim) -> str:
    return (
        f"claim {claim.namespace}/{claim.name}: container {use.container.name} of pod "
        f"{use.pod.namespace}/{use.pod.name}"
    )


async def _read_other(kube: KubeApi, driver: str, claim: ClaimView, use: OtherClaim, name: str) -> ClaimView:
    where = f"{_who(claim, use)} also uses claim {claim.namespace}/{name}"
    try:
        obj = await kube.get_resource_claim(claim.namespace, name)
    except NotFound:
        raise PrepareError(f"{where}, which is not found: cannot tell whether it is a vGPU claim") from None
    except KubeError as err:
        raise PrepareError(f"{where}: API error: {err}") from None
    try:
        other = parse_claim(obj, driver)
    except ModelError as err:
        raise PrepareError(f"{where}: {err}") from None
    if not other.allocated:
        raise PrepareError(f"{where}, which is not allocated yet: cannot tell whether it is a vGPU claim")
    return other
