"""The eager partitions of the prepared claims as they are used now: the debug state and the drift
check read them. Each read goes to the API (the claim and its reserved pods)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from vgpud.dra.claimedits import PrepareError
from vgpud.dra.claimindex import ClaimRef
from vgpud.dra.context import DraContext
from vgpud.dra.prepare import read_claim
from vgpud.partition.assigner import PartitionConflict, PartitionRecord
from vgpud.partition.model import ContainerRef, claim_consumers


@dataclass(frozen=True)
class ClaimPartitions:
    """A prepared claim's partitions as Prepare recorded them, with the containers that use each now
    (from the claim's reserved pods in the API) and the conflicts among them (bug-2, eager mode)."""

    claim: ClaimRef
    record: PartitionRecord
    #: partition key -> the containers whose requests went to it; a conflicting container is in several
    containers: Mapping[str, tuple[ContainerRef, ...]] = field(default_factory=dict, hash=False)
    conflicts: tuple[PartitionConflict, ...] = ()
    #: why the claim or its pods could not be read (then `containers` and `conflicts` are empty)
    error: str = ""


async def claim_partitions(ctx: DraContext, *, min_partitions: int = 1) -> list[ClaimPartitions]:
    """The prepared claims whose record has at least `min_partitions` partitions, each with the
    containers that use its partitions now and the conflicts among them (eager mode only: lazy
    records have no partitions)."""
    found = []
    for _uid, (ref, record) in sorted(ctx.index.records().items()):
        if len(set(record.request_partitions.values())) < min_partitions:
            continue
        try:
            claim, pods = await read_claim(ctx, ref)
        except PrepareError as err:
            found.append(ClaimPartitions(ref, record, error=str(err)))
            continue
        by_key: dict[str, list[ContainerRef]] = {}
        for container, requests in claim_consumers(claim, pods).items():
            for key in sorted(
                {record.request_partitions[r] for r in requests if r in record.request_partitions}
            ):
                by_key.setdefault(key, []).append(container)
        conflicts = ctx.assigner.conflicts(record, claim, pods)
        found.append(ClaimPartitions(ref, record, {k: tuple(v) for k, v in by_key.items()}, conflicts))
    return found
