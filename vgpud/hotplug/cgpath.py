"""A container's cgroup directory from the cgroups path the runtime reports through NRI (pure).

containerd passes the kubelet's path on: with the cgroupfs driver an absolute path
(`/kubepods/besteffort/pod<uid>/<id>`), with the systemd driver `slice:prefix:name`
(`kubepods-besteffort-pod<uid>.slice:cri-containerd:<id>`), which runc places at
`/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid>.slice/cri-containerd-<id>.scope`
(each dash of a slice name is a level, as systemd nests slices).
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

#: a path component vgpud accepts: no `..`, no empty name, nothing a runtime would not write
_COMPONENT = re.compile(r"^[A-Za-z0-9_.:@-]{1,255}$")


class CgroupPathError(ValueError):
    """The runtime's cgroups path is not one vgpud can place."""


def _slice_dirs(name: str) -> list[str]:
    """`a-b-c.slice` -> [`a.slice`, `a-b.slice`, `a-b-c.slice`] (systemd's slice nesting)."""
    if name == "-.slice":
        return []
    if not name.endswith(".slice") or name.startswith("-") or "--" in name[: -len(".slice")]:
        raise CgroupPathError(f"{name!r} is not a systemd slice name")
    parts = name[: -len(".slice")].split("-")
    return ["-".join(parts[: n + 1]) + ".slice" for n in range(len(parts))]


def cgroup_dir(cgroups_path: str) -> PurePosixPath:
    """The directory below a hierarchy's mount point (relative, never escaping it); CgroupPathError
    for an empty path, a `..`, or a systemd path that is not `slice:prefix:name`."""
    if not cgroups_path:
        raise CgroupPathError("the runtime reported no cgroups path for the container")
    if cgroups_path.startswith("/"):
        parts = [p for p in cgroups_path.split("/") if p]
    else:
        fields = cgroups_path.split(":")
        if len(fields) != 3 or not all(fields):
            raise CgroupPathError(f"cgroups path {cgroups_path!r} is neither absolute nor slice:prefix:name")
        slice_name, prefix, name = fields
        unit = name if name.endswith(".slice") else f"{prefix}-{name}.scope"
        parts = [*_slice_dirs(slice_name), unit]
    for part in parts:
        if part in (".", "..") or not _COMPONENT.match(part):
            raise CgroupPathError(f"cgroups path {cgroups_path!r} has the component {part!r}")
    if not parts:
        raise CgroupPathError(f"cgroups path {cgroups_path!r} is a hierarchy's root, not a container's")
    return PurePosixPath(*parts)
