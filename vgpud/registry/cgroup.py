"""Which pod and container a process runs in, from its `/proc/<pid>/cgroup` text (pure functions).

The kernel writes a process's cgroup paths, so they are the one identity a caller cannot forge: the
registry trusts them over the pod UID and container name in the request. The kubelet names a pod's
cgroup after its UID and the runtime names a container's after its ID, in one of two layouts:

- cgroupfs: `.../kubepods[/burstable|/besteffort]/pod<uid>/<id>` (CRI-O: `crio-<id>`)
- systemd:  `.../kubepods.slice[/kubepods-<qos>.slice]/kubepods[-<qos>]-pod<uid_>.slice/`
  `cri-containerd-<id>.scope` (the UID's dashes become underscores; CRI-O `crio-`, docker `docker-`)

cgroup v1 lists one line per hierarchy (`<n>:<controllers>:<path>`), v2 one (`0::<path>`); a path may
start with `/..` components when the reader runs in its own cgroup namespace. Only the pod component
and the one right below it (the container's) are read, wherever they sit, so all of these parse the
same; a process in a sub-cgroup the container made for itself still counts as the container's. When the
kubelet's cgroup driver is configured (`--cgroup-driver`), only that driver's layout names a pod.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from vgpud.containers.values import UID_PATTERN

_CGROUPFS_POD = re.compile(rf"pod({UID_PATTERN.format(s='-')})")
#: systemd slice names spell a pod UID's dashes as underscores
_SYSTEMD_POD = re.compile(rf"kubepods(?:-(burstable|besteffort))?-pod({UID_PATTERN.format(s='_')})\.slice")
#: conmon's own `crio-conmon-<id>.scope` is deliberately not a container
_CONTAINER = re.compile(r"(?:(?:cri-containerd|crio|docker)-)?([0-9a-f]{64})(?:\.scope)?")
_STATUS_ID = re.compile(r"[a-z][a-z0-9+.-]*://([0-9a-f]{64})")

QOS_CLASSES = ("guaranteed", "burstable", "besteffort")


class CgroupParseError(ValueError):
    """A /proc/<pid>/cgroup text that names two different pods or containers."""


@dataclass(frozen=True)
class Membership:
    """Where a process sits: its pod, and its container when it is in one."""

    pod_uid: str
    systemd: bool
    #: the container's cgroup directory name (`<id>` or `cri-containerd-<id>.scope`), None when the
    #: process sits in the pod's own cgroup
    container_dir: str | None = None
    container_id: str | None = None


def _pod_component(component: str) -> tuple[str, bool] | None:
    """(pod UID, systemd layout) when `component` is a kubelet pod cgroup name."""
    if match := _CGROUPFS_POD.fullmatch(component):
        return match.group(1), False
    if match := _SYSTEMD_POD.fullmatch(component):
        return match.group(2).replace("_", "-"), True
    return None


def membership_of_path(path: str, systemd: bool | None = None) -> Membership | None:
    """The pod and container of one cgroup path; None when no component is a pod's.

    `systemd`: only pod components of that layout count (the kubelet's cgroup driver is known);
    None: either layout.
    """
    parts = [p for p in path.split("/") if p]
    for index, part in enumerate(parts):
        pod = _pod_component(part)
        if pod is None or (systemd is not None and pod[1] != systemd):
            continue
        below = parts[index + 1] if index + 1 < len(parts) else None
        container = _CONTAINER.fullmatch(below) if below is not None else None
        if container is None:
            return Membership(pod[0], pod[1])
        return Membership(pod[0], pod[1], below, container.group(1))
    return None


def parse_proc_cgroup(text: str, systemd: bool | None = None) -> Membership | None:
    """The pod and container of a `/proc/<pid>/cgroup` text (v1 or v2); None outside every pod.

    Hierarchies that do not place the process in a pod are ignored (a v1 host may leave some
    controllers at `/`); those that do must agree, else CgroupParseError. `systemd` as for
    `membership_of_path`.
    """
    found: set[Membership] = set()
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        membership = membership_of_path(fields[2], systemd)
        if membership is not None:
            found.add(membership)
    if len(found) > 1:
        described = ", ".join(sorted(f"pod {m.pod_uid} container {m.container_id}" for m in found))
        raise CgroupParseError(f"the cgroup hierarchies disagree: {described}")
    return found.pop() if found else None


def container_id_of_status(value: str) -> str | None:
    """`containerd://<id>` (or `cri-o://`, `docker://`) -> `<id>`; None when not of that shape."""
    match = _STATUS_ID.fullmatch(value or "")
    return match.group(1) if match else None


def pod_cgroup_dirs(pod_uid: str, systemd: bool) -> tuple[PurePosixPath, ...]:
    """Where the kubelet puts the pod's cgroup below its cgroup root, one path per QoS class.

    The QoS class is not read from the caller's path: in a private cgroup namespace the parent
    component may show as `..`. The caller of this function tries each (a UID is under one only).
    """
    if systemd:
        uid = pod_uid.replace("-", "_")
        return (
            PurePosixPath("kubepods.slice", f"kubepods-pod{uid}.slice"),
            PurePosixPath("kubepods.slice", "kubepods-burstable.slice", f"kubepods-burstable-pod{uid}.slice"),
            PurePosixPath(
                "kubepods.slice", "kubepods-besteffort.slice", f"kubepods-besteffort-pod{uid}.slice"
            ),
        )
    return (
        PurePosixPath("kubepods", f"pod{pod_uid}"),
        PurePosixPath("kubepods", "burstable", f"pod{pod_uid}"),
        PurePosixPath("kubepods", "besteffort", f"pod{pod_uid}"),
    )


# --------------------------------------------------------------------------------------------------
# The pod object's status, as far as registration cares


def _status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    status = pod.get("status")
    return status if isinstance(status, Mapping) else {}


def container_status(pod: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    """The status entry of the init or app container `name`; None when the kubelet has none yet."""
    status = _status(pod)
    for key in ("initContainerStatuses", "containerStatuses"):
        for entry in status.get(key) or ():
            if isinstance(entry, Mapping) and entry.get("name") == name:
                return entry
    return None


def _state(entry: Mapping[str, Any]) -> Mapping[str, Any]:
    state = entry.get("state")
    return state if isinstance(state, Mapping) else {}


def is_running(entry: Mapping[str, Any]) -> bool:
    return isinstance(_state(entry).get("running"), Mapping)


def pod_terminated(pod: Mapping[str, Any]) -> bool:
    """Succeeded or Failed, or being deleted with no container left running (the kubelet's rule)."""
    status = _status(pod)
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    deleting = bool((pod.get("metadata") or {}).get("deletionTimestamp"))
    statuses = [e for e in status.get("containerStatuses") or () if isinstance(e, Mapping)]
    return deleting and not any(is_running(entry) for entry in statuses)
