"""Each GPU of the node as an operator reads it: capacity, what its vGPU containers are allocated, what
they use, and the containers themselves. One pure function of the inventory, the usage reader's last
pass and the device health, shared by the metrics (`vgpud_gpu_*`), `/debug/state` (`gpus`) and
`vgpud top`, so the three never disagree. A GPU vgpud does not share (`vgpud.gpu.exclusion`: MIG mode)
has no vGPU view: it is an `ExcludedGpu`, with why and its MIG devices (`vgpud_gpus_excluded`, the
state's `excluded_gpus`).

Allocated is what the containers' libraries enforce (each vgpu.config's limits), summed per GPU, as the
reference's device view sums its containers' limits: a prepared claim with no container yet allocates
nothing here. A container without a memory (or core) limit adds nothing to that sum and is counted in
`unlimited`. Used is the library's own formula (NVML's memory of the registered PIDs plus its ledger)
and the shared bucket's SM utilization, summed over the containers that report them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vgpud.gpu.exclusion import excluded_gpus, shared_gpus
from vgpud.gpu.model import GpuInfo, MigDevice
from vgpud.observe.usage import ContainerUsage


@dataclass(frozen=True)
class VgpuOnGpu:
    """One vGPU container (lazy mode) or partition (eager mode) on one GPU."""

    namespace: str
    #: "" in eager mode (a partition may serve several pods)
    pod: str
    container: str
    claim_uid: str
    partition: str
    #: bytes, None when the library enforces no memory limit
    memory_limit: int | None
    #: 0..1, None when it enforces no core limit
    core_limit: float | None
    #: bytes the library counts against its limit; None when unknown (no registered PID)
    memory_used: int | None
    #: 0..1 at the shared bucket's last sample; None before the first
    sm_utilization: float | None
    pids: tuple[int, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "namespace": self.namespace,
            "pod": self.pod,
            "container": self.container,
            "claim_uid": self.claim_uid,
            "partition": self.partition,
            "memory_limit_bytes": self.memory_limit,
            "core_limit_ratio": self.core_limit,
            "memory_used_bytes": self.memory_used,
            "sm_utilization_ratio": self.sm_utilization,
            "pids": list(self.pids),
        }


@dataclass(frozen=True)
class GpuView:
    """One physical GPU and the vGPUs on it."""

    index: int
    uuid: str
    product: str
    memory_total: int
    #: None when no device-health watcher runs
    healthy: bool | None
    vgpus: tuple[VgpuOnGpu, ...] = ()

    @property
    def memory_allocated(self) -> int:
        return sum(v.memory_limit for v in self.vgpus if v.memory_limit is not None)

    @property
    def cores_allocated(self) -> float:
        return sum(v.core_limit for v in self.vgpus if v.core_limit is not None)

    @property
    def memory_used(self) -> int:
        return sum(v.memory_used for v in self.vgpus if v.memory_used is not None)

    @property
    def sm_utilization(self) -> float:
        return sum(v.sm_utilization for v in self.vgpus if v.sm_utilization is not None)

    @property
    def unlimited(self) -> int:
        """vGPUs on it with no memory limit (each may take the whole GPU's memory)."""
        return sum(1 for v in self.vgpus if v.memory_limit is None)

    def to_dict(self) -> dict[str, object]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "product": self.product,
            "healthy": self.healthy,
            "memory_total_bytes": self.memory_total,
            "memory_allocated_bytes": self.memory_allocated,
            "memory_used_bytes": self.memory_used,
            "cores_allocated_ratio": round(self.cores_allocated, 4),
            "sm_utilization_ratio": round(self.sm_utilization, 4),
            "unlimited_vgpus": self.unlimited,
            "vgpus": [v.to_dict() for v in self.vgpus],
        }


@dataclass(frozen=True)
class ExcludedGpu:
    """A GPU of the node that vgpud does not share, and why."""

    index: int
    uuid: str
    product: str
    #: an `ExclusionReason` value ("mig")
    reason: str
    #: why, for people
    excluded: str
    mig_devices: tuple[MigDevice, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "product": self.product,
            "reason": self.reason,
            "excluded": self.excluded,
            "mig_devices": [dataclasses.asdict(m) for m in self.mig_devices],
        }


def excluded_views(gpus: Iterable[GpuInfo]) -> list[ExcludedGpu]:
    """Every GPU vgpud does not share, by index."""
    gpus = sorted(gpus, key=lambda g: g.index)
    why = excluded_gpus(gpus)
    return [
        ExcludedGpu(
            g.index, g.uuid, g.product_name, why[g.uuid].reason.value, why[g.uuid].detail, g.mig_devices
        )
        for g in gpus
        if g.uuid in why
    ]


def _ratio(value: int | None, whole: int) -> float | None:
    return None if value is None else value / whole


def gpu_views(
    gpus: Iterable[GpuInfo],
    containers: Iterable[ContainerUsage] = (),
    healthy: Mapping[str, bool] | None = None,
) -> list[GpuView]:
    """Every shared GPU by index, each with the containers whose files name it (by UUID, or by index
    when the file gave none). A container's device that names no shared GPU is left out."""
    by_gpu: dict[int, list[VgpuOnGpu]] = {}
    gpus = sorted(shared_gpus(gpus), key=lambda g: g.index)
    index_of = {g.uuid: g.index for g in gpus}
    known = {g.index for g in gpus}
    for entry in containers:
        target, usage = entry.target, entry.usage
        for device in usage.devices:
            index = index_of.get(device.uuid, device.index if not device.uuid else -1)
            if index not in known:
                continue
            by_gpu.setdefault(index, []).append(
                VgpuOnGpu(
                    namespace=target.namespace,
                    pod=target.pod_name,
                    container=target.container,
                    claim_uid=target.claim_uid,
                    partition=target.partition,
                    memory_limit=device.memory_limit if device.memory_limited else None,
                    core_limit=device.core_limit / 100 if device.core_limited else None,
                    memory_used=device.used_bytes,
                    sm_utilization=_ratio(device.sm_util_permille, 1000),
                    pids=tuple(sorted(usage.pids)),
                )
            )
    return [
        GpuView(
            index=g.index,
            uuid=g.uuid,
            product=g.product_name,
            memory_total=g.memory_total,
            healthy=None if healthy is None else healthy.get(g.uuid, True),
            vgpus=tuple(sorted(by_gpu.get(g.index, ()), key=lambda v: (v.namespace, v.pod, v.container))),
        )
        for g in gpus
    ]
