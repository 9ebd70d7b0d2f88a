"""Where the GPU inventory comes from: the backend and what it needs (a profile, or the NVML library).

All that `vgpud gpus` needs, and what `vgpud run` opens first; the settings' rules about which of these
go together are in vgpud.config.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vgpud.gpu.inventory import GpuInventory, open_inventory
from vgpud.gpu.mock import shipped_profiles
from vgpud.gpu.model import GpuInventoryError
from vgpud.nvdriver.discover import DriverRoots, find_nvml
from vgpud.nvdriver.names import NVML_SONAME

GPU_BACKENDS = ("nvml", "mock")
BUILTIN_PROFILES = tuple(shipped_profiles())


def gpu_profile(raw: str) -> Path:
    """A built-in profile name or the path of a YAML profile file (ValueError otherwise)."""
    if raw in BUILTIN_PROFILES:
        return shipped_profiles()[raw]
    path = Path(raw)
    if not path.is_file():
        raise ValueError(
            f"{raw!r} is neither a built-in profile ({', '.join(BUILTIN_PROFILES)}) nor a readable file"
        )
    return path.resolve()


@dataclass(frozen=True)
class GpuSource:
    backend: str
    profile: Path | None
    nvml_library: Path | None
    #: the driver root as vgpud sees it: where NVML is looked for when no library is named
    driver_root: Path | None = None

    def inventory(self) -> GpuInventory:
        """The inventory these settings name (GpuInventoryError when it cannot be opened)."""
        return open_inventory(self.backend, profile=self.profile, nvml_library=self.nvml_path())

    def nvml_path(self) -> str | None:
        """The NVML library the nvml backend loads: the named one, else libnvidia-ml.so.1 in the
        driver root (GpuInventoryError when it has none); None for the mock backend."""
        if self.backend != "nvml":
            return None
        if self.nvml_library is not None:
            return str(self.nvml_library)
        root = self.driver_root or Path("/")
        found = find_nvml(DriverRoots.same(root))
        if found is None:
            raise GpuInventoryError(
                f"no {NVML_SONAME} under the driver root {root} (set --driver-root to the NVIDIA driver's "
                "root, /run/nvidia/driver under the GPU Operator, or --nvml-library)"
            )
        return str(found)

    def problem(self) -> str | None:
        """Why these do not go together, None when they do."""
        if self.backend == "mock" and self.profile is None:
            return (
                "--gpu-backend mock needs --gpu-profile (a YAML file or one of "
                + ", ".join(BUILTIN_PROFILES)
                + ")"
            )
        if self.backend == "nvml" and self.profile is not None:
            return "--gpu-profile is only used with --gpu-backend mock"
        if self.backend == "mock" and self.nvml_library is not None:
            return "--nvml-library is only used with --gpu-backend nvml"
        return None
