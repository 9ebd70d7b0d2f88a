"""Prepare of vGPU claims (vgpu-manager-contracts.md "Prepare").

Per claim: read the claim from the API (its UID must match and it must be allocated), then under the
node-wide lock: PrepareCompleted -> the recorded devices; refuse devices already prepared for another
claim; PrepareStarted -> roll back first; record PrepareStarted; create the claim's directories,
annotations and CDI spec; record PrepareCompleted. A failure after PrepareStarted rolls back at once,
so a refused claim leaves nothing behind; a crash leaves PrepareStarted, which the next Prepare or the
periodic cleanup rolls back.

Eager mode refuses a claim whose use needs NRI mode (`vgpud.partition.nrionly`: reserved for several
pods, or a container that also uses another vGPU claim); NRI mode refuses a container whose vGPU
claims have devices on the same GPU (one limit per GPU reaches it). Per claim, before any side
effect; each refusal is counted by its reason (`DraContext.refusals`). A claim prepared already
replays, with none of these lookups (an API error must not fail a replay).

Every per-claim failure is a message in that claim's reply entry, never a whole-call error.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import trio

from vgpud.dra.cdi import write_spec
from vgpud.dra.checkpoint import (
    Checkpoint,
    CheckpointError,
    ClaimEntry,
    PreparedDevice,
    PrepareState,
)
from vgpud.dra.claimedits import PrepareError, build_claim_spec, gpu_for
from vgpud.dra.claimindex import ClaimRef
from vgpud.dra.context import DraContext, PrepareOutcome, state_error
from vgpud.dra.nodelock import NodeLockTimeout
from vgpud.dra.nrionly import GpuNeighbours, nri_only_refusal, shared_gpu_refusal
from vgpud.fsutil import remove_tree
from vgpud.kube import KubeError, NotFound
from vgpud.partition.assigner import Mode, PartitionError, PrepareResult
from vgpud.partition.model import ClaimView, ModelError, PodView, parse_claim, parse_pod
from vgpud.partition.nrionly import PrepareRefusal
from vgpud.partition.pidsfile import PidsFileError, create_pids_file
from vgpud.recorder import HookCall, Outcome

log = logging.getLogger("vgpud.dra")

Fetched = tuple[ClaimRef, ClaimView, list[PodView]]
#: the failures a Prepare expects; anything else is logged with its traceback, and still only fails its claim
EXPECTED = (PrepareError, PartitionError, PidsFileError, OSError, KubeError, ValueError)
#: worker threads writing one call's files at once (their system calls release the GIL; more than two
#: gained nothing on a 2-core node), and the claims each hop carries
WRITE_THREADS, WRITE_CHUNK = 2, 8
#: the detail of a Prepare answered from the checkpoint (a kubelet asks again after its restart, for
#: each new pod sandbox that uses a claim it prepared before)
REPLAYED = "already prepared: the recorded devices"


async def prepare(ctx: DraContext, claims: Sequence[ClaimRef]) -> dict[str, PrepareOutcome]:
    outcomes: dict[str, PrepareOutcome] = {}
    read: list[Fetched] = []
    for ref in claims:  # API reads before the lock, as the Go helper does
        try:
            read.append((ref, *await read_claim(ctx, ref)))
        except PrepareError as err:
            outcomes[ref.uid] = ctx.failed("Prepare", ref, err)
    fetched: list[Fetched] = []
    #: claim UID -> why it fails unless it is prepared already (under the lock: a prepared claim replays)
    refusals: dict[str, PrepareRefusal | PrepareError] = {}
    neighbours = (
        GpuNeighbours(ctx, [claim for _, claim, _ in read]) if ctx.assigner.mode is Mode.LAZY else None
    )
    for ref, claim, pods in read:
        if ctx.index.prepared_claim(ref.uid) is not None:  # a replay: no lookups, which could fail it
            refusals[ref.uid] = PrepareError(
                f"claim {ref.namespace}/{ref.name} was unprepared while this Prepare ran, "
                "before its use was checked: try again"
            )
            fetched.append((ref, claim, pods))
            continue
        try:
            refused = await _refusal(ctx, claim, pods, neighbours)
        except PrepareError as err:
            outcomes[ref.uid] = ctx.failed("Prepare", ref, err)
            continue
        if refused is not None:
            refusals[ref.uid] = refused
        fetched.append((ref, claim, pods))
    if fetched:
        try:
            async with ctx.node_lock():
                await _prepare_locked(ctx, fetched, outcomes, refusals)
        except (NodeLockTimeout, CheckpointError) as err:
            for ref, _, _ in fetched:
                if ref.uid not in outcomes:
                    outcomes[ref.uid] = ctx.failed("Prepare", ref, PrepareError(state_error(err)))
    return outcomes


async def _refusal(
    ctx: DraContext, claim: ClaimView, pods: list[PodView], neighbours: GpuNeighbours | None
) -> PrepareRefusal | None:
    """Why this node refuses a vGPU claim's use, or None; a lookup that fails is a PrepareError. Eager:
    the uses that need NRI mode. NRI (`neighbours` given): a container whose vGPU claims share a GPU,
    judged (reading the reserved pods) only when another claim of the call or a prepared one of the
    namespace is on one of its GPUs."""
    if not claim.devices:
        return None
    if neighbours is None:
        return await nri_only_refusal(ctx, claim, pods)
    near = neighbours.of(claim)
    if not near:
        return None
    return await shared_gpu_refusal(ctx, claim, await _reserved_pods(ctx, claim), near)


async def _prepare_locked(
    ctx: DraContext,
    fetched: list[Fetched],
    outcomes: dict[str, PrepareOutcome],
    refusals: dict[str, PrepareRefusal | PrepareError],
) -> None:
    """Two checkpoint writes per call, not per claim: every claim to prepare is marked
    PrepareStarted before any side effect, and the results are recorded together at the end. A claim
    in `refusals` that is not prepared already is refused before any side effect."""
    checkpoint = await ctx.load()
    # the batch's own PrepareStarted entries below prepare no devices, so this stays true for the loop
    prepared = _prepared_index(checkpoint)
    todo = []
    for ref, claim, pods in fetched:
        entry = checkpoint.claims.get(ref.uid)
        if entry is not None and entry.state is PrepareState.COMPLETED:
            with ctx.timed("Prepare", ref) as call:
                call.detail = REPLAYED
                outcomes[ref.uid] = PrepareOutcome(devices=entry.prepared_devices)
            log.info("claim %s/%s (%s) %s", ref.namespace, ref.name, ref.uid, REPLAYED)
            continue
        try:
            if ref.uid in refusals:
                raise refusals[ref.uid]
            _check_devices(ctx, claim, prepared)
        except (PrepareError, PrepareRefusal) as err:
            outcomes[ref.uid] = ctx.failed("Prepare", ref, err)
            continue
        if entry is not None:
            log.warning("claim %s/%s: rolling back an interrupted Prepare", ref.namespace, ref.name)
            problem = await ctx.try_remove_artifacts(ref)
            if problem:  # the PrepareStarted entry stays: the next Prepare or the cleanup tries again
                outcomes[ref.uid] = ctx.failed(
                    "Prepare", ref, PrepareError(f"claim {ref.namespace}/{ref.name}: {problem}")
                )
                continue
        started = ClaimEntry(
            state=PrepareState.STARTED,
            name=claim.name,
            namespace=claim.namespace,
            vgpu=bool(claim.devices),
            mode=ctx.assigner.mode.value,
        )
        checkpoint = checkpoint.with_claim(ref.uid, started)
        todo.append((ref, claim, pods))
    if not todo:
        return
    # A cancellation (the kubelet's deadline) from here on leaves PrepareStarted entries: the next
    # Prepare or the periodic cleanup rolls them back.
    checkpoint = await ctx.save(checkpoint)
    for (ref, _, _), (planned, failure, seconds) in zip(todo, await _materialize_all(ctx, todo), strict=True):
        if failure is None:
            assert planned is not None
            checkpoint = checkpoint.with_claim(ref.uid, planned)
            outcomes[ref.uid] = PrepareOutcome(devices=planned.prepared_devices)
            _record(ctx, ref, seconds)
            continue
        message = _failure_message(ctx, ref, failure)
        started = time.perf_counter()
        problem = await ctx.try_remove_artifacts(ref)
        if problem:  # PrepareStarted stays, so the next Prepare or the cleanup rolls back
            message = f"{message}; {problem}"
        else:
            checkpoint = checkpoint.without_claim(ref.uid)
        log.warning("%s", message)
        outcomes[ref.uid] = PrepareOutcome(error=message)
        _record(ctx, ref, seconds + time.perf_counter() - started, message)
    try:
        await ctx.save(checkpoint)
    except CheckpointError as err:  # done but not recorded: PrepareStarted stays, so it is redone
        for ref, _, _ in todo:
            if not outcomes[ref.uid].error:
                outcomes[ref.uid] = ctx.failed(
                    "Prepare", ref, PrepareError(f"claim {ref.namespace}/{ref.name}: {state_error(err)}")
                )


def _failure_message(ctx: DraContext, ref: ClaimRef, failure: Exception) -> str:
    """The reply text of a claim that failed after PrepareStarted; a refusal is counted, anything
    unexpected logged with its traceback."""
    if not isinstance(failure, EXPECTED):
        log.error(
            "claim %s/%s: unexpected Prepare failure",
            ref.namespace,
            ref.name,
            exc_info=(type(failure), failure, failure.__traceback__),
        )
    if isinstance(failure, PrepareRefusal):  # its message names the claim already
        ctx.count_refusal(failure)
        return str(failure)
    return f"claim {ref.namespace}/{ref.name}: {failure}"


#: one claim's completed checkpoint entry or what failed it (then the entry is None), and the seconds
#: its own side effects took
Materialized = tuple[ClaimEntry | None, Exception | None, float]


@dataclass
class _Plan:
    """One claim's side effects, computed on the event loop, written in the batch's worker thread."""

    claim: ClaimView
    result: PrepareResult
    spec: dict
    devices: tuple[PreparedDevice, ...]
    failure: Exception | None = None
    seconds: float = 0.0


async def _materialize_all(ctx: DraContext, todo: list[Fetched]) -> list[Materialized]:
    """The side effects of the batch's Prepares, in request order: each claim's directories and CDI
    spec, then its claim annotations through the API (eager client mode only). The files of every
    WRITE_CHUNK claims go to a worker thread as soon as their plans are computed, at most
    WRITE_THREADS at once, so the file system works while the event loop computes the next plans."""
    plans: list[_Plan | tuple[Exception, float]] = []
    limiter = trio.CapacityLimiter(WRITE_THREADS)
    async with trio.open_nursery() as nursery:
        chunk: list[_Plan] = []
        for i, (_, claim, pods) in enumerate(todo, 1):
            started = time.perf_counter()
            try:
                result = ctx.assigner.prepare(claim, pods)
                spec, devices = build_claim_spec(ctx.facts, claim, result)
            except Exception as err:  # whatever it is, it is this claim's error
                plans.append((err, time.perf_counter() - started))
            else:
                plan = _Plan(claim, result, spec, devices, seconds=time.perf_counter() - started)
                plans.append(plan)
                chunk.append(plan)
            if chunk and (len(chunk) == WRITE_CHUNK or i == len(todo)):
                write = partial(trio.to_thread.run_sync, _write_files, ctx.cdi_root, ctx.driver, chunk)
                nursery.start_soon(partial(write, limiter=limiter))
                chunk = []
                await trio.lowlevel.checkpoint()  # hand it to its thread now, not after the loop
    done: list[Materialized] = []
    for plan in plans:
        if not isinstance(plan, _Plan):
            done.append((None, *plan))
            continue
        if plan.failure is None and plan.result.annotations:
            claim = plan.claim
            started = time.perf_counter()
            try:
                await ctx.kube.patch_resource_claim_annotations(
                    claim.namespace, claim.name, dict(plan.result.annotations), uid=claim.uid
                )
            except Exception as err:  # whatever it is, it is this claim's error
                plan.failure = err
            plan.seconds += time.perf_counter() - started
        entry = _completed(ctx, plan) if plan.failure is None else None
        done.append((entry, plan.failure, plan.seconds))
    return done


def _write_files(cdi_root: Path, driver: str, plans: list[_Plan]) -> None:
    """Each plan's directories, then its CDI spec; a failure is recorded on its plan (blocking)."""
    for plan in plans:
        started = time.perf_counter()
        try:
            _create_directories(plan.result)
            write_spec(cdi_root, driver, plan.claim.uid, plan.spec)
        except Exception as err:  # whatever it is, it is this claim's error
            plan.failure = err
        plan.seconds += time.perf_counter() - started


def _record(ctx: DraContext, ref: ClaimRef, seconds: float, error: str = "") -> None:
    """One claim's Prepare in the recorder, timed by its own side effects (the batch shares its hops)."""
    ctx.recorder.record(
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


def _completed(ctx: DraContext, plan: _Plan) -> ClaimEntry:
    claim, devices = plan.claim, plan.devices
    log.info(
        "claim %s/%s (%s) prepared: %s",
        claim.namespace,
        claim.name,
        claim.uid,
        ", ".join(f"{d.device}/{d.share_id or '-'}" for d in devices) or "no vGPU devices",
    )
    return ClaimEntry(
        state=PrepareState.COMPLETED,
        name=claim.name,
        namespace=claim.namespace,
        prepared_devices=devices,
        partition=plan.result.record.to_dict(),
        vgpu=bool(devices),
        status={
            "reservedFor": [{"resource": "pods", "name": r.name, "uid": r.uid} for r in claim.reserved_for]
        },
        mode=ctx.assigner.mode.value,
    )


async def read_claim(ctx: DraContext, ref: ClaimRef) -> tuple[ClaimView, list[PodView]]:
    """The claim with the kubelet's UID, allocated, and (eager) its reserved pods; PrepareError."""
    if not (ref.namespace and ref.name and ref.uid):
        raise PrepareError(f"claim reference {ref} lacks a namespace, name or UID")
    try:
        obj = await ctx.kube.get_resource_claim(ref.namespace, ref.name)
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
        claim = parse_claim(obj, ctx.driver)
    except ModelError as err:
        raise PrepareError(str(err)) from None
    if not claim.allocated:
        raise PrepareError(f"claim {ref.namespace}/{ref.name} is not allocated")
    pods = await _reserved_pods(ctx, claim) if ctx.assigner.mode is Mode.EAGER else []
    return claim, pods


async def _reserved_pods(ctx: DraContext, claim: ClaimView) -> list[PodView]:
    """The pods the claim is reserved for that still exist with the reserved UID (eager only)."""
    pods = []
    for reserved in claim.reserved_for:
        try:
            obj = await ctx.kube.get_pod(claim.namespace, reserved.name)
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


#: (device, pool, share id) -> the checkpoint's claims that have it prepared, in checkpoint order
PreparedIndex = dict[tuple[str, str, str | None], list[tuple[str, ClaimEntry]]]


def _prepared_index(checkpoint: Checkpoint) -> PreparedIndex:
    """Built once per call, so checking a batch is not claims x prepared claims."""
    index: PreparedIndex = {}
    for uid, other in checkpoint.claims.items():
        for prepared in other.prepared_devices:
            index.setdefault((prepared.device, prepared.pool, prepared.share_id), []).append((uid, other))
    return index


def _check_devices(ctx: DraContext, claim: ClaimView, prepared: PreparedIndex) -> None:
    """Every result is a GPU of this node and not already prepared for another claim."""
    for device in claim.devices:
        if device.admin_access:
            raise PrepareError(
                f"claim {claim.namespace}/{claim.name}: adminAccess is not supported "
                f"for vGPU device {device.device}"
            )
        gpu_for(ctx.facts, device)
        for uid, other in prepared.get((device.device, device.pool, device.share_id), ()):
            if uid != claim.uid:
                raise PrepareError(
                    f"device {device.device} (share {device.share_id or '-'}) is already prepared "
                    f"for claim {other.namespace}/{other.name} ({uid})"
                )


def _create_directories(result: PrepareResult) -> None:
    """A fresh claim dir, then each partition dir with an empty pids.config (blocking). Everything
    below the claim dir is new, so each directory is one mkdir on its string (no `parents=True`
    walk, no exist check) and each pids.config one exclusive create."""
    claim_dir = str(result.claim_dir)
    remove_tree(Path(claim_dir))
    try:
        os.mkdir(claim_dir, 0o755)
    except FileNotFoundError:  # the claims dir itself is missing (a first Prepare)
        Path(claim_dir).mkdir(parents=True, mode=0o755)
    made = {claim_dir}
    for paths in result.partition_dirs:
        for directory in map(str, paths.directories):
            _make_below(directory, made)
        create_pids_file(str(paths.config))


def _make_below(directory: str, made: set[str]) -> None:
    """mkdir `directory` and any of its parents not in `made` (directories this call made under a
    fresh claim dir); `made` gains them."""
    if directory in made:
        return
    parent = os.path.dirname(directory)
    if parent == directory:
        raise OSError(errno.EINVAL, f"{directory} is not below the claim directory")
    if parent not in made:
        _make_below(parent, made)
    os.mkdir(directory, 0o755)
    made.add(directory)
