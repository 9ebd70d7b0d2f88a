"""Small value types shared by the readers of the node's containers (pure, no I/O)."""

from __future__ import annotations

import re
from typing import NamedTuple

#: (pod UID, container name): what a register call identifies, and what all instances of a restarted
#: container share
ContainerKey = tuple[str, str]

#: a pod UID (static pods have 32 hex digits); `{s}` is its separator: "-", or "_" in systemd slice names
UID_PATTERN = "[0-9a-f]{{8}}{s}[0-9a-f]{{4}}{s}[0-9a-f]{{4}}{s}[0-9a-f]{{4}}{s}[0-9a-f]{{12}}|[0-9a-f]{{32}}"
_POD_UID = re.compile(f"(?:{UID_PATTERN.format(s='-')})")


def is_pod_uid(value: str) -> bool:
    """A pod UID as the kubelet writes it into cgroup names: a lower-case UUID, or 32 hex digits."""
    return bool(_POD_UID.fullmatch(value))


class DeviceRule(NamedTuple):
    """One device cgroup rule (OCI `LinuxDeviceCgroup`; NRI sends the same shape)."""

    allow: bool
    #: "c", "b" or "a" (every device)
    type: str
    #: None: any major
    major: int | None
    #: None: any minor
    minor: int | None
    access: str

    def __str__(self) -> str:
        """The cgroup v1 `devices.allow` line: `c 195:0 rw`."""
        major = "*" if self.major is None else str(self.major)
        minor = "*" if self.minor is None else str(self.minor)
        return f"{self.type} {major}:{minor} {self.access}"
