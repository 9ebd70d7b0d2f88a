"""Device programs on a real cgroup v2 cgroup (this kernel, a private cgroup2 mount from
tests/unit/libvgpu/cgroup2.py): a process in the cgroup opens /dev/null and /dev/zero, and the
kernel's EPERM or success is what the program decided. The replacement widens and narrows access,
a failed attach changes nothing, and a failed detach puts back the programs that were there."""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import require
from tests.unit.hotplug.test_devfilter import random_rules
from tests.unit.libvgpu import cgroup2
from vgpud.containers.values import DeviceRule
from vgpud.hotplug import bpfsys, cgroup2dev
from vgpud.hotplug.cgroup2dev import DeviceFilterError, attached_filters, replace_device_filter
from vgpud.hotplug.devfilter import LICENSE, compile_filter

BASE = [DeviceRule(False, "a", None, None, "rwm"), DeviceRule(True, "c", 1, 3, "rwm")]
ZERO_RW = DeviceRule(True, "c", 1, 5, "rw")
ZERO_R = DeviceRule(True, "c", 1, 5, "r")
HINT = "run the tests as root (CAP_BPF and CAP_SYS_ADMIN) on a Linux kernel with cgroup v2 (4.15 or later)"

#: waits for a line on stdin (by then the test has moved it into the cgroup), then opens each
#: PATH:MODE argument and prints {argument: errno, 0 when the open worked}
PROBE = """
import json, os, sys
sys.stdin.readline()
flags = {"r": os.O_RDONLY, "w": os.O_WRONLY, "rw": os.O_RDWR}
out = {}
for arg in sys.argv[1:]:
    path, mode = arg.split(":")
    try:
        os.close(os.open(path, flags[mode]))
        out[arg] = 0
    except OSError as error:
        out[arg] = error.errno
print(json.dumps(out))
"""


def _bpf_works() -> bool:
    try:
        os.close(bpfsys.prog_load(compile_filter([]), LICENSE))
    except OSError:
        return False
    return True


@pytest.fixture
def cgroup() -> Iterator[Path]:
    require(cgroup2.available() and _bpf_works(), "cgroup v2 and bpf(2) device programs", HINT)
    with cgroup2.hierarchy() as tree:
        yield tree.make("devices")


def opens(cgroup: Path, *args: str) -> dict[str, int]:
    """Each PATH:MODE open's errno (0: opened) in a process of `cgroup`."""
    child = subprocess.Popen(
        [sys.executable, "-c", PROBE, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        cgroup2.Hierarchy.move(child.pid, cgroup)
        out, _ = child.communicate("go\n", timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, out
    return json.loads(out)


def attach_directly(cgroup: Path, rules: list[DeviceRule]) -> None:
    """Load and attach a program beside any others, as runc does when it creates the container."""
    prog_fd = bpfsys.prog_load(compile_filter(rules), LICENSE)
    cgroup_fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY)
    try:
        bpfsys.prog_attach(cgroup_fd, prog_fd)
    finally:
        os.close(cgroup_fd)
        os.close(prog_fd)


EPERM = errno.EPERM


def test_replace_widens_then_narrows_what_a_process_may_open(cgroup: Path) -> None:
    attach_directly(cgroup, BASE)
    [runc_program] = attached_filters(cgroup)
    assert opens(cgroup, "/dev/null:rw", "/dev/zero:r") == {"/dev/null:rw": 0, "/dev/zero:r": EPERM}

    replace_device_filter(cgroup, [*BASE, ZERO_RW])
    [widened] = attached_filters(cgroup)
    assert widened != runc_program
    assert opens(cgroup, "/dev/null:rw", "/dev/zero:rw") == {"/dev/null:rw": 0, "/dev/zero:rw": 0}

    replace_device_filter(cgroup, [*BASE, ZERO_R])
    assert len(attached_filters(cgroup)) == 1
    assert opens(cgroup, "/dev/zero:r", "/dev/zero:rw", "/dev/zero:w") == {
        "/dev/zero:r": 0,
        "/dev/zero:rw": EPERM,
        "/dev/zero:w": EPERM,
    }

    replace_device_filter(cgroup, BASE)
    assert len(attached_filters(cgroup)) == 1
    assert opens(cgroup, "/dev/null:rw", "/dev/zero:r") == {"/dev/null:rw": 0, "/dev/zero:r": EPERM}


def test_replace_takes_out_every_program_that_was_there(cgroup: Path) -> None:
    """Two programs (all must allow): /dev/zero is refused until both are replaced by one."""
    attach_directly(cgroup, [*BASE, ZERO_RW])
    attach_directly(cgroup, BASE)
    assert len(attached_filters(cgroup)) == 2
    assert opens(cgroup, "/dev/zero:r") == {"/dev/zero:r": EPERM}
    replace_device_filter(cgroup, [*BASE, ZERO_RW])
    assert len(attached_filters(cgroup)) == 1
    assert opens(cgroup, "/dev/zero:r") == {"/dev/zero:r": 0}


def test_a_failed_attach_changes_nothing(cgroup: Path) -> None:
    """The kernel takes at most 64 programs per cgroup: with 64 there, the attach fails."""
    for _ in range(bpfsys.MAX_PROGS):
        attach_directly(cgroup, BASE)
    before = attached_filters(cgroup)
    with pytest.raises(DeviceFilterError) as info:
        replace_device_filter(cgroup, [*BASE, ZERO_RW])
    assert info.value.step == "attach", info.value
    assert str(cgroup) in info.value.message
    assert attached_filters(cgroup) == before
    assert opens(cgroup, "/dev/zero:r") == {"/dev/zero:r": EPERM}


def test_a_failed_detach_puts_the_old_programs_back(cgroup: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second old program's detach fails (injected; every other call is the kernel's): the
    first goes back, the new one comes out, and the error names the step."""
    attach_directly(cgroup, BASE)
    attach_directly(cgroup, BASE)
    before = sorted(attached_filters(cgroup))
    real_detach = bpfsys.prog_detach
    calls = []

    def second_fails(cgroup_fd: int, prog_fd: int) -> None:
        calls.append(prog_fd)
        if len(calls) == 2:
            raise OSError(errno.EIO, "injected")
        real_detach(cgroup_fd, prog_fd)

    monkeypatch.setattr(cgroup2dev.bpfsys, "prog_detach", second_fails)
    with pytest.raises(DeviceFilterError) as info:
        replace_device_filter(cgroup, [*BASE, ZERO_RW])
    assert info.value.step == "detach", info.value
    assert "rolled back" in info.value.message
    assert len(calls) == 3  # old 1, old 2 (fails), then the new one in the rollback
    assert sorted(attached_filters(cgroup)) == before
    assert opens(cgroup, "/dev/zero:r") == {"/dev/zero:r": EPERM}


def test_bad_rules_and_bad_cgroups_are_refused_before_any_change(cgroup: Path, tmp_path: Path) -> None:
    attach_directly(cgroup, BASE)
    before = attached_filters(cgroup)
    with pytest.raises(DeviceFilterError) as info:
        replace_device_filter(cgroup, [*BASE, DeviceRule(True, "c", -1, 0, "rw")])
    assert (info.value.step, "-1" in info.value.message) == ("load", True), info.value
    assert attached_filters(cgroup) == before
    for where in (tmp_path / "gone", tmp_path):
        with pytest.raises(DeviceFilterError) as info:
            replace_device_filter(where, BASE)
        assert (info.value.step, str(where) in info.value.message) == ("query", True), info.value


def test_the_kernel_verifier_takes_every_compiled_program(cgroup: Path) -> None:
    """The random rule lists of the interpreter test, loaded for real (unreachable code, jumps out
    of the program or an unset r0 would be refused)."""
    rng = random.Random(18)
    for _ in range(300):
        os.close(bpfsys.prog_load(compile_filter(random_rules(rng)), LICENSE))
