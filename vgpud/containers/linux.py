"""A container's cgroups path and device rules (NRI `Container.linux`), read from the runtime's message
only when someone needs them.

A Synchronize's cgroups paths and device rules stay in upb's message until someone reads them:
containerd reports a dozen rules per container (its default allow list), and reading them all took
longer than the rest of a 10,000-container Synchronize (about 1.4 us a rule, and 1 us a container to
reach them); a hot-plug reads one container's. Until then the store keeps the Synchronize message's
memory alive (its size: a few MiB at 10,000 containers), up to the next one. The message is read
duck-typed (upb's or betterproto2's), so this module needs neither.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vgpud.containers.values import DeviceRule


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
    """A container's cgroups path and device rules. From a Synchronize it holds the runtime's message
    and reads it on first use, then lets it go; from a lifecycle event, the values (`of`). Equal to
    another with the same values."""

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

    @classmethod
    def read(cls, container: Any) -> ContainerLinux:
        """The values of an event's message, read now (the message is not kept)."""
        linux = cls(container)
        linux.facts()
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


#: a container the runtime gave no cgroups path and no device rules
NO_LINUX = ContainerLinux.of()
