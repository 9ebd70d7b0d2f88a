"""The cgroup v1 writer on this host's real devices hierarchy: a process in a fresh devices cgroup is
refused /dev/zero (EPERM) until `allow` writes its rule, and again after `deny`."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import require
from vgpud.containers.values import DeviceRule
from vgpud.hotplug import cgroup1dev
from vgpud.hotplug.devrules import char_rule

DEVICES = Path("/sys/fs/cgroup") / cgroup1dev.DEVICES_HIERARCHY
NULL, ZERO = char_rule(1, 3, "rwm"), char_rule(1, 5, "rw")
#: a child that opens each path named on stdin in its cgroup and answers the errno (0: opened)
OPENER = """
import os, sys
for line in sys.stdin:
    try:
        os.close(os.open(line.strip(), os.O_RDONLY)); print(0, flush=True)
    except OSError as err:
        print(err.errno, flush=True)
"""


@pytest.fixture
def cgroup() -> Iterator[Path]:
    require(
        (DEVICES / "devices.allow").exists() and os.geteuid() == 0,
        "a cgroup v1 devices hierarchy at /sys/fs/cgroup/devices, as root",
        "run the tests as root on a host with cgroup v1 or hybrid cgroups (Debian 12 here)",
    )
    path = DEVICES / f"vgpud-test-{uuid.uuid4().hex[:12]}"
    path.mkdir()
    try:
        (path / "devices.deny").write_text("a")
        cgroup1dev.allow(path, [NULL])
        yield path
    finally:
        path.rmdir()


def test_allow_and_deny_change_what_a_running_process_may_open(cgroup: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", OPENER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        (cgroup / "cgroup.procs").write_text(str(child.pid))

        def opens(path: str) -> int:
            child.stdin.write(path + "\n")
            child.stdin.flush()
            return int(child.stdout.readline())

        assert (opens("/dev/null"), opens("/dev/zero")) == (0, errno.EPERM)
        cgroup1dev.allow(cgroup, [ZERO])
        assert opens("/dev/zero") == 0
        assert "c 1:5 rw" in cgroup1dev.listed(cgroup)
        cgroup1dev.deny(cgroup, [ZERO])
        assert opens("/dev/zero") == errno.EPERM
        assert opens("/dev/null") == 0
    finally:
        child.stdin.close()
        child.wait(timeout=10)


def test_a_rule_the_parent_does_not_allow_is_refused_with_a_clear_error(cgroup: Path) -> None:
    inner = cgroup / "inner"
    inner.mkdir()
    try:
        with pytest.raises(cgroup1dev.DeviceCgroupError, match=r"writing 'c 1:5 rw' to .*devices.allow"):
            cgroup1dev.allow(inner, [ZERO])  # the parent denies 1:5
        assert "c 1:5 rw" not in cgroup1dev.listed(inner)
    finally:
        inner.rmdir()


def test_a_symlinked_or_missing_cgroup_is_refused(cgroup: Path, tmp_path: Path) -> None:
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "devices.allow").write_text("")
    link = tmp_path / "link"
    link.symlink_to(fake)
    with pytest.raises(cgroup1dev.DeviceCgroupError, match="cannot open the container's devices cgroup"):
        cgroup1dev.allow(link, [ZERO])
    assert (fake / "devices.allow").read_text() == ""
    (fake / "real").mkdir()
    (fake / "real" / "devices.allow").symlink_to(fake / "devices.allow")
    with pytest.raises(cgroup1dev.DeviceCgroupError, match="cannot open"):
        cgroup1dev.allow(fake / "real", [ZERO])
    assert (fake / "devices.allow").read_text() == ""
    with pytest.raises(cgroup1dev.DeviceCgroupError, match="No such file"):
        cgroup1dev.deny(cgroup / "gone", [DeviceRule(False, "c", 1, 5, "rw")])
