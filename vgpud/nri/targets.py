"""Every container the runtime reported through NRI, vGPU or not: what a hot-plug needs of its target.

The hot-plug (issue 18) grants a slave pod's vGPU to any running container of the node, so this map
holds them all, keyed by container ID and indexed by (pod UID, container name) like the NRI cache:
its process (pid, for the mount namespace), its cgroup (`cgroups_path`, as the runtime gives it) and
its own device cgroup rules (what the runtime created it with: the rules a grant adds to, and a revoke
goes back to). A Synchronize replaces everything; the lifecycle hooks keep it current in between
(`vgpud.nri.hooks`). Immutable values, NamedTuples: a Synchronize builds thousands.

A Synchronize's cgroups paths and device rules stay in upb's message until someone reads them
(`ContainerLinux`): containerd reports a dozen rules per container (its default allow list), and
reading them all took longer than the rest of a 10,000-container Synchronize (about 1.4 us a rule, and
1 us a container to reach them); a hot-plug reads one container's. Until then the targets keep the
Synchronize message's memory alive (its size: a few MiB at 10,000 containers), up to the next one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from vgpud.hotplug.devrules import DeviceRule
from vgpud.hotplug.rules import KnownContainer
from vgpud.nri.cache import ContainerMap


def device_rules(devices: Iterable[Any]) -> tuple[DeviceRule, ...]:
    """NRI LinuxDeviceCgroup messages (upb's or betterproto2's) as DeviceRules; an unset major or
    minor is None (any), an unset type is `a` (every device: the OCI spec's default, and what
    containerd's `deny all` rule leaves unset)."""
    return tuple(
        [
            DeviceRule(d.allow, d.type or "a", _optional(d, "major"), _optional(d, "minor"), d.access)
            for d in devices
        ]
    )


def _optional(message: Any, name: str) -> int | None:
    """An OptionalInt64 field's value, None when unset."""
    return getattr(message, name).value if _has(message, name) else None


def _has(message: Any, name: str) -> bool:
    """Whether a message field is set: upb says so through HasField, betterproto2 with None."""
    has_field = getattr(message, "HasField", None)
    return has_field(name) if has_field is not None else getattr(message, name) is not None


class ContainerLinux:
    """A container's cgroups path and device rules (NRI `Container.linux`). From a Synchronize it holds
    the runtime's message and reads it on first use, then lets it go; from a lifecycle event, the
    values (`of`). Equal to another with the same values."""

    __slots__ = ("_facts", "_message")

    def __init__(self, container: Any) -> None:
        """`container`: an NRI Container message, upb's or betterproto2's."""
        self._message: Any = container
        self._facts: tuple[str, tuple[DeviceRule, ...]] | None = None

    @classmethod
    def of(cls, cgroups_path: str = "", device_rules: Iterable[DeviceRule] = ()) -> ContainerLinux:
        linux = cls(None)
        linux._facts = (cgroups_path, tuple(device_rules))
        return linux

    def facts(self) -> tuple[str, tuple[DeviceRule, ...]]:
        """(cgroups path, device rules): "" and () where the runtime gave none."""
        if self._facts is None:
            message, self._message = self._message, None
            linux = message.linux if message is not None and _has(message, "linux") else None
            if linux is None:
                self._facts = ("", ())
            else:
                resources = linux.resources if _has(linux, "resources") else None
                devices = resources.devices if resources is not None else ()
                self._facts = (linux.cgroups_path, device_rules(devices) if devices else ())
        return self._facts

    def __eq__(self, other: object) -> bool:
        return self.facts() == other.facts() if isinstance(other, ContainerLinux) else NotImplemented

    def __hash__(self) -> int:
        return hash(self.facts())

    def __repr__(self) -> str:
        cgroups_path, rules = self.facts()
        return f"ContainerLinux.of({cgroups_path!r}, {rules!r})"


class TargetContainer(NamedTuple):
    """One container instance as the runtime last reported it."""

    container_id: str
    pod_uid: str
    #: the container's name in its pod
    container: str
    pod_namespace: str
    pod_name: str
    #: it has a live process (started, not stopped; a paused one counts)
    running: bool
    #: its process ID in the runtime's PID namespace (0 while none runs, or when the runtime did not say)
    pid: int
    #: its cgroups path and device rules (`cgroups_path`, `device_rules`)
    linux: ContainerLinux

    @property
    def cgroups_path(self) -> str:
        """NRI Container.linux.cgroups_path, as given ("" when the runtime gave none)."""
        return self.linux.facts()[0]

    @property
    def device_rules(self) -> tuple[DeviceRule, ...]:
        """NRI Container.linux.resources.devices: the container's own rules, as the runtime created it."""
        return self.linux.facts()[1]

    def known(self) -> KnownContainer:
        return KnownContainer(
            self.container_id, self.pod_uid, self.container, self.pod_namespace, self.pod_name, self.running
        )


class TargetContainers(ContainerMap[TargetContainer]):
    """Every container instance the runtime runs or keeps; a `vgpud.hotplug.service.TargetLookup`."""

    def __init__(self) -> None:
        super().__init__()
        #: true once the first complete Synchronize arrived, and from then on (as `NriCache.synced`)
        self.synced = False

    def replace(self, entries: Iterable[tuple[str, TargetContainer]]) -> None:
        """A Synchronize's view replaces everything; the map is synced from now on."""
        super().replace(entries)
        self.synced = True

    def container(self, pod_uid: str, name: str) -> KnownContainer | None:
        """The newest instance of (pod UID, container name), None when the runtime reported none."""
        target = self.get(pod_uid, name)
        return target.known() if target is not None else None

    def by_id(self, container_id: str) -> TargetContainer | None:
        return self.instance(container_id)

    def running_ids(self) -> list[str]:
        """The IDs of the instances with a live process, in no particular order."""
        return [cid for cid, target in self._entries.items() if target.running]
