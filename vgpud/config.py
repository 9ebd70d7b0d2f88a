"""Settings of `vgpud run` from flags and environment, and the feature gates with their rules.

Every setting has a flag and most have the environment variable the Helm chart sets (the same names
as the reference system). A flag wins over the environment, the environment over the default. All
validation happens here, before anything starts: a bad value or gate combination is a `ConfigError`
whose message names the flag and the variable, and the CLI turns it into one line and exit code 2.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from vgpud.gpu import GpuInventory, open_inventory
from vgpud.gpu.mock import shipped_profiles

DEFAULT_DRIVER_NAME = "manager.nvidia.com"
GPU_BACKENDS = ("nvml", "mock")
CGROUP_DRIVERS = ("cgroupfs", "systemd")
LOG_LEVELS = ("debug", "info", "warning", "error")
BUILTIN_PROFILES = tuple(shipped_profiles())


class ConfigError(ValueError):
    """A setting or combination of settings that vgpud refuses to start with."""


# --------------------------------------------------------------------------------------------------
# Feature gates


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
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


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
        if raw in _TRUE:
            values[name] = True
        elif raw in _FALSE:
            values[name] = False
        else:
            raise ConfigError(f"feature gate {name}={raw!r}: the value must be true or false")
    for gate in GATES:
        for needed in gate.requires:
            if values[gate.name] and not values[needed]:
                raise ConfigError(f"feature gate {gate.name} requires {needed}, which is disabled")
    return FeatureGates(values)


# --------------------------------------------------------------------------------------------------
# Value parsers: each takes the raw string and raises ValueError with a reason.


def _absolute_path(raw: str) -> Path:
    if not raw.startswith("/"):
        raise ValueError(f"{raw!r} is not an absolute path")
    return Path(os.path.normpath(raw))


def _int_in(low: int, high: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw, 10)
        except ValueError:
            raise ValueError(f"{raw!r} is not an integer") from None
        if not low <= value <= high:
            raise ValueError(f"{value} is outside {low}..{high}")
        return value

    return parse


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise ValueError(f"{raw!r} is not one of {', '.join(choices)}")
        return value

    return parse


_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NRI_IDX = re.compile(r"^[0-9]{2}$")


def _dns_subdomain(raw: str) -> str:
    if len(raw) > 253 or not _DNS_SUBDOMAIN.match(raw):
        raise ValueError(f"{raw!r} is not a DNS subdomain (lower-case letters, digits, '-' and '.')")
    return raw


def _nri_idx(raw: str) -> str:
    if not _NRI_IDX.match(raw):
        raise ValueError(f"{raw!r} is not exactly two digits (the NRI plugin index, e.g. 00)")
    return raw


def _ip_address(raw: str) -> str:
    try:
        ipaddress.ip_address(raw)
    except ValueError:
        raise ValueError(f"{raw!r} is not an IP address") from None
    return raw


def parse_host_port(raw: str) -> tuple[str, int]:
    """`HOST:PORT` or `[V6]:PORT` with an IP address as the host -> (host, port)."""
    host, sep, port = raw.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"{raw!r} is not HOST:PORT")
    if int(port) > 65535:
        raise ValueError(f"{raw!r}: port {port} is outside 0..65535")
    return _ip_address(host), int(port)


_OFF = {"", "-1", "off"}


def _listen_address(raw: str) -> tuple[str, int] | None:
    """HOST:PORT, or '', -1, off: not served."""
    return None if raw.strip().lower() in _OFF else parse_host_port(raw)


def _loopback_address(raw: str) -> tuple[str, int] | None:
    """As `_listen_address`, and only a loopback IP: the debug routes have no authentication."""
    address = _listen_address(raw)
    if address is not None and not ipaddress.ip_address(address[0]).is_loopback:
        raise ValueError(f"{raw!r}: the debug address must be a loopback address (127.0.0.1, ::1)")
    return address


#: `--debug-socket off`: no debug unix socket
SOCKET_OFF = "off"


def _socket_path_or_off(raw: str) -> Path | str:
    return SOCKET_OFF if raw.strip().lower() in _OFF else _absolute_path(raw)


def _gpu_profile(raw: str) -> Path:
    """A built-in profile name or the path of a YAML profile file."""
    if raw in BUILTIN_PROFILES:
        return shipped_profiles()[raw]
    path = Path(raw)
    if not path.is_file():
        raise ValueError(
            f"{raw!r} is neither a built-in profile ({', '.join(BUILTIN_PROFILES)}) nor a readable file"
        )
    return path.resolve()


# --------------------------------------------------------------------------------------------------
# The settings and their options


@dataclass(frozen=True)
class Option:
    """One setting: its flag, its environment variable (or none), its parser and default."""

    dest: str
    flag: str
    env: str | None
    parse: Callable[[str], Any]
    default: str | None
    help: str
    metavar: str | None = None
    #: a path default that --root-prefix moves under the prefix
    rebased: bool = False


OPTIONS: tuple[Option, ...] = (
    Option(
        "node_name",
        "--node-name",
        "NODE_NAME",
        _dns_subdomain,
        None,
        "this node's name (default: the host name)",
    ),
    Option(
        "driver_name",
        "--driver-name",
        "DRIVER_NAME",
        _dns_subdomain,
        DEFAULT_DRIVER_NAME,
        "DRA driver name; must match the DeviceClass and ResourceSlices",
    ),
    Option(
        "feature_gates",
        "--feature-gates",
        "FEATURE_GATES",
        parse_feature_gates,
        "",
        "comma-separated Name=true|false: "
        + ", ".join(f"{g.name} ({'on' if g.default else 'off'})" for g in GATES),
        "GATES",
    ),
    Option(
        "manager_dir",
        "--host-manager-dir",
        "HOST_MANAGER_DIR",
        _absolute_path,
        "/etc/vgpu-manager",
        "manager root on the host: claims, registry socket, library",
        "DIR",
        rebased=True,
    ),
    Option(
        "cdi_root",
        "--cdi-root",
        "CDI_ROOT",
        _absolute_path,
        "/var/run/cdi",
        "where transient CDI specs are written",
        "DIR",
        rebased=True,
    ),
    Option(
        "nri_root",
        "--nri-root",
        "NRI_ROOT",
        _absolute_path,
        "/var/run/nri",
        "directory of the runtime's nri.sock",
        "DIR",
        rebased=True,
    ),
    Option(
        "kubelet_registrar_dir",
        "--kubelet-registrar-dir",
        "KUBELET_REGISTRAR_DIR",
        _absolute_path,
        "/var/lib/kubelet/plugins_registry",
        "kubelet plugin registration directory",
        "DIR",
        rebased=True,
    ),
    Option(
        "kubelet_plugins_dir",
        "--kubelet-plugins-dir",
        "KUBELET_PLUGINS_DIR",
        _absolute_path,
        "/var/lib/kubelet/plugins",
        "kubelet plugins directory (holds <driver>/dra.sock)",
        "DIR",
        rebased=True,
    ),
    Option(
        "proc_root",
        "--proc-root",
        "HOST_PROC",
        _absolute_path,
        "/proc",
        "the host's /proc (caller identity)",
        "DIR",
    ),
    Option(
        "cgroup_driver",
        "--cgroup-driver",
        "CGROUP_DRIVER",
        _choice(*CGROUP_DRIVERS),
        "cgroupfs",
        "the kubelet's cgroup driver: cgroupfs or systemd",
    ),
    Option(
        "healthcheck_port",
        "--healthcheck-port",
        "HEALTHCHECK_PORT",
        _int_in(-1, 65535),
        "51515",
        "TCP port of the gRPC health service ('' and 'liveness'); 0 = any free port, -1 = off",
        "PORT",
    ),
    Option(
        "healthcheck_address",
        "--healthcheck-address",
        "HEALTHCHECK_ADDRESS",
        _ip_address,
        "0.0.0.0",
        "address the gRPC health service binds (the kubelet probe dials the node IP)",
        "ADDR",
    ),
    Option(
        "nri_plugin_idx",
        "--nri-plugin-idx",
        "NRI_PLUGIN_IDX",
        _nri_idx,
        "00",
        "NRI plugin index: two digits, the order among NRI plugins",
        "IDX",
    ),
    Option(
        "device_cores_ratio",
        "--device-cores-ratio",
        "DEVICE_CORES_RATIO",
        _int_in(1, 10000),
        "100",
        "percent of each GPU's compute offered as 'cores' capacity",
        "PCT",
    ),
    Option(
        "device_memory_ratio",
        "--device-memory-ratio",
        "DEVICE_MEMORY_RATIO",
        _int_in(1, 10000),
        "100",
        "percent of each GPU's memory offered as 'memory' capacity (>100 oversells)",
        "PCT",
    ),
    Option(
        "gpu_backend",
        "--gpu-backend",
        "GPU_BACKEND",
        _choice(*GPU_BACKENDS),
        "nvml",
        "where GPUs come from: nvml (real) or mock (a YAML profile)",
    ),
    Option(
        "gpu_profile",
        "--gpu-profile",
        "GPU_PROFILE",
        _gpu_profile,
        None,
        "mock GPU profile: a YAML file or a built-in name (" + ", ".join(BUILTIN_PROFILES) + ")",
        "PROFILE",
    ),
    Option(
        "nvml_library",
        "--nvml-library",
        "NVML_LIBRARY",
        _absolute_path,
        None,
        "path of libnvidia-ml.so.1 (default: the dynamic loader's search)",
        "PATH",
    ),
    Option(
        "kubeconfig",
        "--kubeconfig",
        "KUBECONFIG",
        _absolute_path,
        None,
        "kubeconfig file (default: the in-cluster service account)",
        "FILE",
    ),
    Option(
        "library_source",
        "--library-source",
        "LIBRARY_SOURCE",
        _absolute_path,
        None,
        "libvgpu-control.so to install into the manager root (default: none installed)",
        "FILE",
    ),
    Option(
        "register_client_source",
        "--register-client-source",
        "REGISTER_CLIENT_SOURCE",
        _absolute_path,
        None,
        "vgpu-register to install as <manager root>/registry/vgpu-register, the client the library runs",
        "FILE",
    ),
    Option(
        "shutdown_timeout",
        "--shutdown-timeout",
        "SHUTDOWN_TIMEOUT",
        _int_in(1, 300),
        "10",
        "seconds every component gets to close on SIGTERM",
        "SECONDS",
    ),
    Option(
        "metrics_address",
        "--metrics-address",
        "METRICS_ADDRESS",
        _listen_address,
        "127.0.0.1:9464",
        "HOST:PORT of the Prometheus /metrics server ('' or off: none; 0.0.0.0:9464 for a scraper)",
        "HOST:PORT",
    ),
    Option(
        "debug_socket",
        "--debug-socket",
        "DEBUG_SOCKET",
        _socket_path_or_off,
        None,
        "unix socket of the debug endpoint and the live hook stream, mode 0600 "
        "(default: <kubelet plugins dir>/<driver>/debug.sock; off: none)",
        "PATH",
    ),
    Option(
        "debug_address",
        "--debug-address",
        "DEBUG_ADDRESS",
        _loopback_address,
        None,
        "also serve the debug endpoint on this loopback HOST:PORT (default: none)",
        "HOST:PORT",
    ),
    Option(
        "drift_interval",
        "--drift-interval",
        "DRIFT_INTERVAL",
        _int_in(0, 86400),
        "60",
        "seconds between drift self-checks (NRI cache vs runtime vs disk vs checkpoint); 0 = off",
        "SECONDS",
    ),
    Option(
        "log_level", "--log-level", "LOG_LEVEL", _choice(*LOG_LEVELS), "info", "debug, info, warning or error"
    ),
)

_ROOT_PREFIX = Option(
    "root_prefix",
    "--root-prefix",
    "VGPUD_ROOT_PREFIX",
    _absolute_path,
    None,
    "put every default host path under DIR (development and tests)",
    "DIR",
)


@dataclass(frozen=True)
class Settings:
    """Everything `vgpud run` needs to know, validated."""

    node_name: str
    driver_name: str
    feature_gates: FeatureGates
    manager_dir: Path
    cdi_root: Path
    nri_root: Path
    kubelet_registrar_dir: Path
    kubelet_plugins_dir: Path
    proc_root: Path
    cgroup_driver: str
    healthcheck_port: int
    healthcheck_address: str
    nri_plugin_idx: str
    device_cores_ratio: int
    device_memory_ratio: int
    gpu_backend: str
    gpu_profile: Path | None
    nvml_library: Path | None
    kubeconfig: Path | None
    library_source: Path | None
    register_client_source: Path | None
    shutdown_timeout: int
    metrics_address: tuple[str, int] | None
    #: a path, SOCKET_OFF, or None for the default (`debug_socket_path`)
    debug_socket: Path | str | None
    debug_address: tuple[str, int] | None
    drift_interval: int
    log_level: str
    root_prefix: Path | None = field(default=None)

    @property
    def plugin_dir(self) -> Path:
        """`<plugins dir>/<driver>`: dra.sock, checkpoint.json and the lock files."""
        return self.kubelet_plugins_dir / self.driver_name

    @property
    def dra_socket(self) -> Path:
        return self.plugin_dir / "dra.sock"

    @property
    def registration_socket(self) -> Path:
        return self.kubelet_registrar_dir / f"{self.driver_name}-reg.sock"

    @property
    def debug_socket_path(self) -> Path | None:
        """Where the debug endpoint listens; None when it is off."""
        if self.debug_socket is None:
            return self.plugin_dir / "debug.sock"
        return None if self.debug_socket == SOCKET_OFF else Path(self.debug_socket)

    @property
    def nri_socket(self) -> Path:
        return self.nri_root / "nri.sock"

    @property
    def gpu_source(self) -> GpuSource:
        return GpuSource(self.gpu_backend, self.gpu_profile, self.nvml_library)

    def summary(self) -> dict[str, str]:
        """The settings as strings, for the start-up log line and `vgpud debug state`."""
        return {f.name: str(getattr(self, f.name)) for f in fields(self)}


def add_settings_arguments(parser: argparse.ArgumentParser, dests: tuple[str, ...] | None = None) -> None:
    """Register the options (all, or those in `dests`); values stay raw strings until resolved."""
    for option in (*OPTIONS, _ROOT_PREFIX):
        if dests is not None and option.dest not in dests:
            continue
        env = f" [env {option.env}]" if option.env else ""
        default = f" (default: {option.default})" if option.default not in (None, "") else ""
        parser.add_argument(
            option.flag,
            dest=option.dest,
            default=None,
            metavar=option.metavar,
            help=f"{option.help}{default}{env}",
        )


def settings_from(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Settings:
    """Resolve flag > environment > default for every option, validate, and check combinations."""
    environ = os.environ if environ is None else environ
    prefix = _resolve(_ROOT_PREFIX, args, environ, None)
    values: dict[str, Any] = {"root_prefix": prefix}
    for option in OPTIONS:
        values[option.dest] = _resolve(option, args, environ, prefix)
    if values["node_name"] is None:
        values["node_name"] = _dns_subdomain(socket.gethostname().lower())
    settings = Settings(**values)
    _check_combinations(settings)
    return settings


def _resolve(
    option: Option, args: argparse.Namespace, environ: Mapping[str, str], prefix: Path | None
) -> Any:
    raw = getattr(args, option.dest, None)
    source = option.flag
    if raw is None and option.env and environ.get(option.env, "") != "":
        raw, source = environ[option.env], f"{option.env} (environment)"
    if raw is None:
        if option.default is None:
            return None
        raw, source = option.default, f"{option.flag} default"
        if option.rebased and prefix is not None:
            raw = str(prefix) + raw
    try:
        return option.parse(raw)
    except ValueError as err:
        raise ConfigError(f"{source}: {err}") from None


@dataclass(frozen=True)
class GpuSource:
    """Where the GPU inventory comes from: all that `vgpud gpus` needs."""

    backend: str
    profile: Path | None
    nvml_library: Path | None

    def inventory(self) -> GpuInventory:
        """The inventory these settings name (GpuInventoryError when it cannot be opened)."""
        return open_inventory(
            self.backend,
            profile=self.profile,
            nvml_library=str(self.nvml_library) if self.nvml_library else None,
        )


GPU_SOURCE_DESTS = ("gpu_backend", "gpu_profile", "nvml_library")


def gpu_source_from(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> GpuSource:
    """Resolve only the GPU options, so `vgpud gpus` does not depend on unrelated settings."""
    environ = os.environ if environ is None else environ
    by_dest = {option.dest: option for option in OPTIONS}
    source = GpuSource(*(_resolve(by_dest[dest], args, environ, None) for dest in GPU_SOURCE_DESTS))
    _check_gpu_source(source)
    return source


def _check_gpu_source(source: GpuSource) -> None:
    if source.backend == "mock" and source.profile is None:
        raise ConfigError(
            "--gpu-backend mock needs --gpu-profile (a YAML file or one of "
            + ", ".join(BUILTIN_PROFILES)
            + ")"
        )
    if source.backend == "nvml" and source.profile is not None:
        raise ConfigError("--gpu-profile is only used with --gpu-backend mock")
    if source.backend == "mock" and source.nvml_library is not None:
        raise ConfigError("--nvml-library is only used with --gpu-backend nvml")


def _check_combinations(settings: Settings) -> None:
    _check_gpu_source(settings.gpu_source)
    sockets = (settings.dra_socket, settings.registration_socket, settings.debug_socket_path)
    for path in sockets:
        if path is not None and len(str(path)) >= 108:
            raise ConfigError(f"socket path {path} is longer than the 107 bytes a unix socket address holds")
