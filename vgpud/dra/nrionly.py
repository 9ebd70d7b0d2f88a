"""Prepare's lookups for the rules of `vgpud.partition.nrionly`: the other claims the containers of
a claim's reserved pods use, read through the API before the node lock. Eager mode reads every one
(`nri_only_refusal`); NRI mode only those that could share a GPU with the claim (`GpuNeighbours`,
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


class GpuNeighbours:
    """NRI mode: the vGPU claims on each GPU of this node, by namespace, built once per
    NodePrepareResources call: those of the call (their view, read already) and those prepared here
    before (None: to be read). The kubelet sends every unprepared claim of a pod in one call, so of
    two claims one container uses, the later one to arrive finds the other here, whichever order they
    come in."""

    def __init__(self, ctx: DraContext, batch: Sequence[ClaimView]) -> None:
        self._node = ctx.facts.node_name
        #: (namespace, device) -> claim UID -> (name, view or None)
        self._on: dict[tuple[str, str], dict[str, tuple[str, ClaimView | None]]] = {}
        for uid, namespace in ctx.index.vgpu_claim_namespaces().items():
            ref = ctx.index.prepared_claim(uid)
            if ref is None:
                continue
            for device in ctx.index.prepared_devices(uid):
                self._on.setdefault((namespace, device), {})[uid] = (ref.name, None)
        for claim in batch:
            for device in self._devices(claim):
                self._on.setdefault((claim.namespace, device), {})[claim.uid] = (claim.name, claim)

    def _devices(self, claim: ClaimView) -> set[str]:
        return {d.device for d in claim.devices if d.pool == self._node}

    def of(self, claim: ClaimView) -> dict[str, ClaimView | None]:
        """The other claims of the claim's namespace with a device on one of its GPUs, by name (a
        view read in this call, else None). Empty in the common case, and then no pod is read."""
        found: dict[str, ClaimView | None] = {}
        for device in sorted(self._devices(claim)):
            for uid, (name, view) in self._on.get((claim.namespace, device), {}).items():
                if uid != claim.uid and found.get(name) is None:
                    found[name] = view
        return found


async def shared_gpu_refusal(
    ctx: DraContext, claim: ClaimView, pods: Sequence[PodView], neighbours: Mapping[str, ClaimView | None]
) -> PrepareRefusal | None:
    """NRI mode: the refusal of a container of the claim's reserved `pods` whose vGPU requests of it
    and of a neighbour (`GpuNeighbours.of`) it also uses are on the same GPU, or None. A neighbour
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
