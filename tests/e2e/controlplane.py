"""The control plane of a local cluster: etcd + kube-apiserver (tests/kubeapi.py), kube-controller-manager
(its default controllers: the node lifecycle controller lifts the kubelet's not-ready taint, the
resourceclaim controller releases and deallocates claims, DaemonSets, Deployments, service accounts and
garbage collection work as in a real cluster) and kube-scheduler, each with DRA's gates, no leader
election and its own port on loopback. One serves a single LocalNode (which starts its own) or every
node of a LocalCluster. Stopped by PID."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e.procs import spawn, stop_proc
from tests.kubeapi import ApiServer, binary, free_port, log_tail, start_apiserver

#: the control-plane components the kubelets and vgpud need beside the API server
COMPONENTS = ("kube-controller-manager", "kube-scheduler")


@dataclass
class ControlPlane:
    """`start()` brings it up under `workdir/kube` with its logs in `logs`; `stop()` tears it down."""

    workdir: Path
    logs: Path
    api: ApiServer | None = None
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def start(self, timeout_s: float) -> ApiServer:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.api = start_apiserver(self.workdir / "kube", timeout_s=timeout_s, controllers=True)
        self._start_component(
            "kube-controller-manager",
            # the key the API server verifies service-account tokens with, and the CA pods trust
            f"--service-account-private-key-file={self.api.workdir / 'sa.key'}",
            f"--root-ca-file={self.api.ca_file}",
        )
        self._start_component("kube-scheduler")
        return self.api

    def stop(self) -> None:
        """Idempotent."""
        for name in reversed(COMPONENTS):
            stop_proc(self.procs.pop(name, None))
        if self.api is not None:
            self.api.stop()
            self.api = None

    def check_alive(self, name: str) -> None:
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log_tail(self.log(name))}")

    def all_logs(self) -> dict[str, Path]:
        """Every component's log by name (the API server's and etcd's included)."""
        own = {name: self.log(name) for name in self.procs}
        return {**(self.api.logs if self.api is not None else {}), **own}

    def _start_component(self, name: str, *extra: str) -> None:
        assert self.api is not None
        argv = [
            str(binary(name)),
            f"--kubeconfig={self.api.kubeconfig}",
            f"--authentication-kubeconfig={self.api.kubeconfig}",
            f"--authorization-kubeconfig={self.api.kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={free_port()}",
            "--feature-gates=DRAConsumableCapacity=true",
            "--v=1",
            *extra,
        ]
        self.procs[name] = spawn(argv, self.log(name))
