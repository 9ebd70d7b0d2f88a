"""The cluster scale scenario's placement checker (tests/clustertest/placement.py)."""

from __future__ import annotations

from typing import Any

from tests.clustertest.placement import Amount, capacities, consumed, overcommitted, room_for

DRIVER = "manager.nvidia.com"
GI = 1 << 30


def slice_(pool: str, devices: dict[str, tuple[str, str]], driver: str = DRIVER) -> dict[str, Any]:
    return {
        "spec": {
            "driver": driver,
            "pool": {"name": pool},
            "devices": [
                {"name": name, "capacity": {"memory": {"value": mem}, "cores": {"value": cores}}}
                for name, (mem, cores) in devices.items()
            ],
        }
    }


def claim(*results: tuple[str, str, str, str]) -> dict[str, Any]:
    return {
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "driver": DRIVER,
                            "pool": p,
                            "device": d,
                            "consumedCapacity": {"memory": m, "cores": c},
                        }
                        for p, d, m, c in results
                    ]
                }
            }
        }
    }


SLICES = [
    slice_("n0", {"vgpu-0": ("4Gi", "100"), "vgpu-1": (str(4 * GI), "100")}),
    slice_("n0", {"other": ("1Gi", "1")}, driver="other.example.com"),
]


def test_capacities_are_read_per_pool_and_device_of_the_driver() -> None:
    assert capacities(SLICES, DRIVER) == {
        ("n0", "vgpu-0"): Amount(4 * GI, 100),
        ("n0", "vgpu-1"): Amount(4 * GI, 100),
    }


def test_consumption_adds_up_per_device_and_skips_unallocated_claims() -> None:
    claims = [claim(("n0", "vgpu-0", "1Gi", "30")), claim(("n0", "vgpu-0", "512Mi", "20")), {"status": {}}]
    assert consumed(claims, DRIVER) == {("n0", "vgpu-0"): Amount(GI + GI // 2, 50)}


def test_overcommitment_is_reported_by_memory_cores_or_an_unknown_device() -> None:
    capacity = capacities(SLICES, DRIVER)
    assert overcommitted(capacity, {("n0", "vgpu-0"): Amount(4 * GI, 100)}) == []
    assert len(overcommitted(capacity, {("n0", "vgpu-0"): Amount(4 * GI + 1, 1)})) == 1
    assert len(overcommitted(capacity, {("n0", "vgpu-1"): Amount(1, 101)})) == 1
    assert overcommitted(capacity, {("n1", "vgpu-0"): Amount(1, 1)}) == [
        "('n1', 'vgpu-0'): allocated but not published"
    ]


def test_room_is_what_is_left_on_each_device() -> None:
    capacity = capacities(SLICES, DRIVER)
    used = {("n0", "vgpu-0"): Amount(3 * GI, 90)}
    assert room_for(Amount(GI, 10), capacity, used) == [("n0", "vgpu-0"), ("n0", "vgpu-1")]
    assert room_for(Amount(GI, 11), capacity, used) == [("n0", "vgpu-1")]
    assert room_for(Amount(5 * GI, 1), capacity, used) == []
