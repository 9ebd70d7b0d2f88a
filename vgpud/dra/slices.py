"""The node's ResourceSlice: a pure builder, and `SliceKeeper`, which publishes the slice and keeps it.

One slice per node (pool = node name, `resourceSliceCount: 1`), one device per physical GPU, named
`vgpu-<minor>` and shared through consumable capacity (vgpu-manager-contracts.md "ResourceSlice").
Attribute names and formats follow the Go reference system, which uses NVIDIA's go-nvlib names and the
standard attributes of `k8s.io/dynamic-resource-allocation/deviceattribute`:

- `resource.kubernetes.io/pciBusID`: lower-case extended BDF, "0000:07:00.0";
- `resource.kubernetes.io/pcieRoot`: "pci<domain>:<bus>" of the root complex, read from sysfs (the
  first element under /sys/devices of the device's /sys/bus/pci/devices link);
- `resource.kubernetes.io/numaNode`: an int, only when the platform reports NUMA affinity.

In the driver's own domain (unqualified names) besides the GPU's facts: `coreRatio` and `memoryRatio`
(the oversubscription settings), and `NRI_MODE_ATTRIBUTE` (`nriMode`, a bool): true when the daemon
runs NRI (lazy) mode, false in eager mode, including an NRI start that fell back to eager. Claims that
need NRI select on it (`vgpud.relaxations`); a restart in the other mode republishes the slice with
the new value (the slice differs, so it is applied with the next pool generation).

Kubelet deletes every slice of its node when it starts, and a driver's slices 30 s after the driver
loses its last endpoint (dra-kubelet-plugin.md §1): publishing once is not enough, so `SliceKeeper`
watches the slice and puts it back. The slice has a fixed name, because server-side apply needs one.

Device health (`NVMLDeviceHealthCheck`): a GPU the health board calls unhealthy gets a device taint
`<driver>/unhealthy=<why>:NoSchedule`, so the scheduler places no new claim on it while the pods
already there keep it (their status tells them, through the kubelet's health stream). A server that
drops the taint field (DRADeviceTaints off) is noticed on the apply, and sick devices are then left
out of the slice instead (docs/decisions.md "Sick devices are tainted, or left out of the slice").
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio

from vgpud import excgroup
from vgpud.gpu.health import DeviceHealth, HealthBoard
from vgpud.gpu.model import GpuInfo
from vgpud.kube import RESOURCE_API, JsonObject, KubeApi, NotFound, WatchEvent, WatchEventType
from vgpud.quantity import parse_quantity
from vgpud.relaxations import NRI_MODE_ATTRIBUTE

log = logging.getLogger("vgpud.dra.slices")

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
#: at least this long between two watch starts, so a watch that ends at once cannot spin
WATCH_MIN_INTERVAL = 1.0
#: how many of our own writes' resourceVersions are remembered, to know their (late) watch events
OWN_VERSIONS_KEPT = 16

_BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9a-f]")  # deviceattribute's check
_NOT_IN_LABEL_VALUE = re.compile(r"[^a-z0-9._-]+")


class SliceError(Exception):
    """The slice cannot be published (its owner Node is missing); the supervisor retries the session."""


# --- the pure builder ---------------------------------------------------------------------------


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
    if _BDF.fullmatch(gpu.pci_bus_id):
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
    id to its root complex (see `read_pcie_roots`). `taints` maps a GPU UUID to the taint its device
    carries; the GPUs in `left_out` (UUIDs) are not published at all. `nri_mode` is the daemon's mode
    (`device_attributes`). No GPUs -> an empty slice, which still tells the scheduler that this node's
    pool exists and is empty."""
    roots = pcie_roots or {}
    taints = taints or {}
    devices = []
    for gpu in sorted(gpus, key=lambda gpu: gpu.minor):
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


def read_pcie_root(pci_bus_id: str, sysfs: Path = Path("/sys")) -> str | None:
    """`pci<domain>:<bus>` above a PCI device, as deviceattribute reads it: the first element under
    <sysfs>/devices of where <sysfs>/bus/pci/devices/<bdf> points. None when sysfs does not know the
    device (a mock GPU) or the link looks wrong. Blocking: call it from a worker thread."""
    if not _BDF.fullmatch(pci_bus_id):
        return None
    link = sysfs / "bus" / "pci" / "devices" / pci_bus_id
    try:
        target = Path(os.path.normpath(link.parent / os.readlink(link)))
    except OSError:
        return None
    devices = sysfs / "devices"
    if target.name != pci_bus_id or not target.is_relative_to(devices):
        return None
    root = target.relative_to(devices).parts[0]
    return root if root.startswith("pci") else None


def read_pcie_roots(gpus: Sequence[GpuInfo], sysfs: Path = Path("/sys")) -> dict[str, str]:
    """`read_pcie_root` for every GPU that has one, keyed by PCI bus id (what `build_slice` takes)."""
    return {gpu.pci_bus_id: root for gpu in gpus if (root := read_pcie_root(gpu.pci_bus_id, sysfs))}


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


def _essence(slice_: JsonObject) -> Any:
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
    return _essence(current) == _essence(desired)


def _has_taints(essence: Any) -> bool:
    return any(device["taints"] for device in essence["devices"])


# --- the keeper ---------------------------------------------------------------------------------


def _name_of(slice_: JsonObject) -> str:
    return str((slice_.get("metadata") or {}).get("name", ""))


def _version_of(slice_: JsonObject) -> str:
    return str((slice_.get("metadata") or {}).get("resourceVersion", ""))


def _generation_of(slice_: JsonObject) -> int:
    generation = ((slice_.get("spec") or {}).get("pool") or {}).get("generation", 0)
    return generation if isinstance(generation, int) else 0


class SliceKeeper:
    """Supervised component: publishes this node's slice and keeps it published.

    A session: read the Node (the slice's owner), open the watch, list and reconcile (apply ours when it
    is missing or differs, delete every other slice of this driver on this node), call `ready()`, then
    repair on each event: ours deleted or changed -> apply again; another slice of ours appears ->
    delete it. Watching first and listing second leaves no window in which a deletion goes unseen. An
    event that shows our own apply compares equal and is ignored, so applies cannot feed on themselves.
    When the watch ends, and every `resync_interval`, it lists and reconciles again. API errors end the
    session: the supervisor's Restart backoff is the retry.

    With a health board (`health`, the NVMLDeviceHealthCheck gate), the slice follows it: each change
    republishes with a new pool generation, a sick device tainted (or left out, on a server that drops
    taints). Without one, no device is ever tainted.

    The pool generation starts one above any generation found on the server when what is there differs
    from what this session publishes, so consumers can tell the new pool contents from leftovers.
    """

    def __init__(
        self,
        kube: KubeApi,
        *,
        driver: str,
        node_name: str,
        gpus: Sequence[GpuInfo],
        cores_ratio: int,
        memory_ratio: int,
        nri_mode: bool,
        field_manager: str = "vgpud",
        resync_interval: float = 300.0,
        sysfs: Path | None = Path("/sys"),
        health: HealthBoard | None = None,
    ) -> None:
        """`sysfs` is where PCIe roots are read; None publishes none (mock GPUs have no sysfs entry).
        `nri_mode`: the partition mode this process decided at start (true: NRI/lazy; an NRI start
        that fell back to eager is false), published on every device."""
        self._kube = kube
        self.driver = driver
        self.node_name = node_name
        self._gpus = tuple(gpus)
        self._cores_ratio = cores_ratio
        self._memory_ratio = memory_ratio
        self._nri_mode = nri_mode
        self._field_manager = field_manager
        self._resync_interval = resync_interval
        self._sysfs = sysfs
        self._health = health
        self.name = slice_name(node_name, driver)
        #: repairs done after a session became ready (re-applies and stale deletions), for metrics
        self.repairs = 0
        #: the server dropped the device taints: sick devices are left out of the slice instead
        self.leaves_out_sick = False
        self._desired: JsonObject = {}
        self._expected: Any = None  # the essence of our slice as the server keeps it
        self._serving = False
        self._build: Callable[[int], JsonObject] = lambda generation: {}
        self._health_seen = 0  # the board's version that `_desired` shows
        #: the resourceVersions our last applies got: their watch events are not someone's change
        self._own_versions: deque[str] = deque(maxlen=OWN_VERSIONS_KEPT)
        # the watch and the health follower both apply: one at a time, each with a consistent view
        self._lock = trio.Lock()

    async def run(self, ready: Callable[[], None]) -> None:
        """One session (see the class); returns only by cancellation, raises on any API error."""
        self._serving = False
        try:
            node = await self._kube.get_node(self.node_name)
        except NotFound as err:
            raise SliceError(
                f"node {self.node_name!r} does not exist, and it must own the ResourceSlice: "
                "is the node name right?"
            ) from err
        node_uid = str(node["metadata"]["uid"])
        roots: dict[str, str] = {}
        if self._sysfs is not None:
            roots = await trio.to_thread.run_sync(read_pcie_roots, self._gpus, self._sysfs)

        def desired(generation: int) -> JsonObject:
            taints, left_out = self._health_edits()
            return build_slice(
                driver=self.driver,
                node_name=self.node_name,
                node_uid=node_uid,
                gpus=self._gpus,
                nri_mode=self._nri_mode,
                cores_ratio=self._cores_ratio,
                memory_ratio=self._memory_ratio,
                generation=generation,
                pcie_roots=roots,
                taints=taints,
                left_out=left_out,
            )

        self._build = desired
        try:
            async with trio.open_nursery() as nursery:
                await self._session(nursery, ready)
        except BaseExceptionGroup as group:
            # the session's own error as it was, not wrapped: callers and tests catch KubeError
            errors = [e for e in excgroup.leaves(group) if not isinstance(e, trio.Cancelled)]
            if len(errors) == 1:
                raise errors[0] from errors[0].__cause__
            raise

    async def _session(self, nursery: trio.Nursery, ready: Callable[[], None]) -> None:
        first = True
        while True:
            started = trio.current_time()
            with trio.move_on_after(self._resync_interval):
                async with self._kube.watch_resource_slices(
                    driver=self.driver, node_name=self.node_name
                ) as events:
                    existing = await self._kube.list_resource_slices(
                        driver=self.driver, node_name=self.node_name
                    )
                    async with self._lock:
                        if first:
                            self._set_desired(self._first_generation(existing, self._build))
                        await self._reconcile(existing)
                    if first:
                        first = False
                        self._serving = True
                        devices = len(self._desired["spec"]["devices"])
                        log.info("ResourceSlice %s published: %d devices", self.name, devices)
                        ready()
                        if self._health is not None:
                            nursery.start_soon(self._follow_health, self._health)
                    async for event in events:
                        async with self._lock:
                            await self._on_event(event)
            await trio.sleep_until(started + WATCH_MIN_INTERVAL)

    def _health_edits(self) -> tuple[dict[str, JsonObject], set[str]]:
        """The taints of the sick GPUs by UUID, or (after the server dropped taints) the sick UUIDs to
        leave out; the board's version is recorded as the one the slice now shows."""
        if self._health is None:
            return {}, set()
        self._health_seen = self._health.version
        sick = self._health.unhealthy()
        if self.leaves_out_sick:
            return {}, set(sick)
        return {uuid: unhealthy_taint(self.driver, health) for uuid, health in sick.items()}, set()

    def _set_desired(self, generation: int) -> None:
        self._desired = self._build(generation)
        self._expected = _essence(self._desired)

    async def _follow_health(self, board: HealthBoard) -> None:
        """Republish on every board change that changes the slice, with the next pool generation."""
        while True:
            await board.wait_changed(self._health_seen)
            async with self._lock:
                before = self._desired
                generation = _generation_of(before)
                if same_slice(before, self._build(generation)):
                    continue  # a change of reason that the taint does not show
                self._set_desired(generation + 1)
                await self._apply(lambda: f"device health changed: {self._describe_sick()}", repair=False)

    def _describe_sick(self) -> str:
        """For the log: "vgpu-0 tainted xid-79", "vgpu-0 left out (xid-79)" or "every device healthy"."""
        assert self._health is not None
        names = device_names(self._gpus)
        sick = sorted(self._health.unhealthy().values(), key=lambda h: names[h.uuid])
        if not sick:
            return "every device healthy"
        if self.leaves_out_sick:
            return ", ".join(f"{names[h.uuid]} left out ({taint_value(h)})" for h in sick)
        return ", ".join(f"{names[h.uuid]} tainted {taint_value(h)}" for h in sick)

    def _first_generation(self, existing: Sequence[JsonObject], desired: Callable[[int], JsonObject]) -> int:
        """Keep the generation on the server when it already holds exactly our slice; else go above it."""
        ours = [s for s in existing if self._in_pool(s)]
        if len(ours) == 1 and _name_of(ours[0]) == self.name:
            generation = _generation_of(ours[0])
            if same_slice(ours[0], desired(generation)):
                return generation
        return max((_generation_of(s) for s in ours), default=0) + 1

    def _in_pool(self, slice_: JsonObject) -> bool:
        """A slice of this driver on this node; the watch filters already, this guards deletions."""
        spec = slice_.get("spec") or {}
        return spec.get("driver") == self.driver and spec.get("nodeName") == self.node_name

    async def _reconcile(self, existing: Sequence[JsonObject]) -> None:
        ours = None
        for slice_ in existing:
            if _name_of(slice_) == self.name:
                ours = slice_
            elif self._in_pool(slice_):
                await self._delete_stale(_name_of(slice_))
        if ours is None:
            await self._apply("missing: created")
        elif _essence(ours) != self._expected:
            await self._apply("changed by someone: restored")

    async def _on_event(self, event: WatchEvent) -> None:
        name = _name_of(event.object)
        if name == self.name:
            if event.type is WatchEventType.DELETED:
                await self._apply("deleted by someone: re-created")
            elif _version_of(event.object) in self._own_versions:
                pass  # our own write (maybe one a later apply of ours has superseded already)
            elif _essence(event.object) != self._expected:
                await self._apply("changed by someone: restored")
        elif event.type is not WatchEventType.DELETED and self._in_pool(event.object):
            await self._delete_stale(name)

    async def _apply(self, what: str | Callable[[], str], *, repair: bool = True) -> None:
        """Apply, and from then on expect what the server made of it: a server that drops fields (an
        older one, or DRAConsumableCapacity off) must not make every event look like a change. One
        that drops the device taints switches to leaving sick devices out, and gets that at once.
        `what` (or what it returns, once applied) says why, for the log."""
        sent = _essence(self._desired)
        served = await self._send()
        if _has_taints(sent) and not _has_taints(served):
            self.leaves_out_sick = True
            log.warning(
                "ResourceSlice %s: the API server drops device taints (is the DRADeviceTaints feature "
                "gate on?): unhealthy devices are left out of the slice instead",
                self.name,
            )
            self._set_desired(_generation_of(self._desired) + 1)
            sent = _essence(self._desired)
            served = await self._send()
        if served not in (self._expected, sent):
            log.warning(
                "ResourceSlice %s: the API server does not keep it as sent (is the DRAConsumableCapacity "
                "feature gate on?): vGPU sharing will not work",
                self.name,
            )
        self._expected = served
        if self._serving:
            if repair:
                self.repairs += 1
            log.info("ResourceSlice %s %s", self.name, what if isinstance(what, str) else what())

    async def _send(self) -> Any:
        """Apply the desired slice; the essence of what the server keeps."""
        served = await self._kube.apply_resource_slice(self._desired, field_manager=self._field_manager)
        self._own_versions.append(_version_of(served))
        return _essence(served)

    async def _delete_stale(self, name: str) -> None:
        await self._kube.delete_resource_slice(name)
        if self._serving:
            self.repairs += 1
        log.info("ResourceSlice %s of driver %s on this node has a stale name: deleted", name, self.driver)
