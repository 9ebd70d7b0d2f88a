"""The hot-plugged devices' limits in the target container's vgpu.config (issue 18, item 2).

An attachment adds the slave claim's devices to the target's devices[] entries (`extend_config`) and
a detach removes exactly those entries again (`shrink_config`). The file is the one the library's
first process wrote in the target's config directory (`vgpud.partition.libfiles` holds its layout),
or, before any process ran, a header-only one `vgpud.hotplug.configfile` creates (the library then
merges its env into it); that module rewrites it in place under the library's own protocol. Pure:
no I/O.

What the library does with it (csrc/libvgpu): the env of a running container cannot change, so at
initialisation each process adopts the active entries at host indexes its env leaves empty
(vgpu_config_file.c `vgpu_config_adopt`, called from init.c `global_init`) and enforces their memory
and core limits like the env's. A process already running at Attach (or Detach) keeps what it read.

`slave_limits` turns the slave claim's per-device env (the CDI spec vgpud wrote at Prepare, read by
`configfile.read_claim_spec`) into the entries, with the library's own parsing rules (env.c,
core_env.c, vgpu_config_file.c).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from vgpud.partition import libfiles as F
from vgpud.partition.layout import (
    ENV_CUDA_CORE_LIMIT,
    ENV_CUDA_CORE_SOFT_LIMIT,
    ENV_CUDA_MEM_LIMIT,
    ENV_CUDA_MEM_OVERSOLD,
    ENV_CUDA_MEM_RATIO,
    ENV_VISIBLE_DEVICE,
    indexed,
)

_TRUE = ("true", "TRUE", "True", "1")
_SIZE_SHIFTS = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}


class ConfigError(Exception):
    """A change refused or failed; the file is unchanged."""


@dataclass(frozen=True)
class AddedDevice:
    """One device an attachment adds: its host NVML index (the devices[] slot, the `<i>` of its
    env) and its entry (uuid and limits, `activate` set; `extend_config` marks it `hotplug`)."""

    index: int
    limits: F.DeviceLimits

    def __str__(self) -> str:
        return f"{self.limits.uuid} (host index {self.index})"


# --------------------------------------------------------------------------------------------------
# Pure: the entries


def _parse(buf: bytes) -> F.VgpuConfig:
    try:
        return F.parse_vgpu_config(buf)
    except F.LibFileError as err:
        raise ConfigError(f"not a valid vgpu.config: {err}") from None


def entry_bytes(buf: bytes, index: int) -> bytes:
    """The 128 bytes of devices[index]."""
    at = F.config_device_offset(index)
    return bytes(buf[at : at + F.CONFIG_DEVICE_SIZE])


def _check_added(added: Sequence[AddedDevice]) -> None:
    seen: dict[int, str] = {}
    for device in added:
        if not 0 <= device.index < F.MAX_DEVICES:
            raise ConfigError(f"{device}: vgpu.config has slots for host indexes 0..{F.MAX_DEVICES - 1}")
        if not device.limits.uuid.startswith("GPU-") or not device.limits.activate:
            raise ConfigError(f"{device}: an added entry needs a GPU UUID and activate set")
        if device.index in seen and seen[device.index] != device.limits.uuid:
            raise ConfigError(f"{device} and {seen[device.index]} claim the same host index")
        seen[device.index] = device.limits.uuid


def extend_config(buf: bytes, added: Sequence[AddedDevice]) -> bytes:
    """`buf` with each added device's entry, marked `hotplug`, in its slot. An entry already added
    with the same limits changes nothing (idempotent); ConfigError when the slot holds a device of the
    target's own env (the library writes those unmarked) or another added device, holds this device
    with other limits, is inactive but not empty, or the device sits at another index."""
    _check_added(added)
    config = _parse(buf)
    out = bytearray(buf)
    for device in added:
        entry = replace(device.limits, seq=0, hotplug=True)
        current = config.devices[device.index]
        elsewhere = [i for i, d in config.active().items() if d.uuid == entry.uuid and i != device.index]
        if elsewhere:
            raise ConfigError(f"{device}: the target has it at host index {elsewhere[0]} already")
        if current.activate and not current.hotplug:
            raise ConfigError(
                f"{device}: the slot holds {current.uuid}, a device of the target's own env (one entry "
                "per GPU: a second share of the same GPU cannot have limits of its own)"
            )
        if current.activate and current.uuid != entry.uuid:
            raise ConfigError(f"{device}: the slot holds {current.uuid}, hot-plugged by another attachment")
        if current.activate and replace(current, seq=0) != entry:
            raise ConfigError(f"{device}: the target has it already, with other limits ({current})")
        if current.activate:
            continue
        if any(entry_bytes(buf, device.index)):
            raise ConfigError(f"{device}: slot {device.index} is inactive but not empty; not overwritten")
        at = F.config_device_offset(device.index)
        out[at : at + F.CONFIG_DEVICE_SIZE] = F.build_config_device(entry)
    return bytes(out)


def shrink_config(buf: bytes, uuids: Iterable[str]) -> bytes:
    """`buf` without the added (`hotplug`) entries of `uuids`, their slots zeroed as before
    `extend_config`; the target's own entries are never touched, and a UUID the file does not hold
    is already gone (idempotent)."""
    config = _parse(buf)
    wanted = set(uuids)
    out = bytearray(buf)
    for index, device in config.active().items():
        if device.hotplug and device.uuid in wanted:
            at = F.config_device_offset(index)
            out[at : at + F.CONFIG_DEVICE_SIZE] = bytes(F.CONFIG_DEVICE_SIZE)
    return bytes(out)


# --------------------------------------------------------------------------------------------------
# Pure: the slave claim's limits, by the library's rules


def _size(value: str, name: str) -> int:
    """env.c `vgpu_parse_size`: digits, then k/m/g/t (binary), an optional i, an optional b."""
    digits = len(value) - len(value.lstrip("0123456789"))
    rest = value[digits:]
    unit = rest[:1].lower()
    shift = _SIZE_SHIFTS.get(unit) if unit in "kmgt" else None
    if shift is not None and unit:
        rest = rest[1:]
        rest = rest[1:] if rest[:1] in ("i", "I") else rest
        rest = rest[1:] if rest[:1] in ("b", "B") else rest
    if not digits or shift is None or rest:
        raise ConfigError(f"{name}={value!r} is not a size like 8192m")
    number = int(value[:digits]) << shift
    if number >= 1 << 64:
        raise ConfigError(f"{name}={value!r} does not fit 64 bits")
    return number


def _percent(value: str | None, name: str) -> int:
    """core_env.c `percent`: 1..99, 0 for off (absent, empty, <= 0, >= 100)."""
    if not value:
        return 0
    try:
        number = int(value.rstrip(" \n")) if "_" not in value else None
    except ValueError:
        number = None
    if number is None:
        raise ConfigError(f"{name}={value!r} is not a whole percent")
    return number if 0 < number < 100 else 0


def device_limits(env: Mapping[str, str], index: int) -> F.DeviceLimits | None:
    """The entry the library would write for host index `index` of a container with this env
    (vgpu_config_file.c `vgpu_config_build`); None when the env names no device there."""

    def get(name: str) -> tuple[str, str | None]:
        key = indexed(name, index)
        return (key, env[key]) if key in env else (name, env.get(name))

    uuid = env.get(indexed(ENV_VISIBLE_DEVICE, index), "").split(",", 1)[0].strip()
    if not uuid.startswith("GPU-") or len(uuid) <= 4:
        return None
    name, value = get(ENV_CUDA_MEM_LIMIT)
    limit = _size(value, name) if value else 0
    name, value = get(ENV_CUDA_MEM_RATIO)
    ratio = 1.0
    if value:
        try:
            ratio = float(value) if "_" not in value else float("nan")
        except ValueError:
            ratio = float("nan")
        if not ratio >= 1.0 or ratio == float("inf"):
            raise ConfigError(f"{name}={value!r} is not a number >= 1")
    oversold = get(ENV_CUDA_MEM_OVERSOLD)[1] in _TRUE
    name, value = get(ENV_CUDA_CORE_LIMIT)
    hard = _percent(value, name)
    name, value = get(ENV_CUDA_CORE_SOFT_LIMIT)
    soft = _percent(value, name)
    if hard == 0 or soft <= hard:
        soft = 0
    return F.DeviceLimits(
        uuid=uuid,
        total_memory=limit,
        real_memory=int(limit / ratio) if ratio > 1.0 else limit,
        hard_core=hard,
        soft_core=soft,
        core_limit=hard > 0,
        hard_limit=hard > 0 and soft == 0,
        memory_limit=limit > 0,
        memory_oversold=ratio > 1.0 or oversold,
        activate=True,
    )


def spec_env(spec: Mapping[str, Any]) -> dict[str, str]:
    """The env a container using every device of a claim's CDI spec gets: the common edits, then
    each device's (per-device names carry their `_<i>`, so devices never overwrite each other)."""
    env: dict[str, str] = {}
    edits = [spec.get("containerEdits") or {}]
    devices = spec.get("devices")
    if not isinstance(devices, list):
        raise ConfigError("the CDI spec has no device list")
    edits += [d.get("containerEdits") or {} for d in devices if isinstance(d, Mapping)]
    for edit in edits:
        for entry in edit.get("env") or () if isinstance(edit, Mapping) else ():
            name, sep, value = entry.partition("=") if isinstance(entry, str) else ("", "", "")
            if not sep:
                raise ConfigError(f"CDI env entry {entry!r} is not NAME=VALUE")
            env[name] = value
    return env


def slave_limits(specs: Iterable[Mapping[str, Any]]) -> list[AddedDevice]:
    """The entries of a slave pod's prepared claims, from their CDI specs (`read_claim_spec`), by
    host index; ConfigError for a value the library would refuse or two claims on one index."""
    found: dict[int, AddedDevice] = {}
    for spec in specs:
        env = spec_env(spec)
        for index in range(F.MAX_DEVICES):
            limits = device_limits(env, index)
            if limits is None:
                continue
            if index in found and found[index].limits != limits:
                raise ConfigError(f"host index {index}: two claims give {found[index]} and {limits.uuid}")
            found[index] = AddedDevice(index, limits)
    return [found[i] for i in sorted(found)]
