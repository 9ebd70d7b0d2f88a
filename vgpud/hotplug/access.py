"""`CgroupDeviceAccess`: what Attach and Detach change on the node, step by step.

For an attachment the service asks to grant, on the target container instance the runtime reported:

1. `NRI UpdateContainers`: the device cgroup rules of the slave claim's GPUs (`devrules.gpu_rules`),
   sent to the runtime as an unsolicited update, the standard path. containerd 1.7 and 2.x accept it
   and report success, but drop device rules on the way to the OCI runtime (docs/decisions.md;
   docs/hotplug.md has the evidence), so:
2. `device cgroup`: the same rules put into the container's cgroup directly: cgroup v1 `devices.allow`,
   cgroup v2 a device program holding the container's own rules plus the granted ones
   (`cgroup2dev.replace_device_filter`).
3. `vgpu.config`: the slave's device limits added to the target's vgpu.config when it has one.

A failed step undoes the steps before it and raises `ApplyError` naming itself. A revoke takes back
only what no other attachment of the same instance needs and the container's own rules do not allow
(a target that holds a vGPU of its own keeps `/dev/nvidiactl`). A target instance that no longer runs
needs no revoke: its cgroup went with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol

import trio

from vgpud.containers.values import DeviceRule
from vgpud.dra.claimedits import device_minor
from vgpud.hotplug import cgroup1dev
from vgpud.hotplug.cgpath import CgroupPathError, cgroup_dir
from vgpud.hotplug.cgroup2dev import DeviceFilterError, replace_device_filter
from vgpud.hotplug.devfilter import check_rule, verdict
from vgpud.hotplug.devrules import container_rules, gpu_rules
from vgpud.hotplug.rules import Attachment
from vgpud.hotplug.service import ApplyError

log = logging.getLogger("vgpud.hotplug")

STEP_LOOKUP = "target lookup"
STEP_NRI = "NRI UpdateContainers"
STEP_CGROUP = "device cgroup"
STEP_LIMITS = "vgpu.config"
PROC_DEVICES = Path("/proc/devices")
#: how long the runtime may take to answer an UpdateContainers (its own request timeout is 2 s)
NRI_UPDATE_TIMEOUT = 5.0
#: what a device cgroup step raises when it cannot change the cgroup (the cgroup is then unchanged)
CGROUP_ERRORS = (OSError, cgroup1dev.DeviceCgroupError, DeviceFilterError, CgroupPathError)


class Target(Protocol):
    """A container instance as the NRI plugin keeps it (`vgpud.containers.record.NodeContainer`)."""

    @property
    def running(self) -> bool: ...
    @property
    def cgroups_path(self) -> str: ...
    @property
    def device_rules(self) -> tuple[DeviceRule, ...]: ...


class Targets(Protocol):
    def by_id(self, container_id: str) -> Target | None: ...


class RuntimeUpdates(Protocol):
    """The NRI plugin's unsolicited calls to the runtime (`vgpud.nri.runtime_link.RuntimeLink`)."""

    async def update_devices(
        self,
        container_id: str,
        rules: Sequence[DeviceRule],
        timeout: float,  # noqa: ASYNC109 (the link's own deadline, like NRI's request timeout)
    ) -> None:
        """Raises when the runtime refuses, does not answer in time, or is not connected."""
        ...


class DeviceCgroup(Protocol):
    """Puts a container's device rules into its cgroup (v1 or v2); blocking, run in a thread."""

    def grant(self, target: Target, granted: Sequence[DeviceRule], kept: Sequence[DeviceRule]) -> None:
        """Allow `granted`; `kept`: the rules of the instance's other attachments."""
        ...

    def revoke(self, target: Target, revoked: Sequence[DeviceRule], kept: Sequence[DeviceRule]) -> None:
        """Take `revoked` back, keeping the container's own rules and `kept`."""
        ...


class TargetLimits(Protocol):
    """The slave's device limits in the target's vgpu.config."""

    async def extend(self, attachment: Attachment, target: Target) -> None: ...
    async def shrink(self, attachment: Attachment, target: Target) -> None: ...


def attachment_minors(attachment: Attachment) -> list[int]:
    """The GPU minors of the slave claims' devices (`vgpu-<minor>`); ApplyError for another name."""
    minors = []
    for claim in attachment.claims:
        for device in claim.devices:
            minor = device_minor(device)
            if minor is None:
                raise ApplyError(
                    STEP_LOOKUP, f"{claim}: device {device!r} is not a vGPU device of this driver"
                )
            minors.append(minor)
    return minors


def _valid(rule: DeviceRule) -> bool:
    """A rule the kernel could be given; others (an empty access) are logged and left out."""
    try:
        check_rule(rule)
    except ValueError as err:
        log.warning("hot-plug: the container's own %s", err)
        return False
    return True


def read_proc_devices(path: Path = PROC_DEVICES) -> str:
    try:
        return path.read_text()
    except OSError as err:
        log.warning(
            "hot-plug: cannot read %s (%s): the unified-memory nodes are left out", path, err.strerror
        )
        return ""


class CgroupDeviceAccess:
    def __init__(
        self,
        *,
        targets: Targets,
        runtime: RuntimeUpdates,
        cgroup: DeviceCgroup,
        limits: TargetLimits,
        others: Callable[[Attachment], Iterable[Attachment]],
        proc_devices: Callable[[], str] = read_proc_devices,
    ) -> None:
        """`others(a)`: the attachments of a's container instance besides a (their rules are kept)."""
        self.targets = targets
        self.runtime = runtime
        self.cgroup = cgroup
        self.limits = limits
        self.others = others
        self.proc_devices = proc_devices

    def rules(self, attachment: Attachment) -> tuple[DeviceRule, ...]:
        return gpu_rules(attachment_minors(attachment), self.proc_devices())

    def _kept(self, attachment: Attachment) -> list[DeviceRule]:
        return sorted({r for other in self.others(attachment) for r in self.rules(other)})

    def _target(self, attachment: Attachment) -> Target:
        target = self.targets.by_id(attachment.container_id)
        if target is None or not target.running:
            raise ApplyError(STEP_LOOKUP, f"container instance {attachment.container_id} no longer runs")
        return target

    async def grant(self, attachment: Attachment) -> None:
        target = self._target(attachment)
        rules, kept = self.rules(attachment), self._kept(attachment)
        await self._nri(attachment.container_id, rules)
        try:
            await trio.to_thread.run_sync(self.cgroup.grant, target, rules, kept)
        except CGROUP_ERRORS as err:
            await self._nri_undo(attachment.container_id, rules)
            raise ApplyError(STEP_CGROUP, str(err)) from None
        try:
            await self.limits.extend(attachment, target)
        except ApplyError as err:
            try:
                revocable = self._revocable(target, rules, kept)
                await trio.to_thread.run_sync(self.cgroup.revoke, target, revocable, kept)
            except CGROUP_ERRORS as undo:
                raise ApplyError(
                    err.step, f"{err}; taking the device rules back failed too: {undo}"
                ) from None
            await self._nri_undo(attachment.container_id, rules)
            raise

    async def revoke(self, attachment: Attachment) -> None:
        target = self.targets.by_id(attachment.container_id)
        if target is None or not target.running:
            log.info(
                "hot-plug: %s: instance %s no longer runs: nothing to revoke",
                attachment.key,
                attachment.container_id,
            )
            return
        rules, kept = self.rules(attachment), self._kept(attachment)
        await self.limits.shrink(attachment, target)
        revoked = self._revocable(target, rules, kept)
        try:
            await trio.to_thread.run_sync(self.cgroup.revoke, target, revoked, kept)
        except CGROUP_ERRORS as err:
            await self.limits.extend(attachment, target)
            raise ApplyError(STEP_CGROUP, str(err)) from None
        await self._nri_undo(attachment.container_id, revoked)

    @staticmethod
    def _revocable(
        target: Target, rules: Sequence[DeviceRule], kept: Sequence[DeviceRule]
    ) -> list[DeviceRule]:
        """The granted rules no other attachment needs and the container's own rules do not allow."""
        own = [r for r in container_rules(target.device_rules, ()) if _valid(r)]
        return [r for r in rules if r not in kept and not verdict(own, r.type, r.major, r.minor, r.access)]

    async def _nri(self, container_id: str, rules: Sequence[DeviceRule]) -> None:
        try:
            await self.runtime.update_devices(container_id, rules, NRI_UPDATE_TIMEOUT)
        except Exception as err:  # RuntimeUpdateError; a broken link must not leave half a change either
            raise ApplyError(STEP_NRI, str(err)) from None

    async def _nri_undo(self, container_id: str, rules: Sequence[DeviceRule]) -> None:
        """Tell the runtime the rules are gone again (deny rules); a failure is only logged: the runtime
        drops device rules anyway, and the cgroup is what decides."""
        if not rules:
            return
        try:
            await self.runtime.update_devices(
                container_id, [r._replace(allow=False) for r in rules], NRI_UPDATE_TIMEOUT
            )
        except Exception as err:
            log.warning("hot-plug: NRI UpdateContainers (deny) for %s failed: %s", container_id, err)


class CgroupV1Devices:
    """cgroup v1: `devices.allow` / `devices.deny` of the container's devices cgroup."""

    def __init__(self, cgroup_mount: Path) -> None:
        self.cgroup_mount = cgroup_mount

    def _dir(self, target: Target) -> Path:
        return cgroup1dev.devices_dir(self.cgroup_mount, cgroup_dir(target.cgroups_path))

    def grant(self, target: Target, granted: Sequence[DeviceRule], kept: Sequence[DeviceRule]) -> None:
        cgroup1dev.allow(self._dir(target), granted)

    def revoke(self, target: Target, revoked: Sequence[DeviceRule], kept: Sequence[DeviceRule]) -> None:
        cgroup1dev.deny(self._dir(target), revoked)


class CgroupV2Devices:
    """cgroup v2: the container's device program replaced by one of its own rules (as runc applies
    them), the other attachments' and the granted ones (`cgroup2dev.replace_device_filter`)."""

    def __init__(self, cgroup_mount: Path) -> None:
        self.cgroup_mount = cgroup_mount

    def _dir(self, target: Target) -> Path:
        return self.cgroup_mount / cgroup_dir(target.cgroups_path)

    def grant(self, target: Target, granted: Sequence[DeviceRule], kept: Sequence[DeviceRule]) -> None:
        replace_device_filter(self._dir(target), container_rules(target.device_rules, (*kept, *granted)))

    def revoke(self, target: Target, revoked: Sequence[DeviceRule], kept: Sequence[DeviceRule]) -> None:
        replace_device_filter(self._dir(target), container_rules(target.device_rules, kept))
