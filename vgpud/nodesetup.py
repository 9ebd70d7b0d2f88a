"""What vgpud puts on the host before it prepares anything: the manager root the CDI mounts point at.

Every vGPU container gets read-only bind mounts of `<root>/registry`, `<root>/ld.so.preload` and
`<root>/libvgpu-control.so.<version>`; a missing source makes container creation fail, so they are
created at start, idempotently, and replaced atomically when their content changes. The control
library and the register client come from the build (`vgpud.artifacts`) or the files the settings
name; without either vgpud does not start (`NodeSetupError`): no empty stand-in is ever installed.
"""

from __future__ import annotations

import logging
from pathlib import Path

from vgpud.fsutil import write_atomic
from vgpud.partition.layout import (
    CONT_CONTROL_LIBRARY,
    REGISTER_CLIENT,
    REGISTER_CLIENT_REFERENCE,
    Layout,
)

log = logging.getLogger("vgpud.node")

REGISTRY_DIR_MODE = 0o711
ELF_MAGIC = b"\x7fELF"


class NodeSetupError(Exception):
    """The node cannot be set up (a part to install is missing or not what it must be); one line."""


def cgroup_v2(cgroup_root: Path = Path("/sys/fs/cgroup")) -> bool:
    """True on a unified (v2-only) hierarchy; hybrid and v1 hosts count as v1. The reference counts a
    hybrid host as v2, but there containerd gives a container no cgroup namespace (runc does put it
    in the unified hierarchy, as `0::/kubepods/.../<id>`), so the library's v2 rule, `0::/` through
    its own namespace, would match none of its processes; the v1 `memory` path does."""
    return (cgroup_root / "cgroup.controllers").is_file()


def read_elf(path: Path, what: str, setting: str) -> bytes:
    """The content of a built ELF file to install; NodeSetupError naming the setting when it is absent
    or not an ELF file."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise NodeSetupError(
            f"no {what} at {path}: build it with `make build` or name it with {setting}"
        ) from None
    except OSError as err:
        raise NodeSetupError(f"cannot read the {what} {path} ({setting}): {err.strerror or err}") from None
    if not data.startswith(ELF_MAGIC):
        raise NodeSetupError(f"the {what} {path} ({setting}) is not an ELF file")
    return data


def prepare_manager_root(
    layout: Layout, library_version: str, library_source: Path, register_client: Path
) -> None:
    """Create the claims and registry dirs, `ld.so.preload`, the versioned control library and the
    register client (under both names) that the library runs from the read-only registry mount.
    Both sources are read and checked before anything on the host changes."""
    library_bytes = read_elf(library_source, "control library", "--library-source / LIBRARY_SOURCE")
    client_bytes = read_elf(
        register_client, "register client", "--register-client-source / REGISTER_CLIENT_SOURCE"
    )
    root = Path(layout.root)
    root.mkdir(parents=True, exist_ok=True, mode=0o755)
    Path(layout.claims_dir).mkdir(exist_ok=True, mode=0o755)
    registry = Path(layout.registry_dir)
    registry.mkdir(exist_ok=True)
    registry.chmod(REGISTRY_DIR_MODE)
    _replace_if_different(Path(layout.ld_so_preload), f"{CONT_CONTROL_LIBRARY}\n".encode(), 0o644)
    for name in (REGISTER_CLIENT, REGISTER_CLIENT_REFERENCE):
        _replace_if_different(registry / name, client_bytes, 0o755)
    _replace_if_different(Path(layout.control_library(library_version)), library_bytes, 0o755)


def _replace_if_different(path: Path, content: bytes, mode: int) -> None:
    if path.is_file() and not path.is_symlink() and path.read_bytes() == content:
        return
    write_atomic(path, content, mode)
    log.info("installed %s", path)
