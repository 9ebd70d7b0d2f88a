"""CgroupDeviceAccess's steps: their order, what each is given, the rollback of a failed one, and what a
revoke keeps. The runtime link, the cgroup writer and the limits are recorders here (the cgroup writers
are tested on the real kernel in test_cgroup1dev / test_cgroup2dev, the link against the Go NRI
adaptation in the conformance suite)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pytest
import trio

from tests.unit.hotplug.world import CLAIMS, KEY
from vgpud.containers.values import DeviceRule
from vgpud.hotplug.access import STEP_CGROUP, STEP_LIMITS, STEP_LOOKUP, STEP_NRI, CgroupDeviceAccess
from vgpud.hotplug.devrules import char_rule
from vgpud.hotplug.rules import Attachment, SlaveClaim
from vgpud.hotplug.service import ApplyError

CID = "c" * 64
ATTACHMENT = Attachment(KEY, CID, "team", "trainer", CLAIMS, 1.0)
GPU0, CTL = char_rule(195, 0), char_rule(195, 255)
DENY_ALL = DeviceRule(False, "a", None, None, "rwm")


@dataclass(frozen=True)
class Target:
    running: bool = True
    cgroups_path: str = "/kubepods/besteffort/pod1/" + CID
    device_rules: tuple[DeviceRule, ...] = (DENY_ALL,)


@dataclass
class World:
    targets: dict[str, Target] = field(default_factory=lambda: {CID: Target()})
    log: list[tuple[str, ...]] = field(default_factory=list)
    fail: set[str] = field(default_factory=set)
    others: list[Attachment] = field(default_factory=list)

    def by_id(self, container_id: str) -> Target | None:
        return self.targets.get(container_id)

    def _step(self, name: str, *what: str) -> None:
        if name in self.fail:
            self.fail.discard(name)
            raise {"nri": RuntimeError, "cgroup": OSError}.get(name, ApplyError)(
                *((STEP_LIMITS, "limits refused") if name in ("extend", "shrink") else (f"{name} refused",))
            )
        self.log.append((name, *what))

    async def update_devices(self, container_id: str, rules: Sequence[DeviceRule], timeout: float) -> None:  # noqa: ASYNC109
        await trio.lowlevel.checkpoint()
        self._step("nri", container_id, *(("+" if r.allow else "-") + str(r) for r in rules))

    def grant(self, target: Target, granted: Sequence[DeviceRule], kept: Sequence[DeviceRule]) -> None:
        self._step("cgroup", "allow", *map(str, granted))

    def revoke(self, target: Target, revoked: Sequence[DeviceRule], kept: Sequence[DeviceRule]) -> None:
        self._step("cgroup", "deny", *map(str, revoked))

    async def extend(self, attachment: Attachment, target: Target) -> None:
        self._step("extend")

    async def shrink(self, attachment: Attachment, target: Target) -> None:
        self._step("shrink")

    def access(self) -> CgroupDeviceAccess:
        return CgroupDeviceAccess(
            targets=self,
            runtime=self,
            cgroup=self,
            limits=self,
            others=lambda a: self.others,
            proc_devices=str,
        )


async def test_grant_then_revoke() -> None:
    world = World()
    await world.access().grant(ATTACHMENT)
    await world.access().revoke(ATTACHMENT)
    assert world.log == [
        ("nri", CID, "+c 195:0 rw", "+c 195:255 rw"),
        ("cgroup", "allow", "c 195:0 rw", "c 195:255 rw"),
        ("extend",),
        ("shrink",),
        ("cgroup", "deny", "c 195:0 rw", "c 195:255 rw"),
        ("nri", CID, "-c 195:0 rw", "-c 195:255 rw"),
    ]


NRI_ALLOW = ("nri", CID, "+c 195:0 rw", "+c 195:255 rw")
NRI_DENY = ("nri", CID, "-c 195:0 rw", "-c 195:255 rw")
ALLOW = ("cgroup", "allow", "c 195:0 rw", "c 195:255 rw")
DENY = ("cgroup", "deny", "c 195:0 rw", "c 195:255 rw")


@pytest.mark.parametrize(
    ("failing", "step", "log"),
    [
        ("nri", STEP_NRI, []),
        ("cgroup", STEP_CGROUP, [NRI_ALLOW, NRI_DENY]),
        ("extend", STEP_LIMITS, [NRI_ALLOW, ALLOW, DENY, NRI_DENY]),
    ],
)
async def test_a_failed_grant_step_undoes_the_steps_before_it(failing: str, step: str, log: list) -> None:
    world = World(fail={failing})
    with pytest.raises(ApplyError) as info:
        await world.access().grant(ATTACHMENT)
    assert info.value.step == step
    assert world.log == log


async def test_a_failed_revoke_of_the_cgroup_puts_the_limits_back() -> None:
    world = World(fail={"cgroup"})
    with pytest.raises(ApplyError) as info:
        await world.access().revoke(ATTACHMENT)
    assert info.value.step == STEP_CGROUP
    assert world.log == [("shrink",), ("extend",)]


async def test_a_revoke_keeps_the_containers_own_rules_and_other_attachments_rules() -> None:
    own_ctl = World(targets={CID: Target(device_rules=(DENY_ALL, char_rule(195, 255, "rwm")))})
    await own_ctl.access().revoke(ATTACHMENT)
    assert ("cgroup", "deny", "c 195:0 rw") in own_ctl.log  # its own /dev/nvidiactl stays

    other = replace(ATTACHMENT, claims=(SlaveClaim("team", "b", "u2", ("vgpu-0",)),))
    shared = World(others=[other])
    await shared.access().revoke(ATTACHMENT)
    assert ("cgroup", "deny") in shared.log  # nothing to deny: the other attachment needs both rules


async def test_a_gone_target() -> None:
    world = World(targets={})
    with pytest.raises(ApplyError) as info:
        await world.access().grant(ATTACHMENT)
    assert info.value.step == STEP_LOOKUP and "no longer runs" in str(info.value)
    await world.access().revoke(ATTACHMENT)  # nothing to revoke: its cgroup is gone
    assert world.log == []


async def test_a_device_of_another_driver_is_refused() -> None:
    bad = replace(ATTACHMENT, claims=(SlaveClaim("team", "x", "u", ("gpu-0",)),))
    with pytest.raises(ApplyError, match="'gpu-0' is not a vGPU device of this driver"):
        await World().access().grant(bad)


def test_rules_of_an_attachment() -> None:
    assert World().access().rules(ATTACHMENT) == (GPU0, CTL)
