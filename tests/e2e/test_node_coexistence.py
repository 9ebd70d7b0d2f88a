"""vgpud beside another NRI plugin on a real node (issue 17 item 2), on containerd 1.7 (NRI v0.6.1) and
2.x (NRI v0.12): the side plugin (tests/e2e/sideplugin.py, NRI's Go stub at index 10) and vgpud
(index 00) both adjust one vGPU container.

- Both adjustments land, vgpud's exactly; the runtime calls the plugins in index order (its log lists
  the order at each registration) and applies each reply to the request before the next plugin sees
  it: the side plugin's request already carries vgpud's env and mounts, and vgpud's call ended before
  the side plugin's began.
- vgpud restarted: the side plugin keeps its connection (no new Synchronize) and adjusts new
  containers; vgpud registers again (after the side plugin, still called first) and adjusts.
- The side plugin restarted: vgpud keeps its session; a new pod gets both adjustments.
- Both set the same env var: the runtime refuses the container (the CRI call fails with NRI's conflict
  error, the kubelet reports CreateContainerError and retries); vgpud, called first, had answered and
  made the container's directory; the runtime's undo (RemoveContainer to the plugins) removes it.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conformance.nri import gobuild
from tests.e2e import workload as w
from tests.e2e.conftest import NRI_TRACKS
from tests.e2e.node import LocalNode
from tests.e2e.sideplugin import ANNOTATION_ENV, ANNOTATION_NOFILE, SidePlugin, side_plugin
from tests.support import require
from vgpud.observe.client import Endpoint, get_json

pytestmark = NRI_TRACKS

NOFILE = 2345
SIDE_ENV = ("SIDE_ADJUSTED", "yes")
VGPUD_ENV_KEYS = (
    "VGPU_POD_UID",
    "VGPU_POD_NAME",
    "VGPU_POD_NAMESPACE",
    "VGPU_CONTAINER_NAME",
    "MANAGER_CLIENT_REGISTER_UUID",
)
#: vgpud's per-container mounts: destination -> the source under the container's directory
VGPUD_MOUNTS = {
    "/etc/vgpu-manager/config": "config",
    "/etc/vgpu-manager/config/pids.config": "config/pids.config",
    "/tmp/.vgpu_lock": "vgpu_lock",
    "/tmp/.vmem_node": "vmem_node",
    "/tmp/.sm_node": "sm_node",
}
VGPUD_NRI_NAME = "00-manager.nvidia.com"
#: vgpud's log line for each registration with the runtime
REGISTERED = rf"NRI: registered as {re.escape(VGPUD_NRI_NAME)}"
#: containerd (1.7 and 2.x) logs the whole order at info level whenever a plugin registers
_ORDER_HEADER = 'msg="plugin invocation order"'
_ORDER_ENTRY = re.compile(r'msg="  #\d+: \\"([^"\\]+)\\" \((?:external|builtin):[^)\[]*(?:\[(\d+)\])?\)"')


@pytest.fixture(scope="module")
def side_binary() -> Path:
    require(
        gobuild.go_usable(),
        f"Go >= {'.'.join(map(str, gobuild.MIN_GO))} on PATH",
        "install Go; the side plugin is built with it, modules come from the Go module proxy",
    )
    return gobuild.build("sideplugin", log=sys.stderr)


@pytest.fixture
def side(node: LocalNode, side_binary: Path) -> Iterator[SidePlugin]:
    with side_plugin(node, side_binary) as plugin:
        yield plugin


def annotated_pod(
    node: LocalNode, ns: str, name: str, *, env: str = "=".join(SIDE_ENV), plain: bool = False
) -> dict[str, Any]:
    """A pod the side plugin adjusts: `main` on the vGPU claim `gpu`, and with `plain` a container
    without a claim (vgpud leaves it alone)."""
    containers = [w.container("main", [("gpu", "gpu")])]
    if plain:
        containers.append(w.container("plain"))
    spec = {
        "hostNetwork": True,
        "terminationGracePeriodSeconds": 1,
        "containers": containers,
        "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}],
    }
    metadata = {"name": name, "annotations": {ANNOTATION_NOFILE: str(NOFILE), ANNOTATION_ENV: env}}
    return node.request("POST", f"/api/v1/namespaces/{ns}/pods", {"metadata": metadata, "spec": spec})


def claim(node: LocalNode, ns: str) -> str:
    return w.create_claim(node, ns, "gpu", [w.vgpu_request("gpu", "1Gi", "5")])["metadata"]["uid"]


def nofile(node: LocalNode, cid: str) -> tuple[int, int]:
    """(soft, hard) RLIMIT_NOFILE of the container's main process."""
    limits = w.exec_in(node, cid, "cat /proc/1/limits").stdout
    match = re.search(r"^Max open files\s+(\d+)\s+(\d+)", limits, re.MULTILINE)
    assert match, limits
    return int(match[1]), int(match[2])


def check_both(node: LocalNode, side: SidePlugin, pod: dict[str, Any], claim_uid: str) -> None:
    """`main` carries vgpud's injection exactly and the side plugin's adjustment, and the side plugin
    was called after vgpud with vgpud's adjustment already in its request."""
    meta = pod["metadata"]
    cid = w.container_id(pod, "main")
    env = w.container_env(node, cid)
    assert {key: env.get(key) for key in VGPUD_ENV_KEYS} == {
        "VGPU_POD_UID": meta["uid"],
        "VGPU_POD_NAME": meta["name"],
        "VGPU_POD_NAMESPACE": meta["namespace"],
        "VGPU_CONTAINER_NAME": "main",
        "MANAGER_CLIENT_REGISTER_UUID": "",
    }
    assert env.get(SIDE_ENV[0]) == SIDE_ENV[1]
    assert nofile(node, cid) == (NOFILE, NOFILE)
    directory = node.claim_dir(claim_uid) / f"{meta['uid']}_main"
    mounts = w.oci_mounts(node, cid)
    ours = [(dest, src) for dest, src in mounts if dest in VGPUD_MOUNTS]
    assert sorted(ours) == sorted((dest, str(directory / sub)) for dest, sub in VGPUD_MOUNTS.items())
    assert w.container_mounts(node, cid)["/etc/vgpu-manager/config/pids.config"].startswith("ro")

    # index order: the side plugin's request already held vgpud's env and mounts ...
    (seen,) = side.created(meta["uid"], "main")
    assert set(VGPUD_ENV_KEYS) <= set(seen["env_keys"]), seen
    assert set(VGPUD_MOUNTS) <= set(seen["mounts"]), seen
    # ... and vgpud's CreateContainer had ended when the side plugin's began (one clock: this host)
    (call,) = vgpud_calls(node, meta["uid"], "main")
    assert call["outcome"] == "ok", call
    assert call["time"] <= seen["time"], (call, seen)


def vgpud_calls(
    node: LocalNode, pod_uid: str, container: str, hook: str = "CreateContainer"
) -> list[dict[str, Any]]:
    """vgpud's recorded calls (of one hook, "" for all) for this container, oldest first (debug endpoint)."""
    calls = get_json(Endpoint(unix_path=node.debug_socket), f"/debug/calls?n=1000&hook={hook}&pod={pod_uid}")
    return [c for c in calls["calls"] if c["container"] == container]


def invocation_order(node: LocalNode) -> list[tuple[str, int | None]]:
    """The runtime's last logged plugin invocation order: (indexed name, PID of an external plugin)."""
    lines = node.log("containerd").read_text(errors="replace").splitlines()
    starts = [i for i, line in enumerate(lines) if _ORDER_HEADER in line]
    order: list[tuple[str, int | None]] = []
    for line in lines[starts[-1] + 1 :] if starts else []:
        match = _ORDER_ENTRY.search(line)
        if match is None:
            break
        order.append((match[1], int(match[2]) if match[2] else None))
    return order


def wait_order(node: LocalNode, side: SidePlugin) -> list[str]:
    """The runtime's logged order once it lists the running vgpud and side plugin processes, in that
    order (2.x lists its built-in validator too)."""
    assert side.proc is not None
    want = [(VGPUD_NRI_NAME, node.procs["vgpud"].pid), (side.full_name, side.proc.pid)]

    def listed() -> list[str] | None:
        order = invocation_order(node)
        return [name for name, _ in order] if [e for e in order if e[1] is not None] == want else None

    return w.wait_for(listed, what=f"the runtime's logged plugin invocation order {want}")


def registrations(node: LocalNode) -> int:
    return len(re.findall(REGISTERED, node.log("vgpud").read_text(errors="replace")))


def finish(node: LocalNode, ns: str, pods: list[str], claim_uid: str) -> None:
    for name in pods:
        w.delete_pod(node, ns, name)
    w.wait_for(lambda: not node.claim_dir(claim_uid).exists(), what="claim directory removed")
    w.release_claim(node, ns, "gpu")


def test_both_adjust_in_index_order_and_a_side_plugin_restart_leaves_vgpud_undisturbed(
    node: LocalNode, side: SidePlugin
) -> None:
    print(f"invocation order: {wait_order(node, side)}")
    ns = w.namespace(node, "co")
    uid = claim(node, ns)
    annotated_pod(node, ns, "before", plain=True)
    pod = w.wait_running(node, ns, "before")
    check_both(node, side, pod, uid)
    # the claim-less container: the side plugin's adjustment alone; nothing of vgpud's in its request
    plain = w.container_id(pod, "plain")
    assert w.container_env(node, plain).get(SIDE_ENV[0]) == SIDE_ENV[1]
    assert "VGPU_POD_UID" not in w.container_env(node, plain)
    assert nofile(node, plain) == (NOFILE, NOFILE)
    (seen,) = side.created(pod["metadata"]["uid"], "plain")
    assert not set(VGPUD_ENV_KEYS) & set(seen["env_keys"]) and not set(VGPUD_MOUNTS) & set(seen["mounts"])

    # the side plugin restarted: vgpud keeps its session, a new pod gets both adjustments
    registered = registrations(node)
    session = get_json(Endpoint(unix_path=node.debug_socket), "/debug/state?calls=0")["nri"]["session"]
    side.stop()
    took = side.start()
    print(f"side plugin synchronized {took:.2f} s after its start")
    (sync,) = side.entries("Synchronize")[-1:]
    assert sync["containers"] >= 2  # it found the running pod's containers
    wait_order(node, side)
    annotated_pod(node, ns, "after")
    check_both(node, side, w.wait_running(node, ns, "after"), uid)
    assert registrations(node) == registered
    state = get_json(Endpoint(unix_path=node.debug_socket), "/debug/state?calls=0")["nri"]
    assert state["session"] == session
    finish(node, ns, ["before", "after"], uid)


def test_vgpud_restart_leaves_the_side_plugin_registered(node: LocalNode, side: SidePlugin) -> None:
    synced = len(side.entries("Synchronize"))
    registered = registrations(node)
    began = time.monotonic()
    node.stop_vgpud()
    node.start_vgpud()
    w.wait_for(lambda: registrations(node) > registered, timeout=60, what="vgpud to register again")
    print(f"vgpud registered again {time.monotonic() - began:.2f} s after its SIGTERM")
    node.wait_vgpud(time.monotonic() + 60)
    wait_order(node, side)  # vgpud registered after the side plugin, and is still first: by index

    ns = w.namespace(node, "co")
    uid = claim(node, ns)
    annotated_pod(node, ns, "p")
    pod = w.wait_running(node, ns, "p")
    assert side.running()
    # one connection all along: a side plugin that had been dropped would have synchronized again
    assert len(side.entries("Synchronize")) == synced
    check_both(node, side, pod, uid)
    finish(node, ns, ["p"], uid)


def test_both_setting_one_env_var_fails_the_container(node: LocalNode, side: SidePlugin) -> None:
    ns = w.namespace(node, "co")
    uid = claim(node, ns)
    annotated_pod(node, ns, "p", env="VGPU_POD_NAME=imposter")

    def refused() -> dict[str, Any] | None:
        for status in w.get_pod(node, ns, "p")["status"].get("containerStatuses", []):
            waiting = status.get("state", {}).get("waiting", {})
            if waiting.get("reason") == "CreateContainerError":
                return waiting
        return None

    waiting = w.wait_for(refused, timeout=60, what="CreateContainerError")
    # NRI's conflict error, the later plugin first: "env" at v0.6.1, "Env" (the field's name) at v0.12
    want = rf'plugins "{side.full_name}" and "{VGPUD_NRI_NAME}" both tried to set [Ee]nv VGPU_POD_NAME'
    assert re.search(want, waiting.get("message", "")), waiting
    print(f"conflict: {waiting['message']}")
    # vgpud, called first, answered and made the container's directory; the runtime undid the refused
    # creation with a RemoveContainer to the plugins, and vgpud removed the directory again
    pod_uid = w.get_pod(node, ns, "p")["metadata"]["uid"]
    directory = node.claim_dir(uid) / f"{pod_uid}_main"

    def undone() -> list[tuple[str, str]]:
        calls = [(c["call"], c["outcome"]) for c in vgpud_calls(node, pod_uid, "main", hook="")]
        return calls if calls[-1:] == [("RemoveContainer", "ok")] and not directory.exists() else []

    calls = w.wait_for(undone, what="the refused container's directory removed")
    assert calls[:2] == [("CreateContainer", "ok"), ("RemoveContainer", "ok")], calls
    finish(node, ns, ["p"], uid)
