"""The library's cgroup v2 membership rule on a real v2 hierarchy (tests/unit/libvgpu/cgroup2.py): the
probe joins a cgroup and gets a cgroup namespace rooted there (`unshare --cgroup`), as a container's
process does on a v2 node, and reads the real /proc (the host's: no PID namespace here) as the
library reads /etc/vgpu-manager/.host_proc. An outsider holds 512 MiB of the fake GPU and the limit
is 1 GiB, so a 128 MiB fill gets 8 chunks when the outsider is in another cgroup and 4 when it is in
the probe's own."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import require
from tests.unit.libvgpu import cgroup2
from tests.unit.libvgpu.conftest import MIB, Container, parse, read_result


@pytest.fixture
def tree() -> Iterator[cgroup2.Hierarchy]:
    require(cgroup2.available(), "a cgroup v2 mount and unshare", cgroup2.INSTALL_HINT)
    with cgroup2.hierarchy() as mounted:
        yield mounted


def _in_namespace(container: Container, cgroup: Path, *args: str, **env: str) -> dict[str, str]:
    """memprobe ARGS in `cgroup` with its own cgroup namespace rooted there (same PID)."""
    wrapper = container.root / "enter-v2.sh"
    wrapper.write_text(f'#!/bin/sh\necho $$ > {cgroup}/cgroup.procs && exec unshare --cgroup "$@"\n')
    wrapper.chmod(0o755)
    proc = subprocess.run(
        [str(wrapper), str(container.probe), *args],
        env=container.environ(**env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return parse(proc.stdout)


def _seen_from(cgroup: Path, pid: int) -> str:
    """The `0::` line of /proc/<pid>/cgroup as a process of `cgroup`'s namespace reads it."""
    text = subprocess.run(
        ["sh", "-c", f"echo $$ > {cgroup}/cgroup.procs && exec unshare --cgroup cat /proc/{pid}/cgroup"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return next(line for line in text.splitlines() if line.startswith("0::"))


@pytest.mark.parametrize("mode", ["2", "102"])
@pytest.mark.parametrize(("outsider_ours", "expected"), [(False, "8"), (True, "4")])
def test_v2_rule_counts_the_processes_of_our_cgroup(
    container: Container, tree: cgroup2.Hierarchy, mode: str, outsider_ours: bool, expected: str
) -> None:
    ours, other = tree.make("ours"), tree.make("other")
    outsider = container.start("take", str(512 * MIB), preload=False)
    try:
        assert read_result(outsider, ("rc",))["rc"] == "0"
        tree.move(outsider.pid, ours if outsider_ours else other)
        seen = _seen_from(ours, outsider.pid)
        assert seen == ("0::/" if outsider_ours else f"0::/../{other.name}"), seen
        env = {"MANAGER_COMPATIBILITY_MODE": mode, "VGPU_HOST_PROC": "/proc", "CUDA_MEM_LIMIT_0": "1g"}
        assert _in_namespace(container, ours, "fill", "direct", str(128 * MIB), **env)["count"] == expected
    finally:
        outsider.communicate(timeout=30)


def test_v2_rule_counts_a_forked_child_with_its_parent(container: Container, tree: cgroup2.Hierarchy) -> None:
    """The child of a fork stays in its parent's cgroup: the parent's 256 MiB count against the
    child's fill (3 chunks of 1 GiB, not 4), the outsider in the other cgroup does not."""
    ours, other = tree.make("ours"), tree.make("other")
    outsider = container.start("take", str(512 * MIB), preload=False)
    try:
        assert read_result(outsider, ("rc",))["rc"] == "0"
        tree.move(outsider.pid, other)
        env = {"MANAGER_COMPATIBILITY_MODE": "102", "VGPU_HOST_PROC": "/proc", "CUDA_MEM_LIMIT_0": "1g"}
        got = _in_namespace(container, ours, "fork", str(256 * MIB), **env)
    finally:
        outsider.communicate(timeout=30)
    assert (got["parent_rc"], got["count"], got["child_status"]) == ("0", "3", "0"), got
