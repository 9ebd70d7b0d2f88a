"""The settings of `vgpud run`: the option table (flag, environment variable, parser, default), the
validated `Settings`, and the rules about which settings go together.

Every setting has a flag and an environment variable (the reference system's names where it has the
setting, so a DaemonSet written for it configures vgpud the same way). A flag wins over the
environment, the environment over the default. All validation happens here, before anything starts:
a bad value or gate combination, or a setting vgpud cannot honour, is a `ConfigError` whose message
names the flag or the variable, and the CLI turns it into one line and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path, PurePosixPath
from typing import Any

from vgpud.artifacts import DEFAULT_LIBRARY_SOURCE, DEFAULT_REGISTER_CLIENT_SOURCE
from vgpud.gates import FeatureGates, gates_help, parse_feature_gates
from vgpud.gpu.healthrules import DEFAULT_IGNORED_XIDS, NO_XIDS, parse_xid_list
from vgpud.gpu.source import BUILTIN_PROFILES, GPU_BACKENDS, GpuSource, gpu_profile
from vgpud.logs import LOG_FORMATS
from vgpud.nvdriver.discover import DriverRoots
from vgpud.options import ConfigError, Option, add_arguments, resolve
from vgpud.parsers import (
    SOCKET_OFF,
    absolute_path,
    choice,
    dns_subdomain,
    int_in,
    ip_address,
    listen_address,
    loopback_address,
    nri_idx,
    socket_path_or_off,
)

DEFAULT_DRIVER_NAME = "manager.nvidia.com"
CGROUP_DRIVERS = ("cgroupfs", "systemd")
LOG_LEVELS = ("debug", "info", "warning", "error")


OPTIONS: tuple[Option, ...] = (
    Option(
        "node_name",
        "--node-name",
        "NODE_NAME",
        dns_subdomain,
        None,
        "this node's name, as the kubelet registered it",
        "NAME",
        unset="the host name",
    ),
    Option(
        "driver_name",
        "--driver-name",
        "DRIVER_NAME",
        dns_subdomain,
        DEFAULT_DRIVER_NAME,
        "DRA driver name; must match the DeviceClass and ResourceSlices",
        "NAME",
    ),
    Option(
        "feature_gates",
        "--feature-gates",
        "FEATURE_GATES",
        parse_feature_gates,
        "",
        "comma-separated Name=true|false: " + gates_help() + "; VGPUSupport is always on",
        "GATES",
        unset="none set",
    ),
    Option(
        "manager_dir",
        "--host-manager-dir",
        "HOST_MANAGER_DIR",
        absolute_path,
        "/etc/vgpu-manager",
        "manager root on the host: claim directories, the registry socket, the control library",
        "DIR",
        rebased=True,
    ),
    Option(
        "cdi_root",
        "--cdi-root",
        "CDI_ROOT",
        absolute_path,
        "/var/run/cdi",
        "where the per-claim CDI specs are written (the runtime's CDI spec directory)",
        "DIR",
        rebased=True,
    ),
    Option(
        "nri_root",
        "--nri-root",
        "NRI_ROOT",
        absolute_path,
        "/var/run/nri",
        "directory of the runtime's nri.sock (used with NRISupport)",
        "DIR",
        rebased=True,
    ),
    Option(
        "kubelet_registrar_dir",
        "--kubelet-registrar-dir",
        "KUBELET_REGISTRAR_DIR",
        absolute_path,
        "/var/lib/kubelet/plugins_registry",
        "kubelet plugin registration directory (where <driver>-reg.sock is put)",
        "DIR",
        rebased=True,
    ),
    Option(
        "kubelet_plugins_dir",
        "--kubelet-plugins-dir",
        "KUBELET_PLUGINS_DIR",
        absolute_path,
        "/var/lib/kubelet/plugins",
        "kubelet plugins directory (<driver>/ holds dra.sock, checkpoint.json, the lock and debug.sock)",
        "DIR",
        rebased=True,
    ),
    Option(
        "proc_root",
        "--proc-root",
        "HOST_PROC",
        absolute_path,
        "/proc",
        "the host's /proc, where a registering caller's cgroups are read (used with DevicePluginClientMode)",
        "DIR",
    ),
    Option(
        "cgroup_driver",
        "--cgroup-driver",
        "CGROUP_DRIVER",
        choice(*CGROUP_DRIVERS),
        None,
        "the kubelet's cgroup driver, cgroupfs or systemd: a registering caller must then be in a pod "
        "cgroup of that layout (with DevicePluginClientMode); without it, the layout in which a "
        "container's cgroup is looked up for its memory usage",
        "DRIVER",
        unset="either layout, as each caller's cgroup path shows it",
    ),
    Option(
        "healthcheck_port",
        "--healthcheck-port",
        "HEALTHCHECK_PORT",
        int_in(-1, 65535),
        "51515",
        "TCP port of the gRPC health service ('' and 'liveness'); 0 = any free port, -1 = off",
        "PORT",
    ),
    Option(
        "healthcheck_address",
        "--healthcheck-address",
        "HEALTHCHECK_ADDRESS",
        ip_address,
        "0.0.0.0",
        "address the gRPC health service binds (the kubelet probe dials the node IP)",
        "ADDR",
    ),
    Option(
        "nri_plugin_idx",
        "--nri-plugin-idx",
        "NRI_PLUGIN_IDX",
        nri_idx,
        "00",
        "NRI plugin index: two digits, the order among NRI plugins (used with NRISupport)",
        "IDX",
    ),
    Option(
        "device_cores_ratio",
        "--device-cores-ratio",
        "DEVICE_CORES_RATIO",
        int_in(1, 10000),
        "100",
        "percent of each GPU's compute offered as 'cores' capacity",
        "PCT",
    ),
    Option(
        "device_memory_ratio",
        "--device-memory-ratio",
        "DEVICE_MEMORY_RATIO",
        int_in(1, 10000),
        "100",
        "percent of each GPU's memory offered as 'memory' capacity (>100 oversells)",
        "PCT",
    ),
    Option(
        "gpu_backend",
        "--gpu-backend",
        "GPU_BACKEND",
        choice(*GPU_BACKENDS),
        "nvml",
        "where GPUs come from: nvml (real) or mock (a YAML profile)",
        "BACKEND",
    ),
    Option(
        "gpu_profile",
        "--gpu-profile",
        "GPU_PROFILE",
        gpu_profile,
        None,
        "mock GPU profile: a YAML file or a built-in name (" + ", ".join(BUILTIN_PROFILES) + "); "
        "required with --gpu-backend mock, refused otherwise",
        "PROFILE",
        unset="none",
    ),
    Option(
        "nvml_library",
        "--nvml-library",
        "NVML_LIBRARY",
        absolute_path,
        None,
        "path of libnvidia-ml.so.1 (--gpu-backend nvml only)",
        "PATH",
        unset="libnvidia-ml.so.1 in the driver root's library directories",
    ),
    Option(
        "driver_root",
        "--driver-root",
        "NVIDIA_DRIVER_ROOT",
        absolute_path,
        "/",
        "the NVIDIA driver's root on the host: its libraries, binaries and firmware are found there and "
        "handed to vGPU containers from there (/run/nvidia/driver under the GPU Operator)",
        "DIR",
        rebased=True,
    ),
    Option(
        "driver_root_ctr_path",
        "--driver-root-ctr-path",
        "DRIVER_ROOT_CTR_PATH",
        absolute_path,
        None,
        "where vgpud sees the driver root, when it runs in a container that mounts it elsewhere",
        "DIR",
        unset="--driver-root",
    ),
    Option(
        "dev_root",
        "--dev-root",
        "NVIDIA_DEV_ROOT",
        absolute_path,
        None,
        "the root under which the driver's device nodes are on the host (<dev root>/dev/nvidia0)",
        "DIR",
        unset="the driver root if it has a dev/ directory, else /",
    ),
    Option(
        "dev_root_ctr_path",
        "--dev-root-ctr-path",
        "DEV_ROOT_CTR_PATH",
        absolute_path,
        None,
        "where vgpud sees the dev root, when it runs in a container that mounts it elsewhere",
        "DIR",
        unset="--dev-root, or the driver root's path if the dev root is the driver root",
    ),
    Option(
        "nvidia_cdi_hook_path",
        "--nvidia-cdi-hook-path",
        "NVIDIA_CDI_HOOK_PATH",
        socket_path_or_off,
        None,
        "host path of NVIDIA's nvidia-cdi-hook, which vGPU containers' CDI edits run to make the "
        "driver libraries' links and update the linker cache (vgpud sees it at that path); off: none, "
        "the links become bind mounts",
        "PATH",
        unset="usr/bin, usr/local/bin or usr/local/nvidia/toolkit under the driver root, else none",
    ),
    Option(
        "health_ignored_xids",
        "--health-ignored-xids",
        "HEALTH_IGNORED_XIDS",
        parse_xid_list,
        DEFAULT_IGNORED_XIDS,
        "comma-separated XIDs that leave a GPU healthy (application errors, as NVIDIA's device plugin "
        f"ignores them; {NO_XIDS!r}: every XID makes the GPU unhealthy; used with NVMLDeviceHealthCheck)",
        "XIDS",
    ),
    Option(
        "health_recovery_seconds",
        "--health-recovery-seconds",
        "HEALTH_RECOVERY_SECONDS",
        int_in(1, 86400),
        "300",
        "an unhealthy GPU is healthy again once it answers NVML and has had no fatal XID or failed "
        "check for this long (used with NVMLDeviceHealthCheck)",
        "SECONDS",
    ),
    Option(
        "kubeconfig",
        "--kubeconfig",
        "KUBECONFIG",
        absolute_path,
        None,
        "kubeconfig file for the Kubernetes API",
        "FILE",
        unset="the in-cluster service account",
    ),
    Option(
        "library_source",
        "--library-source",
        "LIBRARY_SOURCE",
        absolute_path,
        str(DEFAULT_LIBRARY_SOURCE),
        "libvgpu-control.so to install into the manager root as the control library containers load; "
        "vgpud refuses to start without it",
        "FILE",
    ),
    Option(
        "register_client_source",
        "--register-client-source",
        "REGISTER_CLIENT_SOURCE",
        absolute_path,
        str(DEFAULT_REGISTER_CLIENT_SOURCE),
        "vgpu-register to install as <manager root>/registry/vgpu-register and device-client (the "
        "reference's name), the client the library runs; vgpud refuses to start without it",
        "FILE",
    ),
    Option(
        "shutdown_timeout",
        "--shutdown-timeout",
        "SHUTDOWN_TIMEOUT",
        int_in(1, 300),
        "10",
        "seconds every component gets to close on SIGTERM",
        "SECONDS",
    ),
    Option(
        "metrics_address",
        "--metrics-address",
        "METRICS_ADDRESS",
        listen_address,
        "127.0.0.1:9464",
        "HOST:PORT of the Prometheus /metrics server ('' or off: none; 0.0.0.0:9464 for a scraper)",
        "HOST:PORT",
    ),
    Option(
        "debug_socket",
        "--debug-socket",
        "DEBUG_SOCKET",
        socket_path_or_off,
        None,
        "unix socket of the debug endpoint and the live hook stream, mode 0600 ('', -1 or off: none)",
        "PATH",
        unset="<kubelet plugins dir>/<driver>/debug.sock",
    ),
    Option(
        "hotplug_socket",
        "--hotplug-socket",
        "HOTPLUG_SOCKET",
        socket_path_or_off,
        "off",
        "unix socket of the hot-plug API for device-mounter, mode 0600: it gives running containers "
        "access to other pods' vGPUs, so it is off unless asked for (needs NRISupport and a writable "
        "/sys/fs/cgroup; PATH, or '' -1 off: none)",
        "PATH",
    ),
    Option(
        "debug_address",
        "--debug-address",
        "DEBUG_ADDRESS",
        loopback_address,
        None,
        "also serve the debug endpoint on this loopback HOST:PORT",
        "HOST:PORT",
        unset="none",
    ),
    Option(
        "drift_interval",
        "--drift-interval",
        "DRIFT_INTERVAL",
        int_in(0, 86400),
        "60",
        "seconds between drift self-checks (the runtime's vGPU containers vs disk vs checkpoint); 0 = off",
        "SECONDS",
    ),
    Option(
        "usage_interval",
        "--usage-interval",
        "USAGE_INTERVAL",
        int_in(0, 86400),
        "10",
        "seconds between reads of each vGPU container's library files (limits, ledger, shared bucket) "
        "for the metrics and the debug state; 0 = off",
        "SECONDS",
    ),
    Option(
        "log_level",
        "--log-level",
        "LOG_LEVEL",
        choice(*LOG_LEVELS),
        "info",
        "log level: debug, info, warning or error",
        "LEVEL",
    ),
    Option(
        "log_format",
        "--log-format",
        "LOG_FORMAT",
        choice(*LOG_FORMATS),
        "text",
        "log line format: text (one line of text per record) or json (one JSON object per line, with "
        "the pod, namespace, container, claim and GPU a line is about as fields)",
        "FORMAT",
    ),
)

_ROOT_PREFIX = Option(
    "root_prefix",
    "--root-prefix",
    "VGPUD_ROOT_PREFIX",
    absolute_path,
    None,
    "put every default host path under DIR (development and tests)",
    "DIR",
    unset="none: the host paths as they are",
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
    #: cgroupfs, systemd, or None: not configured (either layout)
    cgroup_driver: str | None
    healthcheck_port: int
    healthcheck_address: str
    nri_plugin_idx: str
    device_cores_ratio: int
    device_memory_ratio: int
    gpu_backend: str
    gpu_profile: Path | None
    nvml_library: Path | None
    #: the driver root and dev root on the host, and where vgpud sees them (None: at the host path)
    driver_root: Path
    driver_root_ctr_path: Path | None
    dev_root: Path | None
    dev_root_ctr_path: Path | None
    #: a path, SOCKET_OFF, or None: looked for under the driver root
    nvidia_cdi_hook_path: Path | str | None
    #: XIDs that leave a GPU healthy
    health_ignored_xids: frozenset[int]
    health_recovery_seconds: int
    kubeconfig: Path | None
    library_source: Path
    register_client_source: Path
    shutdown_timeout: int
    metrics_address: tuple[str, int] | None
    #: a path, SOCKET_OFF, or None for the default (`debug_socket_path`)
    debug_socket: Path | str | None
    debug_address: tuple[str, int] | None
    #: a path or SOCKET_OFF
    hotplug_socket: Path | str
    drift_interval: int
    usage_interval: int
    log_level: str
    log_format: str
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
    def hotplug_socket_path(self) -> Path | None:
        """Where the hot-plug API listens; None when it is off."""
        return None if self.hotplug_socket == SOCKET_OFF else Path(self.hotplug_socket)

    @property
    def systemd_cgroups(self) -> bool | None:
        """The kubelet's cgroup layout for caller identity: systemd (True), cgroupfs (False), either."""
        return None if self.cgroup_driver is None else self.cgroup_driver == "systemd"

    @property
    def nri_socket(self) -> Path:
        return self.nri_root / "nri.sock"

    @property
    def gpu_source(self) -> GpuSource:
        return GpuSource(self.gpu_backend, self.gpu_profile, self.nvml_library, self.driver_roots.driver_seen)

    @property
    def driver_roots(self) -> DriverRoots:
        return driver_roots(
            self.driver_root, self.driver_root_ctr_path, self.dev_root, self.dev_root_ctr_path
        )

    @property
    def driver_root_explicit(self) -> bool:
        """The driver root was set (not the default /): it must then hold the driver."""
        return self.driver_root != (self.root_prefix or Path("/"))

    @property
    def device_health_check(self) -> bool:
        """The health watcher runs: NVMLDeviceHealthCheck on, and NVML to watch (the mock backend
        has none; an explicit gate with it is refused, the default is logged as not applicable)."""
        return self.feature_gates.enabled(HEALTH_GATE) and self.gpu_backend == "nvml"

    def summary(self) -> dict[str, str]:
        """The settings as strings, for the start-up log line and `vgpud debug state`."""
        return {f.name: str(getattr(self, f.name)) for f in fields(self)}


def add_settings_arguments(parser: argparse.ArgumentParser, dests: tuple[str, ...] | None = None) -> None:
    """Register the options (all, or those in `dests`); values stay raw strings until resolved."""
    add_arguments(parser, (o for o in (*OPTIONS, _ROOT_PREFIX) if dests is None or o.dest in dests))


def settings_from(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Settings:
    """Resolve flag > environment > default for every option, validate, and check combinations."""
    environ = os.environ if environ is None else environ
    prefix = resolve(_ROOT_PREFIX, args, environ, None)
    values: dict[str, Any] = {"root_prefix": prefix}
    for option in OPTIONS:
        values[option.dest] = resolve(option, args, environ, prefix)
    if values["node_name"] is None:
        values["node_name"] = dns_subdomain(socket.gethostname().lower())
    settings = Settings(**values)
    _check_combinations(settings)
    return settings


GPU_SOURCE_DESTS = ("gpu_backend", "gpu_profile", "nvml_library", "driver_root", "driver_root_ctr_path")
DRIVER_DESTS = (*GPU_SOURCE_DESTS, "dev_root", "dev_root_ctr_path", "nvidia_cdi_hook_path")


def driver_roots(
    driver_root: Path, driver_seen: Path | None, dev_root: Path | None, dev_seen: Path | None
) -> DriverRoots:
    """The roots as the host has them and as vgpud sees them. An unset dev root is the driver root
    when that has a dev/ directory (the GPU Operator's driver container), else / (NVIDIA's DRA driver
    decides it the same way)."""
    seen = driver_seen or driver_root
    if dev_root is None:
        if (seen / "dev").is_dir():
            return DriverRoots(seen, PurePosixPath(driver_root), seen, PurePosixPath(driver_root))
        dev_root = Path("/")
    return DriverRoots(seen, PurePosixPath(driver_root), dev_seen or dev_root, PurePosixPath(dev_root))


def _resolve_dests(
    args: argparse.Namespace, environ: Mapping[str, str] | None, dests: tuple[str, ...]
) -> list[Any]:
    environ = os.environ if environ is None else environ
    by_dest = {option.dest: option for option in OPTIONS}
    return [resolve(by_dest[dest], args, environ, None) for dest in dests]


def gpu_source_from(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> GpuSource:
    """Resolve only the GPU options, so `vgpud gpus` does not depend on unrelated settings."""
    backend, profile, library, root, seen = _resolve_dests(args, environ, GPU_SOURCE_DESTS)
    source = GpuSource(backend, profile, library, seen or root)
    _check_gpu_source(source)
    return source


def driver_settings_from(
    args: argparse.Namespace, environ: Mapping[str, str] | None = None
) -> tuple[GpuSource, DriverRoots, Path | str | None]:
    """The GPU source, the driver roots and the nvidia-cdi-hook setting, for `vgpud driver`."""
    backend, profile, library, root, seen, dev, dev_seen, hook = _resolve_dests(args, environ, DRIVER_DESTS)
    source = GpuSource(backend, profile, library, seen or root)
    _check_gpu_source(source)
    return source, driver_roots(root, seen, dev, dev_seen), hook


def _check_gpu_source(source: GpuSource) -> None:
    problem = source.problem()
    if problem is not None:
        raise ConfigError(problem)


HEALTH_GATE = "NVMLDeviceHealthCheck"


def _check_combinations(settings: Settings) -> None:
    _check_gpu_source(settings.gpu_source)
    gates = settings.feature_gates
    if settings.gpu_backend == "mock" and HEALTH_GATE in gates.explicit and gates.enabled(HEALTH_GATE):
        raise ConfigError(
            f"feature gate {HEALTH_GATE}=true needs --gpu-backend nvml: the mock GPU backend has no NVML "
            "to watch"
        )
    if settings.hotplug_socket_path is not None and not gates.enabled("NRISupport"):
        raise ConfigError(
            "--hotplug-socket needs the feature gate NRISupport=true: the hot-plug API finds its target "
            "containers through the NRI plugin"
        )
    sockets = (
        settings.dra_socket,
        settings.registration_socket,
        settings.debug_socket_path,
        settings.hotplug_socket_path,
    )
    for path in sockets:
        if path is not None and len(str(path)) >= 108:
            raise ConfigError(f"socket path {path} is longer than the 107 bytes a unix socket address holds")
