"""Init containers and native sidecars with vGPU requests on a real node (issue 17 item 4).

One claim with two requests: `a` for a plain init container and the app container after it (an init
container may share a claim's requests with one app), `b` for a native sidecar (an init container with
restartPolicy Always) as its only user — the pod the webhook's rules allow (checked with those rules
here; the default tracks run no webhook).

- NRI track: a directory per container (`<podUID>_<name>`), made at its CreateContainer. The exited
  init container keeps its directory while the pod lives: the kubelet keeps the exited init container
  (no RemoveContainer), so vgpud's StopPodSandbox at the pod's deletion removes all three.
- eager track: a directory per partition, all made at Prepare: the init container and the app share
  `cg-<hash>` (one register UUID), the sidecar alone has `pod-<hash>-init/<name>`.
- A sidecar that restarts gets the same directory and registers again; removing its exited instance
  (what the kubelet's container GC does) keeps the running one's directory.
"""

from __future__ import annotations

import hashlib
import os
import signal
from typing import Any

from tests.e2e import workload as w
from tests.e2e.node import DEVICE_CLASS, DRIVER, LocalNode
from tests.e2e.test_node_containers import CONFIG_MOUNT, crictl, debug_state
from vgpud.observe.client import Endpoint, get_json
from vgpud.webhook.claims import Policy, claim_vgpu_requests
from vgpud.webhook.rules import check_pod

SIDECAR, INIT, APP = "side", "setup", "main"
#: request -> (memory, cores, the CUDA_MEM_LIMIT_<i> value the container gets)
REQUESTS = {"a": ("1Gi", "5", "1024m"), "b": ("512Mi", "3", "512m")}
GO_FILE = "/tmp/go"
REQUEST_OF = {SIDECAR: "b", INIT: "a", APP: "a"}


def short_hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:12]


def pod_body(name: str, *, with_init: bool = True) -> dict[str, Any]:
    """Sidecar `side` (request b), then (`with_init`) plain init `setup` (request a) waiting for
    GO_FILE, then app `main` (request a)."""
    sidecar = w.container(SIDECAR, [("gpu", "b")], restartPolicy="Always")
    wait = ["sh", "-c", f"until [ -e {GO_FILE} ]; do sleep 0.2; done"]
    inits = [sidecar, *([w.container(INIT, [("gpu", "a")], command=wait)] if with_init else [])]
    return {
        "metadata": {"name": name},
        "spec": {
            "hostNetwork": True,
            "terminationGracePeriodSeconds": 1,
            "initContainers": inits,
            "containers": [w.container(APP, [("gpu", "a")])],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}],
        },
    }


def create(node: LocalNode, ns: str, name: str, *, with_init: bool = True) -> dict[str, Any]:
    """The claim and the pod; the webhook's rules accept the pod (as the API server stored it)."""
    requests = [w.vgpu_request(r, memory, cores) for r, (memory, cores, _) in REQUESTS.items()]
    claim = w.create_claim(node, ns, "gpu", requests)
    pod = node.request("POST", f"/api/v1/namespaces/{ns}/pods", pod_body(name, with_init=with_init))
    policy = Policy(driver=DRIVER, vgpu_classes=frozenset({DEVICE_CLASS}))
    assert claim_vgpu_requests(claim, policy) == set(REQUESTS)  # the rules see a vGPU claim
    violations = check_pod(pod, {"gpu": claim}, {}, [], policy)
    assert violations == [], [str(v) for v in violations]
    return claim


def status(node: LocalNode, ns: str, pod: str, container: str) -> dict[str, Any]:
    pod_status = w.get_pod(node, ns, pod)["status"]
    for entry in pod_status.get("initContainerStatuses", []) + pod_status.get("containerStatuses", []):
        if entry["name"] == container:
            return entry
    return {}


def running_id(node: LocalNode, ns: str, pod: str, container: str) -> str | None:
    entry = status(node, ns, pod, container)
    if "running" not in entry.get("state", {}):
        return None
    return entry["containerID"].split("://", 1)[1]


def config_source(node: LocalNode, cid: str) -> str:
    """The host directory the runtime mounted at the container's config mount."""
    (source,) = [src for dest, src in w.oci_mounts(node, cid) if dest == CONFIG_MOUNT]
    return source


def expected_dirs(node: LocalNode, pod_uid: str) -> dict[str, str]:
    """Container -> its directory under the claim directory (the keys' scheme, eager.py)."""
    if node.nri:
        return {c: f"{pod_uid}_{c}" for c in (SIDECAR, INIT, APP)}
    shared = "cg-" + short_hash(f"{pod_uid}/app/{APP},{pod_uid}/init/{INIT}|a")
    return {SIDECAR: f"pod-{short_hash(pod_uid)}-init/{SIDECAR}", INIT: shared, APP: shared}


def check_container(node: LocalNode, uid: str, cid: str, name: str, directory: str) -> str:
    """Its mount, env and a registration from it; returns its register UUID (eager) or ''."""
    assert config_source(node, cid) == str(node.claim_dir(uid) / directory / "config"), name
    env = w.container_env(node, cid)
    index = "0" if "CUDA_MEM_LIMIT_0" in env else "1"
    _, cores, limit = REQUESTS[REQUEST_OF[name]]
    assert env[f"CUDA_MEM_LIMIT_{index}"] == limit, (name, env)
    assert env[f"CUDA_CORE_LIMIT_{index}"] == cores, (name, env)
    assert f"CUDA_MEM_LIMIT_{1 - int(index)}" not in env, (name, env)  # only its own request
    if node.nri:
        assert env["MANAGER_VGPU_CLAIM_UID"] == uid
        assert env["VGPU_CONTAINER_NAME"] == name
        assert env["MANAGER_CLIENT_REGISTER_UUID"] == ""
    else:
        assert env["MANAGER_VGPU_CLAIM_UID"] == ""
        assert env["MANAGER_CLIENT_REGISTER_UUID"]
    reg = w.register_from_container(node, cid, hold_s=2)
    assert reg.returncode == 0, (name, reg.output)
    assert reg.shell_host_pid in reg.pids, (name, reg.output)
    return env["MANAGER_CLIENT_REGISTER_UUID"]


def nri_calls(node: LocalNode, hook: str, pod_uid: str) -> list[dict[str, Any]]:
    calls = get_json(Endpoint(unix_path=node.debug_socket), f"/debug/calls?n=500&hook={hook}")["calls"]
    return [c for c in calls if c["pod_uid"] == pod_uid]


def cached_directories(node: LocalNode, pod_uid: str) -> dict[str, Any]:
    directories = debug_state(node)["nri"]["cache"]["directories"]
    return {path: entry for path, entry in directories.items() if pod_uid in path}


def gone(node: LocalNode, uid: str) -> None:
    """After the pod: no claim directory, CDI spec or checkpoint entry."""
    w.wait_for(lambda: not node.claim_dir(uid).exists(), what="claim directory removed")
    w.wait_for(lambda: uid not in w.checkpoint_claims(node), what="checkpoint entry removed")
    assert not node.cdi_spec(uid).exists()


def test_init_sidecar_and_app_containers(node: LocalNode) -> None:
    ns = w.namespace(node)
    claim = create(node, ns, "p")
    uid = claim["metadata"]["uid"]
    side = w.wait_for(lambda: running_id(node, ns, "p", SIDECAR), timeout=90, what="the sidecar to run")
    init = w.wait_for(lambda: running_id(node, ns, "p", INIT), timeout=60, what="the init container to run")
    pod_uid = w.get_pod(node, ns, "p")["metadata"]["uid"]
    dirs = expected_dirs(node, pod_uid)
    # NRI: made at each CreateContainer (main's not yet); eager: every partition at Prepare
    before_app = {dirs[SIDECAR], dirs[INIT]} if node.nri else set(dirs.values())
    assert set(w.claim_subdirs(node, uid)) == before_app

    uuids = {SIDECAR: check_container(node, uid, side, SIDECAR, dirs[SIDECAR])}
    uuids[INIT] = check_container(node, uid, init, INIT, dirs[INIT])

    w.exec_in(node, init, f"touch {GO_FILE}")
    pod = w.wait_running(node, ns, "p")
    assert status(node, ns, "p", INIT)["state"]["terminated"]["exitCode"] == 0
    app = w.container_id(pod, APP)
    uuids[APP] = check_container(node, uid, app, APP, dirs[APP])
    assert running_id(node, ns, "p", SIDECAR) == side  # the sidecar still runs beside the app
    # the exited init container's directory stays: the kubelet keeps the exited container until the pod goes
    assert set(w.claim_subdirs(node, uid)) == set(dirs.values())
    if node.nri:
        assert nri_calls(node, "RemoveContainer", pod_uid) == []
        cached = cached_directories(node, pod_uid)
        assert {path.rsplit("/", 1)[-1]: e["container_ids"] for path, e in cached.items()} == {
            dirs[SIDECAR]: [side],
            dirs[INIT]: [init],
            dirs[APP]: [app],
        }
    else:  # one register UUID per partition: the init container's is the app's
        assert uuids[INIT] == uuids[APP] != uuids[SIDECAR]

    w.delete_pod(node, ns, "p")
    if node.nri:  # the sandbox's stop removed all three directories, before the claim's Unprepare
        removed = {c["container"] for c in nri_calls(node, "StopPodSandbox", pod_uid)}
        assert removed == {SIDECAR, INIT, APP}, removed
        assert cached_directories(node, pod_uid) == {}
    gone(node, uid)
    w.release_claim(node, ns, "gpu")


def sidecar_removals(node: LocalNode, pod_uid: str) -> list[dict[str, Any]]:
    return [c for c in nri_calls(node, "RemoveContainer", pod_uid) if c["container"] == SIDECAR]


def kill_and_wait_restart(node: LocalNode, ns: str, cid: str, restarts: int) -> str:
    """SIGKILL the sidecar's process; the kubelet starts a new instance (restartPolicy Always)."""
    os.kill(w.task_pid(node, cid), signal.SIGKILL)
    new = w.wait_for(
        lambda: (now := running_id(node, ns, "p", SIDECAR)) != cid and now,
        timeout=90,
        what="the kubelet to restart the sidecar",
    )
    assert status(node, ns, "p", SIDECAR)["restartCount"] == restarts
    return new


def test_a_restarted_sidecar_keeps_its_directory(node: LocalNode) -> None:
    """The kubelet keeps the newest exited instance of a container and removes older ones when it dies
    again (its pod container deletor), before its crash-loop back-off (10 s) lets the next one start
    (NRI track: that removal is a RemoveContainer); a container GC that keeps none (`crictl rm` here)
    removes the exited instance while the new one runs."""
    ns = w.namespace(node)
    claim = create(node, ns, "p", with_init=False)
    uid = claim["metadata"]["uid"]
    pod_uid = w.wait_running(node, ns, "p")["metadata"]["uid"]
    first = running_id(node, ns, "p", SIDECAR)
    assert first is not None
    directory = expected_dirs(node, pod_uid)[SIDECAR]
    check_container(node, uid, first, SIDECAR, directory)

    second = kill_and_wait_restart(node, ns, first, 1)
    check_container(node, uid, second, SIDECAR, directory)
    exited, running = first, second
    if node.nri:  # the eager track makes and removes directories at Prepare and Unprepare only
        running = kill_and_wait_restart(node, ns, second, 2)
        check_container(node, uid, running, SIDECAR, directory)
        # the kubelet removed the first instance when the second died, and vgpud kept the directory
        (removal,) = w.wait_for(lambda: sidecar_removals(node, pod_uid), what="the first instance removed")
        assert removal["detail"].startswith("directory kept: used by ") and second in removal["detail"], (
            removal
        )
        (entry,) = [e for p, e in cached_directories(node, pod_uid).items() if p.endswith(directory)]
        assert sorted(entry["container_ids"]) == sorted([second, running])
        exited = second

    crictl(node, "rm", exited)  # the exited instance goes while the new one runs
    if node.nri:
        w.wait_for(lambda: len(sidecar_removals(node, pod_uid)) == 2, what="vgpud to see the removal")
        (entry,) = [e for p, e in cached_directories(node, pod_uid).items() if p.endswith(directory)]
        assert entry["container_ids"] == [running]
    assert directory in w.claim_subdirs(node, uid)
    check_container(node, uid, running, SIDECAR, directory)

    w.delete_pod(node, ns, "p")
    gone(node, uid)
    w.release_claim(node, ns, "gpu")
