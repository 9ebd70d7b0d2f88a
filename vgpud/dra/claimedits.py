"""What Prepare writes into a claim's CDI spec: pure functions from the claim and the assigner's result.

The spec's top-level edits are the claim-common ones (the library, the blanked unsuffixed limits, the
mode, `MANAGER_VGPU_CLAIM_UID`, the common read-only mounts) and the driver's (vgpud.nvdriver: the
control device nodes, libraries, binaries, `NVIDIA_VISIBLE_DEVICES=void`); each device adds its own
`_<idx>` env, its GPU's device node and, in eager mode, its partition's mounts and register UUID. The
vGPU rules are the reference's (docs: "Env injected", "Mounts"); the same spec serves eager and NRI
mode, so both hand a container the same GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from vgpud.dra.cdi import ContainerEdits, claim_spec, device_name, qualified_device_id
from vgpud.dra.checkpoint import PreparedDevice
from vgpud.dra.driveredits import DriverEdits
from vgpud.gpu import GpuInfo
from vgpud.partition.assigner import PrepareResult
from vgpud.partition.edits import compatibility_mode, compute_policy, device_env, memory_ratio_env
from vgpud.partition.layout import (
    CONT_CONTROL_LIBRARY,
    ENV_COMPATIBILITY_MODE,
    ENV_CUDA_CORE_LIMIT,
    ENV_CUDA_CORE_SOFT_LIMIT,
    ENV_CUDA_MEM_LIMIT,
    ENV_CUDA_MEM_OVERSOLD,
    ENV_CUDA_MEM_RATIO,
    ENV_CUDA_SM_SHARED_BUCKET,
    ENV_LD_PRELOAD,
    ENV_VISIBLE_DEVICES,
    ENV_VMEMORY_NODE_ENABLED,
    Layout,
    common_mounts,
)
from vgpud.partition.model import AllocatedDevice, ClaimView

DEVICE_PREFIX = "vgpu-"
#: a GPU minor number is a small integer; more digits are no name this driver publishes
MAX_MINOR_DIGITS = 6


class PrepareError(Exception):
    """A claim this node cannot prepare; the message goes into the claim's entry of the reply."""


@dataclass(frozen=True)
class NodeFacts:
    """What the edits depend on besides the claim: this node's GPUs and how vgpud runs."""

    driver: str
    node_name: str
    layout: Layout
    #: the GPUs vgpud shares (`vgpud.gpu.exclusion`), by minor
    gpus_by_minor: Mapping[int, GpuInfo]
    client_mode: bool
    cgroup_v2: bool
    memory_ratio: int
    library_version: str
    sm_watcher: bool = False
    #: the driver's files and each GPU's device node; None: simulated GPUs on a node without a driver
    #: (the mock backend), whose containers get the limits and no GPU
    driver_edits: DriverEdits | None = None
    #: the labels Prepare puts on each claim it prepares, so the node's claim cache sees it
    #: (`vgpud.dra.claimlabel`); empty where no claim cache runs (eager mode without the registry)
    claim_labels: Mapping[str, str] = field(default_factory=dict, hash=False)
    #: the GPUs vgpud does not share, by minor: the GPU and why, for a claim that names one
    excluded_by_minor: Mapping[int, str] = field(default_factory=dict, hash=False)


def device_minor(name: str) -> int | None:
    """`vgpu-<minor>` -> minor; None for a name this driver does not publish."""
    if not name.startswith(DEVICE_PREFIX):
        return None
    digits = name[len(DEVICE_PREFIX) :]
    if not (digits.isascii() and digits.isdigit() and len(digits) <= MAX_MINOR_DIGITS):
        return None
    return int(digits) if str(int(digits)) == digits else None


def gpu_for(facts: NodeFacts, device: AllocatedDevice) -> GpuInfo:
    """The local GPU an allocation result names, or PrepareError when it is not on this node."""
    if device.pool != facts.node_name:
        raise PrepareError(
            f"device {device.pool}/{device.device} is in pool {device.pool!r}, "
            f"not this node's pool {facts.node_name!r}"
        )
    minor = device_minor(device.device)
    if minor is not None and minor in facts.excluded_by_minor:
        raise PrepareError(
            f"device {device.device!r} is {facts.excluded_by_minor[minor]}; "
            f"node {facts.node_name} does not publish it"
        )
    if minor is None or minor not in facts.gpus_by_minor:
        raise PrepareError(f"device {device.device!r} is not a GPU of node {facts.node_name}")
    return facts.gpus_by_minor[minor]


def gpu_edits(driver: DriverEdits, gpu: GpuInfo) -> ContainerEdits:
    """The GPU's own device node (PrepareError when the dev root had none for it at start)."""
    edits = driver.by_minor.get(gpu.minor)
    if edits is None:
        raise PrepareError(f"GPU {gpu.uuid} (minor {gpu.minor}) has no device node in the dev root")
    return edits


def claim_common_env(facts: NodeFacts, claim_env: Mapping[str, str]) -> dict[str, str]:
    """The env every container of the claim gets, whichever of its devices it uses."""
    ratio, oversold = memory_ratio_env(facts.memory_ratio)
    mode = compatibility_mode(client_register=facts.client_mode, cgroup_v2=facts.cgroup_v2)
    return {
        ENV_LD_PRELOAD: str(CONT_CONTROL_LIBRARY),
        ENV_COMPATIBILITY_MODE: str(mode),
        # blank what the image or a device plugin may have set: only the _<idx> names count
        ENV_VISIBLE_DEVICES: "",
        ENV_CUDA_CORE_LIMIT: "",
        ENV_CUDA_CORE_SOFT_LIMIT: "",
        ENV_CUDA_MEM_LIMIT: "",
        ENV_CUDA_MEM_RATIO: ratio,
        ENV_CUDA_MEM_OVERSOLD: oversold,
        ENV_VMEMORY_NODE_ENABLED: "TRUE",
        ENV_CUDA_SM_SHARED_BUCKET: "TRUE",
        **claim_env,
    }


def _env_list(env: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(f"{key}={value}" for key, value in sorted(env.items()))


def build_claim_spec(
    facts: NodeFacts, claim: ClaimView, result: PrepareResult
) -> tuple[dict, tuple[PreparedDevice, ...]]:
    """The claim's CDI spec and the devices to report to the kubelet, in allocation-result order."""
    policy = compute_policy(claim.annotations)
    driver = facts.driver_edits
    common = ContainerEdits(
        env=_env_list(claim_common_env(facts, result.claim_env)),
        mounts=common_mounts(
            facts.layout,
            library_version=facts.library_version,
            client_mode=facts.client_mode,
            sm_watcher=facts.sm_watcher,
        ),
    ).plus(driver.common if driver else None)
    cdi_devices: list[tuple[str, ContainerEdits]] = []
    prepared: list[PreparedDevice] = []
    for ordinal, edits in enumerate(result.devices):
        device = edits.device
        gpu = gpu_for(facts, device)
        env = device_env(
            gpu.index,
            gpu.uuid,
            total_memory=gpu.memory_total,
            consumed_capacity=device.consumed_capacity,
            policy=policy,
            memory_ratio=facts.memory_ratio,
        )
        env.update(edits.env)
        name = device_name(claim.uid, device.request, gpu.minor, device.share_id, ordinal)
        own = ContainerEdits(env=_env_list(env), mounts=edits.mounts)
        cdi_devices.append((name, own.plus(gpu_edits(driver, gpu) if driver else None)))
        prepared.append(
            PreparedDevice(
                request_names=(device.request,),
                pool=device.pool,
                device=device.device,
                cdi_device_ids=(qualified_device_id(facts.driver, name),),
                share_id=device.share_id,
            )
        )
    return claim_spec(facts.driver, claim.uid, cdi_devices, common), tuple(prepared)
