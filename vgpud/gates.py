"""The feature gates of `vgpud run` (the reference system's names) and their dependency rules.

`--feature-gates` / `FEATURE_GATES` takes the Kubernetes syntax, `Name=true,Other=false`; the rules
are checked as it is parsed, so a bad combination stops vgpud before anything starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from vgpud.options import ConfigError
from vgpud.parsers import FALSE_WORDS, TRUE_WORDS


@dataclass(frozen=True)
class Gate:
    name: str
    default: bool
    requires: tuple[str, ...] = ()
    help: str = ""


GATES: tuple[Gate, ...] = (
    Gate("VGPUSupport", True, help="share GPUs as vGPUs with memory and core limits"),
    Gate("NVMLDeviceHealthCheck", True, help="watch NVML for device health"),
    Gate("DevicePluginClientMode", False, ("VGPUSupport",), "the library registers with vgpud (bit 200)"),
    Gate("NRISupport", False, ("VGPUSupport",), "per-container directories through containerd NRI"),
    Gate("SharedSMUtilizationWatcher", False, ("VGPUSupport",), "one SM utilization watcher per GPU"),
)
_GATES_BY_NAME = {gate.name: gate for gate in GATES}


@dataclass(frozen=True)
class FeatureGates:
    """The resolved gates; `enabled(name)` raises on a name that is not a gate (a typo is a bug)."""

    values: Mapping[str, bool]

    def enabled(self, name: str) -> bool:
        if name not in _GATES_BY_NAME:
            raise KeyError(f"unknown feature gate {name!r}")
        return self.values[name]

    def __str__(self) -> str:
        return ",".join(f"{name}={str(on).lower()}" for name, on in sorted(self.values.items()))


def gates_help() -> str:
    """The gates as `--feature-gates` lists them."""
    return ", ".join(f"{g.name} ({'on' if g.default else 'off'})" for g in GATES)


def parse_feature_gates(text: str) -> FeatureGates:
    """Parse `Name=true,Other=false` (the Kubernetes syntax) and check the gates' dependency rules."""
    values = {gate.name: gate.default for gate in GATES}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, raw = item.partition("=")
        name, raw = name.strip(), raw.strip().lower()
        if not sep or not name:
            raise ConfigError(f"feature gate {item!r} is not of the form Name=true|false")
        if name not in _GATES_BY_NAME:
            known = ", ".join(gate.name for gate in GATES)
            raise ConfigError(f"unknown feature gate {name!r} (known: {known})")
        if raw in TRUE_WORDS:
            values[name] = True
        elif raw in FALSE_WORDS:
            values[name] = False
        else:
            raise ConfigError(f"feature gate {name}={raw!r}: the value must be true or false")
    for gate in GATES:
        for needed in gate.requires:
            if values[gate.name] and not values[needed]:
                raise ConfigError(f"feature gate {gate.name} requires {needed}, which is disabled")
    return FeatureGates(values)
