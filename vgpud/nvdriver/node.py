"""Which driver files this node's vGPU containers get: the start-up decision, from the settings.

On the nvml backend, or with a driver root set explicitly, the root must hold the driver NVML
reported and every GPU's device node: otherwise vgpud does not start, because its pods would get
their limits and no GPU. Simulated GPUs (the mock backend) on a machine without a driver get no
driver files, and that is logged.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from vgpud.nvdriver.discover import (
    DriverFiles,
    DriverRootError,
    DriverRoots,
    check_cdi_hook,
    describe,
    discover,
    find_cdi_hook,
)

log = logging.getLogger(__name__)
HOOK_OFF = "off"


def cdi_hook(roots: DriverRoots, setting: Path | str | None) -> str | None:
    """The host path of nvidia-cdi-hook to use: the configured one (checked), none when `off`,
    else the toolkit's install places under the driver root."""
    if setting == HOOK_OFF:
        return None
    if setting is not None:
        return check_cdi_hook(Path(setting))
    return find_cdi_hook(roots)


def node_driver_files(
    roots: DriverRoots,
    version: str,
    minors: Sequence[int],
    *,
    required: bool,
    hook_setting: Path | str | None,
) -> DriverFiles | None:
    """What this node's vGPU containers receive from the driver; DriverRootError when `required` and
    the roots lack it, None (logged) when they lack it and it is not required."""
    if not minors:
        return None
    try:
        files = discover(roots, version, minors, cdi_hook(roots, hook_setting))
    except DriverRootError as err:
        if required:
            raise DriverRootError(
                f"{err}: vGPU containers would get no GPU (the driver root is set with --driver-root / "
                "NVIDIA_DRIVER_ROOT, the dev root with --dev-root / NVIDIA_DEV_ROOT)"
            ) from None
        log.warning("%s: containers of the simulated GPUs get their limits and no driver files", err)
        return None
    for line in describe(files):
        log.info("%s", line)
    if files.cdi_hook is None:
        log.warning(
            "no nvidia-cdi-hook (--nvidia-cdi-hook-path): vGPU containers get the driver libraries' links "
            "as bind mounts and no linker-cache update, so an image whose loader does not search %s "
            "finds no libcuda.so.1",
            ", ".join(files.library_dirs),
        )
    return files
