"""Kernel mode of the fakes: a driver root (tests/fakedriver.py) and its fake kernel, no FAKE_* env.

The fakes loaded from the root's library directory find the kernel at the root's
run/nvidia-persistenced/socket and learn from it the profile, the state and their caller's host pid;
they see the GPUs whose device nodes the root has; the kernel frees a process's memory when its
last connection closes. Every child here runs without FAKE_* variables.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fakedriver import (
    INSTALL,
    DriverRoot,
    FakeKernel,
    build_driver_root,
    connect_kernel,
    fake_driver_available,
)
from tests.support import REPO, require
from tests.unit.fakes.gpu import GIB, UUID_A, UUID_B, Child, profile_text

IN_PID_NAMESPACE = ("unshare", "--pid", "--fork", "--mount-proc")
GPU_NAME = "NVIDIA A100-SXM4-40GB"
HELLO = "=4sI"  # csrc/fakestate/kernel.h: fk_hello
REPLY = "=4sIi"  # fk_reply

# The children's common start: the root's library directory is argv[1].
PRELUDE = """
import ctypes, os, sys
from tests.unit.fakes.gpu import GIB, Cuda, Nvml, emit, hold
ref = ctypes.byref
lib_dir = sys.argv[1]
cuda_path = os.path.join(lib_dir, "libcuda.so.1")
nvml_path = os.path.join(lib_dir, "libnvidia-ml.so.1")

def nvml_gpus(nvml):
    n = ctypes.c_uint()
    assert nvml.lib.nvmlDeviceGetCount_v2(ref(n)) == 0
    gpus = []
    for i in range(n.value):
        h, uuid = nvml.handle(i), ctypes.create_string_buffer(96)
        minor, index = ctypes.c_uint(), ctypes.c_uint()
        assert nvml.lib.nvmlDeviceGetUUID(h, uuid, 96) == 0
        assert nvml.lib.nvmlDeviceGetMinorNumber(h, ref(minor)) == 0
        assert nvml.lib.nvmlDeviceGetIndex(h, ref(index)) == 0
        gpus.append(dict(uuid=uuid.value.decode(), minor=minor.value, index=index.value,
                         procs=nvml.processes(i), used=nvml.memory(i)[2]))
    return gpus
"""

# Allocates 1 GiB on CUDA ordinal 0, reports its pid as it sees it, holds.
HOLDER = """
cuda = Cuda(cuda_path)
cuda.init()
cuda.use(0)
cuda.alloc(GIB)
emit(pid=os.getpid(), uuid=cuda.uuid(0))
hold()
"""

# The GPUs as NVML shows them: uuid, minor, index, {pid: bytes}, used bytes.
OBSERVER = """
emit(gpus=nvml_gpus(Nvml(nvml_path)))
"""


@dataclass(frozen=True)
class Driver:
    root: DriverRoot
    kernel: FakeKernel


def require_fake_driver() -> None:
    require(
        fake_driver_available(), "the fake driver (build/fakekernel/fakegpu-kernel and the fakes)", INSTALL
    )
    require(os.geteuid() == 0, "root", "run the tests as root: a driver root has device nodes (mknod)")


@pytest.fixture
def driver_root(tmp_path: Path) -> DriverRoot:
    require_fake_driver()
    profile = tmp_path / "profile.yaml"
    profile.write_text(profile_text())
    (tmp_path / "root").mkdir()
    return build_driver_root(tmp_path / "root", profile)


@pytest.fixture
def driver(driver_root: DriverRoot, tmp_path: Path) -> Iterator[Driver]:
    with FakeKernel.start(
        tmp_path / "profile.yaml", tmp_path / "gpu.state", driver_root.kernel_socket
    ) as kernel:
        yield Driver(driver_root, kernel)


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without anything that would point the fakes somewhere."""
    dropped = {"CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "LD_PRELOAD"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_") and k not in dropped}
    return {**env, "PYTHONPATH": str(REPO), **extra}


def spawn(script: str, root: DriverRoot, prefix: Sequence[str] = ()) -> Child:
    proc = subprocess.Popen(
        [*prefix, sys.executable, "-c", PRELUDE + script, str(root.lib_dir)],
        env=clean_env(),
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return Child(proc)


def run(script: str, root: DriverRoot, prefix: Sequence[str] = ()) -> dict[str, Any]:
    child = spawn(script, root, prefix)
    report = child.read()
    child.finish()
    return report


def observe(root: DriverRoot, prefix: Sequence[str] = ()) -> list[dict[str, Any]]:
    gpus = run(OBSERVER, root, prefix)["gpus"]
    for gpu in gpus:
        gpu["procs"] = {int(pid): used for pid, used in gpu["procs"].items()}
    return gpus


def ns_pids(host_pid: int) -> list[int]:
    """The pid of `host_pid` in each PID namespace it is in, outermost first (NSpid)."""
    for line in Path(f"/proc/{host_pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return [int(n) for n in line.split()[1:]]
    raise AssertionError(f"no NSpid for {host_pid}")


def test_the_driver_root_is_laid_out_as_a_gpu_node(driver_root: DriverRoot, tmp_path: Path) -> None:
    lib = driver_root.lib_dir
    assert driver_root.version == "550.54.15" and driver_root.gpu_minors == (0, 1)
    assert not driver_root.libcuda.is_symlink() and driver_root.libcuda.name == "libcuda.so.550.54.15"
    links = {p.name: os.readlink(p) for p in lib.iterdir() if p.is_symlink()}
    assert links == {
        "libcuda.so.1": "libcuda.so.550.54.15",
        "libcuda.so": "libcuda.so.1",
        "libnvidia-ml.so.1": "libnvidia-ml.so.550.54.15",
    }
    cache = subprocess.run(
        ["ldconfig", "-r", str(driver_root.root), "-p"], capture_output=True, text=True, check=True
    ).stdout
    assert "libnvidia-ml.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1" in cache
    nodes = {p.name: os.lstat(p) for p in (driver_root.root / "dev").iterdir()}
    numbers = {name: (os.major(st.st_rdev), os.minor(st.st_rdev)) for name, st in nodes.items()}
    uvm = driver_root.uvm_major
    assert numbers == {
        "nvidia0": (195, 0),
        "nvidia1": (195, 1),
        "nvidiactl": (195, 255),
        "nvidia-modeset": (195, 254),
        "nvidia-uvm": (uvm, 0),
        "nvidia-uvm-tools": (uvm, 1),
    }
    assert all(stat.S_ISCHR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666 for st in nodes.values())
    char_devices = Path("/proc/devices").read_text().split("Block devices:")[0]
    assert str(uvm) not in char_devices.split()  # no real driver has that major
    assert (driver_root.root / "lib/firmware/nvidia/550.54.15/gsp_ga10x.bin").is_file()
    hook = tmp_path / "hook"
    hook.write_text("#!/bin/sh\n")
    (tmp_path / "other").mkdir()
    with_hook = build_driver_root(tmp_path / "other", tmp_path / "profile.yaml", cdi_hook=hook)
    assert with_hook.cdi_hook == tmp_path / "other/usr/bin/nvidia-cdi-hook"
    assert with_hook.cdi_hook.read_text() == hook.read_text()


def test_a_process_in_its_own_pid_namespace_is_charged_by_host_pid_and_freed_when_it_dies(
    driver: Driver,
) -> None:
    able = shutil.which("unshare") is not None
    require(able, "util-linux's unshare", "install util-linux")
    holder = spawn(HOLDER, driver.root, IN_PID_NAMESPACE)
    got = holder.read()
    # CUDA ordinal 0 and NVML index 0 are the lower PCI bus id: UUID_B
    assert got == {"pid": 1, "uuid": UUID_B}
    gpus = observe(driver.root)
    ((host_pid, used),) = gpus[0]["procs"].items()
    assert used == GIB and gpus[0]["used"] == GIB and gpus[1]["procs"] == {}
    assert ns_pids(host_pid) == [host_pid, 1]  # the kernel named it as the host does
    # a reader in another PID namespace, where that pid is no process, drops nothing
    assert observe(driver.root, IN_PID_NAMESPACE)[0]["procs"] == {host_pid: GIB}
    os.kill(host_pid, signal.SIGKILL)  # no exit path of its own: the kernel must free its memory
    holder.proc.communicate(timeout=30)
    deadline = time.monotonic() + 10
    while (gpus := observe(driver.root))[0]["procs"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gpus[0]["procs"] == {} and gpus[0]["used"] == 0


# In a fork child: the parent's library was loaded and connected (cuDriverGetVersion) but CUDA not
# initialized, so the child may initialize; it must be charged as itself. A child forked after the
# parent's cuInit is refused, as before.
FORKS = """
cuda = Cuda(cuda_path)
cuda.ok("cuDriverGetVersion", ref(ctypes.c_int()))
ready_r, ready_w = os.pipe()
done_r, done_w = os.pipe()
child = os.fork()
if child == 0:
    cuda.init()
    cuda.use(0)
    cuda.alloc(GIB)
    os.write(ready_w, b"x")
    os.read(done_r, 1)
    os._exit(0)
os.read(ready_r, 1)
cuda.init()
late = os.fork()
if late == 0:
    os._exit(cuda("cuInit", 0))
emit(parent=os.getpid(), child=child, late_init=os.waitstatus_to_exitcode(os.waitpid(late, 0)[1]))
hold()
os.write(done_w, b"x")
os.waitpid(child, 0)
"""


def test_a_fork_child_is_charged_as_itself_never_as_its_parent(driver: Driver) -> None:
    process = spawn(FORKS, driver.root)
    got = process.read()
    try:
        assert got["late_init"] == 3  # CUDA_ERROR_NOT_INITIALIZED
        assert observe(driver.root)[0]["procs"] == {got["child"]: GIB}
    finally:
        process.finish()


def test_nvml_shutdown_keeps_the_memory_of_a_process_that_still_has_cuda(driver: Driver) -> None:
    """One connection per library: the kernel frees a pid's memory only when its last one closes."""
    script = HOLDER.replace("emit(", "assert Nvml(nvml_path).lib.nvmlShutdown() == 0\nemit(")
    holder = spawn(script, driver.root)
    pid = holder.read()["pid"]
    try:
        assert observe(driver.root)[0]["procs"] == {pid: GIB}
    finally:
        holder.finish()


def replace_node(path: Path, how: str) -> None:
    path.unlink()
    if how == "wrong minor":
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(195, 7))
    elif how == "regular file":
        path.write_text("")


@pytest.mark.parametrize("how", ["missing", "wrong minor", "regular file"])
def test_only_gpus_with_their_device_node_are_enumerated(driver: Driver, how: str) -> None:
    replace_node(driver.root.device(1), how)  # minor 1 is UUID_B, the lower PCI bus id
    report = run(
        "cuda = Cuda(cuda_path)\ncuda.init()\n"
        "emit(cuda=[cuda.uuid(i) for i in range(cuda.count())], nvml=nvml_gpus(Nvml(nvml_path)))",
        driver.root,
    )
    assert report["cuda"] == [UUID_A]
    # NVML numbers the visible GPUs from 0; minor and UUID stay the GPU's own
    assert [(g["uuid"], g["index"], g["minor"]) for g in report["nvml"]] == [(UUID_A, 0, 0)]


def hello(version: int = 1) -> bytes:
    return struct.pack(HELLO, b"FGKH", version)


def test_the_handshake_gives_the_profile_the_state_and_the_host_pid(driver: Driver, tmp_path: Path) -> None:
    with connect_kernel(driver.root.kernel_socket) as conn:
        conn.sendall(hello())
        reply, fds, _, _ = socket.recv_fds(conn, struct.calcsize(REPLY), 4)
    try:
        assert struct.unpack(REPLY, reply) == (b"FGKR", 1, os.getpid())
        assert len(fds) == 2
        assert os.read(fds[0], 1 << 16) == (tmp_path / "profile.yaml").read_bytes()
        assert os.fstat(fds[1]).st_ino == (tmp_path / "gpu.state").stat().st_ino
    finally:
        for fd in fds:
            os.close(fd)


def test_bad_handshakes_are_refused_and_the_kernel_keeps_serving(driver: Driver) -> None:
    with connect_kernel(driver.root.kernel_socket) as conn:
        conn.sendall(b"GARBAGE!")
        assert conn.recv(64) == b""  # closed, no answer
    with connect_kernel(driver.root.kernel_socket) as conn:
        conn.sendall(hello(99))
        assert struct.unpack(REPLY, conn.recv(64)) == (b"FGKR", 1, 0)  # its version, no pid, no fds
        assert conn.recv(64) == b""
    with connect_kernel(driver.root.kernel_socket) as conn:
        conn.sendall(hello()[:3])  # half a hello, then gone
    assert [g["uuid"] for g in observe(driver.root)] == [UUID_B, UUID_A]
    log = driver.kernel.log.read_text()
    assert "refused: not a handshake" in log and "protocol version 99, this kernel speaks 1" in log
    assert "closed during the handshake (3 of 8 bytes)" in log
    assert len(log.splitlines()) == 4, log  # the start line, three refusals; nothing per good client


def smi(root: DriverRoot, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env(LD_LIBRARY_PATH=str(root.lib_dir))
    command = [str(root.nvidia_smi), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=30, check=False)


def test_nvidia_smi_shows_the_gpus_and_their_memory(driver: Driver) -> None:
    holder = spawn(HOLDER, driver.root)
    holder.read()
    try:
        listed = smi(driver.root, "-L")
        table = smi(driver.root)
        query = smi(driver.root, "--query-gpu=uuid,memory.total,memory.used", "--format=csv,noheader,nounits")
        version = smi(driver.root, "--version")
        wrong = smi(driver.root, "--query-gpu=name", "--format=csv")
    finally:
        holder.finish()
    assert listed.stdout.splitlines() == [
        f"GPU 0: {GPU_NAME} (UUID: {UUID_B})",
        f"GPU 1: {GPU_NAME} (UUID: {UUID_A})",
    ]
    rows = table.stdout.splitlines()
    assert rows[0].startswith("NVIDIA-SMI 550.54.15") and "CUDA Version: 12.4" in rows[0]
    assert rows[1].split()[-2:] == ["MIG", "M."]
    assert rows[2].split() == ["0", *GPU_NAME.split(), UUID_B, "1024MiB", "/", "8192MiB", "Disabled"]
    assert rows[3].split() == ["1", *GPU_NAME.split(), UUID_A, "0MiB", "/", "8192MiB", "Disabled"]
    assert query.stdout.splitlines() == [f"{UUID_B}, 8192, 1024", f"{UUID_A}, 8192, 0"]
    assert "DRIVER version      : 550.54.15" in version.stdout
    assert wrong.returncode == 2 and 'Field "name" is not a valid field to query.' in wrong.stderr


def test_a_root_deeper_than_a_socket_address_holds(tmp_path: Path) -> None:
    require_fake_driver()
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    (tmp_path / "profile.yaml").write_text(profile_text())
    root = build_driver_root(deep, tmp_path / "profile.yaml")
    assert len(str(root.kernel_socket)) > 108  # sun_path
    with FakeKernel.start(tmp_path / "profile.yaml", tmp_path / "gpu.state", root.kernel_socket):
        assert smi(root, "-L").stdout.count("GPU-") == 2
    assert not root.kernel_socket.exists()  # removed at SIGTERM


def test_nvidia_smi_without_a_kernel_says_it_cannot_reach_the_driver(driver_root: DriverRoot) -> None:
    done = smi(driver_root, "-L")
    assert done.returncode == 9
    first, why = done.stdout.splitlines()[:2]
    assert first.startswith("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
    assert f"a running fake kernel at {driver_root.kernel_socket} (no answer there" in why
