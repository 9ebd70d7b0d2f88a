"""Each container's limits and usage as the library's own files say: a periodic reader for the metrics
and the debug state.

Which directories: in lazy (NRI) mode the NRI cache's container directories, in eager mode the
partitions of the prepared claims in the checkpoint. Both lists come from memory on the Trio thread;
the files are read in a worker thread (`vgpud.partition.libstate`), off every hook's path. What the
reader shows is what the library wrote: vgpu.config (limits), the vmem_node.config ledger (memory
NVML does not report: managed, async, capture) and the shared bucket's SM utilization.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import trio

from vgpud.observe.state import NodeParts
from vgpud.partition.layout import PartitionPaths
from vgpud.partition.libstate import PartitionUsage, read_partition_usage

DEFAULT_INTERVAL = 10.0


@dataclass(frozen=True, order=True)
class UsageTarget:
    """One directory to read: `partition` is `<pod UID>_<container>` (lazy) or the partition key."""

    claim_uid: str
    partition: str
    directory: PurePosixPath = field(compare=False)
    #: lazy mode: whose directory it is ("" in eager mode: a partition may serve several containers)
    pod_uid: str = field(default="", compare=False)
    container: str = field(default="", compare=False)


@dataclass(frozen=True)
class ContainerUsage:
    target: UsageTarget
    usage: PartitionUsage

    def to_dict(self) -> dict[str, object]:
        return {
            "claim_uid": self.target.claim_uid,
            "partition": self.target.partition,
            "pod_uid": self.target.pod_uid,
            "container": self.target.container,
            **self.usage.to_dict(),
        }


@dataclass(frozen=True)
class UsageStatus:
    interval: float
    reads: int = 0
    #: wall clock of the last completed read
    last_read: float | None = None
    containers: tuple[ContainerUsage, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {
            "interval_seconds": self.interval,
            "reads": self.reads,
            "last_read": self.last_read,
            "containers": {
                f"{c.target.claim_uid}/{c.target.partition}": c.to_dict() for c in self.containers
            },
        }


def usage_targets(parts: NodeParts) -> list[UsageTarget]:
    """Every directory whose files to read now, from the NRI cache (lazy) or the checkpoint (eager)."""
    layout = parts.layout
    if parts.nri is not None:
        found = {
            entry.directory: UsageTarget(
                entry.claim_uid, entry.directory.name, entry.directory, entry.pod_uid, entry.container
            )
            for _, entry in parts.nri.cache.items()
        }
        return sorted(found.values())
    targets = []
    for claim_uid, (_, record) in parts.driver.index.records().items():
        for key in sorted(set(record.request_partitions.values())):
            targets.append(UsageTarget(claim_uid, key, layout.partition(claim_uid, key).base))
    return sorted(targets)


def read_targets(targets: Iterable[UsageTarget]) -> tuple[ContainerUsage, ...]:
    """Blocking: read every target's files."""
    return tuple(ContainerUsage(t, read_partition_usage(PartitionPaths(t.directory))) for t in targets)


class UsageReader:
    """The supervised component: a read every `interval` seconds (the first right away)."""

    def __init__(self, parts: NodeParts, interval: float = DEFAULT_INTERVAL) -> None:
        if interval <= 0:
            raise ValueError(f"usage interval must be > 0, got {interval}")
        self._parts = parts
        self._status = UsageStatus(interval)

    def status(self) -> UsageStatus:
        return self._status

    async def run(self, ready: Callable[[], None]) -> None:
        ready()
        while True:
            await self.read()
            await trio.sleep(self._status.interval)

    async def read(self) -> UsageStatus:
        """One pass over every current directory; the new status."""
        targets = usage_targets(self._parts)
        containers = await trio.to_thread.run_sync(read_targets, targets)
        self._status = UsageStatus(
            self._status.interval,
            reads=self._status.reads + 1,
            last_read=time.time(),
            containers=containers,
        )
        return self._status
