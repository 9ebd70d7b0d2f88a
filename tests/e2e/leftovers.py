"""What a local node leaves behind when its launcher dies, and how the next one clears it.

A node's launcher (`python -m tests.e2e.node`, `make demo`, the e2e fixture) tears the node down in a
`finally`. SIGTERM and SIGHUP would kill it without running that, so `stop_on_signals` turns them into
`KeyboardInterrupt`, which every launcher already handles like Ctrl-C; once only: a second signal
during the teardown is ignored rather than cutting it short.

SIGKILL leaves nothing to run, so each node marks its work dir with its launcher's identity (PID and
process start time, so a reused PID is not mistaken for it), and the next start reaps every marked
dir whose launcher is gone: the processes whose command line or environment names that dir (etcd,
the API server, the controller manager, the scheduler, containerd and its shims, the kubelet,
vgpud), the mounts under it, runc state that points into it, its node IP on `lo` (nodeip.py; a
cluster's, one per node dir inside it) and the dir itself. The kubelet's `kubepods` cgroups are shared by
every node on the host, so they are cleared (their processes killed first) only when no other node's
launcher is alive.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from tests.e2e.nodeip import NODE_IP_FILE, release_node_ip

#: the marker file in a node's work dir: "<launcher pid> <its start time in clock ticks>"
OWNER_FILE = ".local-node-owner"
#: where node work dirs are made (tempfile.mkdtemp(prefix="vgn", dir=...))
NODE_PARENT = Path("/tmp")
#: runc's state of containerd's k8s.io namespace: shared by every containerd on the host
RUNC_STATE = Path("/run/containerd/runc/k8s.io")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt (the first one; later ones are ignored) while inside."""

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        print(f"\n{signal.Signals(signum).name} received: tearing the node down", file=sys.stderr, flush=True)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (start time since boot), None when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


def mark_owner(workdir: Path) -> None:
    """Record this process as the launcher of the node in `workdir`."""
    pid = os.getpid()
    (workdir / OWNER_FILE).write_text(f"{pid} {_start_time(pid)}\n")


def owner_alive(workdir: Path) -> bool:
    """True while the launcher recorded in `workdir` runs (the same process, not a reused PID)."""
    try:
        pid_text, started = (workdir / OWNER_FILE).read_text().split()
    except (OSError, ValueError):
        return False
    return _start_time(int(pid_text)) == started


def node_dirs() -> list[Path]:
    """Every marked node work dir on this host."""
    return sorted(p.parent for p in NODE_PARENT.glob(f"vgn*/{OWNER_FILE}"))


def pids_naming(path: Path) -> list[int]:
    """PIDs whose command line or environment names `path` or anything under it (vgpud takes its
    paths from the environment, as a DaemonSet gives them)."""
    needle = str(path).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            words = [
                *(entry / "cmdline").read_bytes().split(b"\0"),
                *(entry / "environ").read_bytes().split(b"\0"),
            ]
        except OSError:
            continue
        if any(w == needle or w.endswith(b"=" + needle) or needle + b"/" in w for w in words):
            found.append(int(entry.name))
    return found


def mounts_under(prefix: Path) -> list[str]:
    """Mount points at or under `prefix` (from /proc/self/mountinfo), deepest first."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point == str(prefix) or point.startswith(f"{prefix}/"):
            points.append(point)
    return sorted(set(points), key=lambda p: (-p.count("/"), p))


def cgroup_mounts() -> list[Path]:
    """Every cgroup (v1 and v2) hierarchy's mount point."""
    roots = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        pre, _, post = line.partition(" - ")
        if post.split()[0] in ("cgroup", "cgroup2"):
            roots.append(Path(pre.split()[4]))
    return roots


def cgroup_dirs(names: tuple[str, ...] = ("kubepods",)) -> set[Path]:
    """Every directory of the `names` subtrees in every cgroup hierarchy."""
    found: set[Path] = set()
    for root in cgroup_mounts():
        for name in names:
            top = root / name
            if top.is_dir():
                found.add(top)
                found.update(p for p in top.rglob("*") if p.is_dir())
    return found


#: the top-level cgroup of each kubelet of a local cluster is `<prefix><node name>` (one kubepods tree
#: per node, so a node's cleanup never touches another's)
CLUSTER_CGROUP_PREFIX = "vgc-"


def cluster_cgroup_names() -> tuple[str, ...]:
    """The top-level cgroups of local-cluster kubelets, in any hierarchy."""
    names = {p.name for root in cgroup_mounts() for p in root.glob(f"{CLUSTER_CGROUP_PREFIX}*") if p.is_dir()}
    return tuple(sorted(names))


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def remove_cgroups(cgroups: set[Path]) -> None:
    """Kill what runs in `cgroups`, then remove them, deepest first (EBUSY while tasks exit)."""
    for cgroup in cgroups:
        try:
            kill_pids([int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()])
        except OSError:
            continue
    for cgroup in sorted(cgroups, key=lambda p: -len(p.parts)):
        for _ in range(50):
            try:
                cgroup.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)


def _runc_states_naming(workdir: Path) -> list[Path]:
    if not RUNC_STATE.is_dir():
        return []
    found = []
    for state in RUNC_STATE.glob("*/state.json"):
        with contextlib.suppress(OSError):
            if str(workdir) in state.read_text():
                found.append(state.parent)
    return found


def reap_dead_nodes(own: Path | None = None) -> list[str]:
    """Clear every node whose launcher is gone (never `own`); one line per thing removed."""
    removed: list[str] = []
    dead = [d for d in node_dirs() if d != own and not owner_alive(d)]
    for workdir in dead:
        pids = pids_naming(workdir)
        if pids:
            kill_pids(pids)
            removed.append(f"killed {len(pids)} processes of the dead node {workdir}: {sorted(pids)}")
        for point in mounts_under(workdir):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)
            removed.append(f"unmounted {point}")
        for state in _runc_states_naming(workdir):
            shutil.rmtree(state, ignore_errors=True)
            removed.append(f"removed runc state {state}")
        for node_dir in (workdir, *(f.parent for f in workdir.glob(f"*/{NODE_IP_FILE}"))):  # a cluster's
            address = release_node_ip(node_dir)
            if address:
                removed.append(f"removed the node IP {address} from lo")
        shutil.rmtree(workdir, ignore_errors=True)
        removed.append(f"removed {workdir}")
    others_alive = any(owner_alive(d) for d in node_dirs() if d != own)
    if dead and not others_alive:
        cgroups = cgroup_dirs(("kubepods", *cluster_cgroup_names()))
        if cgroups:
            remove_cgroups(cgroups)
            removed.append(f"removed {len(cgroups)} kubepods cgroups")
    return removed
