"""The node's ResourceSlice as a pure function of the GPUs, their health and the settings (no I/O);
`vgpud.dra.slices` publishes it and keeps it.

One slice per node (pool = node name, `resourceSliceCount: 1`), one device per physical GPU, named
`vgpu-<minor>` and shared through consumable capacity (vgpu-manager-contracts.md "ResourceSlice").
A GPU vgpud does not share (`vgpud.gpu.exclusion`: one in MIG mode) is never published.
Attribute names and formats follow the Go reference system, which uses NVIDIA's go-nvlib names and the
standard attributes of `k8s.io/dynamic-resource-allocation/deviceattribute`:

- `resource.kubernetes.io/pciBusID`: lower-case extended BDF, "0000:07:00.0";
- `resource.kubernetes.io/pcieRoot`: "pci<domain>:<bus>" of the root complex, read from sysfs (the
  first element under /sys/devices of the device's /sys/bus/pci/devices link; `slices.read_pcie_roots`);
- `resource.kubernetes.io/numaNode`: an int, only when the platform reports NUMA affinity.

In the driver's own domain (unqualified names) besides the GPU's facts: `coreRatio` and `memoryRatio`
(the oversubscription settings), and `NRI_MODE_ATTRIBUTE` (`nriMode`, a bool): true when the daemon
runs NRI (lazy) mode, false in eager mode, including an NRI start that fell back to eager. Claims that
need NRI select on it (`vgpud.relaxations`); a restart in the other mode republishes the slice with
the new value (the slice differs, so it is applied with the next pool generation).

Device health (`NVMLDeviceHealthCheck`): a GPU the health board calls unhealthy gets a device taint
`<driver>/unhealthy=<why>:NoSchedule`, so the scheduler places no new claim on it while the pods
already there keep it (their status tells them, through the kubelet's health stream); or, where the
server drops the taint field, it is left out of the slice (`build_slice`'s `left_out`).

What the server holds is compared with what we publish by its `essence`: the fields we publish and
only those, quantities as exact numbers.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from vgpud.gpu.exclusion import shared_gpus
from vgpud.gpu.health import DeviceHealth
from vgpud.gpu.model import GpuInfo
from vgpud.kube import RESOURCE_API, JsonObject
from vgpud.quantity import parse_quantity
from vgpud.relaxations import NRI_MODE_ATTRIBUTE

MIB = 1 << 20
#: the standard attribute domain (deviceattribute.StandardDeviceAttributePrefix)
STANDARD_PREFIX = "resource.kubernetes.io/"
PCI_BUS_ID_ATTRIBUTE = STANDARD_PREFIX + "pciBusID"
PCIE_ROOT_ATTRIBUTE = STANDARD_PREFIX + "pcieRoot"
NUMA_NODE_ATTRIBUTE = STANDARD_PREFIX + "numaNode"
#: resource.k8s.io/v1 limits: a string attribute value; an object name (a DNS subdomain)
MAX_ATTRIBUTE_VALUE_LENGTH = 64
MAX_NAME_LENGTH = 253
#: a taint value is a label value
MAX_LABEL_VALUE_LENGTH = 63
#: `<driver>/unhealthy` is the key of the taint a sick device gets
UNHEALTHY_TAINT = "unhealthy"
#: new claims stay off a sick device; running pods keep theirs (NoExecute would evict them)
UNHEALTHY_TAINT_EFFECT = "NoSchedule"

#: a lower-case extended PCI bus id (deviceattribute's check; `slices.read_pcie_root` checks it too)
BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]")
_NOT_IN_LABEL_VALUE = re.compile(r"[^a-z0-9._-]+")


# --- the builder ----------------------------------------------------------------------------------


def slice_name(node_name: str, driver: str) -> str:
    """`<node>-<driver, dots as dashes>`: fixed, so every session applies the same object. Longer than a
    DNS subdomain allows -> cut, with a hash of the full name so two long node names cannot collide."""
    name = f"{node_name}-{driver.replace('.', '-')}".lower()
    if len(name) <= MAX_NAME_LENGTH:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[: MAX_NAME_LENGTH - len(digest) - 1].rstrip('-.')}-{digest}"


def device_name(gpu: GpuInfo) -> str:
    """The DRA device name of a GPU: `vgpu-<minor>` (stable across restarts, unlike the index)."""
    return f"vgpu-{gpu.minor}"


def device_names(gpus: Sequence[GpuInfo]) -> dict[str, str]:
    """GPU UUID -> DRA device name, in the slice's device order (by minor)."""
    return {gpu.uuid: device_name(gpu) for gpu in sorted(gpus, key=lambda gpu: gpu.minor)}


def taint_key(driver: str) -> str:
    return f"{driver}/{UNHEALTHY_TAINT}"


def taint_value(health: DeviceHealth) -> str:
    """Why, as a label value: `xid-<n>` for an XID, else the reason's head ("GPU lost: ..." ->
    "gpu-lost"); "unhealthy" when nothing usable is left."""
    if health.xid is not None:
        return f"xid-{health.xid}"
    head = health.reason.split(":", 1)[0].strip().lower()
    value = _NOT_IN_LABEL_VALUE.sub("-", head)[:MAX_LABEL_VALUE_LENGTH].strip("-._")
    return value or UNHEALTHY_TAINT


def _timestamp(unix_seconds: float) -> str:
    """RFC 3339 in whole seconds, as the API server renders a metav1.Time (so it compares equal)."""
    return datetime.fromtimestamp(int(unix_seconds), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def unhealthy_taint(driver: str, health: DeviceHealth) -> JsonObject:
    """The device taint of a sick GPU; `timeAdded` is when the board decided, so every apply of the
    same state sends the same taint."""
    return {
        "key": taint_key(driver),
        "value": taint_value(health),
        "effect": UNHEALTHY_TAINT_EFFECT,
        "timeAdded": _timestamp(health.since),
    }


def semver(version: str) -> str | None:
    """A dotted numeric version as the semver a `version` attribute needs ("12.4" -> "12.4.0",
    "535.104.05" -> "535.104.5": semver forbids leading zeros). Parts past the third become build
    metadata ("470.82.01.02" -> "470.82.1+02"): kept for reading, ignored in comparisons, where a
    pre-release suffix would wrongly sort before "470.82.1". None when it is not a dotted number."""
    parts = version.strip().split(".")
    if not all(part.isascii() and part.isdigit() for part in parts):
        return None
    core = [str(int(part)) for part in parts[:3]] + ["0"] * (3 - len(parts[:3]))
    build = "+" + ".".join(parts[3:]) if len(parts) > 3 else ""
    return ".".join(core) + build


def _string(value: str) -> dict[str, str]:
    """A string attribute, cut to the API's limit: an over-long product name must not void the slice."""
    return {"string": value[:MAX_ATTRIBUTE_VALUE_LENGTH]}


def device_attributes(
    gpu: GpuInfo, *, cores_ratio: int, memory_ratio: int, nri_mode: bool, pcie_root: str | None = None
) -> dict[str, dict[str, Any]]:
    """The device's attributes in the v1 JSON shape. Unqualified names belong to the driver's domain
    (CEL: `device.attributes["manager.nvidia.com"].type`); the PCI / NUMA ones are the standard names,
    so claims can align GPUs with NICs or CPUs of other drivers. Unknown values are left out.
    `nri_mode`: the mode the daemon runs in (true: NRI/lazy), published as `NRI_MODE_ATTRIBUTE`."""
    attributes: dict[str, dict[str, Any]] = {
        "type": _string("vgpu"),
        "uuid": _string(gpu.uuid.lower()),
        "minor": {"int": gpu.minor},
        "productName": _string(gpu.product_name),
        "brand": _string(gpu.brand),
        "architecture": _string(gpu.architecture),
    }
    if gpu.addressing_mode is not None:
        attributes["addressingMode"] = _string(gpu.addressing_mode)
    for name, raw in (
        ("cudaComputeCapability", gpu.compute_capability),
        ("driverVersion", gpu.driver_version),
        ("cudaDriverVersion", gpu.cuda_driver_version),
    ):
        if (version := semver(raw)) is not None:
            attributes[name] = {"version": version}
    attributes["coreRatio"] = {"int": cores_ratio}
    attributes["memoryRatio"] = {"int": memory_ratio}
    attributes[NRI_MODE_ATTRIBUTE] = {"bool": nri_mode}
    if BDF.fullmatch(gpu.pci_bus_id):
        attributes[PCI_BUS_ID_ATTRIBUTE] = _string(gpu.pci_bus_id)
    if pcie_root is not None:
        attributes[PCIE_ROOT_ATTRIBUTE] = _string(pcie_root)
    if gpu.numa_node is not None and gpu.numa_node >= 0:
        attributes[NUMA_NODE_ATTRIBUTE] = {"int": gpu.numa_node}
    return attributes


def _range_policy(*, default: int, low: int, high: int, step: int) -> dict[str, Any]:
    return {
        "default": str(default),
        "validRange": {"min": str(low), "max": str(high), "step": str(step)},
    }


def device_capacity(gpu: GpuInfo, *, cores_ratio: int, memory_ratio: int) -> dict[str, dict[str, Any]]:
    """`cores` and `memory`, consumable (the contract's request policies). Quantities are exact integer
    strings. The API requires default and max to lie on min + n*step, so for memory they are the value
    cut down to a whole MiB (equal to the value whenever the total is MiB-aligned, as NVML's are)."""
    if cores_ratio < 1 or memory_ratio < 1:
        raise ValueError(f"ratios must be >= 1 (cores {cores_ratio}, memory {memory_ratio})")
    max_cores = min(cores_ratio, 100)
    memory = gpu.memory_total * memory_ratio // 100
    max_memory = memory // MIB * MIB
    if max_memory < 2 * MIB:  # the API wants min + step <= value
        raise ValueError(f"GPU {gpu.uuid}: {memory} bytes of memory is too little to share in MiB steps")
    return {
        "cores": {
            "value": str(cores_ratio),
            "requestPolicy": _range_policy(default=max_cores, low=0, high=max_cores, step=1),
        },
        "memory": {
            "value": str(memory),
            "requestPolicy": _range_policy(default=max_memory, low=MIB, high=max_memory, step=MIB),
        },
    }


def build_slice(
    *,
    driver: str,
    node_name: str,
    node_uid: str,
    gpus: Sequence[GpuInfo],
    nri_mode: bool,
    cores_ratio: int = 100,
    memory_ratio: int = 100,
    generation: int = 1,
    pcie_roots: Mapping[str, str] | None = None,
    taints: Mapping[str, JsonObject] | None = None,
    left_out: Collection[str] = (),
) -> JsonObject:
    """The whole slice, owned by the Node (garbage-collected with it). `pcie_roots` maps a GPU's PCI bus
    id to its root complex (see `slices.read_pcie_roots`). `taints` maps a GPU UUID to the taint its device
    carries; the GPUs in `left_out` (UUIDs), and those vgpud does not share, are not published at all.
    `nri_mode` is the daemon's mode (`device_attributes`). No GPUs -> an empty slice, which still tells
    the scheduler that this node's pool exists and is empty."""
    roots = pcie_roots or {}
    taints = taints or {}
    devices = []
    for gpu in sorted(shared_gpus(gpus), key=lambda gpu: gpu.minor):
        if gpu.uuid in left_out:
            continue
        device: JsonObject = {
            "name": device_name(gpu),
            "attributes": device_attributes(
                gpu,
                cores_ratio=cores_ratio,
                memory_ratio=memory_ratio,
                nri_mode=nri_mode,
                pcie_root=roots.get(gpu.pci_bus_id),
            ),
            "capacity": device_capacity(gpu, cores_ratio=cores_ratio, memory_ratio=memory_ratio),
            "allowMultipleAllocations": True,
        }
        if gpu.uuid in taints:
            device["taints"] = [taints[gpu.uuid]]
        devices.append(device)
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": {
            "name": slice_name(node_name, driver),
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid, "controller": True}
            ],
        },
        "spec": {
            "driver": driver,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


# --- comparing what the server holds with what we publish -----------------------------------------


def _quantity(value: Any) -> Any:
    """A quantity as an exact number (vgpud.quantity): the server re-renders quantities ("1000" comes
    back as "1k"). Anything else (a bool too) is compared as it is."""
    try:
        return parse_quantity(value)
    except ValueError:
        return value


def _quantities(value: Any) -> Any:
    """Every leaf of a capacity entry as an exact number."""
    if isinstance(value, Mapping):
        return {k: _quantities(v) for k, v in value.items()}
    return _quantity(value)


def _taint_essence(taint: Mapping[str, Any]) -> dict[str, Any]:
    return {k: taint.get(k) for k in ("key", "value", "effect", "timeAdded")}


def essence(slice_: JsonObject) -> Any:
    """The fields we publish, and only those: the server adds metadata and may add defaults."""
    spec = slice_.get("spec") or {}
    devices = [
        {
            "name": device.get("name"),
            "attributes": device.get("attributes") or {},
            "capacity": _quantities(device.get("capacity") or {}),
            "allowMultipleAllocations": device.get("allowMultipleAllocations"),
            "taints": [_taint_essence(t) for t in device.get("taints") or []],
        }
        for device in spec.get("devices") or []
    ]
    pool = spec.get("pool") or {}
    return {
        "driver": spec.get("driver"),
        "nodeName": spec.get("nodeName"),
        "pool": {k: pool.get(k) for k in ("name", "generation", "resourceSliceCount")},
        "devices": devices,
    }


def same_slice(current: JsonObject, desired: JsonObject) -> bool:
    """True when the server's slice publishes what `desired` does (so no apply is needed); a taint
    added, changed or removed is a difference."""
    return essence(current) == essence(desired)


def has_taints(kept: Any) -> bool:
    """Whether a slice's `essence` has a tainted device."""
    return any(device["taints"] for device in kept["devices"])
