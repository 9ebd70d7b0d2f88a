"""The feature gates of `vgpud run` (the reference system's names) and their dependency rules.

`--feature-gates` / `FEATURE_GATES` takes the Kubernetes syntax, `Name=true,Other=false`; the rules
are checked as it is parsed, so a bad combination stops vgpud before anything starts. A gate vgpud
cannot honour is refused when it is set to what vgpud cannot do, never accepted and ignored:
`VGPUSupport` is always on (whole-GPU publishing does not exist); `SharedSMUtilizationWatcher` is
off, as it does not exist yet (`=false` is accepted: it is the truth). `NVMLDeviceHealthCheck` is on
by default, as in the reference; which gates were set explicitly is kept, because an explicit
`NVMLDeviceHealthCheck=true` with the mock GPU backend (no NVML to watch) is refused, while the
default is only logged as not applicable (vgpud.config).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from vgpud.options import ConfigError
from vgpud.parsers import FALSE_WORDS, TRUE_WORDS


@dataclass(frozen=True)
class Gate:
    name: str
    default: bool
    requires: tuple[str, ...] = ()
    help: str = ""
    #: the values vgpud can run with; setting another one is refused with `refusal`
    accepts: tuple[bool, ...] = (False, True)
    refusal: str = ""

    @property
    def settable(self) -> bool:
        """Both values work: the gate is a real choice (and `--help` lists it)."""
        return len(self.accepts) == 2


GATES: tuple[Gate, ...] = (
    Gate(
        "VGPUSupport",
        True,
        help="share GPUs as vGPUs with memory and core limits",
        accepts=(True,),
        refusal="vgpud only shares GPUs as vGPUs; publishing whole GPUs without limits is not implemented",
    ),
    Gate(
        "NVMLDeviceHealthCheck",
        True,
        help="watch NVML for XIDs and lost GPUs; a sick GPU is marked unhealthy",
    ),
    Gate("DevicePluginClientMode", False, ("VGPUSupport",), "the library registers with vgpud (bit 200)"),
    Gate("NRISupport", False, ("VGPUSupport",), "per-container directories through containerd NRI"),
    Gate(
        "SharedSMUtilizationWatcher",
        False,
        ("VGPUSupport",),
        "one SM utilization watcher per GPU",
        accepts=(False,),
        refusal="vgpud has no SM utilization watcher yet (containers would get a mount of a "
        "<manager root>/watcher directory that nothing creates or writes)",
    ),
)
_GATES_BY_NAME = {gate.name: gate for gate in GATES}


@dataclass(frozen=True)
class FeatureGates:
    """The resolved gates; `enabled(name)` raises on a name that is not a gate (a typo is a bug)."""

    values: Mapping[str, bool]
    #: the gates `--feature-gates` named (the others have their defaults)
    explicit: frozenset[str] = field(default=frozenset(), compare=False)

    def enabled(self, name: str) -> bool:
        if name not in _GATES_BY_NAME:
            raise KeyError(f"unknown feature gate {name!r}")
        return self.values[name]

    def __str__(self) -> str:
        return ",".join(f"{name}={str(on).lower()}" for name, on in sorted(self.values.items()))


def gates_help() -> str:
    """The gates `--feature-gates` offers (the settable ones), with what they do and their default."""
    return "; ".join(f"{g.name} ({'on' if g.default else 'off'}): {g.help}" for g in GATES if g.settable)


def parse_feature_gates(text: str) -> FeatureGates:
    """Parse `Name=true,Other=false` (the Kubernetes syntax), check the gates' dependency rules (as the
    reference system's), then refuse a value vgpud cannot run with."""
    values = {gate.name: gate.default for gate in GATES}
    explicit: list[str] = []
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
        explicit.append(name)
    for gate in GATES:
        for needed in gate.requires:
            if values[gate.name] and not values[needed]:
                raise ConfigError(f"feature gate {gate.name} requires {needed}, which is disabled")
    for name in explicit:
        gate = _GATES_BY_NAME[name]
        if values[name] not in gate.accepts:
            value = str(values[name]).lower()
            raise ConfigError(f"feature gate {name}={value} is not supported: {gate.refusal}")
    return FeatureGates(values, frozenset(explicit))
