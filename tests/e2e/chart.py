"""vgpud on the local node the way users install it: the image imported into containerd, then
`helm install` of helm/vgpud with the values a node of this shape needs.

The values differ from the chart's defaults only where this node differs from a real one: its host
paths live under the node's temp dir, it has no kube-proxy (so pods reach the API server at 127.0.0.1,
through `kubernetesServiceHost`), its only pod network is the host's (so the webhook runs with
hostNetwork on a free port), its driver root is the node's fake one (tests/fakedriver.py: vgpud reads
the simulated GPUs through its libnvidia-ml.so.1, the nvml backend, or uses the mock backend), and it
has no registry (the image is imported, never pulled). Everything else, RBAC included, is the chart as
shipped: vgpud runs with its ServiceAccount's rights only.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.kubeapi import helm_binary, log_tail
from tests.support import BUILD, REPO

if TYPE_CHECKING:
    from tests.e2e.node import LocalNode

CHART = REPO / "helm" / "vgpud"
NAMESPACE = "vgpud-system"
RELEASE = "vgpud"
IMAGE_ENV = BUILD / "image" / "image.env"
HELM_TIMEOUT_S = 180
INSTALL_HINT = "run make image and hack/install-kube.sh (the test command does both)"


def image_env() -> dict[str, str]:
    """build/image/image.env (hack/build-image.sh): VGPUD_IMAGE, VGPUD_IMAGE_TAR; {} when not built."""
    try:
        text = IMAGE_ENV.read_text()
    except OSError:
        return {}
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def chart_available() -> bool:
    """True when helm and the vgpud image are built."""
    image = image_env().get("VGPUD_IMAGE_TAR")
    return helm_binary() is not None and image is not None and Path(image).is_file()


def image_tag(image: str) -> str:
    return image.rsplit(":", 1)[1]


def values(node: LocalNode, tag: str) -> dict[str, Any]:
    """The chart's values for this node (see the module docstring for why each differs)."""
    assert node.api is not None
    api = urllib.parse.urlsplit(node.api.url)
    gates = {"NRISupport": node.nri, "DevicePluginClientMode": node.client_mode}
    gpu = gpu_values(node)
    intervals = [
        {"name": "DRIFT_INTERVAL", "value": str(node.drift_interval)},
        {"name": "USAGE_INTERVAL", "value": "1"},
    ]
    daemon = {**gpu, "healthcheckPort": node.vgpud_port, "extraEnv": [*intervals, *gpu.get("extraEnv", [])]}
    if node.client_mode:
        daemon["cgroupDriver"] = "cgroupfs"
    return {
        "image": {"repository": image_env()["VGPUD_IMAGE"].rsplit(":", 1)[0], "tag": tag},
        "kubernetesServiceHost": api.hostname,
        "kubernetesServicePort": api.port,
        "featureGates": gates,
        "hostPaths": {
            "managerDir": str(node.manager_dir),
            "cdiRoot": str(node.cdi_root),
            "nriRoot": str(node.nri_root),
            "kubeletRegistrarDir": str(node.registrar_dir),
            "kubeletPluginsDir": str(node.plugins_dir),
        },
        "node": daemon,
        "metrics": {"port": node.metrics_port},
        "webhook": {"hostNetwork": True, "replicas": 1, "port": node.webhook_port},
    }


def gpu_values(node: LocalNode) -> dict[str, Any]:
    """The node's driver root (as `node.driverRoot`, the chart mounts it), and the nvml backend over it
    with `fake_gpu` (NVML found there, as on a GPU node), else the mock backend."""
    from tests.e2e.node import GPU_PROFILE, HEALTH_RECOVERY_S

    if not node.fake_gpu:
        return {"gpu": {"backend": "mock", "profile": GPU_PROFILE}, "driverRoot": str(node.driver_root)}
    recovery = {"name": "HEALTH_RECOVERY_SECONDS", "value": str(HEALTH_RECOVERY_S)}
    return {"gpu": {"backend": "nvml"}, "driverRoot": str(node.driver_root), "extraEnv": [recovery]}


def helm(node: LocalNode, *args: str, values_: dict[str, Any] | None = None) -> str:
    """Run helm against this node's API server (admin kubeconfig) in NAMESPACE; its stdout."""
    assert node.api is not None
    helm_bin = helm_binary()
    if helm_bin is None:
        raise FileNotFoundError(f"helm is not installed: {INSTALL_HINT}")
    argv = [str(helm_bin), *args, "--kubeconfig", str(node.api.kubeconfig), "--namespace", NAMESPACE]
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="values-") as file:
        if values_ is not None:
            json.dump(values_, file)
            file.flush()
            argv += ["--values", file.name]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=HELM_TIMEOUT_S + 30, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"helm {' '.join(args)} failed ({done.returncode}):\n{done.stderr}\n"
            f"--- vgpud:\n{log_tail(node.vgpud_log())}\n--- events:\n{events(node)}"
        )
    return done.stdout


def events(node: LocalNode) -> str:
    items = node.get(f"/api/v1/namespaces/{NAMESPACE}/events").get("items", [])
    return "\n".join(f"  {e['involvedObject']['name']}: {e['reason']}: {e.get('message', '')}" for e in items)


def import_image(node: LocalNode, tag: str | None = None) -> str:
    """Import the built vgpud image into the node's containerd; tag it `tag` too when given (a second
    tag of the same image: what an upgrade to a new tag rolls out). The image name to run."""
    image = image_env()["VGPUD_IMAGE"]
    node.ctr("images", "import", "--no-unpack=false", image_env()["VGPUD_IMAGE_TAR"], timeout=300)
    if tag is None:
        return image
    retagged = f"{image.rsplit(':', 1)[0]}:{tag}"
    node.ctr("images", "tag", "--force", image, retagged)
    return retagged


def install(node: LocalNode, deadline: float) -> None:
    """`helm install` vgpud on the node and wait until its workloads are ready."""
    _install([node], values, deadline)


def install_on_cluster(nodes: list[LocalNode], root: Path, deadline: float) -> None:
    """`helm install` vgpud once for every node of a local cluster (tests/e2e/cluster.py), whose node
    work dirs are `<root>/<node name>`: one DaemonSet, its paths per node through `hostPaths.nodeRoot`."""
    _install(nodes, lambda node, tag: cluster_values(nodes, root, tag), deadline)


def _install(
    nodes: list[LocalNode], values_for: Callable[[LocalNode, str], dict[str, Any]], deadline: float
) -> None:
    from tests.kubeapi import free_port

    if not chart_available():
        raise FileNotFoundError(f"no vgpud image or helm: {INSTALL_HINT}")
    first = nodes[0]
    # one port of each kind for every node: each pod binds its own node IP
    ports = {
        "vgpud_port": first.vgpud_port or free_port(),
        "metrics_port": first.metrics_port or free_port(),
        "webhook_port": first.webhook_port or free_port(),
    }
    tags = set()
    for node in nodes:
        for name, port in ports.items():
            setattr(node, name, port)
        tags.add(image_tag(import_image(node)))
    (tag,) = tags
    timeout = max(30, int(deadline - time.monotonic()))
    args = ("install", RELEASE, str(CHART), "--create-namespace", "--wait", f"--timeout={timeout}s")
    helm(first, *args, values_=values_for(first, tag))
    for node in nodes:
        node.install_command = f"helm {' '.join(args)} --namespace {NAMESPACE} --values <this node's values>"


def cluster_values(nodes: list[LocalNode], root: Path, tag: str) -> dict[str, Any]:
    """The chart's values for a local cluster: a node's values (`values`), its paths `<root>/<name>/...`
    given as `<root>/$(NODE_NAME)/...` under `hostPaths.nodeRoot` (the one host directory mounted, each
    pod's environment names its own node's paths), NRI on where any node has it (a node whose runtime
    has NRI off runs eager), webhook replicas as below."""
    first = nodes[0]
    out = values(first, tag)

    def per_node(path: str) -> str:
        return f"{root}/$(NODE_NAME)/{Path(path).relative_to(first.workdir)}"

    out["hostPaths"] = {key: per_node(path) for key, path in out["hostPaths"].items()} | {
        "nodeRoot": str(root)
    }
    out["node"]["driverRoot"] = per_node(out["node"]["driverRoot"])
    out["featureGates"]["NRISupport"] = any(node.nri for node in nodes)
    # the chart's default of 2 where two nodes can hold them (one per node on the host network): an
    # update then replaces one at a time, the other answering; a lone replica leaves a gap
    out["webhook"]["replicas"] = min(2, len(nodes))
    return out


def upgrade(node: LocalNode, tag: str) -> None:
    """`helm upgrade` to image tag `tag` (the node's other values unchanged) and wait for the rollout."""
    _upgrade(node, values(node, tag))


def upgrade_cluster(nodes: list[LocalNode], root: Path, tag: str) -> None:
    """`helm upgrade` a local cluster's release (`install_on_cluster`) to image tag `tag`."""
    _upgrade(nodes[0], cluster_values(nodes, root, tag))


def _upgrade(node: LocalNode, values_: dict[str, Any]) -> None:
    helm(node, "upgrade", RELEASE, str(CHART), "--wait", f"--timeout={HELM_TIMEOUT_S}s", values_=values_)


def uninstall(node: LocalNode) -> None:
    helm(node, "uninstall", RELEASE, "--wait", f"--timeout={HELM_TIMEOUT_S}s")


def daemon_pods(node: LocalNode) -> list[dict[str, Any]]:
    """The DaemonSet's pods (not the webhook's)."""
    selector = urllib.parse.quote("app.kubernetes.io/component=node")
    return node.get(f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={selector}")["items"]
