"""The periodic rollback of interrupted Prepares: PrepareStarted entries whose claim is gone or was
re-created (a crash mid-Prepare that no later Prepare of the same claim will repair)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from vgpud.dra.checkpoint import PrepareState
from vgpud.dra.claimindex import ClaimRef
from vgpud.dra.context import DraContext
from vgpud.kube import NotFound
from vgpud.recorder import Outcome

log = logging.getLogger("vgpud.dra")

CLEANUP_INTERVAL = 600.0


async def cleanup_stale(ctx: DraContext) -> int:
    """Roll back PrepareStarted claims whose API object is gone or has a new UID; how many."""
    checkpoint = await ctx.load()
    stale = []
    for uid, entry in checkpoint.claims.items():
        if entry.state is not PrepareState.STARTED:
            continue
        try:
            obj = await ctx.kube.get_resource_claim(entry.namespace, entry.name)
        except NotFound:
            stale.append(ClaimRef(entry.namespace, uid, entry.name))
            continue
        if obj.get("metadata", {}).get("uid") != uid:
            stale.append(ClaimRef(entry.namespace, uid, entry.name))
    if not stale:
        return 0
    async with ctx.node_lock():
        checkpoint = await ctx.load()
        for ref in stale:
            entry = checkpoint.claims.get(ref.uid)
            if entry is not None and entry.state is PrepareState.STARTED:  # re-check under the lock
                with ctx.timed("Cleanup", ref) as call:
                    problem = await ctx.try_remove_artifacts(ref)
                    if problem:  # kept for the next pass
                        call.outcome, call.detail = Outcome.ERROR, problem
                        continue
                    checkpoint = checkpoint.without_claim(ref.uid)
        await ctx.save(checkpoint)
    log.info("cleanup: rolled back %d interrupted Prepare(s)", len(stale))
    return len(stale)


async def run_cleanup(ctx: DraContext, ready: Callable[[], None], interval: float = CLEANUP_INTERVAL) -> None:
    """Supervised component: a pass at start, then every `interval` seconds."""
    ready()
    while True:
        await cleanup_stale(ctx)
        await trio.sleep(interval)
