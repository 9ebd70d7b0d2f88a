"""The byte layouts of the library's files, as in csrc/libvgpu/src/vgpu_files.h: parse and build.

Pure (no I/O): the parsers take any buffer (bytes, or an mmap of the file: only the pages of the
fields read are touched), the builders return the file's bytes. The three files:

- `vgpu.config` (the container's limits and identity; the library writes it in DRA mode),
- `vmem_node.config` (the ledger of device memory NVML does not report, per device per host PID),
- `sm_node.config` (the container-wide token bucket of the core limit).

`STRUCTS` is the field table both sides must agree on: tests/unit/test_libfiles.py compares it with
what the C compiler says (build/libvgpu/tests/files_layout). Every integer is little-endian.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vgpud.partition.layout import CONT_CONFIG_DIR, CONT_SM_NODE, CONT_VGPU_LOCK, CONT_VMEM_NODE

MAX_DEVICES = 16

#: what the parsers read: the file's bytes or an mmap of it
Buffer = bytes | bytearray | memoryview | mmap.mmap

#: file names in their directories (config dir, /tmp/.vmem_node, /tmp/.sm_node, /tmp/.vgpu_lock)
VGPU_CONFIG_FILE = "vgpu.config"
VMEM_NODE_FILE = "vmem_node.config"
SM_NODE_FILE = "sm_node.config"
#: the sampler's lock: never deleted by the node side (a live sampler holds it)
SM_NODE_LOCK_FILE = "sm_node.lock"
VGPU_LOCK_FORMAT = "vgpu_{index}.lock"

#: the same files inside the container (the library's paths)
CONT_VGPU_CONFIG = CONT_CONFIG_DIR / VGPU_CONFIG_FILE
CONT_VMEM_NODE_CONFIG = CONT_VMEM_NODE / VMEM_NODE_FILE
CONT_SM_NODE_CONFIG = CONT_SM_NODE / SM_NODE_FILE
CONT_SM_NODE_LOCK = CONT_SM_NODE / SM_NODE_LOCK_FILE
CONT_VGPU_LOCK_FORMAT = str(CONT_VGPU_LOCK / VGPU_LOCK_FORMAT)

CONFIG_MAGIC = 0x56474346
CONFIG_LAYOUT = 1
CONFIG_FILE_SIZE = 8192
CONFIG_STRUCT_SIZE = 2560
CONFIG_DEVICES_OFFSET = 512
CONFIG_DEVICE_SIZE = 128

VMEM_MAGIC = 0x564D4E44
VMEM_LAYOUT = 1
VMEM_FILE_SIZE = 320 * 1024
VMEM_STRUCT_SIZE = 262400
VMEM_DEVICES_OFFSET = 128
VMEM_MAX_PROCESSES = 1024
VMEM_ENTRY_SIZE = 16
VMEM_DEVICE_STRIDE = 16392
VMEM_PROCESSES_SIZE_AT = 16384
VMEM_LOCK_BYTE_AT = 16388

SM_MAGIC = 0x444E4D53  # b"SMND" read as a little-endian u32
SM_LAYOUT = 3
SM_FILE_SIZE = 8192
SM_STRUCT_SIZE = 2176
SM_DEVICES_OFFSET = 128
SM_DEVICE_SIZE = 128
SM_REFILL_PERIOD_NS = 90_000_000


class LibFileError(ValueError):
    """Bytes that are not a valid file of this layout (too short, wrong magic, layout or size)."""


@dataclass(frozen=True)
class Field:
    """One field: its C name, offset in its struct, and `struct` format (little-endian, no padding)."""

    name: str
    offset: int
    fmt: str

    @property
    def size(self) -> int:
        return struct.calcsize("<" + self.fmt)


@dataclass(frozen=True)
class Layout:
    """One C struct: its size and named fields (padding is implied by the offsets)."""

    c_name: str
    size: int
    fields: tuple[Field, ...]

    def __post_init__(self) -> None:
        end = 0
        for f in sorted(self.fields, key=lambda f: f.offset):
            if f.offset < end or f.offset + f.size > self.size:
                raise ValueError(f"{self.c_name}.{f.name} at {f.offset} overlaps or overruns")
            end = f.offset + f.size

    def __getitem__(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)


CONFIG_DEVICE = Layout(
    "struct vgpu_config_device",
    CONFIG_DEVICE_SIZE,
    (
        Field("seq", 0, "I"),
        Field("uuid", 8, "48s"),
        Field("total_memory", 56, "Q"),
        Field("real_memory", 64, "Q"),
        Field("hard_core", 72, "i"),
        Field("soft_core", 76, "i"),
        Field("core_limit", 80, "i"),
        Field("hard_limit", 84, "i"),
        Field("memory_limit", 88, "i"),
        Field("memory_oversold", 92, "i"),
        Field("activate", 96, "i"),
        Field("hotplug", 100, "i"),
    ),
)

CONFIG = Layout(
    "struct vgpu_config",
    CONFIG_STRUCT_SIZE,
    (
        Field("magic", 0, "I"),
        Field("layout", 4, "I"),
        Field("size", 8, "I"),
        Field("count", 12, "I"),
        Field("cuda_version_major", 16, "i"),
        Field("cuda_version_minor", 20, "i"),
        Field("driver_version", 24, "32s"),
        Field("pod_uid", 128, "48s"),
        Field("pod_name", 176, "64s"),
        Field("pod_namespace", 240, "64s"),
        Field("container_name", 304, "64s"),
        Field("reg_uuid", 368, "48s"),
        Field("compatibility_mode", 416, "i"),
        Field("sm_watcher", 420, "i"),
        Field("vmem_node", 424, "i"),
        Field("devices", CONFIG_DEVICES_OFFSET, f"{MAX_DEVICES * CONFIG_DEVICE_SIZE}s"),
    ),
)

VMEM_PROCESS = Layout(
    "struct vgpu_vmem_process", VMEM_ENTRY_SIZE, (Field("pid", 0, "i"), Field("used", 8, "Q"))
)

VMEM_DEVICE = Layout(
    "struct vgpu_vmem_device",
    VMEM_DEVICE_STRIDE,
    (
        Field("processes", 0, f"{VMEM_MAX_PROCESSES * VMEM_ENTRY_SIZE}s"),
        Field("processes_size", VMEM_PROCESSES_SIZE_AT, "I"),
        Field("lock_byte", VMEM_LOCK_BYTE_AT, "B"),
    ),
)

VMEM_NODE = Layout(
    "struct vgpu_vmem_node",
    VMEM_STRUCT_SIZE,
    (
        Field("magic", 0, "I"),
        Field("layout", 4, "I"),
        Field("size", 8, "I"),
        Field("count", 12, "I"),
        Field("devices", VMEM_DEVICES_OFFSET, f"{MAX_DEVICES * VMEM_DEVICE_STRIDE}s"),
    ),
)

SM_DEVICE = Layout(
    "struct vgpu_sm_device",
    SM_DEVICE_SIZE,
    (
        Field("tokens", 0, "q"),
        Field("last_refill_ns", 8, "Q"),
        Field("ceiling", 64, "q"),
        Field("share", 72, "q"),
        Field("last_sample_ns", 80, "Q"),
        Field("util", 88, "i"),
        Field("limit", 92, "i"),
        Field("hard_core", 96, "i"),
        Field("soft_core", 100, "i"),
        Field("active", 104, "i"),
    ),
)

SM_NODE = Layout(
    "struct vgpu_sm_node",
    SM_STRUCT_SIZE,
    (
        Field("magic", 0, "I"),
        Field("layout", 4, "I"),
        Field("size", 8, "I"),
        Field("count", 12, "I"),
        Field("sampler_pid", 16, "i"),
        Field("sampler_heartbeat_ns", 24, "Q"),
        Field("devices", SM_DEVICES_OFFSET, f"{MAX_DEVICES * SM_DEVICE_SIZE}s"),
    ),
)

#: every struct of vgpu_files.h by its C name
STRUCTS: Mapping[str, Layout] = {
    s.c_name: s for s in (CONFIG_DEVICE, CONFIG, VMEM_PROCESS, VMEM_DEVICE, VMEM_NODE, SM_DEVICE, SM_NODE)
}

#: the constants of vgpu_files.h by their C names
CONSTANTS: Mapping[str, int] = {
    "VGPU_MAX_DEVICES": MAX_DEVICES,
    "VGPU_CONFIG_MAGIC": CONFIG_MAGIC,
    "VGPU_CONFIG_LAYOUT": CONFIG_LAYOUT,
    "VGPU_CONFIG_FILE_SIZE": CONFIG_FILE_SIZE,
    "VGPU_CONFIG_STRUCT_SIZE": CONFIG_STRUCT_SIZE,
    "VGPU_VMEM_MAGIC": VMEM_MAGIC,
    "VGPU_VMEM_LAYOUT": VMEM_LAYOUT,
    "VGPU_VMEM_FILE_SIZE": VMEM_FILE_SIZE,
    "VGPU_VMEM_STRUCT_SIZE": VMEM_STRUCT_SIZE,
    "VGPU_VMEM_MAX_PROCESSES": VMEM_MAX_PROCESSES,
    "VGPU_VMEM_DEVICE_STRIDE": VMEM_DEVICE_STRIDE,
    "VGPU_SM_MAGIC": SM_MAGIC,
    "VGPU_SM_LAYOUT": SM_LAYOUT,
    "VGPU_SM_FILE_SIZE": SM_FILE_SIZE,
    "VGPU_SM_STRUCT_SIZE": SM_STRUCT_SIZE,
    "VGPU_SM_REFILL_PERIOD_NS": SM_REFILL_PERIOD_NS,
}


# --------------------------------------------------------------------------------------------------
# Field access


def _get(layout: Layout, name: str, buf: Buffer, base: int = 0) -> int | bytes:
    f = layout[name]
    value: int | bytes = struct.unpack_from("<" + f.fmt, buf, base + f.offset)[0]
    return value


def _int(layout: Layout, name: str, buf: Buffer, base: int = 0) -> int:
    value = _get(layout, name, buf, base)
    assert isinstance(value, int)
    return value


def _text(layout: Layout, name: str, buf: Buffer, base: int = 0) -> str:
    """A NUL-padded string field (a full field has no NUL: read at most its length)."""
    value = _get(layout, name, buf, base)
    assert isinstance(value, bytes)
    return value.split(b"\0", 1)[0].decode("utf-8", "replace")


def _put(layout: Layout, name: str, out: bytearray, value: int | str, base: int = 0) -> None:
    f = layout[name]
    if isinstance(value, str):
        raw = value.encode()
        if len(raw) > f.size:
            raise ValueError(f"{layout.c_name}.{name}: {value!r} is longer than {f.size} bytes")
        struct.pack_into("<" + f.fmt, out, base + f.offset, raw)
    else:
        try:
            struct.pack_into("<" + f.fmt, out, base + f.offset, value)
        except struct.error as err:
            raise ValueError(f"{layout.c_name}.{name}: {value!r} does not fit ({err})") from None


@dataclass(frozen=True)
class Header:
    """The {magic, layout, size, count} header every file starts with; size is the struct's."""

    file: str
    layout: Layout
    magic: int
    version: int

    def check(self, buf: Buffer) -> None:
        """LibFileError unless `buf` holds the whole struct and a header of this file."""
        if len(buf) < self.layout.size:
            raise LibFileError(
                f"{self.file}: {len(buf)} bytes, shorter than its {self.layout.size}-byte layout"
            )
        got = tuple(_int(self.layout, n, buf) for n in ("magic", "layout", "size"))
        want = (self.magic, self.version, self.layout.size)
        if got != want:
            raise LibFileError(
                f"{self.file}: header magic/layout/size {got[0]:#x}/{got[1]}/{got[2]}, "
                f"expected {want[0]:#x}/{want[1]}/{want[2]}"
            )
        count = _int(self.layout, "count", buf)
        if count != MAX_DEVICES:
            raise LibFileError(f"{self.file}: device count {count}, expected {MAX_DEVICES}")

    def write(self, out: bytearray) -> None:
        for name, value in zip(
            ("magic", "layout", "size", "count"),
            (self.magic, self.version, self.layout.size, MAX_DEVICES),
            strict=True,
        ):
            _put(self.layout, name, out, value)


CONFIG_HEADER = Header(VGPU_CONFIG_FILE, CONFIG, CONFIG_MAGIC, CONFIG_LAYOUT)
VMEM_HEADER = Header(VMEM_NODE_FILE, VMEM_NODE, VMEM_MAGIC, VMEM_LAYOUT)
SM_HEADER = Header(SM_NODE_FILE, SM_NODE, SM_MAGIC, SM_LAYOUT)


# --------------------------------------------------------------------------------------------------
# vgpu.config


@dataclass(frozen=True)
class DeviceLimits:
    """One entry of vgpu.config's devices[16] (index = host NVML index)."""

    uuid: str = ""
    total_memory: int = 0
    real_memory: int = 0
    hard_core: int = 0
    soft_core: int = 0
    core_limit: bool = False
    hard_limit: bool = False
    memory_limit: bool = False
    memory_oversold: bool = False
    activate: bool = False
    #: added by vgpud for a device hot-plugged into the running container (vgpud.hotplug.vgpuconfig)
    hotplug: bool = False
    seq: int = 0


@dataclass(frozen=True)
class VgpuConfig:
    """vgpu.config: the container's identity and per-device limits."""

    devices: tuple[DeviceLimits, ...] = field(default_factory=lambda: (DeviceLimits(),) * MAX_DEVICES)
    cuda_version: tuple[int, int] = (0, 0)
    driver_version: str = ""
    pod_uid: str = ""
    pod_name: str = ""
    pod_namespace: str = ""
    container_name: str = ""
    reg_uuid: str = ""
    compatibility_mode: int = 0
    sm_watcher: bool = False
    vmem_node: bool = False

    def active(self) -> dict[int, DeviceLimits]:
        """Host index -> limits of the devices the container has."""
        return {i: d for i, d in enumerate(self.devices) if d.activate}


_DEVICE_INTS = ("total_memory", "real_memory", "hard_core", "soft_core", "seq")
_DEVICE_FLAGS = ("core_limit", "hard_limit", "memory_limit", "memory_oversold", "activate", "hotplug")
_CONFIG_TEXTS = ("driver_version", "pod_uid", "pod_name", "pod_namespace", "container_name", "reg_uuid")


def parse_vgpu_config(buf: Buffer) -> VgpuConfig:
    """The file's content (8192 bytes, or at least the 2560-byte struct); LibFileError if invalid."""
    CONFIG_HEADER.check(buf)
    devices = []
    for i in range(MAX_DEVICES):
        base = CONFIG_DEVICES_OFFSET + i * CONFIG_DEVICE_SIZE
        devices.append(
            DeviceLimits(
                uuid=_text(CONFIG_DEVICE, "uuid", buf, base),
                **{n: _int(CONFIG_DEVICE, n, buf, base) for n in _DEVICE_INTS},
                **{n: _int(CONFIG_DEVICE, n, buf, base) != 0 for n in _DEVICE_FLAGS},
            )
        )
    return VgpuConfig(
        devices=tuple(devices),
        cuda_version=(_int(CONFIG, "cuda_version_major", buf), _int(CONFIG, "cuda_version_minor", buf)),
        **{n: _text(CONFIG, n, buf) for n in _CONFIG_TEXTS},
        compatibility_mode=_int(CONFIG, "compatibility_mode", buf),
        sm_watcher=_int(CONFIG, "sm_watcher", buf) != 0,
        vmem_node=_int(CONFIG, "vmem_node", buf) != 0,
    )


def config_device_offset(index: int) -> int:
    """File offset of devices[index] in vgpu.config; ValueError outside 0..15."""
    if not 0 <= index < MAX_DEVICES:
        raise ValueError(f"vgpu.config device index {index} is outside 0..{MAX_DEVICES - 1}")
    return CONFIG_DEVICES_OFFSET + index * CONFIG_DEVICE_SIZE


def build_config_device(device: DeviceLimits) -> bytes:
    """One 128-byte devices[] entry (what `build_vgpu_config` writes at `config_device_offset`)."""
    out = bytearray(CONFIG_DEVICE_SIZE)
    _put(CONFIG_DEVICE, "uuid", out, device.uuid)
    for name in _DEVICE_INTS:
        _put(CONFIG_DEVICE, name, out, getattr(device, name))
    for name in _DEVICE_FLAGS:
        _put(CONFIG_DEVICE, name, out, int(getattr(device, name)))
    return bytes(out)


def build_vgpu_config(config: VgpuConfig) -> bytes:
    """The whole 8192-byte file; ValueError for a value that does not fit its field."""
    if len(config.devices) != MAX_DEVICES:
        raise ValueError(f"vgpu.config holds exactly {MAX_DEVICES} devices, got {len(config.devices)}")
    out = bytearray(CONFIG_FILE_SIZE)
    CONFIG_HEADER.write(out)
    _put(CONFIG, "cuda_version_major", out, config.cuda_version[0])
    _put(CONFIG, "cuda_version_minor", out, config.cuda_version[1])
    for name in _CONFIG_TEXTS:
        _put(CONFIG, name, out, getattr(config, name))
    _put(CONFIG, "compatibility_mode", out, config.compatibility_mode)
    _put(CONFIG, "sm_watcher", out, int(config.sm_watcher))
    _put(CONFIG, "vmem_node", out, int(config.vmem_node))
    for i, device in enumerate(config.devices):
        base = config_device_offset(i)
        out[base : base + CONFIG_DEVICE_SIZE] = build_config_device(device)
    return bytes(out)


# --------------------------------------------------------------------------------------------------
# vmem_node.config


@dataclass(frozen=True)
class LedgerEntry:
    pid: int
    used: int


@dataclass(frozen=True)
class VmemNode:
    """vmem_node.config: per host device index, the live ledger entries [0, processes_size)."""

    devices: tuple[tuple[LedgerEntry, ...], ...] = ((),) * MAX_DEVICES

    def used(self, index: int) -> int:
        """Bytes the ledger charges on device `index` (entries of pid 0 are free slots)."""
        return sum(e.used for e in self.devices[index] if e.pid > 0)


def vmem_device_offset(index: int) -> int:
    """File offset of device `index`'s ledger."""
    if not 0 <= index < MAX_DEVICES:
        raise ValueError(f"device index {index} is outside 0..{MAX_DEVICES - 1}")
    return VMEM_DEVICES_OFFSET + index * VMEM_DEVICE_STRIDE


def vmem_lock_offset(index: int) -> int:
    """File offset of device `index`'s lock byte (the fcntl byte lock around its read-modify-write)."""
    return vmem_device_offset(index) + VMEM_LOCK_BYTE_AT


def check_vmem_header(buf: Buffer) -> None:
    """LibFileError unless `buf` starts with a valid vmem_node.config header and holds the struct."""
    VMEM_HEADER.check(buf)


def parse_vmem_device(buf: Buffer, index: int) -> tuple[LedgerEntry, ...]:
    """Device `index`'s live entries, reading only that device's used part of `buf` (the whole file
    or an mmap of it). LibFileError when processes_size is beyond the 1024 slots."""
    base = vmem_device_offset(index)
    if len(buf) < base + VMEM_DEVICE_STRIDE:
        raise LibFileError(f"vmem_node.config: {len(buf)} bytes, too short for device {index}")
    count = _int(VMEM_DEVICE, "processes_size", buf, base)
    if count > VMEM_MAX_PROCESSES:
        raise LibFileError(
            f"vmem_node.config: device {index} has processes_size {count} > {VMEM_MAX_PROCESSES}"
        )
    entries = []
    for slot in range(count):
        at = base + slot * VMEM_ENTRY_SIZE
        entries.append(LedgerEntry(_int(VMEM_PROCESS, "pid", buf, at), _int(VMEM_PROCESS, "used", buf, at)))
    return tuple(entries)


def parse_vmem_node(buf: Buffer) -> VmemNode:
    """The whole ledger; LibFileError if the header or a device's count is invalid."""
    check_vmem_header(buf)
    return VmemNode(tuple(parse_vmem_device(buf, i) for i in range(MAX_DEVICES)))


def build_vmem_node(ledger: Mapping[int, Sequence[LedgerEntry]]) -> bytes:
    """The whole 320 KiB file with host index -> entries; ValueError for too many or bad entries."""
    out = bytearray(VMEM_FILE_SIZE)
    VMEM_HEADER.write(out)
    for index, entries in ledger.items():
        base = vmem_device_offset(index)
        if len(entries) > VMEM_MAX_PROCESSES:
            raise ValueError(f"device {index}: {len(entries)} entries, at most {VMEM_MAX_PROCESSES}")
        for slot, entry in enumerate(entries):
            at = base + slot * VMEM_ENTRY_SIZE
            _put(VMEM_PROCESS, "pid", out, entry.pid, at)
            _put(VMEM_PROCESS, "used", out, entry.used, at)
        _put(VMEM_DEVICE, "processes_size", out, len(entries), base)
    return bytes(out)


# --------------------------------------------------------------------------------------------------
# sm_node.config


@dataclass(frozen=True)
class Bucket:
    """One device's shared token bucket (see vgpu_files.h for who writes which field)."""

    tokens: int = 0
    last_refill_ns: int = 0
    ceiling: int = 0
    share: int = 0
    last_sample_ns: int = 0
    #: the container's SM utilization at the last sample, per-mille (-1: no sample could be taken)
    util: int = 0
    #: the effective core limit now, percent
    limit: int = 0
    hard_core: int = 0
    soft_core: int = 0
    #: in use (the file's 1 ready, or 2 being set up)
    active: bool = False


@dataclass(frozen=True)
class SmNode:
    devices: tuple[Bucket, ...] = (Bucket(),) * MAX_DEVICES
    sampler_pid: int = 0
    sampler_heartbeat_ns: int = 0


_BUCKET_INTS = (
    "tokens",
    "last_refill_ns",
    "ceiling",
    "share",
    "last_sample_ns",
    "util",
    "limit",
    "hard_core",
    "soft_core",
)


def parse_sm_node(buf: Buffer) -> SmNode:
    """The file's content; LibFileError if the header is invalid."""
    SM_HEADER.check(buf)
    devices = []
    for i in range(MAX_DEVICES):
        base = SM_DEVICES_OFFSET + i * SM_DEVICE_SIZE
        ints = {n: _int(SM_DEVICE, n, buf, base) for n in _BUCKET_INTS}
        devices.append(Bucket(**ints, active=_int(SM_DEVICE, "active", buf, base) != 0))
    return SmNode(
        tuple(devices), _int(SM_NODE, "sampler_pid", buf), _int(SM_NODE, "sampler_heartbeat_ns", buf)
    )


def build_sm_node(node: SmNode) -> bytes:
    """The whole 8192-byte file; ValueError for a value that does not fit its field."""
    if len(node.devices) != MAX_DEVICES:
        raise ValueError(f"sm_node.config holds exactly {MAX_DEVICES} devices, got {len(node.devices)}")
    out = bytearray(SM_FILE_SIZE)
    SM_HEADER.write(out)
    _put(SM_NODE, "sampler_pid", out, node.sampler_pid)
    _put(SM_NODE, "sampler_heartbeat_ns", out, node.sampler_heartbeat_ns)
    for i, bucket in enumerate(node.devices):
        base = SM_DEVICES_OFFSET + i * SM_DEVICE_SIZE
        for name in _BUCKET_INTS:
            _put(SM_DEVICE, name, out, getattr(bucket, name), base)
        _put(SM_DEVICE, "active", out, int(bucket.active), base)
    return bytes(out)
