"""Partitions on a real node, both tracks: two pods on two requests of one claim (NRI: one directory per
container; eager: refused, a claim serves one pod), one container on two requests of one claim (bug-2:
NRI: one directory, one registration; eager: the known conflict), and vgpud killed while the kubelet
prepares a claim (the pod still runs; nothing is left after it is deleted)."""

from __future__ import annotations

import signal
import time
from typing import Any

from tests.e2e import workload as w
from tests.e2e.node import DRIVER, LocalNode

REFUSED = "without NRI a vGPU claim serves one pod"
CONFLICTS_METRIC = "vgpud_partition_conflicts"


def on_gpu(request: dict[str, Any], minor: int) -> dict[str, Any]:
    """`request` restricted to the GPU with this minor number (so two requests land on two GPUs)."""
    expression = f"device.attributes['{DRIVER}'].minor == {minor}"
    request["exactly"]["selectors"] = [{"cel": {"expression": expression}}]
    return request


def reserved_for(node: LocalNode, ns: str, claim: str) -> list[str]:
    status = w.get_claim(node, ns, claim).get("status", {})
    return [r["name"] for r in status.get("reservedFor", [])]


def vgpu_limits(env: dict[str, str]) -> dict[str, str]:
    prefixes = ("CUDA_MEM_LIMIT_", "CUDA_CORE_LIMIT_", "MANAGER_VISIBLE_DEVICE_")
    return {k: v for k, v in env.items() if k.startswith(prefixes) and v}


def cleanup(node: LocalNode, ns: str, pods: list[str], claim: str, uid: str) -> None:
    for pod in pods:
        w.delete_pod(node, ns, pod)
    w.wait_for(lambda: not node.claim_dir(uid).exists(), what="claim directory removed")
    w.wait_for(lambda: not node.cdi_spec(uid).exists(), what="CDI spec removed")
    w.wait_for(lambda: uid not in w.checkpoint_claims(node), what="checkpoint entry removed")
    w.release_claim(node, ns, claim)


# --------------------------------------------------------------------------------------------------
# Two pods on two requests of one claim


def test_two_pods_two_requests_of_one_claim(node: LocalNode) -> None:
    ns = w.namespace(node)
    if not node.nri:
        # Both pods must be in reservedFor before the kubelet's first Prepare, or the first pod's
        # Prepare succeeds and the kubelet never asks again for the second: vgpud down meanwhile.
        node.stop_vgpud(signal.SIGKILL)
    claim = w.create_claim(node, ns, "gpu", [w.vgpu_request("a", "1Gi", "5"), w.vgpu_request("b", "2Gi", "5")])
    uid = claim["metadata"]["uid"]
    w.create_pod(node, ns, "pa", [w.container("main", [("gpu", "a")])], {"gpu": "gpu"})
    w.create_pod(node, ns, "pb", [w.container("main", [("gpu", "b")])], {"gpu": "gpu"})
    if node.nri:
        pods = {name: w.wait_running(node, ns, name) for name in ("pa", "pb")}
        assert w.claim_subdirs(node, uid) == sorted(f"{p['metadata']['uid']}_main" for p in pods.values())
        for name, memory in (("pa", "1024m"), ("pb", "2048m")):
            cid = w.container_id(pods[name], "main")
            env = w.container_env(node, cid)
            assert memory in vgpu_limits(env).values(), env
            assert env["VGPU_POD_UID"] == pods[name]["metadata"]["uid"]
            reg = w.register_from_container(node, cid, hold_s=3)
            assert reg.returncode == 0, reg.output
            assert reg.shell_host_pid in reg.pids
    else:
        w.wait_for(lambda: len(reserved_for(node, ns, "gpu")) == 2, what="the claim reserved for both pods")
        node.start_vgpud()
        node.wait_vgpud(time.monotonic() + 60)
        for pod in ("pa", "pb"):
            w.wait_for(
                lambda pod=pod: [
                    e for e in w.pod_events(node, ns, pod) if REFUSED in e.get("message", "")
                ],
                timeout=60,
                what=f"pod {pod}: the refused Prepare as an event",
            )
        for pod in ("pa", "pb"):
            status = w.get_pod(node, ns, pod)["status"]
            assert status["phase"] == "Pending", status
            waiting = [s["state"].get("waiting", {}) for s in status.get("containerStatuses", [])]
            assert all(wt.get("reason") == "ContainerCreating" for wt in waiting), status
        reasons = {e["reason"] for e in w.pod_events(node, ns, "pa") if REFUSED in e.get("message", "")}
        assert reasons == {"FailedPrepareDynamicResources"}, reasons
        assert not node.claim_dir(uid).exists()
        assert not node.cdi_spec(uid).exists()
        assert uid not in w.checkpoint_claims(node)
    cleanup(node, ns, ["pa", "pb"], "gpu", uid)


# --------------------------------------------------------------------------------------------------
# bug-2: one container on two requests of one claim


def test_one_container_two_requests_of_one_claim(node: LocalNode) -> None:
    ns = w.namespace(node)
    requests = [on_gpu(w.vgpu_request("r1", "2Gi", "10"), 0), on_gpu(w.vgpu_request("r2", "3Gi", "15"), 1)]
    claim = w.create_claim(node, ns, "gpu", requests)
    uid = claim["metadata"]["uid"]
    conflicts_before = node.metric(CONFLICTS_METRIC)
    w.create_pod(node, ns, "p", [w.container("main", [("gpu", "r1"), ("gpu", "r2")])], {"gpu": "gpu"})
    results = w.wait_for(
        lambda: w.get_claim(node, ns, "gpu").get("status", {}).get("allocation"), what="allocation"
    )["devices"]["results"]
    assert sorted((r["request"], r["device"]) for r in results) == [("r1", "vgpu-0"), ("r2", "vgpu-1")]
    if node.nri:
        pod = w.wait_running(node, ns, "p")
        cid = w.container_id(pod, "main")
        assert w.claim_subdirs(node, uid) == [f"{pod['metadata']['uid']}_main"]
        env = w.container_env(node, cid)
        limits = vgpu_limits(env)
        assert limits["CUDA_MEM_LIMIT_0"] == "2048m" and limits["CUDA_CORE_LIMIT_0"] == "10", limits
        assert limits["CUDA_MEM_LIMIT_1"] == "3072m" and limits["CUDA_CORE_LIMIT_1"] == "15", limits
        assert limits["MANAGER_VISIBLE_DEVICE_0"] != limits["MANAGER_VISIBLE_DEVICE_1"]
        mounts = w.oci_mounts(node, cid)
        destinations = [d for d, _ in mounts]
        assert len(destinations) == len(set(destinations)), mounts
        reg = w.register_from_container(node, cid, hold_s=3)
        assert reg.returncode == 0, reg.output
        assert reg.shell_host_pid in reg.pids
        if conflicts_before is not None:
            assert node.metric(CONFLICTS_METRIC) == 0
    else:
        observe_eager_bug2(node, ns, uid, conflicts_before)
    cleanup(node, ns, ["p"], "gpu", uid)


def observe_eager_bug2(node: LocalNode, ns: str, uid: str, conflicts_before: float | None) -> None:
    """Eager mode: Prepare puts r1 and r2 in two partitions (each with its own directory and register
    UUID); the container gets both CDI devices, so the same env var and mount destinations twice."""
    w.wait_for(lambda: len(w.claim_subdirs(node, uid)) == 2, what="two partition directories")
    pod = w.wait_running(node, ns, "p")
    cid = w.container_id(pod, "main")
    env = w.container_env(node, cid)
    subdirs = w.claim_subdirs(node, uid)
    assert len(subdirs) == 2, subdirs
    mounts = w.oci_mounts(node, cid)
    config = [src for dest, src in mounts if dest == "/etc/vgpu-manager/config"]
    print(f"eager bug-2: partitions {subdirs}; /etc/vgpu-manager/config sources {config}")
    assert len({src for src in config}) >= 1
    # The conflict: the container's one MANAGER_CLIENT_REGISTER_UUID names one of the two partitions.
    reg = w.register_from_container(node, cid, hold_s=3)
    print(f"eager bug-2: register rc {reg.returncode}, pids {reg.pids}: {reg.output}")
    if conflicts_before is not None:
        count = w.wait_for(lambda: node.metric(CONFLICTS_METRIC), timeout=30, what="the counted conflict")
        assert count >= 1
    assert env["MANAGER_CLIENT_REGISTER_UUID"]
