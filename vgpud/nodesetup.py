"""What vgpud puts on the host before it prepares anything: the manager root the CDI mounts point at.

Every vGPU container gets read-only bind mounts of `<root>/registry`, `<root>/ld.so.preload` and
`<root>/libvgpu-control.so.<version>`; a missing source makes container creation fail, so they are
created at start, idempotently, and replaced atomically when their content changes.
"""

from __future__ import annotations

import logging
from pathlib import Path

from vgpud.fsutil import write_atomic
from vgpud.partition.layout import CONT_CONTROL_LIBRARY, REGISTER_CLIENT, Layout

log = logging.getLogger("vgpud.node")

REGISTRY_DIR_MODE = 0o711


def cgroup_v2(cgroup_root: Path = Path("/sys/fs/cgroup")) -> bool:
    """True on a unified (v2-only) hierarchy; hybrid and v1 hosts count as v1, as in the reference."""
    return (cgroup_root / "cgroup.controllers").is_file()


def prepare_manager_root(
    layout: Layout, library_version: str, library_source: Path | None, register_client: Path | None = None
) -> None:
    """Create the claims and registry dirs, `ld.so.preload`, the versioned control library and the
    register client the library runs from the (read-only mounted) registry dir."""
    root = Path(layout.root)
    root.mkdir(parents=True, exist_ok=True, mode=0o755)
    Path(layout.claims_dir).mkdir(exist_ok=True, mode=0o755)
    registry = Path(layout.registry_dir)
    registry.mkdir(exist_ok=True)
    registry.chmod(REGISTRY_DIR_MODE)
    _replace_if_different(Path(layout.ld_so_preload), f"{CONT_CONTROL_LIBRARY}\n".encode(), 0o644)
    if register_client is not None:
        _replace_if_different(registry / REGISTER_CLIENT, register_client.read_bytes(), 0o755)
    library = Path(layout.control_library(library_version))
    if library_source is not None:
        _replace_if_different(library, library_source.read_bytes(), 0o755)
    elif not library.exists():
        # an empty file keeps the bind mount valid; the loader ignores a library it cannot load
        _replace_if_different(library, b"", 0o644)
        log.warning(
            "no control library installed at %s (--library-source not given): containers get "
            "the vGPU env and mounts but no enforcement",
            library,
        )


def _replace_if_different(path: Path, content: bytes, mode: int) -> None:
    if path.is_file() and not path.is_symlink() and path.read_bytes() == content:
        return
    write_atomic(path, content, mode)
    log.info("installed %s", path)
