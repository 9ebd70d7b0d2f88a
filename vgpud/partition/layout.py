"""Every host path, container path and env name of the vGPU contract, in one place.

The names are the reference system's (vgpu-manager-contracts.md "Mounts", "Env injected") so a node,
a library or a tool built for one works with the other. Paths are computed, never touched: the only
filesystem code of the package is `pidsfile`. The manager root is a parameter so tests run in a temp
dir; `Layout.host_root` is the same directory as the container runtime sees it (mount sources), for
when vgpud itself runs in a container that mounts the host's manager dir somewhere else.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import NamedTuple

# --------------------------------------------------------------------------------------------------
# Names under the manager root (host side)

DEFAULT_MANAGER_ROOT = PurePosixPath("/etc/vgpu-manager")
CLAIMS_DIR = "claims"
REGISTRY_DIR = "registry"
REGISTRY_SOCKET = "socket.sock"
#: the register client in the registry dir: the library runs `/etc/vgpu-manager/registry/vgpu-register`
REGISTER_CLIENT = "vgpu-register"
#: the same client under the reference's name, for library builds that exec `registry/device-client`
REGISTER_CLIENT_REFERENCE = "device-client"
WATCHER_DIR = "watcher"
CONFIG_DIR = "config"
VGPU_LOCK_DIR = "vgpu_lock"
VMEM_NODE_DIR = "vmem_node"
SM_NODE_DIR = "sm_node"
PIDS_FILE = "pids.config"
LD_SO_PRELOAD_FILE = "ld.so.preload"
CONTROL_LIBRARY = "libvgpu-control.so"
#: the host's /proc, bind-mounted for cgroup mode (the library resolves its own PIDs)
HOST_PROC = PurePosixPath("/proc")

# --------------------------------------------------------------------------------------------------
# Paths inside the workload container

CONT_MANAGER_ROOT = PurePosixPath("/etc/vgpu-manager")
CONT_CONFIG_DIR = CONT_MANAGER_ROOT / CONFIG_DIR
#: nested read-only file mount inside the writable config dir: the container cannot rewrite its PIDs
CONT_PIDS_FILE = CONT_CONFIG_DIR / PIDS_FILE
CONT_VGPU_LOCK = PurePosixPath("/tmp/.vgpu_lock")
CONT_VMEM_NODE = PurePosixPath("/tmp/.vmem_node")
CONT_SM_NODE = PurePosixPath("/tmp/.sm_node")
CONT_REGISTRY_DIR = CONT_MANAGER_ROOT / REGISTRY_DIR
CONT_REGISTRY_SOCKET = CONT_REGISTRY_DIR / REGISTRY_SOCKET
CONT_CONTROL_LIBRARY = CONT_MANAGER_ROOT / "driver" / CONTROL_LIBRARY
CONT_LD_SO_PRELOAD = PurePosixPath("/etc") / LD_SO_PRELOAD_FILE
CONT_HOST_PROC = CONT_MANAGER_ROOT / ".host_proc"
CONT_WATCHER_DIR = CONT_MANAGER_ROOT / WATCHER_DIR

# --------------------------------------------------------------------------------------------------
# Env names. Per-device names take a `_<idx>` suffix (host NVML index): see `indexed`.

ENV_LD_PRELOAD = "LD_PRELOAD"
ENV_COMPATIBILITY_MODE = "MANAGER_COMPATIBILITY_MODE"
ENV_VISIBLE_DEVICES = "MANAGER_VISIBLE_DEVICES"
ENV_VISIBLE_DEVICE = "MANAGER_VISIBLE_DEVICE"
ENV_CUDA_MEM_LIMIT = "CUDA_MEM_LIMIT"
ENV_CUDA_MEM_RATIO = "CUDA_MEM_RATIO"
ENV_CUDA_MEM_OVERSOLD = "CUDA_MEM_OVERSOLD"
ENV_CUDA_CORE_LIMIT = "CUDA_CORE_LIMIT"
ENV_CUDA_CORE_SOFT_LIMIT = "CUDA_CORE_SOFT_LIMIT"
ENV_VMEMORY_NODE_ENABLED = "VMEMORY_NODE_ENABLED"
ENV_CUDA_SM_SHARED_BUCKET = "CUDA_SM_SHARED_BUCKET"
ENV_EXTERNAL_SM_WATCHER_ENABLED = "EXTERNAL_SM_WATCHER_ENABLED"
#: the claim UID in NRI mode, empty in DRA-only mode so a pod cannot forge it (seed §12.6)
ENV_CLAIM_UID = "MANAGER_VGPU_CLAIM_UID"
#: the partition's register UUID (eager client mode), empty when NRI injects
ENV_REGISTER_UUID = "MANAGER_CLIENT_REGISTER_UUID"
ENV_POD_NAME = "VGPU_POD_NAME"
ENV_POD_NAMESPACE = "VGPU_POD_NAMESPACE"
ENV_POD_UID = "VGPU_POD_UID"
ENV_CONTAINER_NAME = "VGPU_CONTAINER_NAME"
#: the library's last-resort device list when no MANAGER_VISIBLE_DEVICE_<i> is set
ENV_NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"

# MANAGER_COMPATIBILITY_MODE bits; combined by bitwise OR, the library tests (mode & X) == X.
MODE_HOST = 0
MODE_CGROUP_V1 = 1
MODE_CGROUP_V2 = 2
MODE_OPEN_KERNEL = 100
MODE_CLIENT_REGISTER = 200

#: mount options of every bind mount we emit, after the ro/rw flag
BIND_OPTIONS = ("nosuid", "nodev", "bind")


def indexed(name: str, index: int) -> str:
    """`NAME_<idx>`: the per-device form of an env name (the library reads it before `NAME`)."""
    if index < 0:
        raise ValueError(f"device index {index} is negative")
    return f"{name}_{index}"


# --------------------------------------------------------------------------------------------------
# Validation: everything that becomes a path component is checked here, once.


class LayoutError(ValueError):
    """A name that would not make a safe path component (empty, '.', '..', '/', odd characters)."""


#: longest token: a path component with room for a prefix or suffix within NAME_MAX (255)
MAX_TOKEN = 128
_TOKEN = re.compile(rf"[A-Za-z0-9._-]{{1,{MAX_TOKEN}}}")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def check_token(value: str, what: str) -> str:
    """A single path component of 1 to MAX_TOKEN characters of [A-Za-z0-9._-] that is not '.' or '..'
    (UIDs, key parts). A full match: a trailing newline is not a token's end."""
    if not isinstance(value, str) or not _TOKEN.fullmatch(value) or value in {".", ".."}:
        raise LayoutError(
            f"{what} {value!r} is not a safe path component (1 to {MAX_TOKEN} of [A-Za-z0-9._-], not . or ..)"
        )
    return value


def check_dns_label(value: str, what: str) -> str:
    """A Kubernetes DNS label (container and request names); it never contains '_' or '/'."""
    if not isinstance(value, str) or not _DNS_LABEL.fullmatch(value):
        raise LayoutError(f"{what} {value!r} is not a DNS label (lower-case letters, digits, '-')")
    return value


def check_partition_key(key: str) -> str:
    """A relative path of safe components: eager keys look like `pod-<hash>-app/<name>`."""
    if not isinstance(key, str) or not key:
        raise LayoutError(f"partition key {key!r} is empty")
    for part in key.split("/"):
        check_token(part, f"partition key {key!r}: component")
    return key


def container_dir_name(pod_uid: str, container: str) -> str:
    """`<podUID>_<container>`: unique per (pod, container) because a DNS label has no '_'."""
    return f"{check_token(pod_uid, 'pod UID')}_{check_dns_label(container, 'container name')}"


# --------------------------------------------------------------------------------------------------
# The layout


class Mount(NamedTuple):
    """One bind mount, as CDI and NRI both express it. A NamedTuple (immutable, half the cost of a
    frozen dataclass to build): a Synchronize builds five per running vGPU container."""

    host_path: str
    container_path: str
    options: tuple[str, ...]

    @classmethod
    def bind(cls, host_path: PurePosixPath, container_path: PurePosixPath, *, read_only: bool) -> Mount:
        return cls(str(host_path), str(container_path), ("ro" if read_only else "rw", *BIND_OPTIONS))

    @property
    def read_only(self) -> bool:
        return "ro" in self.options


@dataclass(frozen=True)
class PartitionPaths:
    """The directory one partition (eager) or one container (lazy) gets, in vgpud's own view."""

    base: PurePosixPath

    @classmethod
    def of(cls, text: str) -> PartitionPaths:
        """From the string of a normalised absolute path (what `Layout` builds from validated names):
        `text` is kept, so the mounts are joined on strings, never parsed back."""
        paths = cls(PurePosixPath(text))
        paths.__dict__["text"] = text  # the cached_property's slot: str(base) is `text` by construction
        return paths

    @functools.cached_property
    def text(self) -> str:
        """`str(base)`: mount sources are strings, joined without pathlib."""
        return str(self.base)

    @functools.cached_property
    def config(self) -> PurePosixPath:  # cached: the pids file and the target use it
        return self.base / CONFIG_DIR

    @property
    def pids_file(self) -> PurePosixPath:
        return self.config / PIDS_FILE

    @property
    def vgpu_lock(self) -> PurePosixPath:
        return self.base / VGPU_LOCK_DIR

    @property
    def vmem_node(self) -> PurePosixPath:
        return self.base / VMEM_NODE_DIR

    @property
    def sm_node(self) -> PurePosixPath:
        return self.base / SM_NODE_DIR

    @property
    def directories(self) -> tuple[PurePosixPath, ...]:
        """What must exist before the runtime mounts it (parents first)."""
        return (self.base, self.config, self.vgpu_lock, self.vmem_node, self.sm_node)


def _posix(value: str | os.PathLike[str], what: str) -> PurePosixPath:
    path = PurePosixPath(os.fspath(value))
    if not path.is_absolute():
        raise LayoutError(f"{what} {str(path)!r} is not absolute")
    return path


@dataclass(frozen=True)
class Layout:
    """Where things are under one manager root. `root` is vgpud's view, `host_root` the runtime's."""

    root: PurePosixPath = DEFAULT_MANAGER_ROOT
    host_root: PurePosixPath | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", _posix(self.root, "manager root"))
        host = self.root if self.host_root is None else _posix(self.host_root, "host manager root")
        object.__setattr__(self, "host_root", host)

    def host(self, path: PurePosixPath) -> PurePosixPath:
        """The same path as the container runtime sees it (the source of a bind mount)."""
        assert self.host_root is not None
        if self._same_root and _under(str(path), self._root_text):
            return path  # the usual case, without pathlib's parsing
        return self.host_root / path.relative_to(self.root)

    def host_text(self, path: str) -> str:
        """`host` on the string of a normalised absolute path: a Synchronize maps one per container."""
        root = self._root_text
        if _under(path, root):
            if self._same_root:
                return path
            if root != "/" and self._host_root_text != "/":
                return self._host_root_text + path[len(root) :]
        return str(self.host(PurePosixPath(path)))

    @functools.cached_property
    def _same_root(self) -> bool:
        return self.host_root == self.root

    @functools.cached_property
    def _root_text(self) -> str:
        return str(self.root)

    @functools.cached_property
    def _host_root_text(self) -> str:
        return str(self.host_root)

    @functools.cached_property
    def claims_dir(self) -> PurePosixPath:
        return self.root / CLAIMS_DIR

    def claim_dir(self, claim_uid: str) -> PurePosixPath:
        """`claims/<claimUID>`: removed as a whole at Unprepare (the backstop, seed §12.10)."""
        return _child(self.claims_dir, check_token(claim_uid, "claim UID"))

    def partition(self, claim_uid: str, key: str) -> PartitionPaths:
        """Eager: `claims/<claimUID>/<partitionKey>`."""
        return PartitionPaths(self.claim_dir(claim_uid) / check_partition_key(key))

    def container_partition(self, claim_uid: str, pod_uid: str, container: str) -> PartitionPaths:
        """Lazy: `claims/<claimUID>/<podUID>_<container>` (seed §12.3)."""
        return PartitionPaths.of(self.container_dir_text(claim_uid, pod_uid, container))

    def container_dir_text(self, claim_uid: str, pod_uid: str, container: str) -> str:
        """`container_partition(...).base` as a string, joined from the validated names (no pathlib:
        a Synchronize checks thousands)."""
        claim = check_token(claim_uid, "claim UID")
        return f"{self._claims_text}/{claim}/{container_dir_name(pod_uid, container)}"

    @functools.cached_property
    def _claims_text(self) -> str:
        return str(self.claims_dir)

    def device_plugin_config_dir(self, pod_uid: str, container: str) -> PurePosixPath:
        """`<root>/<podUID>_<container>/config`: the registry's pod-UID fallback (non-NRI pods)."""
        return self.root / container_dir_name(pod_uid, container) / CONFIG_DIR

    @property
    def registry_dir(self) -> PurePosixPath:
        return self.root / REGISTRY_DIR

    @property
    def registry_socket(self) -> PurePosixPath:
        return self.registry_dir / REGISTRY_SOCKET

    @property
    def watcher_dir(self) -> PurePosixPath:
        return self.root / WATCHER_DIR

    @property
    def ld_so_preload(self) -> PurePosixPath:
        return self.root / LD_SO_PRELOAD_FILE

    def control_library(self, version: str) -> PurePosixPath:
        """`libvgpu-control.so.<version>`: versioned on the host so an upgrade never swaps a live file."""
        return self.root / f"{CONTROL_LIBRARY}.{check_token(version, 'library version')}"


@functools.lru_cache(maxsize=4096)
def _child(parent: PurePosixPath, name: str) -> PurePosixPath:
    """`parent / name`, remembered: a node has few claims, and every container of one joins the same."""
    return parent / name


def _under(path: str, root: str) -> bool:
    """`path` is `root` or below it (both absolute and normalised, as PurePosixPath gives them)."""
    return path == root or path.startswith(root if root == "/" else root + "/")


#: the mounts of a partition directory, in order: (path under it, container path, read-only)
_PARTITION_MOUNTS = (
    (CONFIG_DIR, CONT_CONFIG_DIR, False),
    (VGPU_LOCK_DIR, CONT_VGPU_LOCK, False),
    (VMEM_NODE_DIR, CONT_VMEM_NODE, False),
    (SM_NODE_DIR, CONT_SM_NODE, False),
    (f"{CONFIG_DIR}/{PIDS_FILE}", CONT_PIDS_FILE, True),
)
_PARTITION_MOUNT_PARTS = tuple(
    (f"/{below}", str(container), ("ro" if read_only else "rw", *BIND_OPTIONS))
    for below, container, read_only in _PARTITION_MOUNTS
)


def partition_mounts(layout: Layout, paths: PartitionPaths) -> tuple[Mount, ...]:
    """The per-partition (eager) or per-container (lazy) mounts; one set per container, never two.
    Joined on strings: a Synchronize builds them for every running vGPU container."""
    host = layout.host_text(paths.text)
    return tuple(
        [Mount(host + below, container, options) for below, container, options in _PARTITION_MOUNT_PARTS]
    )


def common_mounts(
    layout: Layout, *, library_version: str, client_mode: bool, sm_watcher: bool = False
) -> tuple[Mount, ...]:
    """The claim-common read-only mounts; host /proc only without client registration."""
    mounts = [
        Mount.bind(layout.host(layout.registry_dir), CONT_REGISTRY_DIR, read_only=True),
        Mount.bind(
            layout.host(layout.control_library(library_version)), CONT_CONTROL_LIBRARY, read_only=True
        ),
        Mount.bind(layout.host(layout.ld_so_preload), CONT_LD_SO_PRELOAD, read_only=True),
    ]
    if not client_mode:
        mounts.append(Mount.bind(HOST_PROC, CONT_HOST_PROC, read_only=True))
    if sm_watcher:
        mounts.append(Mount.bind(layout.host(layout.watcher_dir), CONT_WATCHER_DIR, read_only=True))
    return tuple(mounts)
