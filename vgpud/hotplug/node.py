"""The hot-plug API as a daemon component: the service with its real inputs, served on its socket, and
the reconcile loop that keeps the attachment table in line with the node.

The component needs the NRI plugin (lazy mode): the target containers, their cgroups and the
unsolicited UpdateContainers come from it. It runs under the supervisor like the others; it loads
the table, serves the root-only socket, and reconciles (`HotPlugService.reconcile`) once the runtime's
list has arrived, then whenever a container instance stops or goes, a claim's preparation changes, or
`RECONCILE_INTERVAL` passed (a missed event costs at most that long).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path, PurePosixPath

import trio

from vgpud.dra.claimindex import ClaimIndex
from vgpud.grpcserve import serve
from vgpud.hotplug.access import CgroupDeviceAccess, CgroupV1Devices, CgroupV2Devices, DeviceCgroup
from vgpud.hotplug.claims import slave_claims
from vgpud.hotplug.limits import ConfigLimits
from vgpud.hotplug.rules import Attachment, AttachState, KnownContainer
from vgpud.hotplug.service import HotPlugService
from vgpud.hotplug.store import HOTPLUG_FILE, AttachmentStore
from vgpud.hotplug.table import AttachmentTable
from vgpud.nri.hooks import NriHooks
from vgpud.nri.runtime_link import RuntimeLink
from vgpud.nri.targets import TargetContainer
from vgpud.recorder import Recorder

log = logging.getLogger("vgpud.hotplug")

#: the longest a reconcile waits for an event that may have been missed
RECONCILE_INTERVAL = 30.0
#: how often the start-up waits for the runtime's first complete list
SYNC_POLL = 0.2
CGROUP_MOUNT = Path("/sys/fs/cgroup")


class NoDeviceCgroup(Exception):
    """Neither a cgroup v1 devices hierarchy nor a cgroup v2 mount at the cgroup mount point."""


def device_cgroup(mount: Path = CGROUP_MOUNT) -> DeviceCgroup:
    """cgroup v1 (or hybrid) when the devices controller is mounted, else cgroup v2 (device programs)."""
    if (mount / "devices" / "devices.allow").exists():
        return CgroupV1Devices(mount)
    if (mount / "cgroup.controllers").exists():
        return CgroupV2Devices(mount)
    raise NoDeviceCgroup(
        f"{mount} holds neither a cgroup v1 devices hierarchy nor a cgroup v2 mount: the hot-plug cannot "
        "change a container's device access (mount the host's /sys/fs/cgroup read-write)"
    )


class HotPlug:
    """The component: `run` is what the supervisor starts; `poke` asks for a reconcile soon."""

    def __init__(self, service: HotPlugService, socket: Path) -> None:
        self.service = service
        self.socket = socket
        self._poked = trio.Event()

    def poke(self) -> None:
        """Reconcile soon (callable from any Trio task or synchronous listener of the Trio thread)."""
        self._poked.set()

    async def on_container_gone(self, container_id: str) -> None:
        if any(a.container_id == container_id for a in self.service.table.attachments.values()):
            self.poke()

    async def run(self, ready: Callable[[], None]) -> None:
        await self.service.table.load()
        async with trio.open_nursery() as nursery:
            await nursery.start(self._serve)
            nursery.start_soon(self._reconcile_loop)
            log.info(
                "hot-plug: serving %s; %d attachments recorded",
                self.socket,
                len(self.service.table.attachments),
            )
            ready()

    async def _serve(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await serve([self.service], path=self.socket, private=True, ready=lambda _: task_status.started())

    async def _reconcile_loop(self) -> None:
        """Reconcile, then wait for a poke; until the runtime's first list arrived, only briefly."""
        while True:
            await self.service.reconcile()
            with trio.move_on_after(RECONCILE_INTERVAL if self.service.targets.synced else SYNC_POLL):
                await self._poked.wait()
            self._poked = trio.Event()


class NriTargets:
    """The NRI plugin's containers as the hot-plug sees them: a vGPU container is one the plugin gave
    a directory (it is in the NRI cache)."""

    def __init__(self, nri: NriHooks) -> None:
        self.nri = nri

    @property
    def synced(self) -> bool:
        return self.nri.targets.synced

    def _known(self, found: TargetContainer | None) -> KnownContainer | None:
        if found is None:
            return None
        return replace(found.known(), vgpu=found.container_id in self.nri.cache)

    def container(self, pod_uid: str, container: str) -> KnownContainer | None:
        instance = self.nri.targets.container(pod_uid, container)
        return self._known(self.nri.targets.by_id(instance.container_id) if instance else None)

    def instance(self, container_id: str) -> KnownContainer | None:
        return self._known(self.nri.targets.by_id(container_id))

    def by_id(self, container_id: str) -> TargetContainer | None:
        return self.nri.targets.by_id(container_id)

    def directory(self, container_id: str) -> PurePosixPath | None:
        """The vGPU container's directory (None: not a vGPU container)."""
        entry = self.nri.cache.instance(container_id)
        return entry.directory if entry is not None else None


def build_hotplug(
    *,
    socket: Path,
    plugin_dir: Path,
    boot_id: str,
    nri: NriHooks,
    link: RuntimeLink,
    index: ClaimIndex,
    recorder: Recorder,
    cgroup: DeviceCgroup,
    cdi_root: Path,
    driver: str,
    uuid_of_minor: Mapping[int, str],
) -> HotPlug:
    """The component from the daemon's parts: the NRI plugin's containers and its link to the runtime,
    the claim index, and the node's devices cgroup."""
    table = AttachmentTable(AttachmentStore(plugin_dir / HOTPLUG_FILE, boot_id))

    def others(attachment: Attachment) -> list[Attachment]:
        return [
            a
            for a in table.attachments.values()
            if a.container_id == attachment.container_id
            and a.key != attachment.key
            and a.state is not AttachState.DETACHING
        ]

    targets = NriTargets(nri)
    access = CgroupDeviceAccess(
        targets=targets,
        runtime=link,
        cgroup=cgroup,
        limits=ConfigLimits(
            directory=targets.directory, cdi_root=cdi_root, driver=driver, uuid_of_minor=uuid_of_minor
        ),
        others=others,
    )
    service = HotPlugService(
        table=table,
        targets=targets,
        claims=partial(slave_claims, index),
        prepared=lambda uid: uid in index.prepared_claim_uids(),
        access=access,
        recorder=recorder,
    )
    component = HotPlug(service, socket)
    index.listeners.append(component.poke)
    nri.on_container_gone.append(component.on_container_gone)
    return component
