"""Find the driver's files under the driver root and its device nodes under the dev root (blocking I/O).

What is found is what NVIDIA's container toolkit would hand a GPU container (vgpud.nvdriver.names has
the rules), recorded with two paths each: the host path the runtime mounts from and the path inside the
container. vgpud may itself run in a container that sees the host's driver root elsewhere
(`/driver-root` in the chart): `DriverRoots` maps what vgpud sees to what the host has. Symbolic links
inside a root are followed inside it (an absolute target means the root's own path), so a root that
is not `/` resolves the same way the runtime's view of it does. Called once at start, in a thread or
before Trio.
"""

from __future__ import annotations

import errno
import fnmatch
import glob
import logging
import os
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from vgpud.nvdriver import names
from vgpud.nvdriver.elfso import ElfError, soname
from vgpud.nvdriver.ldcache import LdCacheError, library_paths

log = logging.getLogger(__name__)
ROOT = PurePosixPath("/")
#: symbolic links followed in one resolution before giving up (the kernel's own limit)
MAX_LINKS = 40


class DriverRootError(Exception):
    """The driver root does not hold what a GPU container needs; the message says what is missing."""


@dataclass(frozen=True)
class DriverRoots:
    """The driver root and the dev root, each as vgpud sees it and as the host (the runtime) has it."""

    driver_seen: Path
    driver_host: PurePosixPath
    dev_seen: Path
    dev_host: PurePosixPath

    @classmethod
    def same(cls, driver: Path, dev: Path | None = None) -> DriverRoots:
        """Roots that vgpud sees at their host paths (a host process)."""
        dev = driver if dev is None else dev
        return cls(driver, PurePosixPath(driver), dev, PurePosixPath(dev))


@dataclass(frozen=True)
class DriverFile:
    """A file handed to the container: from `host_path` on the host to `path` inside."""

    path: str
    host_path: str


@dataclass(frozen=True)
class DeviceNodeInfo:
    """A character device as the dev root has it."""

    path: str
    host_path: str
    major: int
    minor: int
    #: permission bits (st_mode & 0o7777)
    file_mode: int
    gid: int


@dataclass(frozen=True)
class DriverFiles:
    """Everything of the driver a GPU container receives, found under the roots."""

    version: str
    #: container paths of the directories holding the driver's versioned libraries, in search order
    library_dirs: tuple[str, ...]
    libraries: tuple[DriverFile, ...]
    #: `target::link` pairs (container paths) that nvidia-cdi-hook's create-symlinks makes
    links: tuple[str, ...]
    binaries: tuple[DriverFile, ...]
    firmware: tuple[DriverFile, ...]
    ipc: tuple[DriverFile, ...]
    control_nodes: tuple[DeviceNodeInfo, ...]
    #: each GPU's own node by minor number
    gpu_nodes: dict[int, DeviceNodeInfo]
    #: the host path of nvidia-cdi-hook; None: the node has none, the links become bind mounts
    cdi_hook: str | None


# --------------------------------------------------------------------------------------------------
# Paths inside a root


def _under(root: Path, path: PurePosixPath) -> Path:
    """`path` (absolute, as the container or host names it) under `root`."""
    return root / path.relative_to(ROOT)


def _host(host_root: PurePosixPath, path: PurePosixPath) -> str:
    return str(host_root / path.relative_to(ROOT))


def resolve_in_root(root: Path, path: PurePosixPath) -> PurePosixPath | None:
    """`path` with every symbolic link followed inside `root` (absolute targets are the root's own
    paths); None when a component is missing or the links loop."""
    parts = list(path.relative_to(ROOT).parts)
    resolved = ROOT
    links = 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            resolved = resolved.parent
            continue
        candidate = resolved / part
        try:
            target = os.readlink(_under(root, candidate))
        except FileNotFoundError:
            return None
        except OSError as err:
            if err.errno != errno.EINVAL:  # EINVAL: not a link
                return None
            resolved = candidate
            continue
        links += 1
        if links > MAX_LINKS:
            return None
        target_path = PurePosixPath(target)
        parts = list(target_path.parts[1:] if target_path.is_absolute() else target_path.parts) + parts
        if target_path.is_absolute():
            resolved = ROOT
    return resolved if _under(root, resolved).exists() else None


def _glob(root: Path, directory: PurePosixPath, pattern: str) -> list[PurePosixPath]:
    """Entries of `directory` (inside the root) matching `pattern`, sorted, as in-root paths."""
    base = _under(root, directory)
    return [directory / Path(hit).relative_to(base) for hit in sorted(glob.glob(str(base / pattern)))]


def _is_file(root: Path, path: PurePosixPath, *, executable: bool = False) -> bool:
    """The toolkit's file rule: it exists (links followed, inside the root) and is not a directory;
    with `executable`, an execute bit is set."""
    resolved = resolve_in_root(root, path)
    if resolved is None:
        return False
    try:
        mode = os.stat(_under(root, resolved)).st_mode
    except OSError:
        return False
    return not stat.S_ISDIR(mode) and (not executable or bool(mode & 0o111))


# --------------------------------------------------------------------------------------------------
# Libraries


def _library_candidates(root: Path, pattern: str) -> list[PurePosixPath]:
    """Files matching `pattern` in the search directories, links resolved in the root, each once;
    the root's ld.so.cache when the directories have none (the toolkit's order)."""
    found = _unique(
        resolve_in_root(root, hit)
        for directory in names.LIBRARY_SEARCH_DIRS
        for hit in _glob(root, directory, pattern)
        if _is_file(root, hit)
    )
    return found or _from_ldcache(root, pattern)


def _from_ldcache(root: Path, pattern: str) -> list[PurePosixPath]:
    try:
        data = _under(root, names.LD_SO_CACHE).read_bytes()
    except OSError:
        return []
    try:
        paths = library_paths(data)
    except LdCacheError as err:
        log.warning("ignoring %s: %s", _under(root, names.LD_SO_CACHE), err)
        return []
    return _unique(
        resolve_in_root(root, PurePosixPath(p))
        for p in paths
        if p.startswith("/") and fnmatch.fnmatchcase(PurePosixPath(p).name, pattern)
    )


def _unique(paths: Iterable[PurePosixPath | None]) -> list[PurePosixPath]:
    seen: dict[PurePosixPath, None] = {}
    for path in paths:
        if path is not None:
            seen.setdefault(path)
    return list(seen)


def library_dirs(root: Path, version: str) -> list[PurePosixPath]:
    """The directories holding `lib*.so.<version>` (DriverRootError when there is no libcuda or
    libnvidia-ml of that version: the root is not this driver's)."""
    escaped = glob.escape(version)
    if not any(_library_candidates(root, probe + escaped) for probe in names.VERSION_PROBES):
        probes = " or ".join(probe + version for probe in names.VERSION_PROBES)
        raise DriverRootError(f"no {probes} under the driver root {root}")
    return _unique(path.parent for path in _library_candidates(root, "lib*.so." + escaped))


def _versioned_libraries(root: Path, dirs: Sequence[PurePosixPath], version: str) -> list[PurePosixPath]:
    searched = [*dirs, *(d / names.VDPAU_SUBDIR for d in dirs)]
    patterns = ["*.so." + glob.escape(version), *names.UNVERSIONED_LIBRARIES]
    return _unique(
        resolve_in_root(root, hit)
        for pattern in patterns
        for directory in searched
        for hit in _glob(root, directory, pattern)
        if _is_file(root, hit)
    )


def library_links(root: Path, libraries: Sequence[PurePosixPath]) -> list[str]:
    """`target::link` pairs: the toolkit's fixed links (`libcuda.so.1::<dir>/libcuda.so` ...), and
    each library's soname and `.so` links where the root has such a link beside it (its
    create-symlinks rule)."""
    links: dict[str, None] = {}
    for library in libraries:
        directory, name = library.parent, library.name
        for prefix, target, link in names.EXTRA_LINKS:
            if fnmatch.fnmatchcase(name, prefix + "*.*"):
                links.setdefault(f"{target or name}::{directory / link}")
        if not fnmatch.fnmatchcase(name, "*.*.*"):
            continue
        try:
            found = soname(_under(root, library).read_bytes())
        except (OSError, ElfError) as err:
            log.warning("no soname for %s: %s", _under(root, library), err)
            found = None
        if found and found != name and _is_link(root, directory / found):
            links.setdefault(f"{name}::{directory / found}")
        so_target = found or name
        dev_name = _so_link(so_target)
        if dev_name and dev_name != so_target and _is_link(root, directory / dev_name):
            links.setdefault(f"{so_target}::{directory / dev_name}")
    return list(links)


def _so_link(name: str) -> str:
    """`libfoo.so.1.2` -> `libfoo.so`; '' for a name without `.so`."""
    while True:
        stem, dot, ext = name.rpartition(".")
        if not dot:
            return ""
        if ext == "so":
            return name
        name = stem


def _is_link(root: Path, path: PurePosixPath) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(_under(root, path)).st_mode)
    except OSError:
        return False


# --------------------------------------------------------------------------------------------------
# Binaries, firmware, IPC


def _binaries(root: Path) -> list[PurePosixPath]:
    found = []
    for name in names.BINARIES:
        for directory in names.EXECUTABLE_DIRS:
            path = directory / name
            if _is_file(root, path, executable=True):
                found.append(path)
                break
    return found


def _firmware_dirs(release: str, custom: str) -> list[PurePosixPath]:
    dirs = [custom] if custom else []
    dirs += [d.format(release=release) for d in names.FIRMWARE_DIRS]
    return _unique(PurePosixPath(d) for d in dirs if d.startswith("/"))


def _firmware(root: Path, version: str, release: str, custom: str) -> list[PurePosixPath]:
    patterns = [p.format(version=glob.escape(version)) for p in names.FIRMWARE_PATTERNS]
    return _unique(
        hit
        for pattern in patterns
        for directory in _firmware_dirs(release, custom)
        for hit in _glob(root, directory, pattern)
        if _is_file(root, hit)
    )


def _ipc(root: Path) -> list[PurePosixPath]:
    found = []
    for name in names.IPC_SOCKETS:
        hit = next((d / name for d in names.IPC_RUN_DIRS if _is_file(root, d / name)), None)
        if hit is not None:
            found.append(hit)
    return found


# --------------------------------------------------------------------------------------------------
# Device nodes


def char_device(roots: DriverRoots, path: PurePosixPath) -> DeviceNodeInfo | None:
    """The character device at `path` under the dev root (not followed if a link), or None."""
    try:
        info = os.lstat(_under(roots.dev_seen, path))
    except OSError:
        return None
    if not stat.S_ISCHR(info.st_mode):
        return None
    return DeviceNodeInfo(
        path=str(path),
        host_path=_host(roots.dev_host, path),
        major=os.major(info.st_rdev),
        minor=os.minor(info.st_rdev),
        file_mode=stat.S_IMODE(info.st_mode),
        gid=info.st_gid,
    )


def gpu_node_path(minor: int) -> PurePosixPath:
    return names.DEV_DIR / f"{names.GPU_NODE_PREFIX}{minor}"


def gpu_nodes(roots: DriverRoots, minors: Iterable[int]) -> dict[int, DeviceNodeInfo]:
    """Each GPU's node; DriverRootError naming those the dev root lacks."""
    nodes = {minor: char_device(roots, gpu_node_path(minor)) for minor in minors}
    missing = sorted(minor for minor, node in nodes.items() if node is None)
    if missing:
        paths = ", ".join(str(gpu_node_path(m)) for m in missing)
        raise DriverRootError(f"no character device {paths} under the dev root {roots.dev_seen}")
    return {minor: node for minor, node in nodes.items() if node is not None}


# --------------------------------------------------------------------------------------------------
# nvidia-cdi-hook


def find_cdi_hook(roots: DriverRoots) -> str | None:
    """The host path of nvidia-cdi-hook where the toolkit installs it under the driver root."""
    for directory in names.CDI_HOOK_DIRS:
        path = directory / names.CDI_HOOK_NAME
        if _is_file(roots.driver_seen, path, executable=True):
            return _host(roots.driver_host, path)
    return None


def check_cdi_hook(path: Path) -> str:
    """An explicitly configured nvidia-cdi-hook (vgpud sees it at its host path): its path, or
    DriverRootError when it is no executable file."""
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise DriverRootError(f"nvidia-cdi-hook {path} is not an executable file")
    return str(path)


# --------------------------------------------------------------------------------------------------
# Everything


def find_nvml(roots: DriverRoots) -> Path | None:
    """libnvidia-ml.so.1 under the driver root, as vgpud sees it (None when there is none)."""
    found = _library_candidates(roots.driver_seen, names.NVML_SONAME)
    return _under(roots.driver_seen, found[0]) if found else None


def discover(roots: DriverRoots, version: str, minors: Iterable[int], cdi_hook: str | None) -> DriverFiles:
    """What a container of these GPUs receives from the driver of `version` (DriverRootError when
    the root has no such driver or a GPU has no node). `cdi_hook`: its host path, or None."""
    root = roots.driver_seen
    dirs = library_dirs(root, version)
    libraries = _versioned_libraries(root, dirs, version)
    release = os.uname().release
    return DriverFiles(
        version=version,
        library_dirs=tuple(str(d) for d in dirs),
        libraries=_files(roots, libraries),
        links=tuple(library_links(root, libraries)),
        binaries=_files(roots, _binaries(root)),
        firmware=_files(roots, _firmware(root, version, release, _custom_firmware_path())),
        ipc=_files(roots, _ipc(root)),
        control_nodes=tuple(n for n in (char_device(roots, p) for p in names.CONTROL_NODES) if n),
        gpu_nodes=gpu_nodes(roots, minors),
        cdi_hook=cdi_hook,
    )


def _files(roots: DriverRoots, paths: Iterable[PurePosixPath]) -> tuple[DriverFile, ...]:
    return tuple(DriverFile(str(p), _host(roots.driver_host, p)) for p in paths)


def _custom_firmware_path() -> str:
    """The kernel's extra firmware directory (firmware_class.path), '' when none is set."""
    try:
        return Path(names.FIRMWARE_CLASS_PATH).read_text().strip()
    except OSError:
        return ""


def describe(files: DriverFiles) -> Iterator[str]:
    """Log lines: what was found."""
    yield (
        f"driver {files.version}: {len(files.libraries)} libraries in {', '.join(files.library_dirs)}, "
        f"binaries {', '.join(f.path for f in files.binaries) or 'none'}, "
        f"{len(files.firmware)} firmware files, IPC {', '.join(f.path for f in files.ipc) or 'none'}"
    )
    nodes = [n.path for n in files.control_nodes] + [n.path for n in files.gpu_nodes.values()]
    yield f"device nodes: {', '.join(nodes)}"
    if files.cdi_hook:
        yield f"nvidia-cdi-hook {files.cdi_hook}: containers get its links and linker-cache update"
