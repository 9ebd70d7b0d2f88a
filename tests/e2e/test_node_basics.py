"""The main job on a real node, both tracks: slices, one container with one vGPU claim, registration
from inside the container, and clean-up after pod deletion. Most hold on the chart track too (vgpud as
the chart's DaemonSet pod); the one-container scenario and the kubelet registration also run on
containerd 2.x."""

from __future__ import annotations

import time
import urllib.parse

from tests.e2e import workload as w
from tests.e2e.conftest import WITH_CHART, WITH_CHART_AND_CD2
from tests.e2e.node import DRIVER, LocalNode
from tests.kubeapi import log_tail
from vgpud import metrics_names as names
from vgpud.partition import libfiles as F

GiB = 1 << 30


@WITH_CHART
def test_slices_published_and_recreated(node: LocalNode) -> None:
    slices = node.wait_slices(time_limit(30))
    devices = [d for s in slices for d in s["spec"]["devices"]]
    assert sorted(d["name"] for d in devices) == ["vgpu-0", "vgpu-1"]
    for device in devices:
        assert device["allowMultipleAllocations"] is True
        assert set(device["capacity"]) >= {"memory", "cores"}
        assert int(device["capacity"]["memory"]["value"]) == 40 * GiB
        assert device["capacity"]["cores"]["value"] == "100"
    name = slices[0]["metadata"]["name"]
    node.request("DELETE", f"/apis/resource.k8s.io/v1/resourceslices/{urllib.parse.quote(name)}")
    again = node.wait_slices(time_limit(30))
    assert sum(len(s["spec"]["devices"]) for s in again) == 2


def time_limit(seconds: float) -> float:
    return time.monotonic() + seconds


@WITH_CHART_AND_CD2
def test_one_container_one_claim(node: LocalNode) -> None:
    ns = w.namespace(node)
    claim = w.create_claim(node, ns, "gpu", [w.vgpu_request("gpu", "4Gi", "10")])
    uid = claim["metadata"]["uid"]
    w.create_pod(node, ns, "p", [w.container("main", [("gpu", "gpu")])], {"gpu": "gpu"})
    pod = w.wait_running(node, ns, "p")
    cid = w.container_id(pod, "main")

    env = w.container_env(node, cid)
    assert env["CUDA_MEM_LIMIT_0"] == "4096m" or env.get("CUDA_MEM_LIMIT_1") == "4096m", env
    index = "0" if "CUDA_MEM_LIMIT_0" in env else "1"
    assert env[f"CUDA_CORE_LIMIT_{index}"] == "10"
    assert env[f"MANAGER_VISIBLE_DEVICE_{index}"].startswith("GPU-")
    assert env["MANAGER_COMPATIBILITY_MODE"] == "236"  # client registration, cgroup v1
    if node.nri:
        assert env["MANAGER_VGPU_CLAIM_UID"] == uid
        assert env["VGPU_POD_UID"] == pod["metadata"]["uid"]
        assert env["VGPU_CONTAINER_NAME"] == "main"
    else:
        assert env["MANAGER_VGPU_CLAIM_UID"] == ""
        assert env["MANAGER_CLIENT_REGISTER_UUID"]

    mounts = w.container_mounts(node, cid)
    for path in (
        "/etc/vgpu-manager/config",
        "/etc/vgpu-manager/registry",
        w.PIDS_FILE,
        "/tmp/.vgpu_lock",
        "/tmp/.vmem_node",
        "/tmp/.sm_node",
        "/etc/vgpu-manager/driver/libvgpu-control.so",
    ):
        assert path in mounts, mounts
    registry = node.manager_dir / "registry"
    assert (registry / "device-client").read_bytes() == (registry / "vgpu-register").read_bytes()
    assert mounts[w.PIDS_FILE].startswith("ro")
    subdirs = w.claim_subdirs(node, uid)
    if node.nri:
        assert subdirs == [f"{pod['metadata']['uid']}_main"]
    else:
        assert len(subdirs) == 1 and subdirs[0].startswith("pod-") and subdirs[0].endswith("-app/main")
    assert node.cdi_spec(uid).exists()
    assert uid in w.checkpoint_claims(node)

    # the usage reader shows what the library's vgpu.config in the container's directory says
    limits = [F.DeviceLimits()] * 16
    limits[int(index)] = F.DeviceLimits(
        uuid="GPU-e2e", total_memory=4 * GiB, memory_limit=True, activate=True
    )
    config = node.claim_dir(uid) / subdirs[0] / "config" / F.VGPU_CONFIG_FILE
    config.write_bytes(F.build_vgpu_config(F.VgpuConfig(devices=tuple(limits))))
    w.wait_for(lambda: node.metric(names.CONTAINER_MEMORY_LIMIT.name) == 4 * GiB, what="the usage metrics")

    reg = w.register_from_container(node, cid)
    assert reg.returncode == 0, reg.output
    assert reg.shell_host_pid is not None, reg.output
    assert reg.shell_host_pid in reg.pids, reg.output
    assert w.task_pid(node, cid) in reg.pids
    host_file = node.claim_dir(uid) / subdirs[0] / "config" / "pids.config"
    assert reg.shell_host_pid in [int(x) for x in host_file.read_text().split()]

    w.delete_pod(node, ns, "p")
    w.wait_for(lambda: not node.claim_dir(uid).exists(), what="claim directory removed")
    w.wait_for(lambda: not node.cdi_spec(uid).exists(), what="CDI spec removed")
    assert uid not in w.checkpoint_claims(node)
    w.release_claim(node, ns, "gpu")


def test_two_containers_two_requests_of_one_claim(node: LocalNode) -> None:
    ns = w.namespace(node)
    requests = [w.vgpu_request("a", "2Gi", "10"), w.vgpu_request("b", "3Gi", "15")]
    claim = w.create_claim(node, ns, "gpu", requests)
    uid = claim["metadata"]["uid"]
    containers = [w.container("ca", [("gpu", "a")]), w.container("cb", [("gpu", "b")])]
    w.create_pod(node, ns, "p", containers, {"gpu": "gpu"})
    pod = w.wait_running(node, ns, "p")
    limits = {}
    for name in ("ca", "cb"):
        env = w.container_env(node, w.container_id(pod, name))
        limits[name] = {
            k: v for k, v in env.items() if k.startswith(("CUDA_MEM_LIMIT_", "CUDA_CORE_LIMIT_")) and v
        }
    assert sorted(limits["ca"].values()) == ["10", "2048m"], limits
    assert sorted(limits["cb"].values()) == ["15", "3072m"], limits
    subdirs = w.claim_subdirs(node, uid)
    assert len(subdirs) == 2, subdirs
    if node.nri:
        assert subdirs == sorted(f"{pod['metadata']['uid']}_{c}" for c in ("ca", "cb"))
    for name in ("ca", "cb"):
        reg = w.register_from_container(node, w.container_id(pod, name), hold_s=5)
        assert reg.returncode == 0, reg.output
        assert reg.shell_host_pid in reg.pids
    w.delete_pod(node, ns, "p")
    w.wait_for(lambda: not node.claim_dir(uid).exists(), what="claim directory removed")
    w.release_claim(node, ns, "gpu")


def _forger(node: LocalNode, ns: str, claim_uid: str) -> tuple[dict[str, str], dict[str, str]]:
    """A claim-less pod that sets MANAGER_VGPU_CLAIM_UID itself: its env and mounts."""
    forged = w.container("main", env=[{"name": "MANAGER_VGPU_CLAIM_UID", "value": claim_uid}])
    w.create_pod(node, ns, "forger", [forged])
    cid = w.container_id(w.wait_running(node, ns, "forger"), "main")
    return w.container_env(node, cid), w.container_mounts(node, cid)


INJECTED = ("VGPU_", "CUDA_", "MANAGER_VISIBLE", "LD_PRELOAD", "MANAGER_COMPATIBILITY_MODE")


@WITH_CHART
def test_forged_claim_uid_of_no_prepared_claim_gets_nothing(node: LocalNode) -> None:
    ns = w.namespace(node)
    env, mounts = _forger(node, ns, "0b8a3a1e-6a55-4d43-9c3e-9c1a6f0b1d11")
    assert env["MANAGER_VGPU_CLAIM_UID"] == "0b8a3a1e-6a55-4d43-9c3e-9c1a6f0b1d11"  # its own, untouched
    assert not [k for k in env if k.startswith(INJECTED)], env
    assert not [m for m in mounts if m.startswith(("/etc/vgpu-manager", "/tmp/.v"))], mounts
    w.delete_pod(node, ns, "forger")


@WITH_CHART
def test_forged_claim_uid_of_another_namespaces_claim(node: LocalNode) -> None:
    """The UID of a claim prepared for another namespace's pod: nothing at all. (The reference, which
    only checks that the claim is prepared, would give the forger a directory and VGPU_* env on the NRI
    track; vgpud also checks that the claim is of the pod's own namespace.)"""
    owner_ns, ns = w.namespace(node), w.namespace(node)
    claim = w.create_claim(node, owner_ns, "gpu", [w.vgpu_request("gpu", "1Gi", "5")])
    uid = claim["metadata"]["uid"]
    w.create_pod(node, owner_ns, "owner", [w.container("main", [("gpu", "gpu")])], {"gpu": "gpu"})
    w.wait_running(node, owner_ns, "owner")
    try:
        env, mounts = _forger(node, ns, uid)
        assert not [k for k in env if k.startswith(("CUDA_", "MANAGER_VISIBLE", "LD_PRELOAD"))], env
        assert "/etc/vgpu-manager/driver/libvgpu-control.so" not in mounts
        injected = sorted(k for k in env if k.startswith("VGPU_")) + sorted(
            m for m in mounts if m.startswith(("/etc/vgpu-manager", "/tmp/.v"))
        )
        assert not injected, f"injected into a forger from another namespace: {injected}"
        assert len(w.claim_subdirs(node, uid)) == 1
    finally:
        w.delete_pod(node, ns, "forger")
        w.delete_pod(node, owner_ns, "owner")
        w.wait_for(lambda: not node.claim_dir(uid).exists(), what="claim directory removed")
        w.release_claim(node, owner_ns, "gpu")


@WITH_CHART_AND_CD2
def test_driver_registered_with_kubelet(node: LocalNode) -> None:
    """The kubelet logs the driver as connected a while after the node is ready (its plugin watcher
    registers the socket on its own schedule), so wait for that line."""
    needle = f'driverName="{DRIVER}"'

    def connected() -> bool:
        lines = node.log("kubelet").read_text(errors="replace").splitlines()
        return any(needle in line and "connected=true" in line for line in lines)

    try:
        w.wait_for(connected, timeout=60, what="the kubelet to log the driver as connected")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; kubelet log, last lines:\n{log_tail(node.log('kubelet'))}") from None
