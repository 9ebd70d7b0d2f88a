"""What the local-node benches share: a node with one running vGPU pod, and more containers created in
that pod's sandbox straight through CRI (`crictl create`), as the kubelet would create them.

The extra containers carry the claim's UID in MANAGER_VGPU_CLAIM_UID and the pod's identity, so vgpud's
NRI plugin injects them exactly as it injects the pod's own container; they are created, never
started, so no process runs and the node holds hundreds of them. Root, the installed node
(`make node-deps kube`) and the e2e lock: `flock /tmp/vgpud-e2e.lock ...`.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.e2e import workload as w
from tests.e2e.node import INSTALL_HINT, LocalNode, node_available
from tests.kubeapi import kube_env

#: where vgpud's NRI injection mounts the container's config dir (what "injected" means here)
CONFIG_MOUNT = "/etc/vgpu-manager/config"


def usable() -> str:
    """ "" when this machine can run a local node, else why not."""
    if os.geteuid() != 0:
        return "the local node needs root"
    if not node_available():
        return f"the local node is not installed: {INSTALL_HINT}"
    if not Path(kube_env().get("CRICTL_BIN", "")).is_file():
        return "no crictl (CRICTL_BIN in kube.env): run hack/install-kube.sh"
    return ""


@dataclass
class VgpuSandbox:
    """A running pod with a vGPU claim, and the CRI configs for more containers in its sandbox."""

    node: LocalNode
    namespace: str
    claim_uid: str
    sandbox: str
    pod_config: Path

    def crictl(self, *args: str) -> str:
        endpoint = f"unix://{self.node.containerd_socket}"
        argv = [kube_env()["CRICTL_BIN"], "--runtime-endpoint", endpoint, "--image-endpoint", endpoint]
        result = subprocess.run(
            [*argv, "--timeout", "30s", *args], check=False, capture_output=True, text=True, timeout=60
        )
        if result.returncode != 0:
            raise RuntimeError(f"crictl {' '.join(args)} failed: {result.stdout}{result.stderr}")
        return result.stdout

    def config(self, name: str, *, vgpu: bool = True) -> Path:
        """A container config named `name` (busybox, never started) using the claim when `vgpu`."""
        envs = [{"key": "MANAGER_VGPU_CLAIM_UID", "value": self.claim_uid}] if vgpu else []
        path = self.node.workdir / f"bench-{name}.json"
        body = {
            "metadata": {"name": name, "attempt": 0},
            "image": {"image": w.IMAGE},
            "command": ["sleep", "3600"],
            "envs": envs,
            "linux": {},
        }
        path.write_text(json.dumps(body))
        return path

    def create(self, config: Path) -> tuple[str, float]:
        """`crictl create` of one container: its ID and the seconds the command took."""
        began = time.perf_counter()
        cid = self.crictl("create", self.sandbox, str(config), str(self.pod_config)).strip()
        return cid, time.perf_counter() - began

    def remove(self, cids: list[str]) -> None:
        for start in range(0, len(cids), 50):
            self.crictl("rm", *cids[start : start + 50])

    def injected(self, cid: str) -> bool:
        """The runtime created the container with vgpud's config mount (its OCI spec)."""
        return any(dest == CONFIG_MOUNT for dest, _ in w.oci_mounts(self.node, cid))


def vgpu_sandbox(node: LocalNode) -> VgpuSandbox:
    """A namespace, a vGPU claim and a running pod using it; the pod's sandbox for more containers."""
    node.install_device_class()
    ns = w.namespace(node, "bench")
    claim = w.create_claim(node, ns, "gpu", [w.vgpu_request("gpu", "1Gi", "5")])
    w.create_pod(node, ns, "p", [w.container("main", [("gpu", "gpu")])], {"gpu": "gpu"})
    pod = w.wait_running(node, ns, "p")
    box = VgpuSandbox(node, ns, claim["metadata"]["uid"], "", node.workdir / "bench-pod.json")
    info: dict[str, Any] = json.loads(box.crictl("inspect", w.container_id(pod, "main")))
    box.sandbox = info["info"]["sandboxID"]
    meta = {"name": "p", "uid": pod["metadata"]["uid"], "namespace": ns, "attempt": 0}
    box.pod_config.write_text(json.dumps({"metadata": meta, "linux": {}}))
    return box
