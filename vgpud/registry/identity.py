"""Who is calling, and is it the container it registers: SO_PEERCRED, /proc and the cgroup tree.

The request names a pod and container (or a register UUID); nothing in it is trusted. The kernel
says which process connected (SO_PEERCRED, in vgpud's PID namespace: the host's, as vgpud runs with
hostPID) and, through `/proc/<pid>/cgroup`, which pod and container that process runs in.

How a candidate container is matched (a choice; the alternative is below): the caller's own
container ID, read from its cgroup path, must equal the candidate's `containerID` in the pod's
status, and the container's cgroup, found from the pod UID and that same directory name under the
cgroup root, must list the caller among its processes; that listing is also what pids.config gets.
Computing the candidate's cgroup from the pod object alone (QoS class + UID + status containerID +
the kubelet's cgroup driver) would need the cgroup driver setting and the runtime's naming scheme
to be right, and it cannot work for a target whose pod object vgpud cannot read (the device-plugin
fallback). Matching the caller's own path needs neither, and works unchanged in a private cgroup
namespace because only the pod and container components are read.

Blocking but quick (a few small procfs/cgroupfs reads): called from the Trio thread.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vgpud.compat.grpclib import peer_socket
from vgpud.partition.assigner import Candidate, ObjectsPending, ResolveError, TargetNotFound
from vgpud.registry.cgroup import (
    CgroupParseError,
    Membership,
    container_id_of_status,
    container_status,
    is_running,
    membership_of_path,
    parse_proc_cgroup,
    pod_cgroup_dirs,
    pod_terminated,
)

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
#: a container has a handful of processes; a cgroup.procs larger than this is not one we read whole
MAX_PROCS_BYTES = 1 << 20
DEFAULT_CGROUP_MOUNT = Path("/sys/fs/cgroup")


class IdentityError(Exception):
    """The caller's identity cannot be established."""


class WrongPod(Exception):
    """The caller is not a process of the candidate's pod (or of any pod's container): final."""


class NotTheCaller(ResolveError):
    """The caller runs in the candidate's pod but is not (or, by the API's view, not yet) the
    candidate container: retried, as the pod status may lag a container restart."""


class StatusNamesAnother(NotTheCaller, ObjectsPending):
    """The pod status names another container ID for the candidate: only a pod update changes it."""


def peer_pid(stream: Any) -> int | None:
    """The PID of the process at the other end of a grpclib server stream's unix socket (its socket
    through vgpud.compat.grpclib: None, so every call refused, if grpclib moves it)."""
    sock = peer_socket(stream)
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        pid, _uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    except OSError:
        return None
    return pid if pid > 0 else None  # 0: the peer is in a PID namespace we cannot see


@dataclass(frozen=True)
class Caller:
    """A register call's peer: its PID and where the kernel says it runs (None: not in a pod)."""

    pid: int
    membership: Membership | None

    @property
    def key(self) -> str:
        """What the per-caller limit counts by: the pod, so a pod cannot evade it with many PIDs."""
        return self.membership.pod_uid if self.membership is not None else f"pid:{self.pid}"

    def describe(self) -> str:
        m = self.membership
        if m is None:
            return f"pid {self.pid} (not in a pod)"
        where = f"container {m.container_id[:12]}" if m.container_id else "no container"
        return f"pid {self.pid} (pod {m.pod_uid}, {where})"


def identify(proc_root: Path, pid: int | None, systemd: bool | None = None) -> Caller:
    """Read the caller's pod and container from `<proc_root>/<pid>/cgroup`; IdentityError if we can't.

    `systemd`: the kubelet's cgroup driver when it is configured (True: systemd, False: cgroupfs); a
    caller in a pod cgroup of the other layout is then refused, as no kubelet pod of this node is
    named that way. None: either layout.
    """
    if pid is None:
        raise IdentityError(
            "the caller's PID is unknown (SO_PEERCRED gave none: is vgpud running with hostPID?)"
        )
    try:
        text = (proc_root / str(pid) / "cgroup").read_text(errors="replace")
    except OSError as err:
        raise IdentityError(f"cannot read the cgroups of caller pid {pid}: {err.strerror or err}") from None
    try:
        membership = parse_proc_cgroup(text, systemd)
        other = parse_proc_cgroup(text) if membership is None and systemd is not None else None
    except CgroupParseError as err:
        raise IdentityError(f"caller pid {pid}: {err}") from None
    if other is not None:
        layout, driver = ("cgroupfs", "systemd") if systemd else ("systemd", "cgroupfs")
        raise IdentityError(
            f"caller pid {pid} runs in a {layout}-layout cgroup of pod {other.pod_uid}, but the kubelet's "
            f"cgroup driver is set to {driver} (--cgroup-driver, CGROUP_DRIVER)"
        )
    return Caller(pid, membership)


def default_cgroup_root(mount: Path = DEFAULT_CGROUP_MOUNT) -> Path:
    """The hierarchy in which the kubelet's `kubepods` tree is read: the unified one on a v2 host,
    else the v1 `pids` hierarchy (the kubelet creates pod cgroups in every v1 controller)."""
    if (mount / "cgroup.controllers").is_file():
        return mount
    return mount / "pids"


def container_cgroup(cgroup_root: Path, membership: Membership) -> Path:
    """The caller's container cgroup directory under `cgroup_root` (the pod's QoS class is probed);
    ResolveError while it is not there (a wrong cgroup root shows up as the last attempt's reason)."""
    if membership.container_dir is None:
        raise WrongPod(f"a process of pod {membership.pod_uid} that is in no container")
    for pod_dir in pod_cgroup_dirs(membership.pod_uid, membership.systemd):
        candidate = cgroup_root / pod_dir / membership.container_dir
        if candidate.is_dir():
            return candidate
    raise ResolveError(
        f"no cgroup of container {membership.container_id} of pod {membership.pod_uid} under "
        f"{cgroup_root} (is it the hierarchy that holds the kubelet's kubepods tree?)"
    )


def find_container_cgroup(
    cgroup_root: Path, pod_uid: str, container_id: str, systemd: bool | None
) -> Path | None:
    """The cgroup directory of container `container_id` of pod `pod_uid` (either layout when
    `systemd` is None), by the runtime's naming of its directory; None while there is none."""
    for layout in (False, True) if systemd is None else (systemd,):
        for pod_dir in pod_cgroup_dirs(pod_uid, layout):
            try:
                names = os.listdir(cgroup_root / pod_dir)
            except (FileNotFoundError, NotADirectoryError):
                continue
            for name in names:
                found = membership_of_path(str(pod_dir / name), layout)
                if found is not None and found.container_id == container_id:
                    return cgroup_root / pod_dir / name
    return None


def container_pids(
    cgroup_root: Path, systemd: bool | None, pod_uid: str, container_id: str
) -> frozenset[int]:
    """The host PIDs of a container named by its pod and ID (cgroup mode has no pids.config to say
    them); empty while its cgroup is not there."""
    directory = find_container_cgroup(cgroup_root, pod_uid, container_id, systemd)
    return frozenset(cgroup_pids(directory)) if directory is not None else frozenset()


def _read_procs(path: Path) -> list[int]:
    with path.open("rb") as file:
        data = file.read(MAX_PROCS_BYTES + 1)
    if len(data) > MAX_PROCS_BYTES:
        raise OSError(errno.EFBIG, f"{path} is larger than {MAX_PROCS_BYTES} bytes")
    return [int(line) for line in data.split()]


def cgroup_pids(directory: Path) -> tuple[int, ...]:
    """Every PID in `directory` and the cgroups below it, ascending (host PIDs: we run with hostPID).

    A sub-cgroup that disappears while it is walked is skipped, as its processes have gone too.
    """
    pids: set[int] = set()
    for current, _dirs, _files in os.walk(directory):
        try:
            pids.update(_read_procs(Path(current) / "cgroup.procs"))
        except FileNotFoundError:
            continue
    return tuple(sorted(pids))


def _pod_name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '?')}/{meta.get('name', '?')}"


def verify_caller(
    caller: Caller, candidate: Candidate, pod: Mapping[str, Any] | None, cgroup_root: Path
) -> tuple[int, ...]:
    """The candidate container's host PIDs, the caller's among them, when the caller is `candidate`.

    `pod` is the candidate's pod object, None when vgpud cannot read it (the device-plugin fallback):
    then only the kernel's facts count (the caller's pod). Raises WrongPod (final), TargetNotFound
    (the pod terminated), ObjectsPending (the pod status does not show the caller's container running:
    retry on the pod's next change), NotTheCaller or ResolveError (the cgroup tree: retry).
    """
    membership = caller.membership
    if membership is None or membership.container_id is None:
        raise WrongPod(f"caller {caller.describe()} is not a process of any pod's container")
    if membership.pod_uid != candidate.pod_uid:
        raise WrongPod(f"caller {caller.describe()} is not a process of pod {candidate.pod_uid}")
    if pod is not None:
        if pod_terminated(pod):
            raise TargetNotFound(f"pod {_pod_name(pod)} has terminated")
        status = container_status(pod, candidate.container)
        if status is None or not is_running(status):
            raise ObjectsPending(
                f"container {candidate.container} of pod {_pod_name(pod)} is not running yet"
            )
        expected = container_id_of_status(str(status.get("containerID", "")))
        if expected != membership.container_id:
            raise StatusNamesAnother(
                f"caller {caller.describe()} is not container {candidate.container} of pod "
                f"{_pod_name(pod)} ({(expected or 'no id')[:12]})"
            )
    pids = cgroup_pids(container_cgroup(cgroup_root, membership))
    if caller.pid not in pids:
        raise NotTheCaller(f"caller pid {caller.pid} is not among the processes of its container cgroup")
    return pids
