"""What the scheduler's placement of vGPU claims may be, given the ResourceSlices (pure): the devices'
consumable capacity, what the allocated claims consume of it, and whether a claim left unallocated
would have fitted anywhere. The scale scenario (test_scale.py) checks the real scheduler with it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vgpud.quantity import parse_quantity

#: (pool, device)
DeviceKey = tuple[str, str]


@dataclass(frozen=True)
class Amount:
    """A vGPU's memory (bytes) and cores (percent of the GPU's SMs)."""

    memory: int
    cores: int

    def __add__(self, other: Amount) -> Amount:
        return Amount(self.memory + other.memory, self.cores + other.cores)

    def fits_in(self, room: Amount) -> bool:
        return self.memory <= room.memory and self.cores <= room.cores

    def __sub__(self, other: Amount) -> Amount:
        return Amount(self.memory - other.memory, self.cores - other.cores)


NOTHING = Amount(0, 0)


def amount(quantities: Mapping[str, Any]) -> Amount:
    """{"memory": q, "cores": q} (requests or consumedCapacity) as an Amount."""
    return Amount(int(parse_quantity(quantities["memory"])), int(parse_quantity(quantities["cores"])))


def capacities(slices: Iterable[Mapping[str, Any]], driver: str) -> dict[DeviceKey, Amount]:
    """Each published device of `driver` and its capacity."""
    out = {}
    for item in slices:
        spec = item["spec"]
        if spec.get("driver") != driver:
            continue
        for device in spec.get("devices", []):
            capacity = {name: value["value"] for name, value in device["capacity"].items()}
            out[(spec["pool"]["name"], device["name"])] = amount(capacity)
    return out


def consumed(claims: Iterable[Mapping[str, Any]], driver: str) -> dict[DeviceKey, Amount]:
    """What the allocated claims consume, per device."""
    out: dict[DeviceKey, Amount] = {}
    for claim in claims:
        allocation = claim.get("status", {}).get("allocation") or {}
        for result in allocation.get("devices", {}).get("results", []):
            if result["driver"] == driver:
                key = (result["pool"], result["device"])
                out[key] = out.get(key, NOTHING) + amount(result["consumedCapacity"])
    return out


def overcommitted(capacity: Mapping[DeviceKey, Amount], used: Mapping[DeviceKey, Amount]) -> list[str]:
    """Devices whose allocations exceed their capacity, or that no slice publishes; [] when none."""
    problems = []
    for key, total in sorted(used.items()):
        if key not in capacity:
            problems.append(f"{key}: allocated but not published")
        elif not total.fits_in(capacity[key]):
            problems.append(f"{key}: {total} allocated of {capacity[key]}")
    return problems


def room_for(
    request: Amount, capacity: Mapping[DeviceKey, Amount], used: Mapping[DeviceKey, Amount]
) -> list[DeviceKey]:
    """The devices that still have room for `request` (an unallocated claim should find none)."""
    return sorted(key for key, total in capacity.items() if request.fits_in(total - used.get(key, NOTHING)))
