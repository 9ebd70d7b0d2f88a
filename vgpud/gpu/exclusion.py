"""Which GPUs vgpud does not share, and why: a pure rule over the inventory.

An excluded GPU is never published in the node's ResourceSlice, Prepare refuses a claim that names it,
and the per-GPU vGPU views leave it out; the log, `vgpud_gpus_excluded` and `/debug/state` say why.
The one reason today is MIG mode (docs/decisions.md "MIG-mode GPUs are left out"): the control
library's limits and its core limiter work on a whole GPU, not on a MIG instance. A GPU counts by its
current MIG mode; one whose change is pending counts from the reset that applies it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from .model import GpuInfo


class ExclusionReason(enum.Enum):
    """Why a GPU is left out (the `reason` label of `vgpud_gpus_excluded`)."""

    MIG = "mig"


#: where each reason's decision is explained (a section of docs/decisions.md), for the log line
DECISIONS = {ExclusionReason.MIG: "MIG-mode GPUs are left out of the ResourceSlice"}


@dataclass(frozen=True)
class Exclusion:
    reason: ExclusionReason
    #: for people: the log line, `/debug/state`, a refused Prepare
    detail: str


def exclusion(gpu: GpuInfo) -> Exclusion | None:
    """Why `gpu` is not shared, or None when it is."""
    if gpu.mig_mode:
        devices = len(gpu.mig_devices)
        return Exclusion(
            ExclusionReason.MIG,
            f"in MIG mode ({devices} MIG device{'' if devices == 1 else 's'}): vgpud does not share MIG GPUs",
        )
    return None


def excluded_gpus(gpus: Iterable[GpuInfo]) -> dict[str, Exclusion]:
    """GPU UUID -> why, for every GPU that is not shared."""
    return {gpu.uuid: why for gpu in gpus if (why := exclusion(gpu)) is not None}


def shared_gpus(gpus: Iterable[GpuInfo]) -> list[GpuInfo]:
    """The GPUs vgpud shares, in the order given."""
    return [gpu for gpu in gpus if exclusion(gpu) is None]
