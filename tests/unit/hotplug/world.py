"""Shared values for the hot-plug tests: pod UIDs, a running target container, slave claims, and the
service's two inputs from its caller: the runtime's containers (`Targets`) and the device step (`Access`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePosixPath

import trio

from vgpud.containers.record import Injection, NodeContainer
from vgpud.hotplug.rules import AttachKey, Attachment, SlaveClaim
from vgpud.hotplug.service import ApplyError

TARGET = "11111111-2222-3333-4444-555555555555"
SLAVE = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
OTHER_SLAVE = "aaaaaaaa-bbbb-cccc-dddd-ffffffffffff"
CLAIM = "cccccccc-0000-0000-0000-000000000001"
#: the target pod's own vGPU claim (the one vgpud injected its container with)
TARGET_CLAIM = "cccccccc-0000-0000-0000-0000000000ff"
KEY = AttachKey(TARGET, "app", SLAVE)
#: a running vGPU container of this node (vgpud injected it: it has its directory)
RUNNING = NodeContainer(
    "c" * 64,
    TARGET,
    "app",
    "team",
    "trainer",
    running=True,
    pid=4242,
    claim_uid=TARGET_CLAIM,
    injection=Injection.INJECTED,
    directory=PurePosixPath(f"/var/lib/vgpu-manager/claims/{TARGET_CLAIM}/{TARGET}_app"),
)
CLAIMS = (SlaveClaim("team", "slave-gpu", CLAIM, ("vgpu-0",), frozenset({SLAVE})),)


@dataclass
class Targets:
    """What the NRI plugin reported: (pod UID, container) -> instance."""

    synced: bool = True
    known: dict[tuple[str, str], NodeContainer] = field(default_factory=dict)

    def newest(self, pod_uid: str, name: str) -> NodeContainer | None:
        return self.known.get((pod_uid, name))

    def by_id(self, container_id: str) -> NodeContainer | None:
        return next((c for c in self.known.values() if c.container_id == container_id), None)


@dataclass
class Access:
    """Records grants and revokes in order; `fail` makes the named operation fail once."""

    log: list[tuple[str, str]] = field(default_factory=list)
    fail: set[str] = field(default_factory=set)

    async def grant(self, attachment: Attachment) -> None:
        await self._do("grant", attachment)

    async def revoke(self, attachment: Attachment) -> None:
        await self._do("revoke", attachment)

    async def _do(self, what: str, attachment: Attachment) -> None:
        await trio.lowlevel.checkpoint()
        if what in self.fail:
            self.fail.discard(what)
            raise ApplyError("device cgroup rule", f"{what} refused by the test")
        self.log.append((what, attachment.container_id))
