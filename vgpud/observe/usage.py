"""Each container's limits and usage as the library's own files say: a periodic reader for the metrics
and the debug state.

Which directories: in lazy (NRI) mode the NRI cache's container directories, in eager mode the
partitions of the prepared claims in the checkpoint. Both lists come from memory on the Trio thread;
the files are read in a worker thread (`vgpud.partition.libstate`), off every hook's path. What the
reader shows is what the library wrote: vgpu.config (limits), the vmem_node.config ledger (memory
NVML does not report: managed, async, capture) and the shared bucket's SM utilization; plus, from
the GPU inventory, NVML's device memory of the PIDs the container's pids.config registers (client
mode) or, in cgroup mode (no registration) with NRI, of the PIDs in the container's cgroup: with the
ledger, the usage the library's memory limit counts. Eager partitions in cgroup mode have neither
(a partition may serve several containers): their NVML memory is unknown.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

import trio

from vgpud.containers.record import Injection
from vgpud.gpu.model import GpuInventoryError
from vgpud.partition.layout import Layout, PartitionPaths
from vgpud.partition.libstate import PartitionUsage, read_partition_usage

if TYPE_CHECKING:
    from vgpud.containers.store import ContainerStore
    from vgpud.dra.claimindex import ClaimIndex

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
    container_id: str = field(default="", compare=False)
    #: the pod's namespace (lazy mode), or the claim's (eager mode: a partition may serve several pods)
    namespace: str = field(default="", compare=False)
    #: the pod's name (lazy mode; "" in eager mode)
    pod_name: str = field(default="", compare=False)


@dataclass(frozen=True)
class ContainerUsage:
    target: UsageTarget
    usage: PartitionUsage

    def to_dict(self) -> dict[str, object]:
        return {
            "claim_uid": self.target.claim_uid,
            "partition": self.target.partition,
            "namespace": self.target.namespace,
            "pod": self.target.pod_name,
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
    #: why NVML's per-process memory could not be read in the last pass ("" when it was)
    process_memory_error: str = ""

    def to_dict(self) -> dict[str, object]:
        return {
            "interval_seconds": self.interval,
            "reads": self.reads,
            "last_read": self.last_read,
            "process_memory_error": self.process_memory_error,
            "containers": {
                f"{c.target.claim_uid}/{c.target.partition}": c.to_dict() for c in self.containers
            },
        }


def usage_targets(layout: Layout, index: ClaimIndex, containers: ContainerStore | None) -> list[UsageTarget]:
    """Every directory whose files to read now, from the injected containers (lazy) or the checkpoint
    (eager)."""
    if containers is not None:
        found = {
            c.directory: UsageTarget(
                c.claim_uid,
                c.directory.name,
                c.directory,
                c.pod_uid,
                c.name,
                c.container_id,
                c.pod_namespace,
                c.pod_name,
            )
            for c in containers.select(Injection.INJECTED)
            if c.directory is not None
        }
        return sorted(found.values())
    targets = []
    for claim_uid, (claim, record) in index.records().items():
        for key in sorted(set(record.request_partitions.values())):
            base = layout.partition(claim_uid, key).base
            targets.append(UsageTarget(claim_uid, key, base, namespace=claim.namespace))
    return sorted(targets)


#: GPU index -> {host PID: bytes}: NVML's per-process device memory (`GpuInventory.process_memory`)
ProcessMemory = Callable[[], dict[int, dict[int, int]]]
#: (pod UID, container ID) -> the container's host PIDs: cgroup mode's stand-in for pids.config
#: (`vgpud.registry.identity.container_pids`)
ContainerPids = Callable[[str, str], frozenset[int]]


def read_targets(
    targets: Iterable[UsageTarget],
    process_memory: ProcessMemory | None = None,
    container_pids: ContainerPids | None = None,
) -> tuple[tuple[ContainerUsage, ...], str]:
    """Blocking: NVML's per-process memory once, then every target's files; and why the process
    memory could not be read ("" when it was, or when there is none to read). With
    `container_pids`, a lazy target's PIDs are its container's (cgroup mode), not pids.config's."""
    targets = list(targets)
    memory, error = None, ""
    if process_memory is not None and targets:
        try:
            memory = process_memory()
        except GpuInventoryError as err:
            error = str(err)

    def pids(target: UsageTarget) -> frozenset[int] | None:
        if container_pids is None or not target.container_id:
            return None
        return container_pids(target.pod_uid, target.container_id)

    return tuple(
        ContainerUsage(t, read_partition_usage(PartitionPaths(t.directory), memory, pids(t))) for t in targets
    ), error


class UsageReader:
    """The supervised component: a read every `interval` seconds (the first right away)."""

    def __init__(
        self,
        layout: Layout,
        index: ClaimIndex,
        containers: ContainerStore | None,
        interval: float = DEFAULT_INTERVAL,
        *,
        process_memory: ProcessMemory | None = None,
        container_pids: ContainerPids | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"usage interval must be > 0, got {interval}")
        self._layout = layout
        self._index = index
        #: the NRI plugin's store (lazy mode); None: the checkpoint's partitions (eager mode)
        self._containers = containers
        self._process_memory = process_memory
        self._container_pids = container_pids
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
        targets = usage_targets(self._layout, self._index, self._containers)
        containers, error = await trio.to_thread.run_sync(
            read_targets, targets, self._process_memory, self._container_pids
        )
        self._status = UsageStatus(
            self._status.interval,
            reads=self._status.reads + 1,
            last_read=time.time(),
            containers=containers,
            process_memory_error=error,
        )
        return self._status
