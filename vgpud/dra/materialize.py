"""The side effects of a Prepare's plans (`vgpud.dra.decide.Plan`), written after PrepareStarted is
recorded: each claim's directories and CDI spec, then one metadata patch of the claim through the
API: its register annotations (eager client mode) and the node label its claim cache selects
(`vgpud.dra.claimlabel`; wherever a claim cache runs).

The files of every WRITE_CHUNK claims go to one worker thread, at most WRITE_THREADS at once (their
system calls release the GIL; more than two gained nothing on a 2-core node); the patches go out
together, at most PATCHES_AT_ONCE in flight. A failure is its own claim's, whatever it is.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import trio

from vgpud.dra.cdi import write_spec
from vgpud.dra.decide import Plan, Start
from vgpud.fsutil import remove_tree
from vgpud.kube import KubeApi
from vgpud.logs import fields
from vgpud.partition.assigner import PrepareResult
from vgpud.partition.pidsfile import create_pids_file

log = logging.getLogger("vgpud.dra")

#: worker threads writing one call's files at once, and the claims each hop carries
WRITE_THREADS, WRITE_CHUNK = 2, 8
#: claim patches of one call in flight at once (the API client's own connection pool holds 8)
PATCHES_AT_ONCE = 8

#: what failed a claim (None: its plan is written and recorded as done), and the seconds its own side
#: effects took
Written = tuple[Exception | None, float]


@dataclass
class _Write:
    """One plan on its way to the disk and the API (the worker thread records its failure)."""

    plan: Plan
    failure: Exception | None = None
    seconds: float = 0.0


async def materialize(
    kube: KubeApi,
    cdi_root: Path,
    driver: str,
    todo: Sequence[Start],
    *,
    labels: Mapping[str, str] | None = None,
) -> list[Written]:
    """Write each started claim's plan, in request order; a claim without a plan keeps its failure.
    `labels`: what each prepared claim is labelled with (None or empty: nothing)."""
    writes = [_Write(start.plan) for start in todo if start.plan is not None]
    limiter = trio.CapacityLimiter(WRITE_THREADS)
    async with trio.open_nursery() as nursery:
        for first in range(0, len(writes), WRITE_CHUNK):
            chunk = writes[first : first + WRITE_CHUNK]
            write = partial(trio.to_thread.run_sync, _write_files, cdi_root, driver, chunk)
            nursery.start_soon(partial(write, limiter=limiter))
    patches = trio.CapacityLimiter(PATCHES_AT_ONCE)
    async with trio.open_nursery() as nursery:
        for each in writes:
            if each.failure is None and (each.plan.result.annotations or labels):
                nursery.start_soon(_patch, kube, each, labels or {}, patches)
    written = iter(writes)
    done: list[Written] = []
    for start in todo:
        if start.plan is None:
            done.append((start.failure, 0.0))
            continue
        each = next(written)
        if each.failure is None:
            _log_prepared(each.plan)
        done.append((each.failure, each.seconds))
    return done


async def _patch(
    kube: KubeApi, each: _Write, labels: Mapping[str, str], limiter: trio.CapacityLimiter
) -> None:
    """The claim's annotations and labels in one patch; its failure is the claim's."""
    claim = each.plan.claim
    async with limiter:
        started = time.perf_counter()
        try:
            await kube.patch_resource_claim_metadata(
                claim.namespace,
                claim.name,
                uid=claim.uid,
                annotations=dict(each.plan.result.annotations),
                labels=labels,
            )
        except Exception as err:  # whatever it is, it is this claim's error
            each.failure = err
        each.seconds += time.perf_counter() - started


def _log_prepared(plan: Plan) -> None:
    claim = plan.claim
    log.info(
        "claim %s/%s (%s) prepared: %s",
        claim.namespace,
        claim.name,
        claim.uid,
        ", ".join(f"{d.device}/{d.share_id or '-'}" for d in plan.devices) or "no vGPU devices",
        extra=fields(claim=claim.uid, namespace=claim.namespace),
    )


def _write_files(cdi_root: Path, driver: str, writes: list[_Write]) -> None:
    """Each plan's directories, then its CDI spec; a failure is recorded on its write (blocking)."""
    for each in writes:
        started = time.perf_counter()
        try:
            _create_directories(each.plan.result)
            write_spec(cdi_root, driver, each.plan.claim.uid, each.plan.spec)
        except Exception as err:  # whatever it is, it is this claim's error
            each.failure = err
        each.seconds += time.perf_counter() - started


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
