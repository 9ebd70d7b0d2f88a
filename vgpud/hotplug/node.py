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
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from pathlib import Path, PurePosixPath

import trio

from vgpud.containers.store import ContainerStore
from vgpud.dra.claimindex import ClaimIndex
from vgpud.grpcserve import serve
from vgpud.hotplug.access import (
    CgroupDeviceAccess,
    CgroupV1Devices,
    CgroupV2Devices,
    DeviceCgroup,
    RuntimeUpdates,
)
from vgpud.hotplug.claims import slave_claims
from vgpud.hotplug.limits import ConfigLimits
from vgpud.hotplug.rules import Attachment, AttachState
from vgpud.hotplug.service import HotPlugService
from vgpud.hotplug.store import HOTPLUG_FILE, AttachmentStore
from vgpud.hotplug.table import AttachmentTable
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


def vgpu_directory(containers: ContainerStore, container_id: str) -> PurePosixPath | None:
    """The vGPU container's directory (None: not a vGPU container of this node)."""
    record = containers.by_id(container_id)
    return record.directory if record is not None and record.vgpu else None


def build_hotplug(
    *,
    socket: Path,
    plugin_dir: Path,
    boot_id: str,
    containers: ContainerStore,
    gone_listeners: list[Callable[[str], Awaitable[None]]],
    link: RuntimeUpdates,
    index: ClaimIndex,
    recorder: Recorder,
    cgroup: DeviceCgroup,
    cdi_root: Path,
    driver: str,
    uuid_of_minor: Mapping[int, str],
) -> HotPlug:
    """The component from the daemon's parts: the node's containers (the NRI plugin writes them and
    tells `gone_listeners` when an instance stops or goes), its link to the runtime, the claim index,
    and the node's devices cgroup."""
    table = AttachmentTable(AttachmentStore(plugin_dir / HOTPLUG_FILE, boot_id))

    def others(attachment: Attachment) -> list[Attachment]:
        return [
            a
            for a in table.attachments.values()
            if a.container_id == attachment.container_id
            and a.key != attachment.key
            and a.state is not AttachState.DETACHING
        ]

    access = CgroupDeviceAccess(
        targets=containers,
        runtime=link,
        cgroup=cgroup,
        limits=ConfigLimits(
            directory=partial(vgpu_directory, containers),
            cdi_root=cdi_root,
            driver=driver,
            uuid_of_minor=uuid_of_minor,
        ),
        others=others,
    )
    service = HotPlugService(
        table=table,
        targets=containers,
        claims=partial(slave_claims, index),
        prepared=lambda uid: uid in index.prepared_claim_uids(),
        access=access,
        recorder=recorder,
    )
    component = HotPlug(service, socket)
    index.listeners.append(component.poke)
    gone_listeners.append(component.on_container_gone)
    return component
