"""Container instances and the runtime on a real node (issue 12 items 1, 5, 7).

- An exited instance of a container removed through CRI (`crictl rm`, as an operator or another
  kubelet GC setting does) while another instance of it runs: the running one keeps its directory
  and registers (both tracks).
- vgpud's start leaves no plugin error in containerd's log (its start-up probe is the first session);
  on containerd 1.7 and 2.x.
- Containers the NRI plugin never adjusted: vgpud stopped past the runtime's deadline while a vGPU
  container is created (containerd 1.7 and 2.x), and vgpud killed while ten start. containerd 1.7.24
  (NRI v0.6.1) and 2.4.2 (NRI v0.12.3) ignore a plugin's eviction requests, so afterwards every
  running vGPU container has its injection or is reported (debug state, metric, one WARNING line each).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import workload as w
from tests.e2e.conftest import NRI_TRACKS
from tests.e2e.node import LocalNode
from tests.kubeapi import described_events, kube_env
from tests.support import require
from vgpud import metrics_names as names
from vgpud.observe.client import Endpoint, get_json
from vgpud.partition import libfiles as F

CONFIG_MOUNT = "/etc/vgpu-manager/config"
NRI_ONLY = pytest.mark.parametrize("node", ["nri"], indirect=True)
NOT_INJECTED_LINE = "runs without its vGPU injection"


def crictl(node: LocalNode, *args: str) -> str:
    """`crictl <args>` against this node's containerd CRI (the binary hack/install-kube.sh builds)."""
    binary = kube_env().get("CRICTL_BIN", "")
    require(bool(binary) and Path(binary).exists(), "crictl", "run hack/install-kube.sh")
    endpoint = f"unix://{node.containerd_socket}"
    argv = [binary, "--runtime-endpoint", endpoint, "--image-endpoint", endpoint, "--timeout", "30s", *args]
    result = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise AssertionError(f"crictl {' '.join(args)} failed: {result.stdout}{result.stderr}")
    return result.stdout


def debug_state(node: LocalNode) -> dict[str, Any]:
    return get_json(Endpoint(unix_path=node.debug_socket), "/debug/state?calls=0")


def log_text(node: LocalNode, name: str) -> str:
    return node.log(name).read_text(errors="replace")


def injected(node: LocalNode, cid: str) -> bool:
    """The runtime created the container with vgpud's per-container config mount (its OCI spec)."""
    return any(dest == CONFIG_MOUNT for dest, _ in w.oci_mounts(node, cid))


def vgpu_pod(node: LocalNode, ns: str, name: str, claim: str, init_sleep: int = 0) -> None:
    """A pod whose container `main` uses claim `claim`; with `init_sleep`, an init container sleeps
    first, so the claim is prepared well before `main` is created."""
    containers = [w.container("main", [("gpu", None)])]
    body: dict[str, Any] = {
        "metadata": {"name": name},
        "spec": {
            "hostNetwork": True,
            "terminationGracePeriodSeconds": 1,
            "containers": containers,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        },
    }
    if init_sleep:
        body["spec"]["initContainers"] = [w.container("wait", command=["sleep", str(init_sleep)])]
    node.request("POST", f"/api/v1/namespaces/{ns}/pods", body)


def init_running(node: LocalNode, ns: str, name: str) -> bool:
    """The pod's init container runs: its claim is prepared and `main` is created once it exits."""
    statuses = w.get_pod(node, ns, name)["status"].get("initContainerStatuses", [])
    return bool(statuses) and "running" in statuses[0].get("state", {})


def init_started(node: LocalNode, ns: str, name: str) -> bool:
    """The pod's init container runs or ran: the kubelet has its claim's Prepare answer."""
    statuses = w.get_pod(node, ns, name)["status"].get("initContainerStatuses", [])
    return bool(statuses) and bool({"running", "terminated"} & set(statuses[0].get("state", {})))


def check_every_vgpu_container(node: LocalNode, cids: list[str]) -> list[str]:
    """Each container has its injection or is reported (debug state, one WARNING line, the metric);
    the IDs of the reported ones."""
    state = debug_state(node)
    reported = state["nri"]["not_injected"]
    log = log_text(node, "vgpud")
    for cid in cids:
        if injected(node, cid):
            assert cid not in reported, (cid, reported[cid])
            continue
        assert cid in reported, f"{cid} runs without its injection and is not reported: {reported}"
        assert reported[cid]["missing"] and CONFIG_MOUNT in " ".join(reported[cid]["missing"])
        lines = [x for x in log.splitlines() if NOT_INJECTED_LINE in x and cid in x]
        assert len(lines) == 1, lines
    assert node.metric("vgpud_nri_not_injected_containers") == len(reported)
    return [cid for cid in cids if cid in reported]


def removals(node: LocalNode, pod_uid: str) -> list[dict[str, Any]]:
    """vgpud's recorded RemoveContainer calls for container `main` of the pod."""
    calls = get_json(Endpoint(unix_path=node.debug_socket), "/debug/calls?n=200&hook=RemoveContainer")[
        "calls"
    ]
    return [c for c in calls if c["pod_uid"] == pod_uid and c["container"] == "main"]


def start_while_vgpud_stopped(
    node: LocalNode, ns: str, name: str, claim: str, while_stopped: Callable[[], object] = lambda: None
) -> dict[str, Any]:
    """Pod `name` (`main` on `claim`, after a 4 s init container) created while vgpud is stopped
    (SIGSTOP, from the init container's start until `main` runs): containerd drops the stalled plugin
    and creates `main` without the injection. `while_stopped` runs right after the stop. vgpud is
    resumed and has synchronized again on return; the running pod.

    vgpud stays stopped until `main` runs: containerd drops the plugin on the first hook it stalls,
    here the init container's StopContainer, and a vgpud resumed then can reconnect before the
    kubelet creates `main`, which is then adjusted as usual (a CI run saw that race)."""
    vgpu_pod(node, ns, name, claim, init_sleep=4)
    w.wait_for(lambda: init_running(node, ns, name), timeout=90, what="the init container to run")
    before, dropped = syncs(node), log_text(node, "containerd").count("closing plugin")
    vgpud = node.procs["vgpud"]
    vgpud.send_signal(signal.SIGSTOP)
    try:
        while_stopped()
        w.wait_for(
            lambda: log_text(node, "containerd").count("closing plugin") > dropped,
            timeout=60,
            what="containerd to drop the stalled plugin",
        )
        pod = w.wait_running(node, ns, name)
    finally:
        vgpud.send_signal(signal.SIGCONT)
    cid = w.container_id(pod, "main")
    assert not injected(node, cid)  # the runtime really created it without the adjustment
    synchronized_after(node, before)
    return pod


def synchronized_after(node: LocalNode, before: int) -> None:
    w.wait_for(
        lambda: len(re.findall(r"NRI: synchronized: ", log_text(node, "vgpud"))) > before,
        timeout=60,
        what="a Synchronize after vgpud came back",
    )


def syncs(node: LocalNode) -> int:
    return len(re.findall(r"NRI: synchronized: ", log_text(node, "vgpud")))


# -- item 1 ------------------------------------------------------------------------------------------


def test_removing_an_exited_instance_keeps_the_running_ones_directory(node: LocalNode) -> None:
    ns = w.namespace(node)
    claim = w.create_claim(node, ns, "gpu", [w.vgpu_request("gpu", "1Gi", "5")])
    uid = claim["metadata"]["uid"]
    w.create_pod(node, ns, "p", [w.container("main", [("gpu", "gpu")])], {"gpu": "gpu"})
    pod = w.wait_running(node, ns, "p")
    pod_uid, cid = pod["metadata"]["uid"], w.container_id(pod, "main")
    dirs_before = w.claim_subdirs(node, uid)

    # Another instance of container "main" in the same pod sandbox, through CRI: it runs and exits.
    sandbox = json.loads(crictl(node, "inspect", cid))["info"]["sandboxID"]
    config = node.workdir / f"{ns}-stale.json"
    config.write_text(
        json.dumps(
            {
                "metadata": {"name": "main", "attempt": 9},
                "image": {"image": w.IMAGE},
                "command": ["true"],
                "envs": [{"key": "MANAGER_VGPU_CLAIM_UID", "value": uid}],
                "linux": {},
            }
        )
    )
    pod_config = node.workdir / f"{ns}-pod.json"
    pod_config.write_text(
        json.dumps({"metadata": {"name": "p", "uid": pod_uid, "namespace": ns, "attempt": 0}, "linux": {}})
    )
    stale = crictl(node, "create", sandbox, str(config), str(pod_config)).strip()
    crictl(node, "start", stale)
    w.wait_for(
        lambda: json.loads(crictl(node, "inspect", stale))["status"]["state"] == "CONTAINER_EXITED",
        what="the other instance to exit",
    )
    crictl(node, "rm", stale)

    if node.nri:
        w.wait_for(lambda: removals(node, pod_uid), what="vgpud to see the removal")
        assert dirs_before == [f"{pod_uid}_main"]
    assert w.claim_subdirs(node, uid) == dirs_before
    reg = w.register_from_container(node, cid, hold_s=3)
    assert reg.returncode == 0, reg.output
    assert reg.shell_host_pid in reg.pids
    if node.nri:
        directories = debug_state(node)["nri"]["cache"]["directories"]
        (entry,) = [row for row in directories.values() if row["pod_uid"] == pod_uid]
        assert entry["container_ids"] == [cid]
    w.delete_pod(node, ns, "p")
    w.wait_for(lambda: not node.claim_dir(uid).exists(), what="claim directory removed")
    w.release_claim(node, ns, "gpu")


# -- item 5 ------------------------------------------------------------------------------------------


@NRI_TRACKS
def test_vgpud_start_leaves_no_plugin_error_in_containerd_log(node: LocalNode) -> None:
    registered = len(re.findall(r"NRI: registered as", log_text(node, "vgpud")))
    node.restart_vgpud()
    w.wait_for(
        lambda: len(re.findall(r"NRI: registered as", log_text(node, "vgpud"))) > registered,
        what="vgpud's NRI plugin to register",
    )
    containerd = log_text(node, "containerd")
    assert "failed to start external plugin" not in containerd
    assert "failed to register plugin" not in containerd


# -- item 7 ------------------------------------------------------------------------------------------


@NRI_TRACKS
def test_vgpud_stopped_past_the_deadline_leaves_a_reported_container(node: LocalNode) -> None:
    """containerd drops the stalled plugin and creates the container unadjusted; vgpud finishes its
    hook later, then the Synchronize after its reconnect shows what the runtime really did."""
    ns = w.namespace(node)
    claim = w.create_claim(node, ns, "gpu", [w.vgpu_request("gpu", "1Gi", "5")])
    uid = claim["metadata"]["uid"]
    pod = start_while_vgpud_stopped(node, ns, "late", "gpu")
    cid = w.container_id(pod, "main")
    w.wait_for(lambda: cid in debug_state(node)["nri"]["not_injected"], what="the container reported")
    assert check_every_vgpu_container(node, [cid]) == [cid]
    assert w.container_env(node, cid).get("VGPU_POD_UID") is None
    # and `kubectl describe pod` says so (vgpud writes it within a second)
    assert node.api is not None
    pod_uid = pod["metadata"]["uid"]
    [event] = w.wait_for(
        lambda: described_events(node.api, "Pod", "late", pod_uid, namespace=ns, reason="VGPUNotInjected"),
        timeout=10,
        what="the VGPUNotInjected Event on the pod",
    )
    assert event["type"] == "Warning" and event["source"] == {"component": "vgpud", "host": node.name}
    assert event["message"].startswith("container main runs without its vGPU injection (missing "), event
    assert event["message"].endswith("recreate the pod"), event

    w.delete_pod(node, ns, "late")
    w.wait_for(lambda: not node.claim_dir(uid).exists(), what="claim directory removed")
    assert cid not in debug_state(node)["nri"]["not_injected"]
    w.release_claim(node, ns, "gpu")


@NRI_ONLY
def test_vgpud_killed_while_ten_pods_start(node: LocalNode) -> None:
    ns = w.namespace(node)
    names = [f"p{i}" for i in range(10)]
    uids = []
    for name in names:
        claim = w.create_claim(node, ns, name, [w.vgpu_request("gpu", "256Mi", "1")])
        uids.append(claim["metadata"]["uid"])
        vgpu_pod(node, ns, name, name, init_sleep=6)
    # every Prepare answered (the kubelet started the init container), not only checkpointed: a
    # pod whose answer the kill cut off would wait for vgpud, which comes back only after all run
    w.wait_for(
        lambda: set(uids) <= set(w.checkpoint_claims(node)) and all(init_started(node, ns, n) for n in names),
        timeout=120,
        what="every claim prepared and its answer with the kubelet",
    )
    node.stop_vgpud(signal.SIGKILL)
    try:
        started = time.monotonic()
        pods = [w.wait_running(node, ns, name, timeout=120) for name in names]
        print(f"10 pods running {time.monotonic() - started:.1f} s after SIGKILL")
        before = syncs(node)
    finally:  # the node's later tests need vgpud back, whatever happened here
        node.start_vgpud()
        node.wait_vgpud(time.monotonic() + 60)
    synchronized_after(node, before)
    cids = [w.container_id(pod, "main") for pod in pods]
    reported = check_every_vgpu_container(node, cids)
    print(f"{len(reported)} of 10 containers created while vgpud was down, all reported")
    assert reported  # the init containers held every main container past the kill

    for name in names:
        w.delete_pod(node, ns, name)
    assert not set(cids) & set(debug_state(node)["nri"]["not_injected"])
    for name in names:
        w.release_claim(node, ns, name)


# -- issue 13 item 4 ---------------------------------------------------------------------------------


@NRI_ONLY
def test_a_restarted_container_starts_without_the_earlier_ledger_and_bucket(node: LocalNode) -> None:
    """The kubelet restarts a killed container; NRI CreateContainer of the new instance deletes the
    earlier instance's vmem_node.config and sm_node.config (never sm_node.lock), and the usage metrics
    drop the ledger with it."""
    ns = w.namespace(node)
    claim = w.create_claim(node, ns, "gpu", [w.vgpu_request("gpu", "1Gi", "5")])
    uid = claim["metadata"]["uid"]
    w.create_pod(node, ns, "p", [w.container("main", [("gpu", "gpu")])], {"gpu": "gpu"})
    pod = w.wait_running(node, ns, "p")
    first = w.container_id(pod, "main")
    (subdir,) = w.claim_subdirs(node, uid)
    base = node.claim_dir(uid) / subdir
    ledger = base / "vmem_node" / F.VMEM_NODE_FILE
    ledger.write_bytes(F.build_vmem_node({0: [F.LedgerEntry(w.task_pid(node, first), 1 << 30)]}))
    bucket = base / "sm_node" / F.SM_NODE_FILE
    bucket.write_bytes(F.build_sm_node(F.SmNode(sampler_pid=1)))
    lock = base / "sm_node" / F.SM_NODE_LOCK_FILE
    lock.write_bytes(b"")
    w.wait_for(
        lambda: node.metric(names.CONTAINER_LEDGER_BYTES.name) == 1 << 30, what="the ledger in the metrics"
    )

    os.kill(w.task_pid(node, first), signal.SIGKILL)

    def restarted() -> str | None:
        status = w.get_pod(node, ns, "p")["status"].get("containerStatuses", [])
        running = [s for s in status if s["name"] == "main" and s.get("state", {}).get("running")]
        cid = running[0]["containerID"].split("://", 1)[-1] if running else None
        return cid if cid and cid != first else None

    w.wait_for(restarted, timeout=90, what="the kubelet to restart the container")
    assert not ledger.exists() and not bucket.exists()
    assert lock.exists()
    w.wait_for(
        lambda: not node.metric(names.CONTAINER_LEDGER_BYTES.name), what="the ledger gone from the metrics"
    )
    w.delete_pod(node, ns, "p")
    w.release_claim(node, ns, "gpu")
