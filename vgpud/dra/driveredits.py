"""The CDI edits that deliver the GPU itself: pure functions from what `discover` found.

Per claim spec, the spec-level edits carry what every GPU container needs (the control nodes, the
driver's libraries, binaries, firmware and IPC sockets, `NVIDIA_VISIBLE_DEVICES=void`, and with
nvidia-cdi-hook its create-symlinks, enable-cuda-compat, update-ldcache and
disable-device-node-modification hooks); each device adds its own GPU's node. That is the shape of
NVIDIA's own CDI spec and of NVIDIA's DRA driver's per-claim specs. A node without nvidia-cdi-hook
gets the links as bind mounts of the files they point to (docs/driver-root.md says what that leaves
out: the linker cache and CUDA forward compatibility).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from vgpud.dra.cdi import ContainerEdits, DeviceNode, Hook
from vgpud.nvdriver import names
from vgpud.nvdriver.discover import DeviceNodeInfo, DriverFile, DriverFiles
from vgpud.partition.layout import Mount

_WORLD_RW = 0o006


@dataclass(frozen=True)
class DriverEdits:
    """The GPU part of a claim's CDI spec: `common` once per spec, `by_minor` per GPU device."""

    common: ContainerEdits
    by_minor: Mapping[int, ContainerEdits]


def driver_edits(files: DriverFiles) -> DriverEdits:
    """The edits that hand these driver files and device nodes to a container."""
    # ordered by path, as the toolkit's spec lists them
    control = [device_node(n) for n in sorted(files.control_nodes, key=lambda n: n.path)]
    mounts = [
        *(Mount(f.host_path, f.path, names.IPC_MOUNT_OPTIONS) for f in files.ipc),
        *_file_mounts(files.binaries),
        *_file_mounts(files.libraries),
        *_file_mounts(files.firmware),
    ]
    if files.cdi_hook is None:
        mounts += link_mounts(files.libraries, files.links)
    void_source, void_target = names.VOID_MOUNT
    mounts.append(Mount(str(void_source), str(void_target), names.VOID_MOUNT_OPTIONS))
    env = (
        f"{names.ENV_LIBCUDA_DIR}={':'.join(files.library_dirs)}",
        f"{names.ENV_NVIDIA_VISIBLE_DEVICES}={names.NVIDIA_VISIBLE_DEVICES_VOID}",
    )
    common = ContainerEdits(
        env=env,
        mounts=tuple(mounts),
        device_nodes=tuple(node for node, _ in control),
        hooks=hooks(files) if files.cdi_hook else (),
        additional_gids=_gids(gid for _, gid in control),
    )
    by_minor = {}
    for minor, info in files.gpu_nodes.items():
        node, gid = device_node(info)
        by_minor[minor] = ContainerEdits(device_nodes=(node,), additional_gids=_gids([gid]))
    return DriverEdits(common, by_minor)


def device_node(info: DeviceNodeInfo) -> tuple[DeviceNode, int | None]:
    """The node's CDI entry, and the group a container process needs to open it (None: none), as
    the toolkit decides it: the node's group unless it is root's or the node is world read-write."""
    node = DeviceNode(
        path=info.path,
        host_path=info.host_path,
        major=info.major,
        minor=info.minor,
        file_mode=info.file_mode,
        permissions=names.DEVICE_PERMISSIONS,
        gid=info.gid,
    )
    needs_gid = info.gid != 0 and info.file_mode & _WORLD_RW != _WORLD_RW
    return node, info.gid if needs_gid else None


def _gids(gids: Iterable[int | None]) -> tuple[int, ...]:
    unique: dict[int, None] = {}
    for gid in gids:
        if gid is not None:
            unique.setdefault(gid)
    return tuple(unique)


def _file_mounts(files: tuple[DriverFile, ...]) -> list[Mount]:
    return [Mount(f.host_path, f.path, names.FILE_MOUNT_OPTIONS) for f in files]


def hooks(files: DriverFiles) -> tuple[Hook, ...]:
    """nvidia-cdi-hook's createContainer hooks, in the toolkit's order."""
    assert files.cdi_hook is not None
    path = files.cdi_hook
    argv0 = PurePosixPath(path).name

    def hook(name: str, *args: str) -> Hook:
        return Hook(names.HOOK_CREATE_CONTAINER, path, (argv0, name, *args), names.HOOK_ENV)

    out = []
    if files.links:
        out.append(hook(names.HOOK_CREATE_SYMLINKS, *(a for link in files.links for a in ("--link", link))))
    out.append(hook(names.HOOK_ENABLE_CUDA_COMPAT, f"--host-driver-version={files.version}"))
    folders = library_folders(files.libraries)
    if folders:
        out.append(hook(names.HOOK_UPDATE_LDCACHE, *(a for f in folders for a in ("--folder", f))))
    out.append(hook(names.HOOK_DISABLE_DEVICE_NODE_MODIFICATION))
    return tuple(out)


def library_folders(libraries: tuple[DriverFile, ...]) -> list[str]:
    """The directories of the mounted shared libraries (`lib?*.so` and `lib?*.so.<x>` names)."""
    folders: dict[str, None] = {}
    for library in libraries:
        path = PurePosixPath(library.path)
        if _is_library_name(path.name):
            folders.setdefault(str(path.parent))
    return list(folders)


def _is_library_name(name: str) -> bool:
    """The toolkit's rule: `lib?*.so*`, and what follows the last `.so` is empty or starts with '.'."""
    if not name.startswith("lib") or ".so" not in name[4:]:
        return False
    rest = name.rsplit(".so", maxsplit=1)[-1]
    return rest == "" or rest.startswith(".")


def link_mounts(libraries: tuple[DriverFile, ...], links: tuple[str, ...]) -> list[Mount]:
    """Without nvidia-cdi-hook: each link as a read-only bind mount of the library it leads to.

    `target::link` targets are names in the link's directory; a chain (libcuda.so -> libcuda.so.1 ->
    libcuda.so.<version>) is followed to the mounted file."""
    by_path = {library.path: library for library in libraries}
    targets = dict(_split(link) for link in links)
    mounts = []
    for link in targets:
        seen: set[str] = set()
        current = link
        while current in targets and current not in seen:
            seen.add(current)
            current = str(PurePosixPath(current).parent / targets[current])
        library = by_path.get(current)
        if library is not None:
            mounts.append(Mount(library.host_path, link, names.FILE_MOUNT_OPTIONS))
    return mounts


def _split(pair: str) -> tuple[str, str]:
    """`target::link` -> (link, target)."""
    target, _, link = pair.partition("::")
    return link, target
