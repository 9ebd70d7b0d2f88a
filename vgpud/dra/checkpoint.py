"""Prepared-claim state that survives a vgpud restart: `checkpoint.json` in the plugin dir.

Prepare writes `PrepareStarted` before any side effect and `PrepareCompleted` after the CDI spec, so
a restart can tell finished claims (answered from here) from interrupted ones (rolled back). The
layout is the reference system's (vgpu-manager-contracts.md "Prepare"):

    {"checksum": <int>,
     "v2": {"preparedClaims": {<claimUID>: {"checkpointState": "PrepareStarted" | "PrepareCompleted",
                                            "status": {...}, "preparedDevices": [...],
                                            "name": ..., "namespace": ...,
                                            "partition": {...}, "vgpu": true,
                                            "mode": "lazy" | "eager"}},
            "nodeBootID": "..."}}

`partition`, `vgpu` and `mode` are ours (`mode` is absent in entries written before it existed).
`status` is the claim's status as Prepare saw it, as in the reference; vgpud keeps its `reservedFor`.

The checksum is NOT the Go one (kubelet's FNV over a `spew` dump,
not reproducible): it is `zlib.crc32` (IEEE polynomial, unsigned 32-bit) of the canonical JSON of
the "v2" object, `json.dumps(v2, sort_keys=True, separators=(",", ":"), ensure_ascii=True)`
encoded as ASCII. It covers content, not formatting: re-indenting the file keeps it valid, changing
a value does not. A checkpoint written by the Go plugin therefore fails the check and is quarantined.

A checkpoint from another boot is discarded (every prepared claim died with the node). A corrupt one
is moved aside and vgpud starts empty: a clear error and a safe start, never a crash loop. The store
never follows a symlink at its path. All file I/O here blocks: call it from a worker thread. The
store does no locking of its own; callers serialize read-modify-write under the node lock (`pu.lock`).
"""

from __future__ import annotations

import json
import logging
import os
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from vgpud.fsutil import read_regular, write_atomic

log = logging.getLogger(__name__)

CHECKPOINT_FILE = "checkpoint.json"
CHECKPOINT_MODE = 0o600
#: a checkpoint this large is not ours (a few hundred bytes per claim); refuse to read it into memory
MAX_CHECKPOINT_BYTES = 64 << 20
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
#: the values of an entry's "mode" (vgpud.partition.assigner.Mode)
PARTITION_MODES = ("eager", "lazy")


class CheckpointError(Exception):
    """The checkpoint cannot be decoded (corrupt), read safely (not a regular file) or written."""


class PrepareState(StrEnum):
    STARTED = "PrepareStarted"
    COMPLETED = "PrepareCompleted"


# --------------------------------------------------------------------------------------------------
# Typed reads of untrusted JSON: one place that turns a bad shape into a ValueError naming the field.

_REQUIRED = object()
_KIND_NAMES = {str: "a string", list: "a list", dict: "an object", bool: "a boolean"}


def _get(obj: Mapping[str, Any], key: str, kind: type, default: Any, where: str) -> Any:
    """`obj[key]` of exactly type `kind` (json.loads makes exact types; a bool is not an int here);
    `default` when absent or null."""
    value = obj.get(key)
    if value is None:
        if default is _REQUIRED:
            raise ValueError(f"{where}: {key} is missing")
        return default
    if type(value) is not kind:
        raise ValueError(f"{where}: {key} must be {_KIND_NAMES[kind]}, not {type(value).__name__}")
    return value


def _strings(obj: Mapping[str, Any], key: str, where: str) -> tuple[str, ...]:
    values = _get(obj, key, list, [], where)
    if not all(type(v) is str for v in values):
        raise ValueError(f"{where}: {key} must be a list of strings")
    return tuple(values)


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if type(value) is not dict:
        raise ValueError(f"{where}: expected an object, not {type(value).__name__}")
    return value


# --------------------------------------------------------------------------------------------------
# Values


@dataclass(frozen=True)
class PreparedDevice:
    """One prepared device as the kubelet gets it back (kubeletplugin.Device's JSON)."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "requestNames": list(self.request_names),
            "poolName": self.pool,
            "deviceName": self.device,
            "cdiDeviceIDs": list(self.cdi_device_ids),
        }
        if self.share_id is not None:
            obj["shareID"] = self.share_id
        return obj

    @classmethod
    def from_dict(cls, obj: Any) -> PreparedDevice:
        """The inverse of `to_dict`; ValueError naming the field when `obj` is not one."""
        where = "prepared device"
        obj = _object(obj, where)
        return cls(
            request_names=_strings(obj, "requestNames", where),
            pool=_get(obj, "poolName", str, _REQUIRED, where),
            device=_get(obj, "deviceName", str, _REQUIRED, where),
            cdi_device_ids=_strings(obj, "cdiDeviceIDs", where),
            share_id=_get(obj, "shareID", str, None, where),
        )


@dataclass(frozen=True)
class ClaimEntry:
    """One claim's record. `partition` is `PartitionRecord.to_dict()`, opaque here; `status` is the
    claim's status as Prepare saw it (the reference keeps it; optional for us)."""

    state: PrepareState
    name: str
    namespace: str
    prepared_devices: tuple[PreparedDevice, ...] = ()
    partition: dict[str, Any] = field(default_factory=dict, hash=False)
    #: the claim holds at least one vGPU device (the NRI plugin injects only for these)
    vgpu: bool = True
    status: dict[str, Any] = field(default_factory=dict, hash=False)
    #: the partition mode Prepare ran in ("lazy" | "eager"); None in entries of older versions
    mode: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "checkpointState": self.state.value,
            "status": self.status,
            "preparedDevices": [d.to_dict() for d in self.prepared_devices],
            "name": self.name,
            "namespace": self.namespace,
            "partition": self.partition,
            "vgpu": self.vgpu,
            **({"mode": self.mode} if self.mode is not None else {}),
        }

    @classmethod
    def from_dict(cls, obj: Any, where: str = "claim") -> ClaimEntry:
        """The inverse of `to_dict`; ValueError naming the field when `obj` is not one."""
        obj = _object(obj, where)
        state = _get(obj, "checkpointState", str, _REQUIRED, where)
        try:
            state = PrepareState(state)
        except ValueError:
            known = ", ".join(s.value for s in PrepareState)
            raise ValueError(f"{where}: unknown checkpointState {state!r} (known: {known})") from None
        devices = _get(obj, "preparedDevices", list, [], where)
        mode = _get(obj, "mode", str, None, where)
        if mode is not None and mode not in PARTITION_MODES:
            raise ValueError(f"{where}: unknown mode {mode!r} (known: {', '.join(PARTITION_MODES)})")
        return cls(
            state=state,
            name=_get(obj, "name", str, "", where),
            namespace=_get(obj, "namespace", str, "", where),
            prepared_devices=tuple(PreparedDevice.from_dict(d) for d in devices),
            partition=dict(_get(obj, "partition", dict, {}, where)),
            vgpu=_get(obj, "vgpu", bool, True, where),
            status=dict(_get(obj, "status", dict, {}, where)),
            mode=mode,
        )


@dataclass(frozen=True)
class Checkpoint:
    """Every claim this node has prepared (or started to), by claim UID, for one boot."""

    boot_id: str
    claims: Mapping[str, ClaimEntry] = field(default_factory=dict, hash=False)

    def with_claim(self, uid: str, entry: ClaimEntry) -> Checkpoint:
        return replace(self, claims={**self.claims, uid: entry})

    def without_claim(self, uid: str) -> Checkpoint:
        """A checkpoint without `uid` (the same content when it was not there)."""
        return replace(self, claims={k: v for k, v in self.claims.items() if k != uid})


# --------------------------------------------------------------------------------------------------
# Codec (pure)


def _canonical(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode(
        "ascii"
    )


def checksum(v2: Mapping[str, Any]) -> int:
    """crc32 of the canonical JSON of the "v2" object (see the module docstring)."""
    return zlib.crc32(_canonical(v2))


def encode(cp: Checkpoint) -> bytes:
    """The file's bytes: one line of JSON, keys sorted, checksum over "v2". ValueError or TypeError
    when an opaque field (`status`, `partition`) holds something JSON cannot carry."""
    v2 = {
        "preparedClaims": {uid: entry.to_dict() for uid, entry in cp.claims.items()},
        "nodeBootID": cp.boot_id,
    }
    return _canonical({"checksum": checksum(v2), "v2": v2}) + b"\n"


def decode(data: bytes) -> Checkpoint:
    """Parse and verify a checkpoint; CheckpointError saying what is wrong with any malformed input."""
    try:
        top = _object(json.loads(data), "checkpoint")
        expected = top.get("checksum")
        if type(expected) is not int:
            raise ValueError("checkpoint: checksum is missing or not an integer")
        v2 = _object(top.get("v2"), "checkpoint v2")
        actual = checksum(v2)
        if actual != expected:
            raise ValueError(f"checksum mismatch: the file says {expected}, its content gives {actual}")
        boot_id = _get(v2, "nodeBootID", str, "", "checkpoint v2")
        claims = _get(v2, "preparedClaims", dict, {}, "checkpoint v2")
        return Checkpoint(
            boot_id=boot_id,
            claims={uid: ClaimEntry.from_dict(obj, f"claim {uid}") for uid, obj in claims.items()},
        )
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CheckpointError(f"not a valid checkpoint: {err}") from err


# --------------------------------------------------------------------------------------------------
# Files


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    """The kernel's boot id: it changes on every boot, so it tells a restart from a reboot."""
    boot_id = path.read_text(encoding="ascii").strip()
    if not boot_id:
        raise ValueError(f"{path} is empty")
    return boot_id


class CheckpointStore:
    """Load and save the checkpoint file at `path` for the current boot `boot_id`."""

    def __init__(self, path: Path, boot_id: str) -> None:
        self.path = Path(path)
        self.boot_id = boot_id

    def empty(self) -> Checkpoint:
        return Checkpoint(boot_id=self.boot_id)

    def _read(self) -> bytes | None:
        try:
            return read_regular(self.path, MAX_CHECKPOINT_BYTES)
        except OSError as err:
            raise CheckpointError(f"cannot read checkpoint: {err.strerror}") from None

    def load(self) -> Checkpoint:
        """The saved checkpoint; empty when missing, from another boot, or corrupt (moved aside).

        CheckpointError only when the path holds something other than a regular file (a symlink is
        never followed) or cannot be read at all.
        """
        data = self._read()
        if data is None:
            return self.empty()
        try:
            if len(data) > MAX_CHECKPOINT_BYTES:
                raise CheckpointError(f"larger than {MAX_CHECKPOINT_BYTES} bytes")
            cp = decode(data)
        except CheckpointError as err:
            self._quarantine(str(err))
            return self.empty()
        if cp.boot_id != self.boot_id:
            log.info(
                "node rebooted: discarding %d claims (checkpoint %s is from boot %r, this is boot %r)",
                len(cp.claims),
                self.path,
                cp.boot_id,
                self.boot_id,
            )
            return self.empty()
        return cp

    def _quarantine(self, reason: str) -> None:
        stamp = int(time.time())
        aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}")
        n = 0
        while aside.exists() or aside.is_symlink():
            n += 1
            aside = self.path.with_name(f"{self.path.name}.corrupt-{stamp}.{n}")
        try:
            os.rename(self.path, aside)
        except OSError as err:
            log.error(
                "checkpoint %s is corrupt (%s) and could not be moved aside (%s); starting with no "
                "prepared claims, the next save replaces it",
                self.path,
                reason,
                err,
            )
            return
        log.error(
            "checkpoint %s is corrupt (%s): moved aside to %s; starting with no prepared claims",
            self.path,
            reason,
            aside.name,
        )

    def save(self, cp: Checkpoint) -> None:
        """Write `cp` atomically (mode 0600); CheckpointError, with the old file intact, on failure."""
        try:
            data = encode(cp)
        except (ValueError, TypeError) as err:  # a NaN, a set or a mixed-type key in an opaque field
            raise CheckpointError(f"cannot encode checkpoint: {err}") from err
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_atomic(self.path, data, CHECKPOINT_MODE)
        except OSError as err:
            raise CheckpointError(f"cannot write checkpoint {self.path}: {err.strerror or err}") from err
