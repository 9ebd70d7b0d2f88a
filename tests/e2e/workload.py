"""Pods and vGPU claims on the local node (tests/e2e/node.py), and what their containers see.

The node runs a kube-controller-manager: a new namespace gets its `default` service account from it
(pods are refused until then, as in a real cluster), and a claim whose pods are gone is released and
deallocated by its resourceclaim controller, which then lets a deleted claim go.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import time
import urllib.error
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.e2e.node import DEVICE_CLASS, DRIVER, LocalNode
from vgpud.relaxations import nri_selector

IMAGE = "localhost/vgpud-busybox:v1"
#: the label that keeps a pod from the chart's webhook (helm/vgpud values webhook.optOutLabel)
WEBHOOK_OPT_OUT = {"vgpud.io/webhook": "disabled"}
POD_TIMEOUT_S = 90.0
REGISTER = "/etc/vgpu-manager/registry/vgpu-register"
PIDS_FILE = "/etc/vgpu-manager/config/pids.config"
_exec_ids = itertools.count(1)
_names = itertools.count(1)


def unique(prefix: str) -> str:
    return f"{prefix}-{int(time.time() * 1000) % 10**8}-{next(_names)}"


def namespace(node: LocalNode, prefix: str = "t") -> str:
    """A new namespace, once the service account controller gave it the `default` account pods need."""
    name = unique(prefix)
    node.request("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
    wait_default_service_account(node, name)
    return name


def wait_default_service_account(node: LocalNode, ns: str, timeout: float = 30) -> None:
    def present() -> bool:
        try:
            node.get(f"/api/v1/namespaces/{ns}/serviceaccounts/default")
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return False
            raise
        return True

    wait_for(present, timeout=timeout, what=f"the service account {ns}/default")


def vgpu_request(name: str, memory: str, cores: str) -> dict[str, Any]:
    capacity = {"requests": {"memory": memory, "cores": cores}}
    return {"name": name, "exactly": {"deviceClassName": DEVICE_CLASS, "capacity": capacity}}


def on_gpu(request: dict[str, Any], minor: int) -> dict[str, Any]:
    """`request` restricted to the GPU with this minor number (so two requests land on two GPUs)."""
    expression = f"device.attributes['{DRIVER}'].minor == {minor}"
    request["exactly"]["selectors"] = [{"cel": {"expression": expression}}]
    return request


def nri_only(request: dict[str, Any]) -> dict[str, Any]:
    """`request` with the selector that keeps it on NRI nodes (vgpud.relaxations), added to its others."""
    request["exactly"].setdefault("selectors", []).append({"cel": {"expression": nri_selector(DRIVER)}})
    return request


def _metadata(name: str, labels: dict[str, str] | None) -> dict[str, Any]:
    return {"name": name, **({"labels": labels} if labels else {})}


def create_claim(
    node: LocalNode,
    ns: str,
    name: str,
    requests: Sequence[dict[str, Any]],
    *,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    body = {"metadata": _metadata(name, labels), "spec": {"devices": {"requests": list(requests)}}}
    return node.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", body)


def container(name: str, claim_refs: Sequence[tuple[str, str | None]] = (), **extra: Any) -> dict[str, Any]:
    """A busybox container that sleeps; `claim_refs` = [(pod claim name, request or None)]."""
    spec: dict[str, Any] = {
        "name": name,
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sleep", "3600"],
        **extra,
    }
    if claim_refs:
        refs = [{"name": c, **({"request": r} if r else {})} for c, r in claim_refs]
        spec["resources"] = {"claims": refs}
    return spec


def create_pod(
    node: LocalNode,
    ns: str,
    name: str,
    containers: Sequence[dict[str, Any]],
    claims: dict[str, str] | None = None,
    *,
    labels: dict[str, str] | None = None,
    host: str | None = None,
) -> dict[str, Any]:
    """A host-network pod (no CNI here); `claims`: pod claim name -> ResourceClaim name; `host`: the
    node it must go to (a node selector: the scheduler still allocates its claims)."""
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "terminationGracePeriodSeconds": 1,
        "containers": list(containers),
    }
    if host is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": host}
    if claims:
        spec["resourceClaims"] = [{"name": k, "resourceClaimName": v} for k, v in claims.items()]
    body = {"metadata": _metadata(name, labels), "spec": spec}
    return node.request("POST", f"/api/v1/namespaces/{ns}/pods", body)


def get_pod(node: LocalNode, ns: str, name: str) -> dict[str, Any]:
    return node.get(f"/api/v1/namespaces/{ns}/pods/{name}")


def get_claim(node: LocalNode, ns: str, name: str) -> dict[str, Any]:
    return node.get(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}")


def wait_running(node: LocalNode, ns: str, name: str, timeout: float = POD_TIMEOUT_S) -> dict[str, Any]:
    end = time.monotonic() + timeout
    pod: dict[str, Any] = {}
    while time.monotonic() < end:
        pod = get_pod(node, ns, name)
        statuses = pod["status"].get("containerStatuses", [])
        if pod["status"].get("phase") == "Running" and statuses and all(s.get("ready") for s in statuses):
            return pod
        if pod["status"].get("phase") in ("Failed", "Succeeded"):
            break
        time.sleep(0.3)
    raise AssertionError(f"pod {ns}/{name} not running: {pod.get('status')}\n{events(node, ns)}")


def events(node: LocalNode, ns: str) -> str:
    items = node.get(f"/api/v1/namespaces/{ns}/events")["items"]
    return "\n".join(f"  {e['involvedObject']['name']}: {e['reason']}: {e.get('message', '')}" for e in items)


def delete_pod(node: LocalNode, ns: str, name: str, timeout: float = 60, *, force: bool = False) -> None:
    """Delete and wait until the kubelet has removed it (containers stopped, claims unprepared next);
    `force`: at once, without the kubelet's word (a lost node's pod)."""
    body = {"gracePeriodSeconds": 0} if force else None
    node.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", body)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            get_pod(node, ns, name)
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return
            raise
        time.sleep(0.3)
    raise AssertionError(f"pod {ns}/{name} still there after {timeout} s")


def release_claim(node: LocalNode, ns: str, name: str, timeout: float = 60) -> None:
    """Delete the claim and wait until it is gone: the resourceclaim controller deallocates it once its
    pods are gone (the capacity is free again for later tests) and then lifts its finalizer."""
    base = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}"
    try:
        node.request("DELETE", base)
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return
        raise
    end = time.monotonic() + timeout
    claim: dict[str, Any] = {}
    while time.monotonic() < end:
        try:
            claim = node.get(base)
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return
            raise
        time.sleep(0.3)
    raise AssertionError(
        f"claim {ns}/{name} not released in {timeout} s: finalizers {claim['metadata'].get('finalizers')}, "
        f"status {claim.get('status')}"
    )


def container_id(pod: dict[str, Any], name: str) -> str:
    for status in pod["status"].get("containerStatuses", []):
        if status["name"] == name:
            return status["containerID"].split("://", 1)[1]
    raise KeyError(f"no container {name} in {pod['metadata']['name']}")


def exec_in(node: LocalNode, cid: str, script: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`sh -c script` in a running container, through containerd (what `kubectl exec` ends in)."""
    result = node.ctr(
        "tasks", "exec", "--exec-id", f"e2e-{next(_exec_ids)}", cid, "sh", "-c", script, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"exec in {cid[:12]} failed ({result.returncode}): {result.stdout}{result.stderr}"
        )
    return result


def container_env(node: LocalNode, cid: str) -> dict[str, str]:
    """The environment of the container's main process (PID 1 inside it)."""
    out = exec_in(node, cid, "cat /proc/1/environ").stdout
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


def vgpu_limits(env: dict[str, str]) -> dict[str, str]:
    """The per-GPU limits and visibility a container's env carries (the set ones)."""
    prefixes = ("CUDA_MEM_LIMIT_", "CUDA_CORE_LIMIT_", "MANAGER_VISIBLE_DEVICE_")
    return {k: v for k, v in env.items() if k.startswith(prefixes) and v}


def container_mounts(node: LocalNode, cid: str) -> dict[str, str]:
    """Mount point -> options for the container's mounts."""
    mounts = {}
    for line in exec_in(node, cid, "cat /proc/self/mounts").stdout.splitlines():
        fields = line.split()
        mounts[fields[1]] = fields[3]
    return mounts


def task_pid(node: LocalNode, cid: str) -> int:
    for line in node.ctr("tasks", "ls").stdout.splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == cid:
            return int(fields[1])
    raise KeyError(f"no task {cid}")


def cgroup_pids(pid: int) -> list[int]:
    """Host PIDs in the pids-controller cgroup of `pid` (v1)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            return [int(p) for p in Path(f"/sys/fs/cgroup/pids{path}/cgroup.procs").read_text().split()]
    raise AssertionError(f"no pids cgroup for {pid}")


def ns_pid(host_pid: int) -> int:
    """The innermost-namespace PID of a host PID (the last NSpid field)."""
    status = Path(f"/proc/{host_pid}/status").read_text()
    match = re.search(r"^NSpid:\s*(.*)$", status, re.MULTILINE)
    assert match is not None
    return int(match.group(1).split()[-1])


@dataclass
class Registration:
    returncode: int
    output: str
    shell_host_pid: int | None
    pids: list[int]


def register_from_container(node: LocalNode, cid: str, hold_s: int = 20) -> Registration:
    """Run vgpu-register as the library does (its four flags from the env) in a new process of the
    container; return its outcome, the host PID of the calling shell and pids.config afterwards."""
    script = (
        f'{REGISTER} --pod-uid "$VGPU_POD_UID" --container-name "$VGPU_CONTAINER_NAME" '
        '--register-uuid "$MANAGER_CLIENT_REGISTER_UUID"; rc=$?; '
        f'echo "rc $rc"; echo "pid $$"; cat {PIDS_FILE}; echo end; sleep {hold_s}'
    )
    argv = [
        node.env["CTR_BIN"],
        "--address",
        str(node.containerd_socket),
        "-n",
        "k8s.io",
        "tasks",
        "exec",
        "--exec-id",
        f"e2e-{next(_exec_ids)}",
        cid,
        "sh",
        "-c",
        script,
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.strip() == "end":
                break
        rc_line = next((x for x in lines if x.startswith("rc ")), "rc -1")
        pid_line = next((x for x in lines if x.startswith("pid ")), None)
        shell_host = None
        if pid_line is not None:
            inner = int(pid_line.split()[1])
            for host in cgroup_pids(task_pid(node, cid)):
                try:
                    if ns_pid(host) == inner:
                        shell_host = host
                except (OSError, AssertionError):
                    continue
        pids = []
        if "end" in lines and pid_line is not None:
            start = lines.index(pid_line) + 1
            pids = [int(x) for x in lines[start : lines.index("end")] if x.strip().isdigit()]
        return Registration(int(rc_line.split()[1]), "\n".join(lines), shell_host, pids)
    finally:
        proc.kill()
        proc.wait()


def claim_subdirs(node: LocalNode, claim_uid: str) -> list[str]:
    """The partition (eager: `<key>`, may hold a `/`) or container (NRI: `<podUID>_<ctr>`) directories."""
    path = node.claim_dir(claim_uid)
    return sorted(str(p.parent.relative_to(path)) for p in path.rglob("config") if p.is_dir())


def checkpoint_claims(node: LocalNode) -> dict[str, Any]:
    import json

    try:
        data = json.loads(node.checkpoint.read_text())
    except FileNotFoundError:
        return {}
    return data.get("v2", {}).get("preparedClaims", {})


def wait_for(predicate: Any, timeout: float = 30, interval: float = 0.3, what: str = "condition") -> Any:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def oci_mounts(node: LocalNode, cid: str) -> list[tuple[str, str]]:
    """(destination, source) of the container's mounts, as the runtime created it (its OCI spec)."""
    import json

    info = json.loads(node.ctr("containers", "info", cid).stdout)
    return [(m["destination"], m.get("source", "")) for m in info["Spec"].get("mounts", [])]


def pod_events(node: LocalNode, ns: str, pod: str) -> list[dict[str, Any]]:
    items = node.get(f"/api/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if e["involvedObject"].get("name") == pod]
