"""Where the acceptance run points: the real driver and NVML of this machine, or the fake pair
(csrc/fakecuda, csrc/fakenvml) over a generated H200-like profile; and the environment of each
phase process (the library preloaded, the limits, the partition directories in the run's own
temporary directory, so nothing outside it is touched)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "build"
LIBRARY = BUILD / "libvgpu" / "libvgpu-control.so"
FAKE_UUID = "GPU-5ac0ffee-1111-4222-8333-444444444444"
#: simulated ns per grid block on the fake: a spin launch of 4 x 132 blocks costs 2.1 ms of GPU time
FAKE_NS_PER_BLOCK = 4000
FAKE_PROFILE = f"""driverVersion: 570.133.20
cudaDriverVersion: "12.8"
gpus:
  - uuid: {FAKE_UUID}
    index: 0
    minor: 0
    productName: NVIDIA H200
    brand: Nvidia
    architecture: Hopper
    memoryTotal: 150754820096
    pciBusId: "00000000:19:00.0"
    computeCapability: "9.0"
"""
#: prefixes of the variables a phase must not inherit (they would change what the library enforces
#: or which GPU it sees); FAKE_* pass, so the real path also runs over a fake driver found by soname
CLEARED = ("CUDA_", "MANAGER_", "VGPU_", "PYTORCH_", "NVIDIA_VISIBLE")
PARTITION_DIRS = ("VGPU_CONFIG_DIR", "VGPU_LOCK_DIR", "VGPU_VMEM_NODE_DIR", "VGPU_SM_NODE_DIR")


@dataclass
class Target:
    """The GPU under test and the variables every process of the run needs to reach it."""

    fake: bool
    work: Path
    base: dict[str, str] = field(default_factory=dict)
    #: MANAGER_COMPATIBILITY_MODE: 0 (every process on the GPU is the container's) or 236 (client
    #: mode: the processes a register client put into pids.config; here a stub writing its parent)
    mode: int = 0

    @classmethod
    def create(cls, fake: bool, work: Path, mode: int = 0) -> Target:
        base: dict[str, str] = {}
        if fake:
            profile = work / "profile.yaml"
            profile.write_text(FAKE_PROFILE)
            base = {
                "LD_LIBRARY_PATH": f"{BUILD / 'fakecuda'}:{BUILD / 'fakenvml'}",
                "FAKE_NVML_PROFILE": str(profile),
                "FAKE_GPU_STATE": str(work / "gpu.state"),
                "FAKE_GPU_NS_PER_BLOCK": str(FAKE_NS_PER_BLOCK),
            }
        return cls(fake=fake, work=work, base=base, mode=mode)

    def adopt(self) -> None:
        """Put the fake's variables into this process (before it loads NVML) so it sees the same GPU."""
        os.environ.update(self.base)

    def client_mode(self) -> dict[str, str]:
        """The variables of client mode 236, with a stub register client that appends its parent's
        PID (the process that ran the library's registration) to pids.config, as the registry would."""
        client, pids = self.work / "register-client.sh", self.work / "pids.config"
        if not client.exists():
            client.write_text(f"#!/bin/sh\necho $PPID >> {pids}\n")
            client.chmod(0o755)
        return {
            "MANAGER_COMPATIBILITY_MODE": "236",
            "VGPU_POD_UID": "acceptance",
            "VGPU_CONTAINER_NAME": "acceptance",
            "VGPU_REGISTER_CLIENT": str(client),
            "VGPU_PIDS_CONFIG": str(pids),
        }

    def env(self, uuid: str, library: Path | None, **limits: str) -> dict[str, str]:
        """A phase process's environment: device 0 = `uuid`, `limits` (CUDA_MEM_LIMIT_0=...), the
        library preloaded unless `library` is None."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(CLEARED) and k != "LD_PRELOAD"}
        env.update(self.base)
        env["PYTHONPATH"] = str(REPO)
        env["CUDA_VISIBLE_DEVICES"] = uuid
        if library is not None:
            env.update({name: str(self.work / name.lower()) for name in PARTITION_DIRS})
            env.update(
                LD_PRELOAD=str(library),
                MANAGER_VISIBLE_DEVICE_0=uuid,
                MANAGER_COMPATIBILITY_MODE="0",
                **limits,
            )
            if self.mode == 236:
                env.update(self.client_mode())
        return env


def module_flavour(version_text: str, license_text: str) -> str:
    """`open` or `proprietary` kernel module, from /proc/driver/nvidia/version and modinfo's license."""
    if "Open Kernel Module" in version_text or "Dual MIT/GPL" in license_text:
        return "open"
    if version_text or license_text.strip() == "NVIDIA":
        return "proprietary"
    return "unknown"


def driver_facts() -> dict[str, str]:
    """The kernel module's version line and flavour (real GPU machines)."""
    try:
        version = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        version = ""
    try:
        lic = subprocess.run(
            ["modinfo", "-F", "license", "nvidia"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except OSError:
        lic = ""
    return {
        "nvrm": version.splitlines()[0] if version else "",
        "module_license": lic.strip(),
        "module_flavour": module_flavour(version, lic),
    }


def build_library() -> dict[str, object]:
    """`make -C csrc/libvgpu` of the library into build/ (the C library only: no virtualenv, no
    network, so it runs on a bare GPU machine with gcc and make)."""
    try:
        proc = subprocess.run(
            ["make", "-C", str(REPO / "csrc" / "libvgpu"), f"OUT={BUILD}", str(LIBRARY)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except OSError as exc:
        return {"rc": -1, "output_tail": str(exc)}
    return {"rc": proc.returncode, "output_tail": (proc.stdout + proc.stderr)[-2000:]}
