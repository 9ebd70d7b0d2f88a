"""FAKE_GPU_HOST_PROC: the fakes record a process by its pid in the host's PID namespace, as the real
kernel module does, also when the process runs in a PID namespace of its own (a container without
hostPID, tests/e2e/test_node_cgroup_mode.py). Here `unshare --pid --fork` makes that namespace and
/proc stays the host's procfs, as the host /proc mounted into a container is."""

from __future__ import annotations

import os
import shutil

import pytest

from tests.support import require
from tests.unit.fakes.conftest import Env
from tests.unit.fakes.gpu import GIB, run, start

IN_PID_NAMESPACE = ("unshare", "--pid", "--fork")

# Allocates 1 GiB on ordinal 0 (NVML index 1), reports its own and its host pid, holds.
HOLDER = """
cuda.init()
cuda.use(0)
rc = cuda('cuMemAlloc_v2', ref(u64()), sz(GIB))
emit(rc=rc, pid=os.getpid(), host_pid=int(os.readlink('/proc/self')))
hold()
"""

OBSERVER = """
nvml = Nvml(os.environ["FAKE_NVML_LIB"])
emit(procs=nvml.processes(1))
"""


@pytest.fixture(autouse=True)
def _pid_namespaces() -> None:
    able = os.geteuid() == 0 and shutil.which("unshare") is not None
    require(able, "root and util-linux's unshare", "run the tests as root with util-linux installed")


@pytest.mark.parametrize("host_proc", [True, False])
def test_process_in_a_pid_namespace_is_listed_by_its_host_pid(gpu_env: Env, host_proc: bool) -> None:
    env = gpu_env(**({"FAKE_GPU_HOST_PROC": "/proc"} if host_proc else {}))
    child = start(HOLDER, env, IN_PID_NAMESPACE)
    got = child.read()
    try:
        assert got["rc"] == 0 and got["pid"] == 1 and got["host_pid"] != 1, got
        listed = {int(p): b for p, b in run(OBSERVER, env)["procs"].items()}
        # the host observer reaps what it cannot find alive: pid 1 is alive here (init), so the
        # namespace pid stays listed, under a number that is not the holder's on the host
        assert listed == {(got["host_pid"] if host_proc else 1): GIB}, listed
    finally:
        child.finish()


def test_observer_in_another_pid_namespace_keeps_the_host_pid_alive(gpu_env: Env) -> None:
    """Liveness is checked in the host's procfs too: from another PID namespace, kill(2) of a host
    pid would find nothing and drop a live process's memory."""
    env = gpu_env(FAKE_GPU_HOST_PROC="/proc")
    child = start(HOLDER, env, IN_PID_NAMESPACE)
    got = child.read()
    try:
        listed = {int(p): b for p, b in run(OBSERVER, env, IN_PID_NAMESPACE)["procs"].items()}
        assert listed == {got["host_pid"]: GIB}, listed
    finally:
        child.finish()
    assert run(OBSERVER, env, IN_PID_NAMESPACE)["procs"] == {}
