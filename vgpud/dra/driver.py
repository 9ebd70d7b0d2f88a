"""`DraDriver`: the DRA node service's state machine, one per `vgpud run`, as its callers see it.

The steps live one concept per module: `prepare` (one pass: `gather` the facts, `decide` per claim,
apply: `materialize` writes the plans), `unprepare`, `cleanup` (interrupted Prepares), `partitions`
(the eager partitions in use, for observability). `index` is the read side the NRI plugin, the
registry and the observability ask (`claimindex`). The steps' entry points share one `DraContext`;
Prepare hands its parts on only as each function needs them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from vgpud.dra import cleanup, partitions
from vgpud.dra import prepare as preparing
from vgpud.dra import unprepare as unpreparing
from vgpud.dra.checkpoint import Checkpoint, CheckpointStore
from vgpud.dra.claimedits import NodeFacts
from vgpud.dra.claimindex import ClaimIndex, ClaimRef
from vgpud.dra.context import NODE_LOCK_TIMEOUT, DraContext, PrepareOutcome
from vgpud.dra.partitions import ClaimPartitions
from vgpud.kube import KubeApi
from vgpud.kube.events import EventSink
from vgpud.partition.assigner import PartitionAssigner
from vgpud.recorder import Recorder

log = logging.getLogger("vgpud.dra")


class DraDriver:
    """`prepare`/`unprepare` are called by the v1 and v1beta1 services alike."""

    def __init__(
        self,
        *,
        kube: KubeApi,
        assigner: PartitionAssigner,
        facts: NodeFacts,
        store: CheckpointStore,
        cdi_root: Path,
        lock_path: Path,
        recorder: Recorder,
        lock_timeout: float = NODE_LOCK_TIMEOUT,
        events: EventSink | None = None,
    ) -> None:
        self.ctx = DraContext(
            kube=kube,
            assigner=assigner,
            facts=facts,
            store=store,
            cdi_root=cdi_root,
            lock_path=lock_path,
            recorder=recorder,
            lock_timeout=lock_timeout,
            events=events,
        )

    @property
    def driver(self) -> str:
        return self.ctx.driver

    @property
    def index(self) -> ClaimIndex:
        """The prepared claims, for the NRI plugin, the registry and the observability."""
        return self.ctx.index

    @property
    def refusals(self) -> Mapping[str, int]:
        """Claims Prepare refused because this node's mode cannot serve their use, by reason."""
        return self.ctx.refusals

    async def load(self) -> Checkpoint:
        """Read the checkpoint at start (a corrupt one is quarantined by the store) and index it."""
        checkpoint = await self.ctx.load()
        self.ctx.index.update(checkpoint)
        index = self.ctx.index
        log.info(
            "checkpoint: %d claims (%d prepared vGPU claims)",
            len(checkpoint.claims),
            len(index.vgpu_claim_namespaces()),
        )
        unrecorded = index.unrecorded_modes()
        if unrecorded:
            log.info(
                "checkpoint: %d claims have no recorded partition mode (an older vgpud's): treated as "
                "prepared in the current mode, %s",
                len(unrecorded),
                index.mode,
            )
        for mismatch in index.mismatches():
            log.warning(
                "mode mismatch: claim %s/%s (%s) %s",
                mismatch.claim.namespace,
                mismatch.claim.name,
                mismatch.claim.uid,
                mismatch.consequence,
                extra=mismatch.claim.log_fields(),
            )
        return checkpoint

    async def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareOutcome]:
        return await preparing.prepare(self.ctx, claims)

    async def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        return await unpreparing.unprepare(self.ctx, claims)

    async def cleanup_stale(self) -> int:
        return await cleanup.cleanup_stale(self.ctx)

    async def run_cleanup(
        self, ready: Callable[[], None], interval: float = cleanup.CLEANUP_INTERVAL
    ) -> None:
        await cleanup.run_cleanup(self.ctx, ready, interval)

    async def claim_partitions(self, *, min_partitions: int = 1) -> list[ClaimPartitions]:
        return await partitions.claim_partitions(self.ctx, min_partitions=min_partitions)
