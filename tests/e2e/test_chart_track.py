"""The chart track: vgpud installed with `helm install` (tests/e2e/chart.py) runs as the DaemonSet's pod
with its ServiceAccount's rights only, the webhook as a Deployment that the API server calls through
its Service; then `helm upgrade` to a new image tag and `helm uninstall` while a vGPU pod runs.

The scenarios shared with the host-process tracks (slices, injection, registration from inside a
container, bug-2, forged claims) run here through WITH_CHART in their own modules.
"""

from __future__ import annotations

import itertools
import json
import time
import urllib.error
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import chart
from tests.e2e import workload as w
from tests.e2e.node import DEVICE_CLASS, DRIVER, LocalNode

pytestmark = pytest.mark.parametrize("node", ["chart"], indirect=True)

ROLLOUT_TIMEOUT_S = 180.0
_tags = itertools.count(1)


def daemon_pod(node: LocalNode) -> dict[str, Any]:
    pods = [p for p in chart.daemon_pods(node) if not p["metadata"].get("deletionTimestamp")]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def wait_daemon_pod(node: LocalNode, image: str) -> dict[str, Any]:
    """The DaemonSet's pod running `image`, Ready, alone (the old one gone)."""

    def ready() -> dict[str, Any] | None:
        pods = chart.daemon_pods(node)
        if len(pods) != 1:
            return None
        pod = pods[0]
        conditions = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
        running = pod["spec"]["containers"][0]["image"] == image and conditions.get("Ready") == "True"
        return pod if running else None

    return w.wait_for(ready, timeout=ROLLOUT_TIMEOUT_S, what=f"the vgpud pod on {image} Ready")


def vgpu_pod(node: LocalNode, ns: str) -> tuple[str, dict[str, Any], str]:
    """A running pod with one vGPU container: (claim uid, pod, its directory name)."""
    uid = w.create_claim(node, ns, "gpu", [w.vgpu_request("gpu", "2Gi", "10")])["metadata"]["uid"]
    w.create_pod(node, ns, "p", [w.container("main", [("gpu", "gpu")])], {"gpu": "gpu"})
    pod = w.wait_running(node, ns, "p")
    (subdir,) = w.claim_subdirs(node, uid)
    return uid, pod, subdir


def test_vgpud_runs_as_the_daemonsets_pod_with_its_service_account(node: LocalNode) -> None:
    pod = daemon_pod(node)
    spec = pod["spec"]
    assert spec["hostPID"] is True and spec["priorityClassName"] == "system-node-critical"
    assert spec["serviceAccountName"].endswith("-node"), spec["serviceAccountName"]
    container = spec["containers"][0]
    names = {e["name"] for e in container.get("env", [])}
    assert "KUBECONFIG" not in names, "vgpud must use its service account, not an admin kubeconfig"
    probes = {k: container[k]["grpc"] for k in ("startupProbe", "livenessProbe")}
    assert all(p == {"port": node.vgpud_port, "service": "liveness"} for p in probes.values()), probes
    # the kubelet's gRPC probes passed (the pod is Ready) and vgpud answers at the pod IP
    assert pod["status"]["podIP"] == node.node_ip
    assert node.vgpud_health() == 1
    binding = node.get(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{spec['serviceAccountName']}")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": spec["serviceAccountName"], "namespace": chart.NAMESPACE}
    ]
    node.get(f"/apis/resource.k8s.io/v1/deviceclasses/{DEVICE_CLASS}")  # the chart's DeviceClass


def test_the_webhook_refuses_a_pod_with_two_containers_on_one_request(node: LocalNode) -> None:
    ns = w.namespace(node)
    w.create_claim(node, ns, "gpu", [w.vgpu_request("gpu", "1Gi", "5")])
    both = [w.container("a", [("gpu", "gpu")]), w.container("b", [("gpu", "gpu")])]
    with pytest.raises(urllib.error.HTTPError) as refused:
        w.create_pod(node, ns, "two", both, {"gpu": "gpu"})
    message = json.loads(refused.value.read())["message"]
    assert refused.value.code in {400, 403}, message
    assert "denied the request" in message and "gpu" in message, message
    with pytest.raises(urllib.error.HTTPError) as gone:
        w.get_pod(node, ns, "two")
    assert gone.value.code == 404
    w.release_claim(node, ns, "gpu")


def test_upgrade_to_a_new_tag_while_a_vgpu_pod_runs(node: LocalNode) -> None:
    ns = w.namespace(node)
    uid, pod, subdir = vgpu_pod(node, ns)
    cid = w.container_id(pod, "main")
    before = daemon_pod(node)
    assert uid in w.checkpoint_claims(node)

    image = chart.import_image(node, tag=f"upgrade-{int(time.time())}-{next(_tags)}")
    chart.upgrade(node, chart.image_tag(image))
    after = wait_daemon_pod(node, image)
    assert after["metadata"]["uid"] != before["metadata"]["uid"]
    node.wait_vgpud(time.monotonic() + 60)

    # the checkpoint survived, the running container kept its directory
    assert uid in w.checkpoint_claims(node)
    assert w.claim_subdirs(node, uid) == [subdir]
    # the new vgpud rebuilt its NRI cache from Synchronize: the container registers through it, and
    # its removal removes its directory
    reg = w.register_from_container(node, cid, hold_s=3)
    assert reg.returncode == 0, reg.output
    assert reg.shell_host_pid in reg.pids
    w.delete_pod(node, ns, "p")
    w.wait_for(lambda: not node.claim_dir(uid).exists(), what="claim directory removed")
    w.release_claim(node, ns, "gpu")


def leftovers(node: LocalNode) -> list[str]:
    """What of vgpud's the API server still has: the chart's objects, by kind."""
    found = []
    selector = urllib.parse.quote(f"app.kubernetes.io/instance={chart.RELEASE}")
    for path in (
        f"/apis/apps/v1/namespaces/{chart.NAMESPACE}/daemonsets",
        f"/apis/apps/v1/namespaces/{chart.NAMESPACE}/deployments",
        f"/api/v1/namespaces/{chart.NAMESPACE}/pods",
        f"/api/v1/namespaces/{chart.NAMESPACE}/services",
        f"/api/v1/namespaces/{chart.NAMESPACE}/serviceaccounts",
        f"/api/v1/namespaces/{chart.NAMESPACE}/secrets",
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
        "/apis/resource.k8s.io/v1/deviceclasses",
    ):
        items = node.get(f"{path}?labelSelector={selector}")["items"]
        found += [f"{path.rsplit('/', 1)[1]}/{i['metadata']['name']}" for i in items]
    return found


def node_files(node: LocalNode) -> list[str]:
    """vgpud's files on the node, relative to the node's work dir."""
    roots = (node.manager_dir, node.plugin_dir, node.cdi_root, node.registrar_dir)
    files = [p for root in roots if root.exists() for p in root.rglob("*") if not p.is_dir()]
    return sorted(str(p.relative_to(node.workdir)) for p in files)


def test_uninstall_leaves_only_what_running_pods_use(node: LocalNode) -> None:
    ns = w.namespace(node)
    uid, _pod, subdir = vgpu_pod(node, ns)
    try:
        chart.uninstall(node)
        w.wait_for(lambda: not leftovers(node), timeout=60, what=f"no chart objects ({leftovers(node)})")
        w.wait_for(lambda: not chart.daemon_pods(node), timeout=60, what="the vgpud pod gone")
        remaining = node_files(node)
        print("after helm uninstall, on the node:\n  " + "\n  ".join(remaining))
        print(f"ResourceSlices of {DRIVER}: {[s['metadata']['name'] for s in node.slices()]}")
        sockets = [f for f in remaining if f.endswith(".sock")]
        assert not sockets, f"vgpud left sockets behind: {sockets}"
        # what the running pod still uses: its directory, the library and the register client its
        # container has mounted, the claim's CDI spec and the checkpoint that lets the next vgpud
        # unprepare the claim
        claim = node.claim_dir(uid) / subdir
        kept = [
            claim / "config" / "pids.config",
            node.manager_dir / "ld.so.preload",
            node.manager_dir / "registry" / "vgpu-register",
            node.cdi_spec(uid),
            node.checkpoint,
        ]
        assert all(p.exists() for p in kept), [str(p) for p in kept if not p.exists()]
        assert list(node.manager_dir.glob("libvgpu-control.so.*")), "the preloaded library is gone"
        allowed = (
            f"vgpu/claims/{uid}/",
            "vgpu/libvgpu-control.so.",
            "vgpu/ld.so.preload",
            "vgpu/registry/",
            f"cdi/{Path(node.cdi_spec(uid)).name}",
            f"kubelet/plugins/{DRIVER}/",
        )
        unexpected = [f for f in remaining if not f.startswith(allowed)]
        assert not unexpected, f"left on the node and used by no running pod: {unexpected}"
    finally:
        chart.install(node, time.monotonic() + ROLLOUT_TIMEOUT_S)
        node.wait_vgpud(time.monotonic() + 60)
    # the reinstalled vgpud finds the claim in the checkpoint and unprepares it with the pod
    w.delete_pod(node, ns, "p")
    w.wait_for(lambda: not node.claim_dir(uid).exists(), what="claim directory removed")
    w.wait_for(lambda: uid not in w.checkpoint_claims(node), what="checkpoint entry removed")
    w.release_claim(node, ns, "gpu")
