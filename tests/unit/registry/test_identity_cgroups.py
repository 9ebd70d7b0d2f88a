"""Caller identity with real processes in real cgroups: the kernel's /proc/<pid>/cgroup and
cgroup.procs, read by vgpud's own code.

A test parent `<hierarchy>/vgpud-test-<random>` stands for the kubelet's cgroup root; below it the
kubelet's cgroupfs layout `kubepods/besteffort/pod<uid>/<container id>`. Child processes (`sleep`) are
moved in by writing their PID to cgroup.procs. Afterwards every process is moved back to the root
cgroup and killed by its PID, and the cgroups are removed deepest first. Needs root and a mounted
cgroup hierarchy (v1 `pids`, or cgroup2); under CI a missing one fails the test.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import objects as o
from tests.support import require
from tests.unit.registry.world import container_id, pod_uid, with_status
from vgpud.partition.assigner import Candidate, TargetNotFound
from vgpud.registry.identity import (
    NotTheCaller,
    WrongPod,
    container_pids,
    default_cgroup_root,
    identify,
    verify_caller,
)

PROC = Path("/proc")


def _hierarchy_usable(root: Path) -> bool:
    return os.geteuid() == 0 and (root / "cgroup.procs").is_file() and os.access(root, os.W_OK)


class Cgroups:
    """Creates cgroups under one test parent and processes in them; `close` undoes all of it."""

    def __init__(self, hierarchy: Path) -> None:
        self.hierarchy = hierarchy
        self.parent = hierarchy / f"vgpud-test-{secrets.token_hex(4)}"
        self.created: list[Path] = []
        self.processes: list[subprocess.Popen[bytes]] = []

    def mkdir(self, relative: str) -> Path:
        path = self.hierarchy
        for part in (self.parent.name, *Path(relative).parts):
            path = path / part
            if not path.exists():
                path.mkdir()
                self.created.append(path)
        return path

    def container(self, uid: str, cid: str) -> Path:
        self.mkdir("kubepods/besteffort")
        return self.mkdir(f"kubepods/besteffort/pod{uid}/{cid}")

    def spawn(self, cgroup: Path | None) -> int:
        """A `sleep` child, moved into `cgroup` (None: left where the test runs)."""
        proc = subprocess.Popen(["sleep", "300"])
        self.processes.append(proc)
        if cgroup is not None:
            self.move(proc.pid, cgroup)
        return proc.pid

    def move(self, pid: int, cgroup: Path) -> None:
        (cgroup / "cgroup.procs").write_text(f"{pid}\n")

    def close(self) -> None:
        for proc in self.processes:
            with contextlib.suppress(OSError):  # already gone
                self.move(proc.pid, self.hierarchy)
            proc.kill()
            proc.wait()
        for path in sorted(self.created, key=lambda p: len(p.parts), reverse=True):
            path.rmdir()


@pytest.fixture
def cgroups() -> Iterator[Cgroups]:
    hierarchy = default_cgroup_root()
    require(
        _hierarchy_usable(hierarchy),
        f"a writable cgroup hierarchy at {hierarchy}",
        "run the tests as root on a host with the v1 pids controller or cgroup2 mounted under /sys/fs/cgroup",
    )
    groups = Cgroups(hierarchy)
    try:
        yield groups
    finally:
        groups.close()
    assert not groups.parent.exists()


POD_A, POD_B = pod_uid(0xA), pod_uid(0xB)
MAIN, SIDE, OTHER = container_id(0xA1), container_id(0xA2), container_id(0xB1)


def _pod_a() -> dict:
    pod = o.pod("pod-a", POD_A, containers=[o.container("main", o.ref("gpu")), o.container("side")])
    return with_status(pod, {"main": MAIN, "side": SIDE})


def test_the_right_container_is_accepted_with_all_its_pids(cgroups: Cgroups) -> None:
    main = cgroups.container(POD_A, MAIN)
    caller = cgroups.spawn(main)
    sibling = cgroups.spawn(main)
    identity = identify(PROC, caller)
    assert identity.membership is not None
    assert (identity.membership.pod_uid, identity.membership.container_id) == (POD_A, MAIN)
    pids = verify_caller(identity, Candidate(POD_A, "main"), _pod_a(), cgroups.parent)
    assert pids == tuple(sorted((caller, sibling)))
    # the device-plugin fallback (no pod object): the kernel's facts alone
    assert verify_caller(identity, Candidate(POD_A, "main"), None, cgroups.parent) == pids


def test_a_process_of_another_pod_is_refused(cgroups: Cgroups) -> None:
    cgroups.container(POD_A, MAIN)
    intruder = cgroups.spawn(cgroups.container(POD_B, OTHER))
    with pytest.raises(WrongPod, match=f"not a process of pod {POD_A}"):
        verify_caller(identify(PROC, intruder), Candidate(POD_A, "main"), _pod_a(), cgroups.parent)


def test_a_process_outside_every_pod_is_refused(cgroups: Cgroups) -> None:
    cgroups.container(POD_A, MAIN)
    host = cgroups.spawn(None)
    caller = identify(PROC, host)
    assert caller.membership is None
    with pytest.raises(WrongPod, match="not a process of any pod"):
        verify_caller(caller, Candidate(POD_A, "main"), _pod_a(), cgroups.parent)


def test_another_container_of_the_same_pod_is_not_the_caller(cgroups: Cgroups) -> None:
    cgroups.container(POD_A, MAIN)
    side = cgroups.spawn(cgroups.container(POD_A, SIDE))
    with pytest.raises(NotTheCaller, match="is not container main"):
        verify_caller(identify(PROC, side), Candidate(POD_A, "main"), _pod_a(), cgroups.parent)


def test_a_pid_no_longer_in_the_container_is_refused(cgroups: Cgroups) -> None:
    main = cgroups.container(POD_A, MAIN)
    caller = cgroups.spawn(main)
    cgroups.spawn(main)  # the container keeps a process
    identity = identify(PROC, caller)
    cgroups.move(caller, cgroups.container(POD_A, SIDE))  # it left between /proc and cgroup.procs
    with pytest.raises(NotTheCaller, match=f"caller pid {caller} is not among the processes"):
        verify_caller(identity, Candidate(POD_A, "main"), _pod_a(), cgroups.parent)


def test_a_terminated_pod_is_not_found(cgroups: Cgroups) -> None:
    caller = cgroups.spawn(cgroups.container(POD_A, MAIN))
    pod = _pod_a()
    pod["status"]["phase"] = "Succeeded"
    with pytest.raises(TargetNotFound, match="terminated"):
        verify_caller(identify(PROC, caller), Candidate(POD_A, "main"), pod, cgroups.parent)


@pytest.mark.parametrize("systemd", [False, True, None])
def test_container_pids_by_pod_and_id_in_either_layout(cgroups: Cgroups, systemd: bool | None) -> None:
    """Cgroup mode's usage (no pids.config): a container's PIDs from its pod UID and container ID.
    The cgroupfs container dir is the ID, the systemd one `cri-containerd-<id>.scope`; a container of
    another pod, or the pod's other container, is not mixed in."""
    if systemd:
        uid = POD_A.replace("-", "_")
        pod_dir = f"kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid}.slice"
        main = cgroups.mkdir(f"{pod_dir}/cri-containerd-{MAIN}.scope")
        side = cgroups.mkdir(f"{pod_dir}/cri-containerd-{SIDE}.scope")
    else:
        main, side = cgroups.container(POD_A, MAIN), cgroups.container(POD_A, SIDE)
    ours = {cgroups.spawn(main), cgroups.spawn(main)}
    cgroups.spawn(side)
    cgroups.spawn(cgroups.container(POD_B, MAIN))  # another pod, the same container ID
    assert container_pids(cgroups.parent, systemd, POD_A, MAIN) == ours
    assert container_pids(cgroups.parent, systemd, POD_A, OTHER) == frozenset()  # no such container
    if systemd is not None:  # the other layout's names are not this driver's containers
        assert container_pids(cgroups.parent, not systemd, POD_A, MAIN) == frozenset()
