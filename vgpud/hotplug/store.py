"""The attachment table's file: `hotplug.json` in the plugin dir, so a vgpud restart keeps it.

    {"version": 1, "nodeBootID": "...",
     "attachments": [{"targetPodUID": ..., "containerName": ..., "slavePodUID": ..., "containerID": ...,
                      "targetPodNamespace": ..., "targetPodName": ..., "attachedAt": <seconds>,
                      "state": "attaching" | "attached" | "detaching",
                      "claims": [{"namespace": ..., "name": ..., "uid": ..., "devices": [...]}]}]}

Written like the checkpoint (`vgpud.fsutil.write_atomic`, mode 0600, never through a symlink). A file
from another boot is discarded: every grant lived in a container cgroup that died with the node. A
file that does not decode is moved aside (`hotplug.json.corrupt-<time>`) with an error logged, and the
table starts empty: a clear error and a safe start, never a crash loop. All I/O here blocks: call it
from a worker thread.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vgpud.fsutil import read_regular, write_atomic
from vgpud.hotplug.rules import (
    MAX_ATTACHMENTS,
    AttachKey,
    Attachment,
    AttachState,
    Refusal,
    SlaveClaim,
    parse_key,
)

log = logging.getLogger("vgpud.hotplug")

HOTPLUG_FILE = "hotplug.json"
FILE_MODE = 0o600
VERSION = 1
#: a few hundred bytes per attachment: a file far larger is not ours
MAX_FILE_BYTES = 4 << 20


class StoreError(Exception):
    """The file cannot be read safely (not a regular file, a symlink) or written."""


# --------------------------------------------------------------------------------------------------
# Codec (pure)


def _str(obj: Mapping[str, Any], key: str, where: str) -> str:
    value = obj.get(key)
    if type(value) is not str:
        raise ValueError(f"{where}: {key} must be a string")
    return value


def _list(obj: Mapping[str, Any], key: str, where: str) -> list[Any]:
    value = obj.get(key, [])
    if type(value) is not list:
        raise ValueError(f"{where}: {key} must be a list")
    return value


def _obj(value: Any, where: str) -> Mapping[str, Any]:
    if type(value) is not dict:
        raise ValueError(f"{where}: expected an object, not {type(value).__name__}")
    return value


def claim_to_dict(claim: SlaveClaim) -> dict[str, Any]:
    return {
        "namespace": claim.namespace,
        "name": claim.name,
        "uid": claim.uid,
        "devices": list(claim.devices),
    }


def attachment_to_dict(a: Attachment) -> dict[str, Any]:
    return {
        "targetPodUID": a.key.target_pod_uid,
        "containerName": a.key.container,
        "slavePodUID": a.key.slave_pod_uid,
        "containerID": a.container_id,
        "targetPodNamespace": a.target_pod_namespace,
        "targetPodName": a.target_pod_name,
        "attachedAt": a.attached_at,
        "state": a.state.value,
        "claims": [claim_to_dict(c) for c in a.claims],
    }


def _claim(obj: Any, where: str) -> SlaveClaim:
    obj = _obj(obj, where)
    devices = _list(obj, "devices", where)
    if not all(type(d) is str for d in devices):
        raise ValueError(f"{where}: devices must be a list of strings")
    return SlaveClaim(
        _str(obj, "namespace", where), _str(obj, "name", where), _str(obj, "uid", where), tuple(devices)
    )


def attachment_from_dict(obj: Any, where: str = "attachment") -> Attachment:
    """The inverse of `attachment_to_dict`; ValueError naming the field when `obj` is not one."""
    obj = _obj(obj, where)
    try:
        key = parse_key(
            _str(obj, "targetPodUID", where),
            _str(obj, "containerName", where),
            _str(obj, "slavePodUID", where),
        )
    except Refusal as err:
        raise ValueError(f"{where}: {err}") from None
    attached_at = obj.get("attachedAt")
    if type(attached_at) not in (int, float):
        raise ValueError(f"{where}: attachedAt must be a number")
    state = _str(obj, "state", where)
    if state not in {s.value for s in AttachState}:
        raise ValueError(f"{where}: state {state!r} is not one of {', '.join(s.value for s in AttachState)}")
    return Attachment(
        key=key,
        container_id=_str(obj, "containerID", where),
        target_pod_namespace=_str(obj, "targetPodNamespace", where),
        target_pod_name=_str(obj, "targetPodName", where),
        claims=tuple(_claim(c, f"{where} claim") for c in _list(obj, "claims", where)),
        attached_at=float(attached_at),
        state=AttachState(state),
    )


def encode(boot_id: str, attachments: Mapping[AttachKey, Attachment]) -> bytes:
    """One line of JSON, attachments in key order (the same table always gives the same bytes)."""
    body = {
        "version": VERSION,
        "nodeBootID": boot_id,
        "attachments": [attachment_to_dict(attachments[k]) for k in sorted(attachments)],
    }
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def decode(data: bytes) -> tuple[str, dict[AttachKey, Attachment]]:
    """(boot ID, attachments by key); ValueError saying what is wrong with malformed input."""
    try:
        top = _obj(json.loads(data), "hotplug file")
    except RecursionError:
        raise ValueError("hotplug file: nested too deeply") from None
    if top.get("version") != VERSION:
        raise ValueError(f"hotplug file: version {top.get('version')!r} is not {VERSION}")
    boot_id = _str(top, "nodeBootID", "hotplug file")
    records = _list(top, "attachments", "hotplug file")
    if len(records) > MAX_ATTACHMENTS:
        raise ValueError(
            f"hotplug file: {len(records)} attachments, more than the {MAX_ATTACHMENTS} vgpud keeps"
        )
    table: dict[AttachKey, Attachment] = {}
    for n, obj in enumerate(records):
        attachment = attachment_from_dict(obj, f"attachment {n}")
        if attachment.key in table:
            raise ValueError(f"attachment {n}: {attachment.key} is listed twice")
        table[attachment.key] = attachment
    return boot_id, table


# --------------------------------------------------------------------------------------------------
# File


class AttachmentStore:
    """Load and save the table at `path` for the current boot `boot_id`."""

    def __init__(self, path: Path, boot_id: str) -> None:
        self.path = Path(path)
        self.boot_id = boot_id

    def _read(self) -> bytes | None:
        try:
            return read_regular(self.path, MAX_FILE_BYTES)
        except OSError as err:
            raise StoreError(f"cannot read {err.strerror}") from None

    def load(self) -> dict[AttachKey, Attachment]:
        """The saved attachments; empty when missing, from another boot, or corrupt (moved aside).
        StoreError only when the path holds something other than a regular file."""
        data = self._read()
        if data is None:
            return {}
        try:
            if len(data) > MAX_FILE_BYTES:
                raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
            boot_id, table = decode(data)
        except ValueError as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            self._quarantine(str(err))
            return {}
        if boot_id != self.boot_id:
            log.info("node rebooted: discarding %d hot-plug attachments of boot %r", len(table), boot_id)
            return {}
        return table

    def _quarantine(self, reason: str) -> None:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{time.time_ns()}")
        try:
            os.rename(self.path, aside)
        except OSError as err:
            log.error(
                "%s is corrupt (%s) and could not be moved aside (%s); starting empty", self.path, reason, err
            )
            return
        log.error(
            "%s is corrupt (%s): moved aside to %s; starting with no attachments",
            self.path,
            reason,
            aside.name,
        )

    def save(self, attachments: Mapping[AttachKey, Attachment]) -> None:
        """Write atomically (mode 0600); StoreError, with the old file intact, on failure."""
        try:
            data = encode(self.boot_id, attachments)
        except ValueError as err:  # a NaN time
            raise StoreError(f"cannot encode {self.path}: {err}") from err
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_atomic(self.path, data, FILE_MODE)
        except OSError as err:
            raise StoreError(f"cannot write {self.path}: {err.strerror or err}") from err
