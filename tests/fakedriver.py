"""A fake driver root laid out like a real GPU node's, and the fake kernel that serves it.

`build_driver_root` puts the fake libcuda and libnvidia-ml (csrc/fakecuda, csrc/fakenvml), nvidia-smi,
firmware, the device nodes and the persistence daemon's socket directory where NVIDIA's driver puts
them, so the NVIDIA container toolkit's discovery (and vgpud's CDI edits) hand them to containers as
on a real node. `FakeKernel` runs build/fakekernel/fakegpu-kernel on the root's socket: without any
env, the fakes loaded from the root, or from a container given its files, find it and through it
their GPU profile, the shared state and their caller's host pid (csrc/fakecuda/README.md, kernel
mode). Building a root and starting a kernel need root (mknod, ldconfig's chroot).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from tests.support import BUILD
from vgpud.gpu.mock import load_profile

DRIVER_LIB_DIR = "usr/lib/x86_64-linux-gnu"
KERNEL_SOCKET = "run/nvidia-persistenced/socket"

CUDA_LIBRARY = BUILD / "fakecuda" / "libcuda.so.1"
NVML_LIBRARY = BUILD / "fakenvml" / "libnvidia-ml.so.1"
NVIDIA_SMI = BUILD / "fakenvml" / "nvidia-smi"
KERNEL = BUILD / "fakekernel" / "fakegpu-kernel"
INSTALL = "run `make build` (it builds csrc/fakecuda, csrc/fakenvml and csrc/fakekernel into build/)"

NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
MODESET_MINOR = 254
#: where nvidia-uvm's dynamic major is looked for, highest first (the real module gets one at load)
UVM_MAJORS = range(254, 233, -1)
FIRMWARE = "gsp_ga10x.bin"
SERVING = "fakegpu-kernel: serving "  # the kernel's line once it listens


def fake_driver_available() -> bool:
    """Whether `make build` made every file a driver root and its kernel need."""
    return all(path.exists() for path in (CUDA_LIBRARY, NVML_LIBRARY, NVIDIA_SMI, KERNEL))


@dataclass(frozen=True)
class DriverRoot:
    root: Path
    version: str  # the profile's driverVersion, the libraries' file suffix
    uvm_major: int
    gpu_minors: tuple[int, ...]  # /dev/nvidia<minor> of each profile GPU, ascending
    libcuda: Path  # <root>/usr/lib/x86_64-linux-gnu/libcuda.so.<version>
    libnvidia_ml: Path
    nvidia_smi: Path
    cdi_hook: Path | None  # usr/bin/nvidia-cdi-hook, when one was given
    kernel_socket: Path

    @property
    def lib_dir(self) -> Path:
        return self.root / DRIVER_LIB_DIR

    def device(self, minor: int) -> Path:
        return self.root / "dev" / f"nvidia{minor}"


def build_driver_root(root: Path, profile: Path, *, cdi_hook: Path | None = None) -> DriverRoot:
    """Lay out a driver root for `profile`'s GPUs under `root`, an existing empty directory."""
    if not root.is_dir() or any(root.iterdir()):
        raise ValueError(f"{root} must be an existing empty directory")
    if not fake_driver_available():
        raise FileNotFoundError(f"the fake driver is not built: {INSTALL}")
    gpus = load_profile(profile)
    version = gpus[0].driver_version
    libcuda, libnvidia_ml = _install_libraries(root, version)
    _write_ld_cache(root)
    bin_dir = root / "usr" / "bin"
    bin_dir.mkdir(parents=True)
    shutil.copy2(NVIDIA_SMI, bin_dir / "nvidia-smi")
    installed_hook = None
    if cdi_hook is not None:
        installed_hook = bin_dir / "nvidia-cdi-hook"
        shutil.copy2(cdi_hook, installed_hook)
    firmware = root / "lib" / "firmware" / "nvidia" / version
    firmware.mkdir(parents=True)
    (firmware / FIRMWARE).write_bytes(b"fake GSP firmware\n")
    minors = tuple(sorted(gpu.minor for gpu in gpus))
    uvm_major = free_char_major()
    _make_device_nodes(root / "dev", minors, uvm_major)
    (root / KERNEL_SOCKET).parent.mkdir(parents=True)
    return DriverRoot(
        root=root,
        version=version,
        uvm_major=uvm_major,
        gpu_minors=minors,
        libcuda=libcuda,
        libnvidia_ml=libnvidia_ml,
        nvidia_smi=bin_dir / "nvidia-smi",
        cdi_hook=installed_hook,
        kernel_socket=root / KERNEL_SOCKET,
    )


def _install_libraries(root: Path, version: str) -> tuple[Path, Path]:
    """Copies named by the driver version, and the links a real node has to them."""
    lib_dir = root / DRIVER_LIB_DIR
    lib_dir.mkdir(parents=True)
    libcuda, libnvidia_ml = lib_dir / f"libcuda.so.{version}", lib_dir / f"libnvidia-ml.so.{version}"
    shutil.copy2(CUDA_LIBRARY, libcuda)
    shutil.copy2(NVML_LIBRARY, libnvidia_ml)
    (lib_dir / "libcuda.so.1").symlink_to(libcuda.name)
    (lib_dir / "libcuda.so").symlink_to("libcuda.so.1")
    (lib_dir / "libnvidia-ml.so.1").symlink_to(libnvidia_ml.name)
    return libcuda, libnvidia_ml


def _write_ld_cache(root: Path) -> None:
    """etc/ld.so.cache as the root's own ldconfig would write it (the toolkit finds libraries there).
    `ldconfig -r` chroots into the root and reads its etc/ld.so.conf; -X leaves the links as made."""
    etc = root / "etc"
    etc.mkdir()
    (etc / "ld.so.conf").write_text(f"/{DRIVER_LIB_DIR}\n")
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    done = subprocess.run([ldconfig, "-X", "-r", str(root)], capture_output=True, text=True, check=False)
    if done.returncode != 0 or not (etc / "ld.so.cache").exists():
        raise RuntimeError(f"ldconfig -r {root} failed ({done.returncode}): {done.stderr.strip()}")


def _make_device_nodes(dev: Path, minors: tuple[int, ...], uvm_major: int) -> None:
    dev.mkdir()
    nodes = {f"nvidia{minor}": (NVIDIA_MAJOR, minor) for minor in minors}
    nodes |= {
        "nvidiactl": (NVIDIA_MAJOR, NVIDIACTL_MINOR),
        "nvidia-modeset": (NVIDIA_MAJOR, MODESET_MINOR),
        "nvidia-uvm": (uvm_major, 0),
        "nvidia-uvm-tools": (uvm_major, 1),
    }
    for name, (major, minor) in nodes.items():
        path = dev / name
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        path.chmod(0o666)  # mknod's mode went through the umask


def free_char_major(devices: Path = Path("/proc/devices")) -> int:
    """The highest character-device major in 234..254 that this host's kernel has not given out, so
    the fake nvidia-uvm nodes name no real driver."""
    used = set()
    section = ""
    for line in devices.read_text().splitlines():
        if line.endswith(":"):
            section = line
        elif section == "Character devices:" and line.split():
            used.add(int(line.split()[0]))
    for major in UVM_MAJORS:
        if major not in used:
            return major
    raise RuntimeError(f"no character-device major in 234..254 is free in {devices}")


class FakeKernelError(RuntimeError):
    """The fake kernel did not come up (its log tail says why)."""


class FakeKernel:
    """build/fakekernel/fakegpu-kernel serving one socket, its output in a log file of its own.
    `stop()` (or the end of a `with` block) ends it by its pid: SIGTERM, then SIGKILL."""

    def __init__(self, proc: subprocess.Popen[bytes], socket_path: Path, log: Path) -> None:
        self.proc = proc
        self.socket = socket_path
        self.log = log

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def start(
        cls, profile: Path, state: Path, socket_path: Path, *, log: Path | None = None, timeout: float = 10.0
    ) -> FakeKernel:
        """Start a kernel and return once its socket accepts connections. `log` defaults to
        <state>.kernel.log."""
        log = log or state.with_name(state.name + ".kernel.log")
        command = [
            str(KERNEL),
            "--socket",
            str(socket_path),
            "--profile",
            str(profile),
            "--state",
            str(state),
        ]
        with log.open("wb") as out:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        kernel = cls(proc, socket_path, log)
        kernel._wait_ready(timeout)
        return kernel

    def _wait_ready(self, timeout: float) -> None:
        """Until this kernel said it serves (another one may answer on the socket) and it accepts."""
        deadline = time.monotonic() + timeout
        while not (SERVING in self.log.read_text(errors="replace") and _accepts(self.socket)):
            if self.proc.poll() is not None:
                raise FakeKernelError(f"fakegpu-kernel exited {self.proc.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise FakeKernelError(f"fakegpu-kernel did not listen within {timeout} s: {self.log_tail()}")
            time.sleep(0.01)

    def stop(self, timeout: float = 5.0) -> int:
        """End the kernel (its socket is removed); returns its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def log_tail(self, lines: int = 20) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"

    def __enter__(self) -> FakeKernel:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def connect_kernel(socket_path: Path) -> socket.socket:
    """A connection to the kernel at `socket_path` (OSError if none answers). Through the directory's
    fd, as the fakes do: a test's directory may be deeper than a socket address holds."""
    dirfd = os.open(socket_path.parent, os.O_PATH | os.O_DIRECTORY)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(f"/proc/self/fd/{dirfd}/{socket_path.name}")
    except OSError:
        conn.close()
        raise
    finally:
        os.close(dirfd)
    return conn


def _accepts(socket_path: Path) -> bool:
    """Whether a kernel listens at `socket_path` (a connection that sends nothing is a probe to it,
    not an error)."""
    try:
        connect_kernel(socket_path).close()
    except OSError:
        return False
    return True
