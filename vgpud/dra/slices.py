"""The node's ResourceSlice on the API server: `SliceKeeper` publishes the slice that
`vgpud.dra.slicebuild` builds and keeps it; and the PCIe roots it carries, read from sysfs.

Kubelet deletes every slice of its node when it starts, and a driver's slices 30 s after the driver
loses its last endpoint (dra-kubelet-plugin.md §1): publishing once is not enough, so `SliceKeeper`
watches the slice and puts it back. The slice has a fixed name, because server-side apply needs one.

Device health (`NVMLDeviceHealthCheck`): a GPU the health board calls unhealthy gets a device taint
(`slicebuild.unhealthy_taint`). A server that drops the taint field (DRADeviceTaints off) is noticed on
the apply, and sick devices are then left out of the slice instead (docs/decisions.md "Sick devices are
tainted, or left out of the slice").

A GPU vgpud does not share (`vgpud.gpu.exclusion`: one in MIG mode) is never in the slice; the keeper
logs a WARNING for each once, at its first session (the GPUs are read once, when vgpud starts).
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import trio

from vgpud import excgroup
from vgpud.dra.slicebuild import (
    BDF,
    build_slice,
    device_names,
    essence,
    has_taints,
    same_slice,
    slice_name,
    taint_value,
    unhealthy_taint,
)
from vgpud.gpu.exclusion import DECISIONS, excluded_gpus, shared_gpus
from vgpud.gpu.health import HealthBoard
from vgpud.gpu.model import GpuInfo
from vgpud.kube import JsonObject, KubeApi, NotFound, WatchEvent, WatchEventType
from vgpud.logs import fields

log = logging.getLogger("vgpud.dra.slices")

#: at least this long between two watch starts, so a watch that ends at once cannot spin
WATCH_MIN_INTERVAL = 1.0
#: how many of our own writes' resourceVersions are remembered, to know their (late) watch events
OWN_VERSIONS_KEPT = 16


class SliceError(Exception):
    """The slice cannot be published (its owner Node is missing); the supervisor retries the session."""


# --- the PCIe roots, from sysfs -------------------------------------------------------------------


def read_pcie_root(pci_bus_id: str, sysfs: Path = Path("/sys")) -> str | None:
    """`pci<domain>:<bus>` above a PCI device, as deviceattribute reads it: the first element under
    <sysfs>/devices of where <sysfs>/bus/pci/devices/<bdf> points. None when sysfs does not know the
    device (a mock GPU) or the link looks wrong. Blocking: call it from a worker thread."""
    if not BDF.fullmatch(pci_bus_id):
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


# --- the keeper -----------------------------------------------------------------------------------


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
        self._exclusions_logged = False
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
        self._log_exclusions()
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
        with excgroup.single_error_unwrapped():
            async with trio.open_nursery() as nursery:
                await self._session(nursery, ready)

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

    def _log_exclusions(self) -> None:
        """A WARNING for each GPU left out of the slice, once per process: not at every session."""
        if self._exclusions_logged:
            return
        self._exclusions_logged = True
        excluded = excluded_gpus(self._gpus)
        for gpu in sorted(self._gpus, key=lambda gpu: gpu.index):
            why = excluded.get(gpu.uuid)
            if why is not None:
                log.warning(
                    'GPU %s (index %d) left out of the ResourceSlice: %s (see docs/decisions.md, "%s")',
                    gpu.uuid,
                    gpu.index,
                    why.detail,
                    DECISIONS[why.reason],
                    extra=fields(gpu=gpu.uuid),
                )

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
        self._expected = essence(self._desired)

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
        names = device_names(shared_gpus(self._gpus))
        sick = sorted(
            (h for h in self._health.unhealthy().values() if h.uuid in names), key=lambda h: names[h.uuid]
        )
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
        elif essence(ours) != self._expected:
            await self._apply("changed by someone: restored")

    async def _on_event(self, event: WatchEvent) -> None:
        name = _name_of(event.object)
        if name == self.name:
            if event.type is WatchEventType.DELETED:
                await self._apply("deleted by someone: re-created")
            elif _version_of(event.object) in self._own_versions:
                pass  # our own write (maybe one a later apply of ours has superseded already)
            elif essence(event.object) != self._expected:
                await self._apply("changed by someone: restored")
        elif event.type is not WatchEventType.DELETED and self._in_pool(event.object):
            await self._delete_stale(name)

    async def _apply(self, what: str | Callable[[], str], *, repair: bool = True) -> None:
        """Apply, and from then on expect what the server made of it: a server that drops fields (an
        older one, or DRAConsumableCapacity off) must not make every event look like a change. One
        that drops the device taints switches to leaving sick devices out, and gets that at once.
        `what` (or what it returns, once applied) says why, for the log."""
        sent = essence(self._desired)
        served = await self._send()
        if has_taints(sent) and not has_taints(served):
            self.leaves_out_sick = True
            log.warning(
                "ResourceSlice %s: the API server drops device taints (is the DRADeviceTaints feature "
                "gate on?): unhealthy devices are left out of the slice instead",
                self.name,
            )
            self._set_desired(_generation_of(self._desired) + 1)
            sent = essence(self._desired)
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
        return essence(served)

    async def _delete_stale(self, name: str) -> None:
        await self._kube.delete_resource_slice(name)
        if self._serving:
            self.repairs += 1
        log.info("ResourceSlice %s of driver %s on this node has a stale name: deleted", name, self.driver)
