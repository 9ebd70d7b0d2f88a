"""Prepare of vGPU claims (vgpu-manager-contracts.md "Prepare"), one pass per NodePrepareResources call:

1. gather (`vgpud.dra.gather`, before the node lock, as the Go helper reads): each claim from the API
   (its UID must match and it must be allocated) and every other fact its use rule needs, once;
2. decide (`vgpud.dra.decide`, pure, under the node lock with the checkpoint just loaded): per claim,
   a replay (PrepareCompleted: the recorded devices), a refusal before any side effect, or what to
   write (partitions, CDI spec, checkpoint entries);
3. apply (here and `vgpud.dra.materialize`): roll back an interrupted Prepare (PrepareStarted) first,
   record PrepareStarted, create the claim's directories, annotations and CDI spec, record
   PrepareCompleted. A failure after PrepareStarted rolls back at once, so a refused claim leaves
   nothing behind; a crash leaves PrepareStarted, which the next Prepare or the periodic cleanup
   rolls back.

Eager mode refuses a claim whose use needs NRI mode (`vgpud.partition.nrionly`: reserved for several
pods, or a container that also uses another vGPU claim); NRI mode refuses a container whose vGPU
claims have devices on the same GPU (one limit per GPU reaches it). Per claim, before any side
effect; each refusal is counted by its reason (`DraContext.refusals`) and told to the claim's
reserved pods (a VGPUClaimRefused Event). A claim prepared already replays, with none of these
lookups (an API error must not fail a replay).

Every per-claim failure is a message in that claim's reply entry, never a whole-call error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from vgpud.dra.checkpoint import Checkpoint, CheckpointError
from vgpud.dra.claimedits import NodeFacts, PrepareError
from vgpud.dra.claimindex import ClaimRef
from vgpud.dra.context import DraContext, PrepareOutcome, state_error
from vgpud.dra.decide import Decision, Refuse, Replay, Start, decide
from vgpud.dra.gather import gather, reserved_pods
from vgpud.dra.gather import read_claim as read_one_claim
from vgpud.dra.materialize import materialize
from vgpud.dra.nodelock import NodeLockTimeout
from vgpud.dra.slicebuild import device_name
from vgpud.kube import KubeError
from vgpud.partition.assigner import Mode, PartitionError
from vgpud.partition.model import ClaimView, PodView
from vgpud.partition.nrionly import PrepareRefusal
from vgpud.partition.pidsfile import PidsFileError
from vgpud.recorder import HookCall, Outcome, Recorder

log = logging.getLogger("vgpud.dra")

#: the failures a Prepare expects; anything else is logged with its traceback, and still only fails its claim
EXPECTED = (PrepareError, PartitionError, PidsFileError, OSError, KubeError, ValueError)
#: the detail of a Prepare answered from the checkpoint (a kubelet asks again after its restart, for
#: each new pod sandbox that uses a claim it prepared before)
REPLAYED = "already prepared: the recorded devices"


async def prepare(ctx: DraContext, claims: Sequence[ClaimRef]) -> dict[str, PrepareOutcome]:
    """Claim UID -> its devices or why it failed: gather, then decide and apply under the node lock
    (not taken when no claim could be read)."""
    outcomes: dict[str, PrepareOutcome] = {}
    mode, facts = ctx.assigner.mode, ctx.facts
    gathered = await gather(
        ctx.kube, claims, mode=mode, node=facts.node_name, driver=facts.driver, index=ctx.index
    )
    for ref, err in gathered.failures:
        outcomes[ref.uid] = ctx.failed("Prepare", ref, err)
    if not gathered.claims:
        return outcomes
    try:
        async with ctx.node_lock():
            checkpoint = await ctx.load()
            decisions = decide(gathered.claims, checkpoint, facts, ctx.assigner, gpu_names(facts))
            views = {claim.ref.uid: claim.claim for claim in gathered.claims}
            await _apply(ctx, decisions, checkpoint, outcomes, views)
    except (NodeLockTimeout, CheckpointError) as err:
        for ref in (claim.ref for claim in gathered.claims):
            if ref.uid not in outcomes:
                outcomes[ref.uid] = ctx.failed("Prepare", ref, PrepareError(state_error(err)))
    return outcomes


def gpu_names(facts: NodeFacts) -> dict[str, str]:
    """Device name -> how a refusal names the GPU (its UUID and host index too)."""
    return {
        device_name(gpu): f"{device_name(gpu)} ({gpu.uuid}, host index {gpu.index})"
        for gpu in facts.gpus_by_minor.values()
    }


async def _apply(
    ctx: DraContext,
    decisions: Sequence[Decision],
    checkpoint: Checkpoint,
    outcomes: dict[str, PrepareOutcome],
    views: Mapping[str, ClaimView],
) -> None:
    """Carry out the decisions, in request order. Two checkpoint writes per call, not per claim:
    every claim to prepare is marked PrepareStarted before any side effect, and the results are
    recorded together at the end. `views`: each claim as gathered, by UID (a refusal tells its pods)."""
    todo: list[Start] = []
    for decision in decisions:
        ref = decision.ref
        if isinstance(decision, Replay):
            with ctx.timed("Prepare", ref) as call:
                call.detail = REPLAYED
                outcomes[ref.uid] = PrepareOutcome(devices=decision.devices)
            log.info(
                "claim %s/%s (%s) %s", ref.namespace, ref.name, ref.uid, REPLAYED, extra=ref.log_fields()
            )
            continue
        if isinstance(decision, Refuse):
            outcomes[ref.uid] = ctx.failed("Prepare", ref, decision.error)
            if isinstance(decision.error, PrepareRefusal):
                ctx.refused(decision.error, views[ref.uid])
            continue
        if decision.rollback_first:
            log.warning(
                "claim %s/%s: rolling back an interrupted Prepare",
                ref.namespace,
                ref.name,
                extra=ref.log_fields(),
            )
            problem = await ctx.try_remove_artifacts(ref)
            if problem:  # the PrepareStarted entry stays: the next Prepare or the cleanup tries again
                outcomes[ref.uid] = ctx.failed(
                    "Prepare", ref, PrepareError(f"claim {ref.namespace}/{ref.name}: {problem}")
                )
                continue
        checkpoint = checkpoint.with_claim(ref.uid, decision.started)
        todo.append(decision)
    if not todo:
        return
    # A cancellation (the kubelet's deadline) from here on leaves PrepareStarted entries: the next
    # Prepare or the periodic cleanup rolls them back.
    checkpoint = await ctx.save(checkpoint)
    written = await materialize(ctx.kube, ctx.cdi_root, ctx.driver, todo, labels=ctx.facts.claim_labels)
    for start, (failure, seconds) in zip(todo, written, strict=True):
        ref = start.ref
        if failure is None:
            assert start.plan is not None
            checkpoint = checkpoint.with_claim(ref.uid, start.plan.completed)
            outcomes[ref.uid] = PrepareOutcome(devices=start.plan.devices)
            _record(ctx.recorder, ref, seconds)
            continue
        message = _failure_message(ref, failure)
        if isinstance(failure, PrepareRefusal):
            ctx.refused(failure, views[ref.uid])
        started = time.perf_counter()
        problem = await ctx.try_remove_artifacts(ref)
        if problem:  # PrepareStarted stays, so the next Prepare or the cleanup rolls back
            message = f"{message}; {problem}"
        else:
            checkpoint = checkpoint.without_claim(ref.uid)
        log.warning("%s", message, extra=ref.log_fields())
        outcomes[ref.uid] = PrepareOutcome(error=message)
        _record(ctx.recorder, ref, seconds + time.perf_counter() - started, message)
    try:
        await ctx.save(checkpoint)
    except CheckpointError as err:  # done but not recorded: PrepareStarted stays, so it is redone
        for start in todo:
            ref = start.ref
            if not outcomes[ref.uid].error:
                outcomes[ref.uid] = ctx.failed(
                    "Prepare", ref, PrepareError(f"claim {ref.namespace}/{ref.name}: {state_error(err)}")
                )


def _failure_message(ref: ClaimRef, failure: Exception) -> str:
    """The reply text of a claim that failed after PrepareStarted; anything unexpected is logged with
    its traceback."""
    if not isinstance(failure, EXPECTED):
        log.error(
            "claim %s/%s: unexpected Prepare failure",
            ref.namespace,
            ref.name,
            exc_info=(type(failure), failure, failure.__traceback__),
            extra=ref.log_fields(),
        )
    if isinstance(failure, PrepareRefusal):  # its message names the claim already
        return str(failure)
    return f"claim {ref.namespace}/{ref.name}: {failure}"


def _record(recorder: Recorder, ref: ClaimRef, seconds: float, error: str = "") -> None:
    """One claim's Prepare in the recorder, timed by its own side effects (the batch shares its hops)."""
    recorder.record(
        HookCall(
            component="dra",
            call="Prepare",
            claim_uid=ref.uid,
            pod_namespace=ref.namespace,
            outcome=Outcome.ERROR if error else Outcome.OK,
            detail=error,
            latency_seconds=seconds,
        )
    )


async def read_claim(ctx: DraContext, ref: ClaimRef) -> tuple[ClaimView, list[PodView]]:
    """The claim with the kubelet's UID, allocated, and (eager) its reserved pods; PrepareError. What
    `vgpud.dra.partitions` reads for the partitions in use."""
    claim = await read_one_claim(ctx.kube, ctx.driver, ref)
    pods = await reserved_pods(ctx.kube, claim) if ctx.assigner.mode is Mode.EAGER else []
    return claim, pods
