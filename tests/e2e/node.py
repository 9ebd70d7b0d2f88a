"""A real single-node Kubernetes cluster on this machine, for the node e2e suite and `make demo`.

`LocalNode(nri=True|False)` starts, everything under one short temp dir: etcd + kube-apiserver
(tests/kubeapi.py), kube-controller-manager (its default controllers: the node lifecycle controller
lifts the kubelet's not-ready taint, the resourceclaim controller releases and deallocates claims,
DaemonSets, Deployments, service accounts and garbage collection work as in a real cluster),
kube-scheduler, containerd 1.7 or, with `containerd=CONTAINERD_2`, containerd 2.x (CDI on, NRI on or off
by track, restrict_oom_score_adj, cgroupfs, its sockets under the temp dir, the local images imported;
both with bookworm's runc), kubelet (DRA, cgroupfs, failCgroupV1: false)
and vgpud as a host process with the mock GPU backend and the reference DaemonSet's environment.
Every node is laid out like a GPU node (tests/fakedriver.py): a driver root with the fake libcuda and
libnvidia-ml under their versioned names, nvidia-smi, NVIDIA's nvidia-cdi-hook (built from the
toolkit's Go module), firmware and device nodes made with mknod, served by a fake kernel that gives
the fakes their simulated GPUs and each caller's host PID; the node is labelled as GPU feature discovery
labels GPU nodes. vgpud hands that driver to vGPU containers through its CDI edits, so pods carry no
driver volumes and keep their own PID namespace. `LocalNode(fake_gpu=True)` runs vgpud on the NVML
backend over that root (the fake libnvidia-ml.so.1 sharing the containers' simulated GPUs) instead of
the mock backend. `LocalNode(chart=True)` installs vgpud with `helm install` of helm/vgpud
instead of running it as a host process (tests/e2e/chart.py). `start()` returns once the node is Ready,
vgpud's health service says SERVING, its ResourceSlice is published and the kubelet has registered its
DRA plugin; `restart_kubelet()` stops the kubelet and starts it again; `stop()` tears everything down
by PID in reverse order and leaves no process, mount or cgroup behind. The node's IP is an address of
its own on `lo` (tests/e2e/nodeip.py), so host-network pods bind nowhere but this host. The binaries
come from hack/install-kube.sh (kube.env), hack/install-node.sh (node.env), hack/install-nvidia-ctk.sh
(nvidia-ctk.env) and, for containerd 2.x, hack/install-containerd2.sh (containerd2.env).

    python -m tests.e2e.node [--nri on|off] [--containerd 1.7|2] [--fake-gpu] [--chart]
        bring a node up, print where everything is, Ctrl-C stops it
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.controlplane import ControlPlane
from tests.e2e.leftovers import (
    cgroup_dirs,
    cgroup_mounts,
    kill_pids,
    mark_owner,
    mounts_under,
    pids_naming,
    reap_dead_nodes,
    remove_cgroups,
    stop_on_signals,
)
from tests.e2e.nodeip import claim_node_ip, release_node_ip
from tests.e2e.procs import spawn, stop_proc
from tests.fakedriver import DriverRoot, FakeKernel, build_driver_root, fake_driver_available
from tests.kubeapi import (
    ApiServer,
    api_request,
    binary,
    cache_env,
    free_port,
    log_tail,
)
from tests.support import BUILD, REPO

DRIVER = "manager.nvidia.com"
DEVICE_CLASS = "vgpu-manager"
GPU_PROFILE = "a100-40gb-x2"
NODE_NAME = "e2e-node"
READY_TIMEOUT_S = 120.0
#: vgpud's HEALTH_RECOVERY_SECONDS on the simulated GPUs: a sick GPU is healthy again this long after
#: its last fatal XID (the default, 5 minutes, is too long for a test)
HEALTH_RECOVERY_S = 15
#: what vgpud logs when a kubelet's NotifyRegistrationStatus says its DRA plugin is registered
PLUGIN_REGISTERED = f"kubelet registered DRA plugin {DRIVER} "
SERVING = 1
#: the simulated GPUs' state file, which the fake kernel serves to every fake (tests/fakedriver.py)
FAKE_STATE_FILE = "state"
#: the label NVIDIA's GPU feature discovery puts on GPU nodes (the chart runs vgpud only there)
GPU_NODE_LABEL = "nvidia.com/gpu.present=true"
#: one Prometheus text sample: name, labels, value
_SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')
INSTALL_HINT = (
    "run make build, hack/install-kube.sh, hack/install-node.sh, hack/install-containerd2.sh and "
    "hack/install-nvidia-ctk.sh (the test command does it)"
)
#: the runtimes a node runs on: containerd 1.7 (Debian's, config version 2) and containerd 2.x (built
#: from its Go module, config version 3 or 4; docs/containerd2.md)
CONTAINERD_1 = "1.7"
CONTAINERD_2 = "2"
CONTAINERD_VERSIONS = (CONTAINERD_1, CONTAINERD_2)


def _epoch(timestamp: str) -> float:
    """An API timestamp ("2026-01-02T03:04:05Z") as epoch seconds; 0 when there is none."""
    if not timestamp:
        return 0.0
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def node_env(containerd: str = CONTAINERD_1) -> dict[str, str]:
    """`<cache>/node.env` (hack/install-node.sh) as a dict, {} if absent; for containerd 2.x with
    containerd, ctr and the shim of `<cache>/containerd2.env` (hack/install-containerd2.sh) instead of
    1.7's ({} if that is absent), the 2.x shim first on NODE_PATH (containerd finds it there)."""
    if containerd not in CONTAINERD_VERSIONS:
        raise ValueError(f"no containerd {containerd!r} track: one of {', '.join(CONTAINERD_VERSIONS)}")
    env = cache_env("node.env")
    if containerd == CONTAINERD_1 or not env:
        return env
    cd2 = cache_env("containerd2.env")
    if not cd2:
        return {}
    return {
        **env,
        "CONTAINERD2_VERSION": cd2["CONTAINERD2_VERSION"],
        "CONTAINERD_BIN": cd2["CONTAINERD_BIN"],
        "CTR_BIN": cd2["CTR_BIN"],
        "SHIM_BIN": str(Path(cd2["SHIM_BIN_DIR"]) / "containerd-shim-runc-v2"),
        "NODE_PATH": f"{cd2['SHIM_BIN_DIR']}:{env['NODE_PATH']}",
        "CONFIG_VERSION": cd2["CONTAINERD2_CONFIG_VERSION"],
        "NODE_VERSIONS": " ".join(
            [f"containerd={cd2['CONTAINERD2_VERSION']}"]
            + [v for v in env.get("NODE_VERSIONS", "").split() if not v.startswith("containerd=")]
        ),
    }


def node_available(containerd: str = CONTAINERD_1) -> bool:
    """True when every binary and image the local node needs (on that containerd) is installed."""
    env = node_env(containerd)
    need = ("CONTAINERD_BIN", "CTR_BIN", "RUNC_BIN", "BUSYBOX_IMAGE_TAR", "PAUSE_IMAGE_TAR")
    need += ("SHIM_BIN",) if containerd != CONTAINERD_1 else ()
    have_node = all(key in env and Path(env[key]).exists() for key in need)
    have_node = have_node and (containerd == CONTAINERD_1 or env.get("CONFIG_VERSION", "").isdigit())
    kube = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")
    have_kube = all(binary(name) for name in kube)
    built = all((BUILD / "libvgpu" / name).exists() for name in ("vgpu-register", "libvgpu-control.so"))
    image = env.get("CUDA_IMAGE_TAR")
    have_image = image is not None and Path(image).is_file()
    hook = cdi_hook_binary()
    driver = fake_driver_available() and hook is not None and hook.is_file()
    return have_node and have_kube and built and have_image and driver


def cdi_hook_binary() -> Path | None:
    """NVIDIA's nvidia-cdi-hook (hack/install-nvidia-ctk.sh), which the node's driver root carries."""
    path = cache_env("nvidia-ctk.env").get("NVIDIA_CDI_HOOK_BIN")
    return Path(path) if path else None


# --------------------------------------------------------------------------------------------------
# Processes, mounts, cgroups


#: containerd 1.7 keeps shim sockets, runc state and client FIFOs here whatever `state` says
SHARED_RUN_DIRS = (
    Path("/run/containerd/fifo"),
    Path("/run/containerd/s"),
    Path("/run/containerd/runc/k8s.io"),
)


def _shared_run_entries() -> set[Path]:
    return {entry for d in SHARED_RUN_DIRS if d.is_dir() for entry in d.iterdir()}


@dataclass(frozen=True)
class HostRunState:
    """What containerd, its shims, runc and the CNI leave in host-wide places (SHARED_RUN_DIRS and
    /run/netns), as it was before a node (or a cluster of nodes) started, to remove what appeared."""

    shared: frozenset[Path]
    netns: frozenset[str]

    @classmethod
    def now(cls) -> HostRunState:
        netns = os.listdir("/run/netns") if os.path.isdir("/run/netns") else []
        return cls(frozenset(_shared_run_entries()), frozenset(netns))

    def remove_what_appeared(self) -> None:
        """Only once every containerd that started since is stopped: their shims' entries go too."""
        if os.path.isdir("/run/netns"):
            for name in set(os.listdir("/run/netns")) - self.netns:
                path = f"/run/netns/{name}"
                subprocess.run(["umount", "-l", path], check=False, capture_output=True)
                with contextlib.suppress(OSError):
                    os.unlink(path)
        for path in _shared_run_entries() - self.shared:  # what ctr/shims/runc left there
            shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------------------------------
# The node


@dataclass
class LocalNode:
    """One local node; `start()` / `stop()`, or use it as a context manager."""

    nri: bool
    name: str = NODE_NAME
    #: the runtime: CONTAINERD_1 (1.7) or CONTAINERD_2 (2.x)
    containerd: str = CONTAINERD_1
    client_mode: bool = True
    keep: bool = False
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="vgn", dir="/tmp")))
    api: ApiServer | None = None
    #: the cluster's control plane when the node is one of several (tests/e2e/cluster.py); None: the
    #: node starts its own and stops it with itself
    control: ControlPlane | None = None
    #: the kubelet's cgroupRoot: "/" for a node alone; a node of a cluster has its own, so each
    #: kubelet's `kubepods` tree (and its cleanup) is its own
    cgroup_root: str = "/"
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    vgpud_port: int = 0
    metrics_port: int = 0
    #: the chart's webhook port (host network, the node IP), with `chart`
    webhook_port: int = 0
    #: how vgpud was installed with `chart` (the helm command line)
    install_command: str = ""
    #: seconds between vgpud's drift self-checks (which also count eager partition conflicts)
    drift_interval: int = 5
    #: vgpud sees the fake GPUs through NVML over the driver root, instead of the mock backend
    fake_gpu: bool = False
    #: this node's IP (an address on `lo`, see tests/e2e/nodeip.py); set by start()
    node_ip: str = ""
    #: vgpud installed with the Helm chart (tests/e2e/chart.py): the DaemonSet and the webhook as pods
    #: of the node, instead of vgpud as a host process
    chart: bool = False
    #: the module vgpud runs as (`python -m <it> run`): tests/e2e/previous_vgpud.py plays an older
    #: release in an upgrade
    vgpud_module: str = "vgpud"
    #: the node's driver root and its fake kernel; set by start()
    driver: DriverRoot | None = None
    fake_kernel: FakeKernel | None = None
    _owns_control: bool = False
    _cgroups_before: set[Path] = field(default_factory=set)
    #: the host's run state before this node started; None in a cluster, which keeps its own (a node's
    #: cleanup must not take another running node's shim sockets and FIFOs)
    _run_before: HostRunState | None = None

    # -- paths -------------------------------------------------------------------------------------
    @property
    def logs(self) -> Path:
        return self.workdir / "logs"

    @property
    def containerd_socket(self) -> Path:
        return self.workdir / "c/containerd.sock"

    @property
    def nri_root(self) -> Path:
        return self.workdir / "nri"

    @property
    def cdi_root(self) -> Path:
        return self.workdir / "cdi"

    @property
    def manager_dir(self) -> Path:
        return self.workdir / "vgpu"

    @property
    def kubelet_dir(self) -> Path:
        return self.workdir / "kubelet"

    @property
    def registrar_dir(self) -> Path:
        return self.kubelet_dir / "plugins_registry"

    @property
    def plugins_dir(self) -> Path:
        return self.kubelet_dir / "plugins"

    @property
    def plugin_dir(self) -> Path:
        return self.plugins_dir / DRIVER

    @property
    def checkpoint(self) -> Path:
        return self.plugin_dir / "checkpoint.json"

    def claim_dir(self, uid: str) -> Path:
        return self.manager_dir / "claims" / uid

    def cdi_spec(self, uid: str) -> Path:
        from vgpud.dra.cdi import spec_path

        return spec_path(self.cdi_root, DRIVER, uid)

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    @property
    def fake_gpu_dir(self) -> Path:
        """Holds the simulated GPUs' state file that the fake kernel serves to vgpud and containers."""
        return self.workdir / "fakegpu"

    @property
    def driver_root(self) -> Path:
        """The node's NVIDIA driver root (and dev root): what a GPU node has at /."""
        return self.workdir / "driver"

    @property
    def fake_gpu_state(self) -> Path:
        return self.fake_gpu_dir / FAKE_STATE_FILE

    @property
    def gpu_profile_path(self) -> Path:
        from vgpud.gpu.mock import shipped_profiles

        return shipped_profiles()[GPU_PROFILE]

    @property
    def debug_socket(self) -> Path:
        """vgpud's debug endpoint and live hook stream (`vgpud debug tail --socket ...`)."""
        return self.plugin_dir / "debug.sock"

    @property
    def hotplug_socket(self) -> Path | None:
        """vgpud's hot-plug API (NRI tracks only: it finds its targets through the NRI plugin)."""
        return self.plugin_dir / "hotplug.sock" if self.nri and not self.chart else None

    @property
    def vgpud_address(self) -> str:
        """Where vgpud's health and metrics listen: loopback as a host process, the node IP as the
        DaemonSet's host-network pod (it binds its pod IP, where the kubelet probes)."""
        return self.node_ip if self.chart else "127.0.0.1"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.vgpud_address}:{self.metrics_port}/metrics"

    def vgpud_log(self) -> Path:
        """vgpud's log: the host process's file, or the newest log of the DaemonSet pod's container."""
        if not self.chart:
            return self.log("vgpud")
        from tests.e2e import chart

        logs = sorted(self.workdir.glob(f"pod-logs/{chart.NAMESPACE}_*/vgpud/*.log"), key=os.path.getmtime)
        return logs[-1] if logs else self.workdir / "pod-logs" / "no-vgpud-pod-log-yet"

    # -- lifecycle ---------------------------------------------------------------------------------
    def __enter__(self) -> LocalNode:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = READY_TIMEOUT_S, *, with_vgpud: bool = True) -> None:
        """The node until it is Ready, then vgpud until it serves; `with_vgpud=False` (a cluster that
        installs the chart on all its nodes at once): the node only, then `wait_serving()`."""
        env = node_env(self.containerd)
        if not node_available(self.containerd):
            raise FileNotFoundError(
                f"the local node (containerd {self.containerd}) is not installed: {INSTALL_HINT}"
            )
        self.env = env
        for line in reap_dead_nodes(own=self.workdir):
            print(f"local node: {line}", file=sys.stderr, flush=True)
        self.workdir.mkdir(parents=True, exist_ok=True)  # a cluster's node: under the cluster's dir
        mark_owner(self.workdir)
        self.node_ip = claim_node_ip(self.workdir)
        deadline = time.monotonic() + timeout_s
        self._cgroups_before = cgroup_dirs(self.cgroup_names)
        self._run_before = HostRunState.now() if self.control is None else None
        for sub in ("logs", "c", "cdi", "nri", "cni", "kubelet", "vgpu", "pod-logs", "fakegpu", "driver"):
            (self.workdir / sub).mkdir(parents=True, exist_ok=True)
        try:
            self.start_driver()
            if self.control is None:
                self.control = ControlPlane(self.workdir, self.logs)
                self._owns_control = True
                self.api = self.control.start(timeout_s)
            else:
                self.api = self.control.api
            self._make_cgroup_root()
            self.start_containerd()
            self._import_images()
            self._start_kubelet()
            self._wait_node_ready(deadline)
            if not with_vgpud:
                return
            if self.chart:
                from tests.e2e import chart

                chart.install(self, deadline)
            else:
                self.install_device_class()
                self.start_vgpud()
            self.wait_serving(deadline)
        except BaseException:
            self.stop()
            raise

    def wait_serving(self, deadline: float) -> None:
        """Until vgpud serves, publishes its devices and the kubelet has registered its plugin."""
        self.wait_vgpud(deadline)
        self.wait_slices(deadline)
        self.wait_plugin_registered(deadline)

    def stop(self) -> None:
        """Everything down by PID in reverse order, then mounts, cgroups, the temp dir. Idempotent."""
        stop_proc(self.procs.pop("vgpud", None))
        stop_proc(self.procs.pop("kubelet", None))
        self._remove_all_containers()
        stop_proc(self.procs.pop("containerd", None))
        kill_pids(pids_naming(self.containerd_socket))  # shims whose containerd is gone
        if self.fake_kernel is not None:
            self.fake_kernel.stop()
            self.fake_kernel = None
        remove_cgroups(cgroup_dirs(self.cgroup_names) - self._cgroups_before)
        if self.control is not None and self._owns_control:
            self.control.stop()
            self.control, self._owns_control = None, False
        self.api = None
        for point in mounts_under(self.workdir):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)
        release_node_ip(self.workdir)
        if self._run_before is not None:
            self._run_before.remove_what_appeared()
        if self.keep:
            print(f"local node: kept {self.workdir}", file=sys.stderr)
        else:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # -- the GPU node's driver ------------------------------------------------------------------------
    def start_driver(self) -> None:
        """Lay out the driver root (once per node) and start its fake kernel. The root is a shared
        mount of its own, as / is on a systemd host: the chart mounts it with HostToContainer
        propagation, which the runtime refuses on a private mount (this machine's / is one)."""
        profile = self.gpu_profile_path
        if self.driver is None:
            self.driver = build_driver_root(self.driver_root, profile, cdi_hook=cdi_hook_binary())
            root = str(self.driver_root)
            subprocess.run(["mount", "--bind", root, root], check=True, capture_output=True)
            subprocess.run(["mount", "--make-rshared", root], check=True, capture_output=True)
        socket = self.driver.kernel_socket
        log = self.log("fakegpu-kernel")
        self.fake_kernel = FakeKernel.start(profile, self.fake_gpu_state, socket, log=log)

    # -- cgroups ------------------------------------------------------------------------------------
    @property
    def cgroup_names(self) -> tuple[str, ...]:
        """The top-level cgroups this node's kubelet creates (in every hierarchy)."""
        return ("kubepods",) if self.cgroup_root == "/" else (self.cgroup_root.strip("/"),)

    def _make_cgroup_root(self) -> None:
        """The kubelet refuses a cgroupRoot that does not exist: make it in every hierarchy."""
        if self.cgroup_root == "/":
            return
        for mount in cgroup_mounts():
            (mount / self.cgroup_root.strip("/")).mkdir(exist_ok=True)

    # -- containerd --------------------------------------------------------------------------------
    def containerd_config(self) -> str:
        """containerd's config file: version 2 for 1.7; 3 or 4 (the plugin IDs 2.x renamed) for 2.x."""
        if self.containerd == CONTAINERD_2:
            return self._containerd2_config()
        return self._containerd1_config()

    def _containerd2_config(self) -> str:
        """containerd 2.x, in the config version the build writes by default (3 up to 2.3, 4 from 2.4;
        docs/containerd2.md): the CRI runtime and images halves are plugins of their own; CDI is always
        on (no enable_cdi key); NRI is on by default, so `disable` is written either way, and its
        built-in validator (NRI v0.10+, off by default) is on and refuses every adjustment kind it
        judges, which vgpud's (env and mounts) must pass; the shim is named by path (1.7's is on
        NODE_PATH too), and its sockets go under the node's temp dir (1.7 puts them in
        /run/containerd/s whatever the config says)."""
        env, w = self.env, self.workdir
        runtime = "plugins.'io.containerd.cri.v1.runtime'"
        version = int(env["CONFIG_VERSION"])
        # Version 4 ignores the top-level [grpc] and [ttrpc] tables (only older versions migrate them)
        # and would listen on /run/containerd/containerd.sock: its servers are plugins.
        grpc, ttrpc = (
            ("plugins.'io.containerd.server.v1.grpc'", "plugins.'io.containerd.server.v1.ttrpc'")
            if version >= 4
            else ("grpc", "ttrpc")
        )
        return f"""version = {version}
root = "{w}/containerd/root"
state = "{w}/c/state"
[{grpc}]
  address = "{self.containerd_socket}"
[{ttrpc}]
  address = "{self.containerd_socket}.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "{w}/containerd/opt"
[plugins.'io.containerd.shim.v1.manager']
  socket_dir = "{w}/s"
[plugins.'io.containerd.nri.v1.nri']
  disable = {str(not self.nri).lower()}
  socket_path = "{self.nri_root}/nri.sock"
  plugin_path = "{self.nri_root}/plugins"
  plugin_config_path = "{self.nri_root}/conf.d"
[plugins.'io.containerd.nri.v1.nri'.default_validator]
  enable = true
  reject_oci_hook_adjustment = true
  reject_runtime_default_seccomp_adjustment = true
  reject_unconfined_seccomp_adjustment = true
  reject_custom_seccomp_adjustment = true
  reject_namespace_adjustment = true
  reject_sysctl_adjustment = true
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "{env["PAUSE_IMAGE"]}"
[{runtime}]
  cdi_spec_dirs = ["{self.cdi_root}"]
  restrict_oom_score_adj = true
  disable_apparmor = true
[{runtime}.containerd]
  default_runtime_name = "runc"
[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  runtime_path = "{env["SHIM_BIN"]}"
[{runtime}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "{env["RUNC_BIN"]}"
[{runtime}.cni]
  bin_dirs = ["{env["CNI_BIN_DIR"]}"]
  conf_dir = "{w}/cni"
"""

    def _containerd1_config(self) -> str:
        env, w = self.env, self.workdir
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return f"""version = 2
root = "{w}/containerd/root"
state = "{w}/c/state"
[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{self.containerd_socket}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{w}/containerd/opt"
[plugins."io.containerd.nri.v1.nri"]
  disable = {str(not self.nri).lower()}
  socket_path = "{self.nri_root}/nri.sock"
  plugin_path = "{self.nri_root}/plugins"
  plugin_config_path = "{self.nri_root}/conf.d"
[{cri}]
  sandbox_image = "{env["PAUSE_IMAGE"]}"
  enable_cdi = true
  cdi_spec_dirs = ["{self.cdi_root}"]
  restrict_oom_score_adj = true
  disable_apparmor = true
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  BinaryName = "{env["RUNC_BIN"]}"
[{cri}.cni]
  bin_dir = "{env["CNI_BIN_DIR"]}"
  conf_dir = "{w}/cni"
"""

    def start_containerd(self) -> None:
        config = self.workdir / "containerd.toml"
        config.write_text(self.containerd_config())
        # Only the loopback network: every test pod uses the host network, but the CRI plugin reports
        # NetworkReady only with a CNI config, and the kubelet holds pods back until it does.
        (self.workdir / "cni/10-loopback.conflist").write_text(
            json.dumps({"cniVersion": "1.0.0", "name": "lo-only", "plugins": [{"type": "loopback"}]})
        )
        env = {**os.environ, "PATH": f"{self.env['NODE_PATH']}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        self.procs["containerd"] = spawn(
            [self.env["CONTAINERD_BIN"], "--config", str(config), "--log-level", "info"],
            self.log("containerd"),
            env,
        )
        end = time.monotonic() + 30
        while time.monotonic() < end:
            self._check_alive("containerd")
            up = self.containerd_socket.exists() and self.ctr("version", check=False).returncode == 0
            if up and (not self.nri or (self.nri_root / "nri.sock").exists()):
                return
            time.sleep(0.1)
        raise RuntimeError(f"containerd not ready in 30 s:\n{log_tail(self.log('containerd'))}")

    def stop_containerd(self, sig: int = signal.SIGTERM) -> None:
        stop_proc(self.procs.pop("containerd", None), sig)

    def ctr(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """`ctr -n k8s.io <args>` against this node's containerd."""
        argv = [self.env["CTR_BIN"], "--address", str(self.containerd_socket), "-n", "k8s.io", *args]
        return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=timeout)

    def _import_images(self) -> None:
        for key in ("PAUSE_IMAGE_TAR", "BUSYBOX_IMAGE_TAR", "CUDA_IMAGE_TAR"):
            self.ctr("images", "import", "--no-unpack=false", self.env[key])

    def _remove_all_containers(self) -> None:
        """Best effort: a ctr call that hangs (a shim gone) is given up, the cgroups' removal kills
        what is left."""
        if "containerd" not in self.procs or self.procs["containerd"].poll() is not None:
            return
        try:
            self._kill_and_delete_containers()
        except subprocess.TimeoutExpired as err:
            print(f"local node {self.name}: {err}; going on", file=sys.stderr)

    def _kill_and_delete_containers(self) -> None:
        tasks = self.ctr("tasks", "ls", "-q", check=False).stdout.split()
        for task in tasks:
            self.ctr("tasks", "kill", "-a", "-s", "SIGKILL", task, check=False)
        for task in tasks:
            self.ctr("tasks", "delete", "-f", task, check=False)
        containers = self.ctr("containers", "ls", "-q", check=False).stdout.split()
        if containers:
            self.ctr("containers", "delete", *containers, check=False)

    # -- kubelet -----------------------------------------------------------------------------------
    def kubelet_config(self) -> dict[str, Any]:
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs",
            "failCgroupV1": False,
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": "127.0.0.1",
            "port": free_port(),
            "readOnlyPort": 0,
            "healthzPort": 0,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            "podLogsDir": str(self.workdir / "pod-logs"),
            "enforceNodeAllocatable": [],
            "cgroupsPerQOS": True,
            "cgroupRoot": self.cgroup_root,
            "evictionHard": {
                "memory.available": "0%",
                "nodefs.available": "0%",
                "nodefs.inodesFree": "0%",
                "imagefs.available": "0%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageMinimumGCAge": "876000h",
            "resolvConf": "/etc/resolv.conf",
            "serializeImagePulls": False,
            "syncFrequency": "5s",
            "fileCheckFrequency": "5s",
            "nodeStatusUpdateFrequency": "2s",
            "protectKernelDefaults": False,
            "makeIPTablesUtilChains": False,
            "localStorageCapacityIsolation": False,
        }

    def _start_kubelet(self) -> None:
        assert self.api is not None
        config = self.workdir / "kubelet.yaml"
        if not config.exists():  # a restart keeps the first start's config (its port too)
            config.write_text(yaml.safe_dump(self.kubelet_config()))
        argv = [
            str(binary("kubelet")),
            f"--config={config}",
            f"--kubeconfig={self.api.kubeconfig}",
            f"--root-dir={self.kubelet_dir}",
            f"--cert-dir={self.kubelet_dir}/pki",
            f"--hostname-override={self.name}",
            f"--node-ip={self.node_ip}",
            f"--node-labels={GPU_NODE_LABEL}",
            "--v=2",
        ]
        env = {**os.environ, "PATH": f"{self.env['NODE_PATH']}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        self.procs["kubelet"] = spawn(argv, self.log("kubelet"), env)

    def stop_kubelet(self, sig: int = signal.SIGTERM) -> None:
        stop_proc(self.procs.pop("kubelet", None), sig)

    def restart_kubelet(self, sig: int = signal.SIGTERM, timeout_s: float = 90) -> None:
        """Stop the kubelet with `sig` (SIGKILL: a crash; a stopped one is just started) and start it again
        with the same config; return once the Node is Ready on a status the new kubelet posted and it has
        registered vgpud's DRA plugin again (vgpud logs each NotifyRegistrationStatus of a kubelet)."""
        registered = self.plugin_registrations()
        self.stop_kubelet(sig)
        # Node heartbeats have whole seconds: start in a second the old kubelet posted none in
        time.sleep(1 - time.time() % 1)
        started = int(time.time())
        self._start_kubelet()
        deadline = time.monotonic() + timeout_s
        self._wait_node_ready(deadline, since=started)
        self.wait_plugin_registered(deadline, more_than=registered)

    def wait_plugin_registered(self, deadline: float, more_than: int = 0) -> None:
        """Until the kubelet has told vgpud more than `more_than` times that its plugin is registered
        (before that the kubelet fails a claim's pod with "DRA driver ... is not registered")."""
        while self.plugin_registrations() <= more_than:
            self._check_alive("kubelet")
            if time.monotonic() > deadline:
                tail = log_tail(self.log("kubelet"))
                raise RuntimeError(f"the kubelet did not register vgpud's DRA plugin in time:\n{tail}")
            time.sleep(0.2)

    def plugin_registrations(self) -> int:
        """How many times a kubelet told vgpud its DRA plugin is registered (vgpud's log)."""
        try:
            return self.vgpud_log().read_text(errors="replace").count(PLUGIN_REGISTERED)
        except FileNotFoundError:
            return 0

    def _wait_node_ready(self, deadline: float, since: float = 0) -> None:
        """Ready, and the not-ready taint lifted by the node lifecycle controller (pods wait for both);
        with `since` (epoch seconds), on a Ready condition heartbeat from then or later."""
        last = "no Node object yet"
        while time.monotonic() < deadline:
            self._check_alive("kubelet")
            if self.control is not None:
                self.control.check_alive("kube-controller-manager")
            try:
                node = self.get(f"/api/v1/nodes/{self.name}")
            except urllib.error.HTTPError as err:
                last = f"HTTP {err.code}"
            else:
                conditions = {c["type"]: c for c in node.get("status", {}).get("conditions", [])}
                ready = conditions.get("Ready", {})
                taints = [t["key"] for t in node["spec"].get("taints", [])]
                fresh = _epoch(ready.get("lastHeartbeatTime", "")) >= since
                if ready.get("status") == "True" and not taints and fresh:
                    return
                last = f"Ready={ready.get('status')}: {ready.get('message')}; taints {taints}"
            time.sleep(0.5)
        manager = self.control.log("kube-controller-manager") if self.control else self.log("none")
        logs = "\n".join(f"--- {path.stem}:\n{log_tail(path)}" for path in (self.log("kubelet"), manager))
        raise RuntimeError(f"node {self.name} not Ready and untainted in time ({last}):\n{logs}")

    # -- vgpud -------------------------------------------------------------------------------------
    def vgpud_env(self) -> dict[str, str]:
        """The environment the reference's DaemonSet sets, with this node's paths."""
        assert self.api is not None
        gates = f"NRISupport={str(self.nri).lower()},DevicePluginClientMode={str(self.client_mode).lower()}"
        if self.fake_gpu:
            gpus = {"GPU_BACKEND": "nvml", "HEALTH_RECOVERY_SECONDS": str(HEALTH_RECOVERY_S)}
        else:
            gpus = {"GPU_BACKEND": "mock", "GPU_PROFILE": GPU_PROFILE}
        gpus["NVIDIA_DRIVER_ROOT"] = str(self.driver_root)
        return {
            "NODE_NAME": self.name,
            "FEATURE_GATES": gates,
            "HOST_MANAGER_DIR": str(self.manager_dir),
            "CDI_ROOT": str(self.cdi_root),
            "NRI_ROOT": str(self.nri_root),
            "KUBELET_REGISTRAR_DIR": str(self.registrar_dir),
            "KUBELET_PLUGINS_DIR": str(self.plugins_dir),
            "CGROUP_DRIVER": "cgroupfs",
            "HEALTHCHECK_PORT": str(self.vgpud_port),
            "HEALTHCHECK_ADDRESS": "127.0.0.1",
            **gpus,
            "KUBECONFIG": str(self.api.kubeconfig),
            "LOG_LEVEL": "info",
            "METRICS_ADDRESS": f"127.0.0.1:{self.metrics_port}",
            "DEBUG_SOCKET": str(self.debug_socket),
            "HOTPLUG_SOCKET": str(self.hotplug_socket or "off"),
            "DRIFT_INTERVAL": str(self.drift_interval),
            "USAGE_INTERVAL": "1",
        }

    def start_vgpud(self) -> None:
        # vgpud installs the control library and the register client from build/libvgpu itself
        if not self.vgpud_port:
            self.vgpud_port = free_port()
        if not self.metrics_port:
            self.metrics_port = free_port()
        # no test setting of the fakes: vgpud's NVML finds its GPUs through the driver root's kernel
        own = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
        env = {**own, **self.vgpud_env(), "PYTHONUNBUFFERED": "1"}
        argv = [sys.executable, "-m", self.vgpud_module, "run"]
        with self.log("vgpud").open("ab") as out:
            self.procs["vgpud"] = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=REPO,
                start_new_session=True,
            )

    def stop_vgpud(self, sig: int = signal.SIGTERM) -> None:
        if self.chart:
            raise RuntimeError("vgpud runs as the DaemonSet's pod: the kubelet starts and stops it")
        stop_proc(self.procs.pop("vgpud", None), sig)

    def restart_vgpud(self, sig: int = signal.SIGTERM, timeout_s: float = 60) -> None:
        """Stop vgpud with `sig` (SIGKILL: a crash) and start it again with the same flags; return once
        it is SERVING and the kubelet has registered its new DRA plugin socket."""
        registered = self.plugin_registrations()
        self.stop_vgpud(sig)
        self.start_vgpud()
        deadline = time.monotonic() + timeout_s
        self.wait_vgpud(deadline)
        self.wait_plugin_registered(deadline, more_than=registered)

    def metrics(self) -> str:
        """vgpud's Prometheus text (empty when it serves none)."""
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=2) as reply:
                return reply.read().decode()
        except (OSError, urllib.error.URLError):
            return ""

    def metric(self, name: str) -> float | None:
        """The sum of every sample of metric `name` (None when vgpud does not export it)."""
        values = [
            float(line.rsplit(" ", 1)[1])
            for line in self.metrics().splitlines()
            if line.startswith((f"{name} ", f"{name}{{"))
        ]
        return sum(values) if values else None

    def metric_samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """Every sample of metric `name` as (labels, value)."""
        out = []
        for line in self.metrics().splitlines():
            match = _SAMPLE.match(line)
            if match and match.group(1) == name:
                labels = dict(_LABEL.findall(match.group(2) or ""))
                out.append((labels, float(match.group(3))))
        return out

    def vgpud_health(self, service: str = "liveness") -> int:
        import grpc

        from tests.stdproto import message_class

        request_cls = message_class("grpc.health.v1.HealthCheckRequest")
        response_cls = message_class("grpc.health.v1.HealthCheckResponse")
        with grpc.insecure_channel(f"{self.vgpud_address}:{self.vgpud_port}") as channel:
            call = channel.unary_unary(
                "/grpc.health.v1.Health/Check",
                request_serializer=request_cls.SerializeToString,
                response_deserializer=response_cls.FromString,
            )
            return call(request_cls(service=service), timeout=2).status

    def wait_vgpud(self, deadline: float) -> None:
        import grpc

        while time.monotonic() < deadline:
            self._check_alive("vgpud")
            try:
                if self.vgpud_health() == SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"vgpud not SERVING in time:\n{log_tail(self.vgpud_log())}")

    def slices(self) -> list[dict[str, Any]]:
        selector = urllib.parse.quote(f"spec.driver={DRIVER},spec.nodeName={self.name}")
        return self.get(f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector={selector}")["items"]

    def wait_slices(self, deadline: float, devices: int = 2) -> list[dict[str, Any]]:
        while time.monotonic() < deadline:
            items = self.slices()
            if sum(len(s["spec"].get("devices", [])) for s in items) == devices:
                return items
            time.sleep(0.2)
        raise RuntimeError(f"no ResourceSlice with {devices} devices in time:\n{log_tail(self.vgpud_log())}")

    # -- API helpers -------------------------------------------------------------------------------
    def get(self, path: str) -> dict[str, Any]:
        assert self.api is not None
        return api_request(self.api, "GET", path)

    def request(self, method: str, path: str, body: object | None = None, **kw: Any) -> dict[str, Any]:
        assert self.api is not None
        return api_request(self.api, method, path, body, **kw)

    def install_device_class(self) -> None:
        """The vGPU DeviceClass (contract "Identity")."""
        expression = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'vgpu'"
        body = {
            "metadata": {"name": DEVICE_CLASS},
            "spec": {"selectors": [{"cel": {"expression": expression}}]},
        }
        try:
            self.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", body)
        except urllib.error.HTTPError as err:
            if err.code != 409:
                raise

    def _check_alive(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log_tail(self.log(name))}")

    def describe(self) -> str:
        assert self.api is not None
        lines = [
            f"local node {self.name} (containerd {self.containerd}, NRI {'on' if self.nri else 'off'}) "
            f"in {self.workdir}",
            f"  runtime          {self.env.get('NODE_VERSIONS', '')}",
            f"  node IP          {self.node_ip} (on lo)",
            f"  kubeconfig       {self.api.kubeconfig}",
            f"  containerd       {self.containerd_socket}  (ctr: {self.env['CTR_BIN']} --address "
            f"{self.containerd_socket} -n k8s.io ...)",
            f"  vgpud health     {self.vgpud_address}:{self.vgpud_port}",
            f"  vgpud metrics    {self.metrics_url}",
            f"  vgpud debug      {self.debug_socket}",
            f"  vgpud hot-plug   {self.hotplug_socket or 'off'}",
            f"  manager root     {self.manager_dir}",
            f"  CDI specs        {self.cdi_root}",
            "  logs:",
        ]
        control = self.control.all_logs() if self.control is not None else {}
        logs = {**control, **{name: self.log(name) for name in self.procs}}
        lines += [f"    {name:16} {path}" for name, path in sorted(logs.items())]
        return "\n".join(lines)


@contextlib.contextmanager
def local_node(nri: bool, **kw: Any) -> Iterator[LocalNode]:
    node = LocalNode(nri=nri, **kw)
    node.start()
    try:
        yield node
    finally:
        node.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Bring up the local node until Ctrl-C.")
    parser.add_argument("--nri", choices=("on", "off"), default="on")
    parser.add_argument(
        "--containerd",
        choices=CONTAINERD_VERSIONS,
        default=CONTAINERD_1,
        help="the runtime: containerd 1.7 (default) or 2.x (hack/install-containerd2.sh)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs) after stopping")
    parser.add_argument("--fake-gpu", action="store_true", help="vgpud on the fake NVML (simulated GPUs)")
    parser.add_argument(
        "--chart",
        action="store_true",
        help="install vgpud with helm/vgpud (needs make image) instead of a host process",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()
    node = LocalNode(
        nri=args.nri == "on",
        containerd=args.containerd,
        keep=args.keep,
        fake_gpu=args.fake_gpu,
        chart=args.chart,
    )
    with stop_on_signals():  # SIGTERM and SIGHUP tear the node down like Ctrl-C
        try:
            node.start()
            print(f"ready in {time.monotonic() - started:.1f} s\n{node.describe()}", flush=True)
            signal.pause()
        except KeyboardInterrupt:
            print()
        finally:
            node.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
