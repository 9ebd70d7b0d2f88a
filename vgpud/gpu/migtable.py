"""The MIG devices a GPU profile describes: which GPUs have MIG, the MIG profiles they offer, and what
each MIG device is. The mock backend's half of the rules the fake NVML (csrc/fakestate/profile.c)
serves, so both report the same MIG devices for one profile (tests/unit/test_gpu_nvml.py compares).

The table is NVIDIA's (`nvidia-smi mig -lgip`): the A100-SXM4-40GB's profiles on Ampere GPUs, the H100
80GB's on Hopper and Blackwell GPUs. A GPU has MIG when its architecture is one of those three and a
word of its product name (split at spaces and dashes) is A100, A30, H100, H200 or B200; other MIG GPUs'
own profiles (an A30's, an A100 80GB's) are not known to the fakes. MIG device `slot` (its place in the
profile's `migDevices`, from 0) has GPU instance id slot + 1 and compute instance id 0 (one compute
instance filling its GPU instance); its UUID is derived from its GPU's (`mig_uuid`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .model import MigDevice

#: a MIG GPU's GPU-instance slices: what its MIG devices share
MIG_SLICES = 7
MIG_MODE_NAMES = {0: "disabled", 1: "enabled"}
MIG_PRODUCTS = ("A100", "A30", "H100", "H200", "B200")
#: architecture -> the one whose table its GPUs offer
MIG_TABLES = {"Ampere": "Ampere", "Hopper": "Hopper", "Blackwell": "Hopper"}
MIG_CAPABLE = "MIG needs an Ampere, Hopper or Blackwell A100, A30, H100, H200 or B200"
_MIB = 1 << 20


@dataclass(frozen=True)
class MigProfile:
    """One MIG profile: a GPU instance's share of the GPU."""

    name: str
    table: str  # the architecture whose GPUs offer it
    slices: int
    memory_mib: int
    multiprocessor_count: int


MIG_PROFILES = (
    MigProfile("1g.5gb", "Ampere", 1, 4864, 14),
    MigProfile("2g.10gb", "Ampere", 2, 9984, 28),
    MigProfile("3g.20gb", "Ampere", 3, 20096, 42),
    MigProfile("4g.20gb", "Ampere", 4, 20096, 56),
    MigProfile("7g.40gb", "Ampere", 7, 40448, 98),
    MigProfile("1g.10gb", "Hopper", 1, 9984, 16),
    MigProfile("2g.20gb", "Hopper", 2, 20096, 32),
    MigProfile("3g.40gb", "Hopper", 3, 40448, 60),
    MigProfile("4g.40gb", "Hopper", 4, 40448, 64),
    MigProfile("7g.80gb", "Hopper", 7, 81152, 132),
)


def mig_capable(product_name: str, architecture: str) -> bool:
    """Whether the fakes give this GPU a MIG mode (see the module's docstring)."""
    return architecture in MIG_TABLES and any(w in MIG_PRODUCTS for w in re.split(r"[ -]+", product_name))


def offered(architecture: str) -> dict[str, MigProfile]:
    """The MIG profiles a GPU of this architecture offers, by name."""
    table = MIG_TABLES.get(architecture)
    return {p.name: p for p in MIG_PROFILES if p.table == table}


def mig_uuid(parent_uuid: str, gpu_instance_id: int, compute_instance_id: int) -> str:
    """ "MIG-" and the parent's UUID after "GPU-", its third group replaced by the two ids (two hex
    digits each): unique per GPU and instance, the same in every run."""
    return f"MIG-{parent_uuid[4:18]}{gpu_instance_id:02x}{compute_instance_id:02x}{parent_uuid[22:]}"


def mig_devices(parent_uuid: str, architecture: str, names: list[str]) -> tuple[MigDevice, ...]:
    """The MIG devices of these profile names, in order; ValueError (why) for a name the GPU does not
    offer, or for more slices than the GPU has."""
    known = offered(architecture)
    for name in names:
        if name not in known:
            raise ValueError(f"unknown MIG profile {name!r} for this GPU (known: {', '.join(known)})")
    slices = sum(known[name].slices for name in names)
    if slices > MIG_SLICES:
        raise ValueError(f"the MIG devices take {slices} slices, more than the GPU's {MIG_SLICES}")
    return tuple(_device(parent_uuid, slot, known[name]) for slot, name in enumerate(names))


def _device(parent_uuid: str, slot: int, profile: MigProfile) -> MigDevice:
    gpu_instance, compute_instance = slot + 1, 0
    return MigDevice(
        uuid=mig_uuid(parent_uuid, gpu_instance, compute_instance),
        gpu_instance_id=gpu_instance,
        compute_instance_id=compute_instance,
        profile=profile.name,
        slices=profile.slices,
        memory_total=profile.memory_mib * _MIB,
        multiprocessor_count=profile.multiprocessor_count,
    )
