"""Per-device env of a vGPU allocation result, keyed by the GPU's host NVML index.

Each device of a claim gets its own `_<idx>` names, so a container that receives several devices
(several requests, or bug-2's several partitions) never has two devices fight over one variable —
the limits are per device by construction. The rules are the reference's (contracts, "Env injected").
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from vgpud.partition.layout import (
    ENV_CUDA_CORE_LIMIT,
    ENV_CUDA_CORE_SOFT_LIMIT,
    ENV_CUDA_MEM_LIMIT,
    ENV_CUDA_MEM_OVERSOLD,
    ENV_CUDA_MEM_RATIO,
    ENV_VISIBLE_DEVICE,
    MODE_CGROUP_V1,
    MODE_CGROUP_V2,
    MODE_CLIENT_REGISTER,
    MODE_HOST,
    MODE_OPEN_KERNEL,
    indexed,
)
from vgpud.quantity import parse_quantity

MIB = 1 << 20
HUNDRED_CORES = 100
CORES = "cores"
MEMORY = "memory"
COMPUTE_POLICY_SUFFIX = "/vgpu-compute-policy"


class ComputePolicy(StrEnum):
    """none: no core limit; balance: soft limit 100 (idle cores lent out); fixed: hard = soft."""

    NONE = "none"
    BALANCE = "balance"
    FIXED = "fixed"


def compute_policy(annotations: Mapping[str, str]) -> ComputePolicy:
    """From the claim annotation ending in `/vgpu-compute-policy`; unknown or absent -> fixed."""
    for key in sorted(annotations):
        if key.endswith(COMPUTE_POLICY_SUFFIX) and annotations[key]:
            try:
                return ComputePolicy(annotations[key].strip().lower())
            except ValueError:
                return ComputePolicy.FIXED
    return ComputePolicy.FIXED


def compatibility_mode(*, client_register: bool, cgroup_v2: bool) -> int:
    """MANAGER_COMPATIBILITY_MODE: client registration replaces the cgroup bit (236 / 102 / 101)."""
    mode = MODE_HOST | MODE_OPEN_KERNEL
    if client_register:
        return mode | MODE_CLIENT_REGISTER
    return mode | (MODE_CGROUP_V2 if cgroup_v2 else MODE_CGROUP_V1)


def memory_ratio_env(memory_ratio: int) -> tuple[str, str]:
    """(`%.2f` ratio, TRUE/FALSE oversold) for a --device-memory-ratio percentage."""
    ratio = memory_ratio / HUNDRED_CORES
    return f"{ratio:.2f}", "TRUE" if ratio > 1 else "FALSE"


def core_limits(cores: int, policy: ComputePolicy) -> tuple[str, str]:
    """(hard, soft) CUDA_CORE_*LIMIT values: empty (unlimited) unless 0 < hard < 100."""
    hard, soft = cores, cores
    if policy is ComputePolicy.BALANCE:
        soft = HUNDRED_CORES
    elif policy is ComputePolicy.NONE:
        hard = HUNDRED_CORES
    if 0 < hard < HUNDRED_CORES:
        return str(hard), str(soft)
    return "", ""


def memory_limit(requested_bytes: int, total_bytes: int, memory_ratio: int = HUNDRED_CORES) -> str:
    """`<MiB>m`, or empty when the request covers the whole (ratio-scaled) device."""
    requested_mib = requested_bytes // MIB
    total_mib = total_bytes * memory_ratio // HUNDRED_CORES // MIB
    return f"{requested_mib}m" if requested_mib < total_mib else ""


def device_env(
    index: int,
    gpu_uuid: str,
    *,
    total_memory: int,
    consumed_capacity: Mapping[str, str],
    policy: ComputePolicy = ComputePolicy.FIXED,
    memory_ratio: int = HUNDRED_CORES,
) -> dict[str, str]:
    """The env one vGPU device contributes: visibility, ratio, and the limits it was allocated.

    A capacity missing from `consumed_capacity`, or not a whole number, sets no limit variable, as
    in the reference; the unsuffixed names are blanked by the claim-common edits.
    """
    ratio, oversold = memory_ratio_env(memory_ratio)
    env = {
        indexed(ENV_CUDA_MEM_RATIO, index): ratio,
        indexed(ENV_CUDA_MEM_OVERSOLD, index): oversold,
        indexed(ENV_VISIBLE_DEVICE, index): gpu_uuid,
    }
    if CORES in consumed_capacity and (cores := quantity_as_int(consumed_capacity[CORES])) is not None:
        hard, soft = core_limits(cores, policy)
        env[indexed(ENV_CUDA_CORE_LIMIT, index)] = hard
        env[indexed(ENV_CUDA_CORE_SOFT_LIMIT, index)] = soft
    if MEMORY in consumed_capacity and (memory := quantity_as_int(consumed_capacity[MEMORY])) is not None:
        env[indexed(ENV_CUDA_MEM_LIMIT, index)] = memory_limit(memory, total_memory, memory_ratio)
    return env


def quantity_as_int(value: str | int) -> int | None:
    """A Kubernetes quantity ("40", "1536Mi", "2e9"; vgpud.quantity, exact decimals) as an integer, or
    None when it has a fraction (Go's `Quantity.AsInt64` ok=false); ValueError naming the value when it
    is not a quantity."""
    try:
        number = parse_quantity(value)
    except ValueError as err:
        raise ValueError(f"{value!r} is not a Kubernetes quantity: {err}") from None
    return int(number) if number == number.to_integral_value() else None
