"""Where the GPU inventory comes from: the backend and what it needs (a profile, or the NVML library).

All that `vgpud gpus` needs, and what `vgpud run` opens first; the settings' rules about which of these
go together are in vgpud.config.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vgpud.gpu.inventory import GpuInventory, open_inventory
from vgpud.gpu.mock import shipped_profiles

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

    def inventory(self) -> GpuInventory:
        """The inventory these settings name (GpuInventoryError when it cannot be opened)."""
        return open_inventory(
            self.backend,
            profile=self.profile,
            nvml_library=str(self.nvml_library) if self.nvml_library else None,
        )

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
