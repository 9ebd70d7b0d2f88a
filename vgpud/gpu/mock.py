"""The mock backend: GPUs described by a YAML profile, for machines without GPUs (CI, demos).

The profile is also what the fake NVML library (`csrc/fakenvml`) serves, so validation here is the
gate for both readers: the subset grammar (`profile.py`), the schema below, and a cross-check that
PyYAML reads every value the same way (an unquoted "00000000:07:00.0" is a YAML 1.1 float, and an
unquoted 8.0 is not the string "8.0"). A GPU's MIG keys become its MIG mode and devices through
`vgpud.gpu.migtable`, the rules the fake NVML serves them by.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .migtable import MIG_CAPABLE, MIG_MODE_NAMES, mig_capable, mig_devices
from .model import (
    ADDRESSING_MODE_NAMES,
    ARCHITECTURE_NAMES,
    BRAND_NAMES,
    GpuInfo,
    GpuInventoryError,
    normalize_pci_bus_id,
)
from .profile import LIST_KEY, FlatDocument, Scalar, parse_flat_yaml, profile_error, render_flat_yaml

PROFILES_DIR = Path(__file__).parent / "profiles"
MAX_GPUS = 64  # the fake NVML library's table size
_INT = re.compile(r"0|[1-9][0-9]*")
_INT32_MAX = 2**31 - 1
_UUID = r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_PCI = r"[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]"

Check = Callable[[Any], str | None]  # returns why the value is invalid, or None


def _pattern(regex: str, what: str) -> Check:
    compiled = re.compile(regex)
    return lambda v: None if compiled.fullmatch(v) else f"{v!r} is not {what}"


def _one_of(names: dict[int, str]) -> Check:
    allowed = sorted(names.values())
    return lambda v: None if v in allowed else f"{v!r} is not one of {', '.join(map(repr, allowed))}"


def _text(max_bytes: int) -> Check:
    return lambda v: None if 0 < len(v) <= max_bytes else f"must be 1 to {max_bytes} characters"


def _range(low: int, high: int) -> Check:
    return lambda v: None if low <= v <= high else f"{v} is outside {low}..{high}"


@dataclass(frozen=True)
class _Field:
    attr: str  # GpuInfo attribute
    kind: type  # int or str
    check: Check
    required: bool = True


TOP_FIELDS: dict[str, _Field] = {
    "driverVersion": _Field(
        "driver_version", str, _pattern(r"[0-9]{1,5}(\.[0-9]{1,5}){0,3}", 'a version like "550.54.15"')
    ),
    "cudaDriverVersion": _Field(
        "cuda_driver_version", str, _pattern(r"(0|[1-9][0-9]{0,2})\.(0|[1-9][0-9]?)", 'a version like "12.4"')
    ),
}

GPU_FIELDS: dict[str, _Field] = {
    "uuid": _Field("uuid", str, _pattern(_UUID, "a GPU UUID (GPU-<lower-case uuid>)")),
    "index": _Field("index", int, _range(0, MAX_GPUS - 1)),
    "minor": _Field("minor", int, _range(0, 254)),  # minor 255 is /dev/nvidiactl
    "productName": _Field("product_name", str, _text(95)),
    "brand": _Field("brand", str, _one_of(BRAND_NAMES)),
    "architecture": _Field("architecture", str, _one_of(ARCHITECTURE_NAMES)),
    "memoryTotal": _Field("memory_total", int, _range(1, 2**64 - 1)),
    "pciBusId": _Field("pci_bus_id", str, _pattern(_PCI, 'an NVML bus id like "00000000:07:00.0"')),
    "numaNode": _Field("numa_node", int, _range(0, _INT32_MAX), required=False),
    "computeCapability": _Field(
        "compute_capability", str, _pattern(r"[1-9][0-9]?\.[0-9]", 'a compute capability like "8.0"')
    ),
    "addressingMode": _Field("addressing_mode", str, _one_of(ADDRESSING_MODE_NAMES), required=False),
    # MIG: turned into GpuInfo's mig_mode and mig_devices by `_mig` (the pending mode is the fake's alone)
    "migMode": _Field("mig_mode", str, _one_of(MIG_MODE_NAMES), required=False),
    "migModePending": _Field("mig_mode_pending", str, _one_of(MIG_MODE_NAMES), required=False),
    "migDevices": _Field("mig_devices", str, _text(127), required=False),
}
MIG_KEYS = ("migMode", "migModePending", "migDevices")


class MockInventory:
    """GPUs from a profile, read and validated once when opened."""

    backend = "mock"

    def __init__(self, profile: Path) -> None:
        self.profile = profile
        self._gpus = load_profile(profile)

    def gpus(self) -> list[GpuInfo]:
        return list(self._gpus)

    def describe(self) -> str:
        return f"mock GPUs from {self.profile} ({len(self._gpus)} GPUs)"

    def process_memory(self) -> dict[int, dict[int, int]]:
        """No process runs on a mock GPU."""
        return {gpu.index: {} for gpu in self._gpus}


def shipped_profiles() -> dict[str, Path]:
    """The profiles that ship with vgpud, by name ("a100-40gb-x2")."""
    return {path.stem: path for path in sorted(PROFILES_DIR.glob("*.yaml"))}


def load_profile(path: Path) -> list[GpuInfo]:
    """Read, validate and convert a profile; GpuInventoryError names the file, line and field."""
    try:
        text = path.read_bytes().decode("utf-8")  # no newline translation: the C reader has none
    except (OSError, UnicodeDecodeError) as err:
        raise GpuInventoryError(f"profile {path} cannot be read: {err}") from err
    doc = parse_flat_yaml(text, path)
    top, items = _typed(doc, path)
    _cross_check_yaml(text, doc, top, items, path)
    _check_unique(doc, items, path)
    driver = {TOP_FIELDS[key].attr: value for key, value in top.items()}
    gpus = []
    for i, item in enumerate(items):
        fields = {GPU_FIELDS[key].attr: value for key, value in item.items() if key not in MIG_KEYS}
        fields["pci_bus_id"] = normalize_pci_bus_id(fields["pci_bus_id"])
        fields.setdefault("numa_node", None)
        fields.setdefault("addressing_mode", None)
        gpus.append(GpuInfo(**fields, **driver, **_mig(item, doc.items[i], f"{LIST_KEY}[{i}].", path)))
    return sorted(gpus, key=lambda gpu: gpu.index)


def dump_profile(gpus: list[GpuInfo]) -> str:
    """A profile that loads back to `gpus` (e.g. to capture a real node for the mock backend)."""
    if not gpus:
        raise ValueError("a profile needs at least one GPU")
    top = {key: getattr(gpus[0], field.attr) for key, field in TOP_FIELDS.items()}
    if any(getattr(gpu, TOP_FIELDS[key].attr) != value for gpu in gpus for key, value in top.items()):
        raise ValueError("GPUs with different driver versions cannot share one profile")
    items = []
    for gpu in gpus:
        item = {key: getattr(gpu, field.attr) for key, field in GPU_FIELDS.items() if key not in MIG_KEYS}
        item["pciBusId"] = "0000" + gpu.pci_bus_id  # back to NVML's 8-digit domain
        if gpu.mig_mode:
            item["migMode"] = MIG_MODE_NAMES[1]
            item["migDevices"] = " ".join(m.profile for m in gpu.mig_devices) or None
        items.append(item)
    return render_flat_yaml(top, items)


def _mig(item: dict[str, Any], raw: dict[str, Scalar], prefix: str, path: Path) -> dict[str, Any]:
    """GpuInfo's MIG fields from a GPU's MIG keys; a GPU without MIG given a MIG mode, MIG devices
    without migMode enabled, and devices the GPU cannot hold are profile errors."""
    enabled = MIG_MODE_NAMES[1]
    mode, pending = item.get("migMode") == enabled, item.get("migModePending") == enabled
    if (mode or pending) and not mig_capable(item["productName"], item["architecture"]):
        key = "migMode" if mode else "migModePending"
        raise profile_error(path, raw[key].line, f"{prefix}{key}: this GPU has no MIG mode ({MIG_CAPABLE})")
    if "migDevices" not in item:
        return {"mig_mode": mode}
    line = raw["migDevices"].line
    if not mode:
        raise profile_error(path, line, f"{prefix}migDevices: MIG devices need migMode: {enabled}")
    try:
        devices = mig_devices(item["uuid"], item["architecture"], item["migDevices"].split())
    except ValueError as err:
        raise profile_error(path, line, f"{prefix}migDevices: {err}") from err
    return {"mig_mode": True, "mig_devices": devices}


def _typed(doc: FlatDocument, path: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Apply the schema: known keys, required keys, types and values."""
    if doc.list_line is None:
        raise GpuInventoryError(f"profile {path}: missing the {LIST_KEY!r} list")
    if not doc.items:
        raise profile_error(path, doc.list_line, f"{LIST_KEY!r} lists no GPUs")
    if len(doc.items) > MAX_GPUS:
        raise profile_error(path, doc.item_lines[MAX_GPUS], f"more than {MAX_GPUS} GPUs")
    top = _typed_mapping(doc.top, TOP_FIELDS, "", 1, path)
    items = [
        _typed_mapping(item, GPU_FIELDS, f"{LIST_KEY}[{i}].", doc.item_lines[i], path)
        for i, item in enumerate(doc.items)
    ]
    return top, items


def _typed_mapping(
    raw: dict[str, Scalar], schema: dict[str, _Field], prefix: str, line: int, path: Path
) -> dict[str, Any]:
    for key, scalar in raw.items():
        if key not in schema:
            known = ", ".join(schema) if prefix else ", ".join([*schema, LIST_KEY])
            raise profile_error(path, scalar.line, f"{prefix}{key}: unknown key (known: {known})")
    for key, field in schema.items():
        if field.required and key not in raw:
            where = prefix.rstrip(".") or "top level"
            raise profile_error(path, line, f"{where}: missing required key {key!r}")
    typed = {}
    for key, scalar in raw.items():
        field = schema[key]
        value: Any = scalar.text
        if field.kind is int:
            if scalar.quoted or not _INT.fullmatch(scalar.text):
                why: str | None = f"expected an unquoted integer, got {scalar.text!r}"
            else:
                value = int(scalar.text)
                why = field.check(value)
        else:
            why = field.check(value)
        if why is not None:
            raise profile_error(path, scalar.line, f"{prefix}{key}: {why}")
        typed[key] = value
    return typed


def _cross_check_yaml(
    text: str, doc: FlatDocument, top: dict[str, Any], items: list[dict[str, Any]], path: Path
) -> None:
    """Every value must mean the same to PyYAML as to the subset reader (and so to the C fake)."""
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise GpuInventoryError(f"profile {path}: not valid YAML: {err}") from err
    if (
        not isinstance(loaded, dict)
        or loaded.keys() != {*top, LIST_KEY}
        or not isinstance(loaded[LIST_KEY], list)
        or len(loaded[LIST_KEY]) != len(items)
        or not all(isinstance(got, dict) for got in loaded[LIST_KEY])
    ):
        raise GpuInventoryError(f"profile {path}: PyYAML reads a different structure: {loaded!r}")
    pairs = [(top, loaded, doc.top, "")]
    pairs += [(item, loaded[LIST_KEY][i], doc.items[i], f"{LIST_KEY}[{i}].") for i, item in enumerate(items)]
    for want, got, raw, prefix in pairs:
        for key, value in want.items():
            other = got.get(key)
            if type(other) is not type(value) or other != value:
                raise profile_error(
                    path,
                    raw[key].line,
                    f"{prefix}{key}: YAML reads this value as {other!r} ({type(other).__name__}), "
                    f"not {value!r}; quote it",
                )


def _check_unique(doc: FlatDocument, items: list[dict[str, Any]], path: Path) -> None:
    """uuid, index, minor and PCI bus id identify a GPU; indices are dense, as NVML numbers them."""
    for key in ("uuid", "index", "minor", "pciBusId"):
        seen: dict[Any, int] = {}
        for i, item in enumerate(items):
            value = item[key] if key != "pciBusId" else normalize_pci_bus_id(item[key])
            if value in seen:
                raise profile_error(
                    path,
                    doc.items[i][key].line,
                    f"{LIST_KEY}[{i}].{key}: {item[key]!r} is already used by {LIST_KEY}[{seen[value]}]",
                )
            seen[value] = i
    for i, item in enumerate(items):
        if item["index"] >= len(items):
            raise profile_error(
                path,
                doc.items[i]["index"].line,
                f"{LIST_KEY}[{i}].index: {item['index']} is out of range: "
                f"{len(items)} GPUs are numbered 0..{len(items) - 1}",
            )
