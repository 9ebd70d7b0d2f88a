"""One transient CDI spec per prepared claim: what the runtime applies to a container using it.

Kind `k8s.<driver>/claim`, file `<cdi_root>/k8s.<driver>-claim_<claimUID>.json` (CDI's transient
spec naming), device names `<claimUID>-<request>-vgpu-<minor>-share-<shareID>` or
`<claimUID>-<request>-vgpu-<minor>-<ordinal>` (vgpu-manager-contracts.md "CDI").

Runtimes cache specs by device name, so a name must never stand for different content: every name
starts with the claim UID, which the API server never reuses, and `claim_spec` refuses a device whose
name does not, so two claims can never collide and one claim's spec is rewritten only with its own
content. `cdiVersion` is the lowest version whose features the spec uses (`minimum_cdi_version`,
the rules of the CDI library's specs-go/version.go), so older runtimes accept the spec.
"""

from __future__ import annotations

import errno
import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vgpud.fsutil import write_atomic
from vgpud.partition.layout import Mount, check_token

CDI_CLASS = "claim"
CDI_SPEC_MODE = 0o644
MOUNT_TYPE = "bind"

#: released CDI spec versions, oldest first (specs-go/version.go); 0.3.0 is the earliest still accepted
CDI_VERSIONS = ("0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0", "1.1.0")

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
# CDI's ValidateVendorName / ValidateClassName and ValidateDeviceName (api/producer/identifiers.go)
_VENDOR_OR_CLASS = re.compile(r"[A-Za-z]([A-Za-z0-9._-]*[A-Za-z0-9])?")
_DEVICE_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._:-]*[A-Za-z0-9])?")
_LEADING_DIGIT = re.compile(r"[0-9]")
#: a DRA driver name is a DNS subdomain of at most 63 characters (resource.k8s.io validation)
MAX_DRIVER_NAME = 63


# --------------------------------------------------------------------------------------------------
# Names


def sanitize(token: str) -> str:
    """Every character outside [A-Za-z0-9._-] becomes '-' (e.g. a `main/sub` request name)."""
    return _UNSAFE.sub("-", token)


def cdi_vendor(driver: str) -> str:
    vendor = f"k8s.{driver}"
    if len(driver) > MAX_DRIVER_NAME or not _VENDOR_OR_CLASS.fullmatch(vendor):
        raise ValueError(f"driver name {driver!r} does not make a valid CDI vendor ({vendor!r})")
    return vendor


def cdi_kind(driver: str) -> str:
    """`k8s.<driver>/claim`."""
    return f"{cdi_vendor(driver)}/{CDI_CLASS}"


def device_name(claim_uid: str, request: str, minor: int, share_id: str | None, ordinal: int) -> str:
    """The claim-unique CDI device name of one allocation result (an empty share id counts as none)."""
    if not claim_uid or not request:
        raise ValueError(
            f"CDI device name needs a claim UID and a request name (got {claim_uid!r}, {request!r})"
        )
    if minor < 0 or ordinal < 0:
        raise ValueError(f"CDI device name: minor {minor} and ordinal {ordinal} must not be negative")
    base = f"{sanitize(claim_uid)}-{sanitize(request)}-vgpu-{minor}"
    name = f"{base}-share-{sanitize(share_id)}" if share_id else f"{base}-{ordinal}"
    if not _DEVICE_NAME.fullmatch(name):
        raise ValueError(f"CDI device name {name!r} must start and end with a letter or digit")
    return name


def qualified_device_id(driver: str, name: str) -> str:
    """`k8s.<driver>/claim=<name>`: what the kubelet hands the runtime (CRI CDI_devices)."""
    return f"{cdi_kind(driver)}={name}"


# --------------------------------------------------------------------------------------------------
# Spec


@dataclass(frozen=True)
class DeviceNode:
    """A CDI `deviceNodes` entry. Zero major/minor, no file mode and gid 0 are left out, as the Go
    types' `omitempty` does (the runtime fills what is missing from the host node)."""

    path: str
    host_path: str | None = None
    major: int = 0
    minor: int = 0
    file_mode: int | None = None
    permissions: str = "rwm"
    gid: int = 0

    def to_cdi(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path}
        if self.host_path and self.host_path != self.path:
            out["hostPath"] = self.host_path
        for key, value in (("major", self.major), ("minor", self.minor), ("fileMode", self.file_mode)):
            if value:
                out[key] = value
        out["permissions"] = self.permissions
        if self.gid:
            out["gid"] = self.gid
        return out


@dataclass(frozen=True)
class Hook:
    """A CDI `hooks` entry: an OCI hook the runtime runs at `hook_name` (e.g. createContainer)."""

    hook_name: str
    path: str
    args: tuple[str, ...]
    env: tuple[str, ...] = ()

    def to_cdi(self) -> dict[str, Any]:
        out: dict[str, Any] = {"hookName": self.hook_name, "path": self.path, "args": list(self.args)}
        if self.env:
            out["env"] = list(self.env)
        return out


@dataclass(frozen=True)
class ContainerEdits:
    """A CDI `containerEdits`: env (`K=V`, in order), bind mounts, device nodes, hooks and the
    additional groups the device nodes need."""

    env: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()
    device_nodes: tuple[DeviceNode, ...] = ()
    hooks: tuple[Hook, ...] = ()
    additional_gids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for entry in self.env:
            name, sep, _ = entry.partition("=") if isinstance(entry, str) else ("", "", "")
            if not (name and sep):
                raise ValueError(f"CDI env entry {entry!r} is not NAME=VALUE")

    @classmethod
    def of(cls, env: Mapping[str, str] | None = None, mounts: Sequence[Mount] = ()) -> ContainerEdits:
        """From an env mapping (its order kept)."""
        return cls(tuple(f"{k}={v}" for k, v in (env or {}).items()), tuple(mounts))

    def plus(self, other: ContainerEdits | None) -> ContainerEdits:
        """These edits followed by `other`'s (None: these alone)."""
        if other is None:
            return self
        gids = self.additional_gids + tuple(g for g in other.additional_gids if g not in self.additional_gids)
        return ContainerEdits(
            self.env + other.env,
            self.mounts + other.mounts,
            self.device_nodes + other.device_nodes,
            self.hooks + other.hooks,
            gids,
        )

    def to_cdi(self) -> dict[str, Any]:
        """The JSON object; empty lists are omitted, as the Go types' `omitempty` does."""
        out: dict[str, Any] = {}
        if self.env:
            out["env"] = list(self.env)
        if self.device_nodes:
            out["deviceNodes"] = [node.to_cdi() for node in self.device_nodes]
        if self.hooks:
            out["hooks"] = [hook.to_cdi() for hook in self.hooks]
        if self.mounts:
            out["mounts"] = [_mount(m) for m in self.mounts]
        if self.additional_gids:
            out["additionalGids"] = list(self.additional_gids)
        return out


def _mount(mount: Mount) -> dict[str, Any]:
    out: dict[str, Any] = {"hostPath": mount.host_path, "containerPath": mount.container_path}
    if mount.options:
        out["options"] = list(mount.options)
    out["type"] = MOUNT_TYPE
    return out


def claim_spec(
    driver: str,
    claim_uid: str,
    devices: Sequence[tuple[str, ContainerEdits]],
    common: ContainerEdits | None = None,
) -> dict[str, Any]:
    """The claim's spec: one device per (name, edits), `common` applied with any of them.

    ValueError for no devices, a duplicate or invalid name, or a name not starting with the claim UID.
    """
    if not devices:
        raise ValueError(f"claim {claim_uid}: a CDI spec needs at least one device")
    prefix = f"{sanitize(claim_uid)}-"
    seen: set[str] = set()
    for name, _ in devices:
        if not name.startswith(prefix) or not _DEVICE_NAME.fullmatch(name):
            raise ValueError(f"claim {claim_uid}: CDI device name {name!r} is not a valid claim-unique name")
        if name in seen:
            raise ValueError(f"claim {claim_uid}: CDI device name {name!r} appears twice")
        seen.add(name)
    spec: dict[str, Any] = {
        "cdiVersion": "",
        "kind": cdi_kind(driver),
        "devices": [{"name": name, "containerEdits": edits.to_cdi()} for name, edits in devices],
    }
    common_edits = common.to_cdi() if common is not None else {}
    if common_edits:
        spec["containerEdits"] = common_edits
    spec["cdiVersion"] = minimum_cdi_version(spec)
    return spec


# --------------------------------------------------------------------------------------------------
# cdiVersion: the rules of tags.cncf.io/container-device-interface specs-go/version.go (v1.1.0)


def _all_edits(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    yield spec.get("containerEdits") or {}
    for device in spec.get("devices") or ():
        yield device.get("containerEdits") or {}


def _requires_v110(spec: Mapping[str, Any]) -> bool:
    for edits in _all_edits(spec):
        rdt = edits.get("intelRdt")
        if rdt is not None and (rdt.get("schemata") is not None or rdt.get("enableMonitoring")):
            return True
        if edits.get("netDevices"):
            return True
    return False


def _requires_v070(spec: Mapping[str, Any]) -> bool:
    return any(e.get("intelRdt") is not None or e.get("additionalGids") for e in _all_edits(spec))


def _requires_v060(spec: Mapping[str, Any]) -> bool:
    if spec.get("annotations") or any(d.get("annotations") for d in spec.get("devices") or ()):
        return True
    _, slash, cls = str(spec.get("kind", "")).partition("/")
    return bool(slash) and "." in cls


def _requires_v050(spec: Mapping[str, Any]) -> bool:
    if any(_LEADING_DIGIT.match(str(d.get("name", ""))) for d in spec.get("devices") or ()):
        return True
    return any(node.get("hostPath") for e in _all_edits(spec) for node in e.get("deviceNodes") or ())


def _requires_v040(spec: Mapping[str, Any]) -> bool:
    return any(mount.get("type") for e in _all_edits(spec) for mount in e.get("mounts") or ())


# newest first; 1.0.0 and 0.8.0 changed only the Go API, so no spec needs them
_RULES: tuple[tuple[str, Callable[[Mapping[str, Any]], bool]], ...] = (
    ("1.1.0", _requires_v110),
    ("0.7.0", _requires_v070),
    ("0.6.0", _requires_v060),
    ("0.5.0", _requires_v050),
    ("0.4.0", _requires_v040),
)


def minimum_cdi_version(spec: Mapping[str, Any]) -> str:
    """The lowest cdiVersion whose features `spec` uses (0.3.0 when it uses none of the later ones):

    1.1.0 netDevices, or intelRdt.schemata / enableMonitoring; 0.7.0 intelRdt or additionalGids;
    0.6.0 annotations, or a '.' in the class; 0.5.0 a device name starting with a digit, or a
    deviceNode hostPath; 0.4.0 a mount `type`.
    """
    for version, required in _RULES:
        if required(spec):
            return version
    return CDI_VERSIONS[0]


# --------------------------------------------------------------------------------------------------
# Files


def spec_path(cdi_root: Path, driver: str, claim_uid: str) -> Path:
    """`<cdi_root>/k8s.<driver>-claim_<claimUID>.json` (CDI's GenerateTransientSpecName)."""
    return Path(cdi_root) / f"{cdi_vendor(driver)}-{CDI_CLASS}_{check_token(claim_uid, 'claim UID')}.json"


def write_spec(cdi_root: Path, driver: str, claim_uid: str, spec: Mapping[str, Any]) -> Path:
    """Write the claim's spec atomically (mode 0644), creating `cdi_root` if needed; OSError on
    failure (a symlink or directory at the target is refused). Blocking: run it in a thread.

    Not fsynced: the CDI root is a tmpfs (/var/run) and a node crash changes the boot ID, which
    discards the checkpoint, so every claim is prepared again anyway."""
    path = spec_path(cdi_root, driver, claim_uid)
    data = json.dumps(spec, indent=2, ensure_ascii=True, allow_nan=False).encode("ascii") + b"\n"
    try:
        write_atomic(path, data, CDI_SPEC_MODE, durable=False)
    except FileNotFoundError:  # the root is made once, not checked for every claim of a Prepare
        Path(cdi_root).mkdir(mode=0o755, parents=True, exist_ok=True)
        write_atomic(path, data, CDI_SPEC_MODE, durable=False)
    return path


def remove_spec(cdi_root: Path, driver: str, claim_uid: str) -> bool:
    """Delete the claim's spec; False when there was none. A symlink is removed, never followed."""
    path = spec_path(cdi_root, driver, claim_uid)
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    except IsADirectoryError:
        raise OSError(errno.EISDIR, f"{path} is a directory, not a CDI spec (refused)") from None
    return True
