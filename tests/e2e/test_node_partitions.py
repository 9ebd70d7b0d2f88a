"""Partitions on a real node, both tracks: two pods on two requests of one claim (NRI: one directory per
container; eager: refused, a claim serves one pod), one container on two requests of one claim (bug-2:
NRI: one directory, one registration; eager: the known conflict), and vgpud killed while the kubelet
prepares a claim (the pod still runs; nothing is left after it is deleted)."""

from __future__ import annotations

import json
import os
import signal
import time

from tests.e2e import workload as w
from tests.e2e.conftest import WITH_CHART
from tests.e2e.node import DRIVER, LocalNode
from vgpud.relaxations import Relaxation

#: what an eager node's Prepare says of a claim reserved for two pods (vgpud/partition/nrionly.py)
REFUSED = f"({Relaxation.CLAIM_ACROSS_PODS}) needs a node in NRI mode"
CONFLICTS_METRIC = "vgpud_partition_conflicts"


def reserved_for(node: LocalNode, ns: str, claim: str) -> list[str]:
    status = w.get_claim(node, ns, claim).get("status", {})
    return [r["name"] for r in status.get("reservedFor", [])]


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
    try:
        _two_pods(node, ns)
    finally:
        ensure_vgpud(node)


def ensure_vgpud(node: LocalNode) -> None:
    """vgpud running again (a test that stopped it and failed must not take the others down)."""
    proc = node.procs.get("vgpud")
    if proc is None or proc.poll() is not None:
        node.procs.pop("vgpud", None)
        node.start_vgpud()
        node.wait_vgpud(time.monotonic() + 60)


def _two_pods(node: LocalNode, ns: str) -> None:
    claim = w.create_claim(
        node, ns, "gpu", [w.vgpu_request("a", "1Gi", "5"), w.vgpu_request("b", "2Gi", "5")]
    )
    uid = claim["metadata"]["uid"]
    w.create_pod(node, ns, "pa", [w.container("main", [("gpu", "a")])], {"gpu": "gpu"})
    w.create_pod(node, ns, "pb", [w.container("main", [("gpu", "b")])], {"gpu": "gpu"})
    if node.nri:
        pods = {name: w.wait_running(node, ns, name) for name in ("pa", "pb")}
        assert w.claim_subdirs(node, uid) == sorted(f"{p['metadata']['uid']}_main" for p in pods.values())
        for name, memory in (("pa", "1024m"), ("pb", "2048m")):
            cid = w.container_id(pods[name], "main")
            env = w.container_env(node, cid)
            assert memory in w.vgpu_limits(env).values(), env
            assert env["VGPU_POD_UID"] == pods[name]["metadata"]["uid"]
            reg = w.register_from_container(node, cid, hold_s=3)
            assert reg.returncode == 0, reg.output
            assert reg.shell_host_pid in reg.pids
    else:
        w.wait_for(lambda: len(reserved_for(node, ns, "gpu")) == 2, what="the claim reserved for both pods")
        ensure_vgpud(node)
        both = {"FailedPrepareDynamicResources", "VGPUClaimRefused"}  # the kubelet's and vgpud's own
        for pod in ("pa", "pb"):
            w.wait_for(
                lambda pod=pod: (
                    {e["reason"] for e in w.pod_events(node, ns, pod) if REFUSED in e.get("message", "")}
                    >= both
                ),
                timeout=60,
                what=f"pod {pod}: the refused Prepare as events",
            )
        for pod in ("pa", "pb"):
            status = w.get_pod(node, ns, pod)["status"]
            assert status["phase"] == "Pending", status
            waiting = [s["state"].get("waiting", {}) for s in status.get("containerStatuses", [])]
            assert all(wt.get("reason") == "ContainerCreating" for wt in waiting), status
        reasons = {e["reason"] for e in w.pod_events(node, ns, "pa") if REFUSED in e.get("message", "")}
        assert reasons == both, reasons
        assert not node.claim_dir(uid).exists()
        assert not node.cdi_spec(uid).exists()
        assert uid not in w.checkpoint_claims(node)
    cleanup(node, ns, ["pa", "pb"], "gpu", uid)


# --------------------------------------------------------------------------------------------------
# bug-2: one container on two requests of one claim


def test_one_container_two_requests_of_one_claim(node: LocalNode) -> None:
    ns = w.namespace(node)
    requests = [
        w.on_gpu(w.vgpu_request("r1", "2Gi", "10"), 0),
        w.on_gpu(w.vgpu_request("r2", "3Gi", "15"), 1),
    ]
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
        limits = w.vgpu_limits(env)
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
        # Eager, with the pod in reservedFor at Prepare: r1 and r2 form one partition (one directory,
        # one register UUID); bug-2 needs a container that appears after Prepare (next test).
        pod = w.wait_running(node, ns, "p")
        cid = w.container_id(pod, "main")
        subdirs = w.claim_subdirs(node, uid)
        assert len(subdirs) == 1 and subdirs[0].endswith("-app/main"), subdirs
        env = w.container_env(node, cid)
        assert env["MANAGER_CLIENT_REGISTER_UUID"]
        limits = w.vgpu_limits(env)
        assert limits["CUDA_MEM_LIMIT_0"] == "2048m" and limits["CUDA_MEM_LIMIT_1"] == "3072m", limits
        reg = w.register_from_container(node, cid, hold_s=3)
        assert reg.returncode == 0, reg.output
        assert reg.shell_host_pid in reg.pids
    cleanup(node, ns, ["p"], "gpu", uid)


@WITH_CHART
def test_bug2_container_after_prepare(node: LocalNode) -> None:
    """bug-2 proper: the claim is prepared for pod A (container ca on r1, cb on r2: two partitions in
    eager mode); pod B then uses the prepared claim with ONE container on r1 and r2 (the kubelet does not
    call Prepare again). NRI: B's container gets its own directory and registers. Eager: B's container
    gets both partitions' CDI devices: one register UUID wins, the mounts of the two partitions collide.
    The webhook refuses B, and B's reservation in the claim (its rule 4): on the chart track the claim
    and B opt out of it, as they could where the webhook is bypassed."""
    ns = w.namespace(node)
    requests = [
        w.on_gpu(w.vgpu_request("r1", "2Gi", "10"), 0),
        w.on_gpu(w.vgpu_request("r2", "3Gi", "15"), 1),
    ]
    uid = w.create_claim(node, ns, "gpu", requests, labels=w.WEBHOOK_OPT_OUT)["metadata"]["uid"]
    a = [w.container("ca", [("gpu", "r1")]), w.container("cb", [("gpu", "r2")])]
    w.create_pod(node, ns, "pa", a, {"gpu": "gpu"})
    w.wait_running(node, ns, "pa")
    dirs_a = w.claim_subdirs(node, uid)
    assert len(dirs_a) == 2, dirs_a
    conflicts_before = node.metric(CONFLICTS_METRIC)
    b = [w.container("main", [("gpu", "r1"), ("gpu", "r2")])]
    w.create_pod(node, ns, "pb", b, {"gpu": "gpu"}, labels=w.WEBHOOK_OPT_OUT)
    pod_b = w.wait_running(node, ns, "pb")
    cid = w.container_id(pod_b, "main")
    env = w.container_env(node, cid)
    limits = w.vgpu_limits(env)
    assert limits["CUDA_MEM_LIMIT_0"] == "2048m" and limits["CUDA_MEM_LIMIT_1"] == "3072m", limits
    mounts = [
        (d, src) for d, src in w.oci_mounts(node, cid) if d.startswith(("/etc/vgpu-manager", "/tmp/.v"))
    ]
    config_sources = [src for d, src in mounts if d == "/etc/vgpu-manager/config"]
    reg = w.register_from_container(node, cid, hold_s=3)
    print(f"bug-2 ({'nri' if node.nri else 'eager'}): dirs {w.claim_subdirs(node, uid)}")
    print(f"  config mounts {config_sources}\n  register uuid {env.get('MANAGER_CLIENT_REGISTER_UUID')}")
    print(f"  register rc {reg.returncode} pids {reg.pids}\n  {reg.output}")
    if node.nri:
        assert w.claim_subdirs(node, uid) == sorted([*dirs_a, f"{pod_b['metadata']['uid']}_main"]), (
            w.claim_subdirs(node, uid)
        )
        assert len(config_sources) == 1, mounts
        assert reg.returncode == 0, reg.output
        assert reg.shell_host_pid in reg.pids
        if conflicts_before is not None:
            assert node.metric(CONFLICTS_METRIC) == 0
    else:
        annotations = w.get_claim(node, ns, "gpu")["metadata"].get("annotations", {})
        uuids = {k.split("/", 1)[1]: v for k, v in annotations.items() if k.startswith(f"{DRIVER}/")}
        print(f"  annotations {uuids}\n  conflicts metric {node.metric(CONFLICTS_METRIC)}")
        assert len(uuids) == 2, annotations
        # Both CDI devices set MANAGER_CLIENT_REGISTER_UUID and mount their partition at the same
        # destinations: one device wins both (CDI replaces a mount of the same destination), the
        # other partition is invisible to the container.
        winner = uuids[env["MANAGER_CLIENT_REGISTER_UUID"]]
        assert len(config_sources) == 1, mounts
        assert config_sources[0] == str(node.claim_dir(uid) / winner / "config"), (winner, mounts)
        assert all(
            winner in src for d, src in mounts if d != "/etc/vgpu-manager/registry" and "claims" in src
        )
        # The registry has no candidate for B's container under the winner's UUID (A's container owns
        # that partition): vgpu-register gives up and B's processes are in no pids.config.
        assert reg.returncode != 0, reg.output
        for key in uuids.values():
            listed = (node.claim_dir(uid) / key / "config/pids.config").read_text().split()
            assert str(reg.shell_host_pid) not in listed, (key, listed)
        if conflicts_before is not None:
            w.wait_for(
                lambda: (node.metric(CONFLICTS_METRIC) or 0) > 0,
                timeout=4 * node.drift_interval + 10,
                what=f"{CONFLICTS_METRIC} > 0",
            )
    cleanup(node, ns, ["pb", "pa"], "gpu", uid)


# --------------------------------------------------------------------------------------------------
# kill -9 vgpud while the kubelet prepares


def test_kill_vgpud_during_prepare(node: LocalNode) -> None:
    """vgpud dies (SIGKILL: no clean-up, stale sockets) as the kubelet starts preparing a claim; the
    kubelet's Prepare fails and is retried once vgpud is back with the same flags: the pod runs, and
    after it is deleted no claim directory, CDI spec or checkpoint entry is left."""
    ns = w.namespace(node)
    claim = w.create_claim(node, ns, "gpu", [w.vgpu_request("gpu", "1Gi", "5")])
    uid = claim["metadata"]["uid"]
    node.stop_vgpud(signal.SIGKILL)
    try:
        w.create_pod(node, ns, "p", [w.container("main", [("gpu", "gpu")])], {"gpu": "gpu"})
        failed = w.wait_for(
            lambda: [
                e for e in w.pod_events(node, ns, "p") if e["reason"] == "FailedPrepareDynamicResources"
            ],
            timeout=60,
            what="the kubelet's Prepare to fail while vgpud is down",
        )
        print(f"Prepare while vgpud was down: {failed[0].get('message', '')}")
        assert w.get_pod(node, ns, "p")["status"]["phase"] == "Pending"
    finally:
        ensure_vgpud(node)
    pod = w.wait_running(node, ns, "p")
    cid = w.container_id(pod, "main")
    env = w.container_env(node, cid)
    assert "1024m" in w.vgpu_limits(env).values(), env
    reg = w.register_from_container(node, cid, hold_s=3)
    assert reg.returncode == 0, reg.output
    assert reg.shell_host_pid in reg.pids
    assert uid in w.checkpoint_claims(node)
    cleanup(node, ns, ["p"], "gpu", uid)


def _kill_vgpud_in_prepare(node: LocalNode, uid: str, timeout: float = 30) -> str:
    """SIGKILL vgpud as soon as the checkpoint names the claim (ideally while PrepareStarted: between
    the first checkpoint write and the last); return the state it was killed in."""
    proc = node.procs["vgpud"]
    end = time.monotonic() + timeout
    state = ""
    while time.monotonic() < end and not state:
        try:
            entry = json.loads(node.checkpoint.read_bytes())["v2"]["preparedClaims"].get(uid)
        except (OSError, ValueError, KeyError):
            entry = None
        if entry is not None:
            os.kill(proc.pid, signal.SIGKILL)
            state = entry.get("checkpointState", "?")
    node.stop_vgpud(signal.SIGKILL)
    return state or "not reached"


def _rollbacks(node: LocalNode) -> int:
    """Interrupted Prepares vgpud rolled back (by the next Prepare, or by its periodic cleanup)."""
    text = node.log("vgpud").read_text()
    return text.count("rolling back an interrupted Prepare") + text.count("cleanup: rolled back")


def test_kill_vgpud_racing_prepare(node: LocalNode) -> None:
    """vgpud killed the moment the checkpoint names the claim (PrepareStarted when the poll wins the
    race, PrepareCompleted when it loses): after the restart the interrupted Prepare is rolled back and
    redone, the pod runs, and after its deletion nothing of the claim is left."""
    ns = w.namespace(node)
    uid = w.create_claim(node, ns, "gpu", [w.vgpu_request("gpu", "1Gi", "5")])["metadata"]["uid"]
    rollbacks_before = _rollbacks(node)
    w.create_pod(node, ns, "p", [w.container("main", [("gpu", "gpu")])], {"gpu": "gpu"})
    try:
        state = _kill_vgpud_in_prepare(node, uid)
        print(f"vgpud killed with the claim {state} in the checkpoint; dir {node.claim_dir(uid).exists()}")
    finally:
        ensure_vgpud(node)
    pod = w.wait_running(node, ns, "p")
    if state == "PrepareStarted":
        assert _rollbacks(node) > rollbacks_before, "no rollback of the interrupted Prepare in vgpud's log"
    cid = w.container_id(pod, "main")
    assert "1024m" in w.vgpu_limits(w.container_env(node, cid)).values()
    reg = w.register_from_container(node, cid, hold_s=3)
    assert reg.returncode == 0, reg.output
    assert reg.shell_host_pid in reg.pids
    cleanup(node, ns, ["p"], "gpu", uid)
