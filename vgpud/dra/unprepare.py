"""Unprepare of claims: strip the register annotations, remove the claim's directory and CDI spec,
and drop its checkpoint entry, all under the node lock. Unknown or deleted claims succeed (the goal
is their absence)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from vgpud.dra.checkpoint import CheckpointError
from vgpud.dra.claimedits import PrepareError
from vgpud.dra.claimindex import ClaimRef
from vgpud.dra.context import DraContext, state_error
from vgpud.dra.nodelock import NodeLockTimeout
from vgpud.kube import KubeError
from vgpud.partition.assigner import Mode
from vgpud.partition.layout import LayoutError
from vgpud.recorder import Outcome

log = logging.getLogger("vgpud.dra")


async def unprepare(ctx: DraContext, claims: Sequence[ClaimRef]) -> dict[str, str]:
    """Claim UID -> "" or the error of that claim."""
    errors: dict[str, str] = {}
    for ref in claims:
        try:
            ctx.assigner.layout.claim_dir(ref.uid)
        except LayoutError as err:  # bad input: its own error, nothing touched
            errors[ref.uid] = ctx.failed(
                "Unprepare", ref, PrepareError(f"claim {ref.namespace}/{ref.name}: {err}")
            ).error
    claims = [ref for ref in claims if ref.uid not in errors]
    annotations = {ref.uid: await _current_annotations(ctx, ref) for ref in claims}
    try:
        async with ctx.node_lock():
            checkpoint = await ctx.load()
            for ref in claims:
                with ctx.timed("Unprepare", ref) as call:
                    await _strip_annotations(ctx, ref, annotations[ref.uid])
                    # gone for the NRI plugin first, then its files: a CreateContainer that holds the
                    # guard finishes its directory before, one that comes after sees no claim
                    async with ctx.index.guard(ref.uid):
                        ctx.index.forget(ref.uid)
                        problem = await ctx.try_remove_artifacts(ref)
                    if problem:  # the entry stays: the kubelet retries the Unprepare
                        errors[ref.uid] = call.detail = f"claim {ref.namespace}/{ref.name}: {problem}"
                        call.outcome = Outcome.ERROR
                        continue
                    checkpoint = checkpoint.without_claim(ref.uid)
                    errors[ref.uid] = ""
                    log.info(
                        "claim %s/%s (%s) unprepared",
                        ref.namespace,
                        ref.name,
                        ref.uid,
                        extra=ref.log_fields(),
                    )
            await ctx.save(checkpoint)
    except (NodeLockTimeout, CheckpointError) as err:
        for ref in claims:
            if errors.get(ref.uid):
                continue
            errors[ref.uid] = ctx.failed("Unprepare", ref, PrepareError(state_error(err))).error
    return errors


async def _current_annotations(ctx: DraContext, ref: ClaimRef) -> dict[str, str]:
    """The claim's annotations if it still exists with this UID and this mode writes any."""
    if (ctx.index.mode_of(ref.uid) or ctx.assigner.mode) is not Mode.EAGER or not ctx.facts.client_mode:
        return {}
    try:
        obj = await ctx.kube.get_resource_claim(ref.namespace, ref.name)
    except KubeError:
        return {}  # gone (or unreachable): nothing to strip that anyone will read
    meta = obj.get("metadata", {})
    return dict(meta.get("annotations") or {}) if meta.get("uid") == ref.uid else {}


async def _strip_annotations(ctx: DraContext, ref: ClaimRef, annotations: dict[str, str]) -> None:
    cleanup = ctx.assigner.unprepare(ref.uid, annotations)
    if not cleanup.annotations_to_remove:
        return
    try:
        await ctx.kube.patch_resource_claim_metadata(
            ref.namespace, ref.name, uid=ref.uid, annotations=dict.fromkeys(cleanup.annotations_to_remove)
        )
    except KubeError as err:  # the claim is going away; its annotations go with it
        log.info("claim %s/%s: register annotations not removed: %s", ref.namespace, ref.name, err)
