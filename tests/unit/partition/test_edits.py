"""Per-device env values (contract "Env injected"), compute policy, compatibility mode, quantities."""

from __future__ import annotations

import pytest

from vgpud.partition.edits import (
    ComputePolicy,
    compatibility_mode,
    compute_policy,
    core_limits,
    device_env,
    memory_limit,
    memory_ratio_env,
    quantity_as_int,
)

GIB = 1 << 30
MIB = 1 << 20
F, B, N = ComputePolicy.FIXED, ComputePolicy.BALANCE, ComputePolicy.NONE


@pytest.mark.parametrize(
    ("cores", "policy", "expected"),
    [
        (40, F, ("40", "40")),
        (40, B, ("40", "100")),  # balance: idle cores may be borrowed up to 100
        (40, N, ("", "")),  # none: unlimited
        (1, F, ("1", "1")),
        (99, F, ("99", "99")),
        (100, F, ("", "")),  # >= 100: the whole device, no limit
        (150, B, ("", "")),
        (0, F, ("", "")),  # <= 0: no limit rather than a zero quota
        (-5, F, ("", "")),
    ],
)
def test_core_limits(cores: int, policy: ComputePolicy, expected: tuple[str, str]) -> None:
    assert core_limits(cores, policy) == expected


@pytest.mark.parametrize(
    ("requested", "total", "ratio", "expected"),
    [
        (4 * GIB, 16 * GIB, 100, "4096m"),
        (16 * GIB, 16 * GIB, 100, ""),  # the whole device: no limit
        (20 * GIB, 16 * GIB, 100, ""),
        (16 * GIB, 16 * GIB, 200, "16384m"),  # oversold: the device offers 32 GiB
        (1536 * MIB + 123, 16 * GIB, 100, "1536m"),  # whole MiB, rounded down
        (4 * GIB, 16 * GIB, 25, ""),  # at or above the ratio-scaled size
    ],
)
def test_memory_limit(requested: int, total: int, ratio: int, expected: str) -> None:
    assert memory_limit(requested, total, ratio) == expected


@pytest.mark.parametrize(
    ("ratio", "expected"),
    [(100, ("1.00", "FALSE")), (150, ("1.50", "TRUE")), (50, ("0.50", "FALSE")), (333, ("3.33", "TRUE"))],
)
def test_memory_ratio_env(ratio: int, expected: tuple[str, str]) -> None:
    assert memory_ratio_env(ratio) == expected


def test_device_env_uses_the_host_index_suffix() -> None:
    env = device_env(
        3, "GPU-abc", total_memory=16 * GIB, consumed_capacity={"cores": "40", "memory": "4Gi"}, policy=B
    )
    assert env == {
        "CUDA_MEM_RATIO_3": "1.00",
        "CUDA_MEM_OVERSOLD_3": "FALSE",
        "MANAGER_VISIBLE_DEVICE_3": "GPU-abc",
        "CUDA_CORE_LIMIT_3": "40",
        "CUDA_CORE_SOFT_LIMIT_3": "100",
        "CUDA_MEM_LIMIT_3": "4096m",
    }


@pytest.mark.parametrize(
    ("capacity", "present"),
    [
        ({}, set()),
        ({"cores": "100"}, {"CUDA_CORE_LIMIT_0", "CUDA_CORE_SOFT_LIMIT_0"}),
        ({"memory": "16Gi"}, {"CUDA_MEM_LIMIT_0"}),
        ({"cores": "40.5", "memory": "1.5"}, set()),  # not whole numbers: no limit variable, as the reference
    ],
)
def test_device_env_sets_only_what_was_allocated(capacity: dict[str, str], present: set[str]) -> None:
    env = device_env(0, "GPU-x", total_memory=16 * GIB, consumed_capacity=capacity)
    assert set(env) - {"CUDA_MEM_RATIO_0", "CUDA_MEM_OVERSOLD_0", "MANAGER_VISIBLE_DEVICE_0"} == present
    assert all(env[name] == "" for name in present)


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        ({}, F),
        ({"nvidia.com/vgpu-compute-policy": "balance"}, B),
        ({"example.io/vgpu-compute-policy": "NONE"}, N),
        ({"nvidia.com/vgpu-compute-policy": "fixed"}, F),
        ({"nvidia.com/vgpu-compute-policy": "greedy"}, F),
        ({"nvidia.com/vgpu-compute-policy": ""}, F),
        ({"nvidia.com/compute-policy": "none"}, F),
    ],
)
def test_compute_policy(annotations: dict[str, str], expected: ComputePolicy) -> None:
    assert compute_policy(annotations) is expected


@pytest.mark.parametrize(
    ("client", "v2", "expected"),
    [(True, True, 236), (True, False, 236), (False, True, 102), (False, False, 101)],
)
def test_compatibility_mode(client: bool, v2: bool, expected: int) -> None:
    mode = compatibility_mode(client_register=client, cgroup_v2=v2)
    assert mode == expected
    assert (mode & 200 == 200) is client  # the library's test


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("40", 40),
        (40, 40),
        ("0", 0),
        ("1Gi", GIB),
        ("1536Mi", 1536 * MIB),
        ("4k", 4000),
        ("2M", 2_000_000),
        ("2e9", 2_000_000_000),
        ("1.5Gi", 3 * GIB // 2),
        ("2000m", 2),
        ("+7", 7),
        ("-1", -1),
        ("1E3", 1000),
        ("3E", 3 * 10**18),
        ("1Ei", 2**60),
        ("500m", None),
        ("1500m", None),
        ("0.5", None),
    ],
)
def test_quantity_as_int(text: str | int, value: int | None) -> None:
    assert quantity_as_int(text) == value


@pytest.mark.parametrize(
    "text", ["", "Gi", "1GB", "0x10", "1.2.3", "ten", "1e", "1ki", "NaN", "Infinity", "-inf"]
)
def test_quantity_as_int_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="is not a Kubernetes quantity"):
        quantity_as_int(text)
