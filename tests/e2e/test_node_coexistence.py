"""vgpud beside other NRI plugins on a real node (issue 17 item 2), on containerd 1.7 (NRI v0.6.1) and
2.x (NRI v0.12), vgpud at index 00: containerd/nri's own sample plugin ulimit-adjuster (nri v0.4.0) at
10 and ours (sideplugin) at 20 (tests/e2e/nriplugins.py).

- All three adjust one vGPU container: vgpud's env and mounts exactly, the sample's rlimits (read from
  /proc/<pid>/limits of the container's process), our plugin's env. The runtime logs the order 00, 10,
  20 and applies each reply to the request before it calls the next plugin: our plugin's request
  already carries vgpud's env and mounts and the sample's rlimits, and vgpud's call had ended when ours
  began.
- The sample restarted: vgpud keeps its session; a new pod gets both adjustments.
- vgpud restarted: the sample keeps its connection (the same process: its stub exits when the runtime
  closes it) and adjusts new containers; vgpud registers again (after the sample, still first).
- vgpud and our plugin set the same env var (the sample sets none): the runtime refuses the container
  (the CRI call fails with NRI's conflict error, the kubelet reports CreateContainerError and retries);
  vgpud, called first, had answered and made the container's directory; the runtime's undo
  (RemoveContainer to the plugins) removes it.
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
from tests.e2e.nriplugins import (
    ANNOTATION_ENV,
    PluginProcess,
    SidePlugin,
    UlimitAdjuster,
    invocation_order,
    started,
    ulimit_annotation,
)
from tests.support import require
from vgpud.observe.client import Endpoint, get_json

pytestmark = NRI_TRACKS

#: what the sample is asked for, type -> (soft, hard), and the line of /proc/<pid>/limits that shows it
LIMITS = {"RLIMIT_NOFILE": (2345, 4567), "RLIMIT_MEMLOCK": (645321, 987654)}
LIMIT_LINES = {"RLIMIT_NOFILE": "Max open files", "RLIMIT_MEMLOCK": "Max locked memory"}
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


def _go() -> None:
    require(
        gobuild.go_usable(),
        f"Go >= {'.'.join(map(str, gobuild.MIN_GO))} on PATH",
        "install Go; the NRI plugins are built with it, modules come from the Go module proxy",
    )


@pytest.fixture(scope="module")
def sample_binary() -> Path:
    _go()
    return gobuild.build_sample("ulimit-adjuster", log=sys.stderr)


@pytest.fixture(scope="module")
def side_binary() -> Path:
    _go()
    return gobuild.build("sideplugin", log=sys.stderr)


@pytest.fixture
def sample(node: LocalNode, sample_binary: Path) -> Iterator[UlimitAdjuster]:
    with started(UlimitAdjuster(node, sample_binary)) as plugin:
        yield plugin


@pytest.fixture
def side(node: LocalNode, side_binary: Path) -> Iterator[SidePlugin]:
    with started(SidePlugin(node, side_binary)) as plugin:
        yield plugin


def annotated_pod(
    node: LocalNode, ns: str, name: str, *, env: str = "=".join(SIDE_ENV), plain: bool = False
) -> dict[str, Any]:
    """A pod both other plugins adjust: `main` on the vGPU claim `gpu`, and with `plain` a container
    without a claim (vgpud leaves it alone)."""
    containers = [w.container("main", [("gpu", "gpu")])]
    if plain:
        containers.append(w.container("plain"))
    annotations = {ANNOTATION_ENV: env}
    for c in containers:
        annotations |= ulimit_annotation(c["name"], LIMITS)
    spec = {
        "hostNetwork": True,
        "terminationGracePeriodSeconds": 1,
        "containers": containers,
        "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}],
    }
    metadata = {"name": name, "annotations": annotations}
    return node.request("POST", f"/api/v1/namespaces/{ns}/pods", {"metadata": metadata, "spec": spec})


def claim(node: LocalNode, ns: str) -> str:
    return w.create_claim(node, ns, "gpu", [w.vgpu_request("gpu", "1Gi", "5")])["metadata"]["uid"]


def check_vgpud(node: LocalNode, pod: dict[str, Any], claim_uid: str) -> None:
    """`main` carries vgpud's env and mounts exactly."""
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
    directory = node.claim_dir(claim_uid) / f"{meta['uid']}_main"
    mounts = w.oci_mounts(node, cid)
    ours = [(dest, src) for dest, src in mounts if dest in VGPUD_MOUNTS]
    assert sorted(ours) == sorted((dest, str(directory / sub)) for dest, sub in VGPUD_MOUNTS.items())
    assert w.container_mounts(node, cid)["/etc/vgpu-manager/config/pids.config"].startswith("ro")


def check_limits(node: LocalNode, pod: dict[str, Any], container: str) -> None:
    """The container's process runs with the sample's rlimits (its /proc/<pid>/limits on the host)."""
    limits = Path(f"/proc/{w.task_pid(node, w.container_id(pod, container))}/limits").read_text()
    for typ, line in LIMIT_LINES.items():
        match = re.search(rf"^{line}\s+(\d+)\s+(\d+)", limits, re.MULTILINE)
        assert match, limits
        assert (int(match[1]), int(match[2])) == LIMITS[typ], limits


def check_side(node: LocalNode, side: SidePlugin, pod: dict[str, Any], container: str, *, vgpu: bool) -> None:
    """The container carries our plugin's env, and our plugin (20) was called after vgpud (00, when the
    container has a vGPU) and the sample (10): its request already held their adjustments."""
    uid = pod["metadata"]["uid"]
    assert w.container_env(node, w.container_id(pod, container)).get(SIDE_ENV[0]) == SIDE_ENV[1]
    (seen,) = side.created(uid, container)
    want = [{"type": typ, "soft": soft, "hard": hard} for typ, (soft, hard) in LIMITS.items()]
    assert all(limit in seen["rlimits"] for limit in want), seen
    if not vgpu:
        assert not set(VGPUD_ENV_KEYS) & set(seen["env_keys"]) and not set(VGPUD_MOUNTS) & set(seen["mounts"])
        return
    assert set(VGPUD_ENV_KEYS) <= set(seen["env_keys"]), seen
    assert set(VGPUD_MOUNTS) <= set(seen["mounts"]), seen
    # ... and vgpud's CreateContainer had ended when ours began (one clock: this host)
    (call,) = vgpud_calls(node, uid, container)
    assert call["outcome"] == "ok", call
    assert call["time"] <= seen["time"], (call, seen)


def vgpud_calls(
    node: LocalNode, pod_uid: str, container: str, hook: str = "CreateContainer"
) -> list[dict[str, Any]]:
    """vgpud's recorded calls (of one hook, "" for all) for this container, oldest first (debug endpoint)."""
    calls = get_json(Endpoint(unix_path=node.debug_socket), f"/debug/calls?n=1000&hook={hook}&pod={pod_uid}")
    return [c for c in calls["calls"] if c["container"] == container]


def wait_order(node: LocalNode, *plugins: PluginProcess) -> list[str]:
    """The runtime's logged order once it lists the running vgpud and these plugin processes, in that
    order (2.x lists its built-in validator too)."""
    want = [(VGPUD_NRI_NAME, node.procs["vgpud"].pid)]
    want += [(p.full_name, p.proc.pid if p.proc else None) for p in plugins]

    def listed() -> list[str] | None:
        order = invocation_order(node)
        return [name for name, _ in order] if [e for e in order if e[1] is not None] == want else None

    return w.wait_for(listed, what=f"the runtime's logged plugin invocation order {want}")


def registrations(node: LocalNode) -> int:
    return len(re.findall(REGISTERED, node.log("vgpud").read_text(errors="replace")))


def nri_session(node: LocalNode) -> Any:
    return get_json(Endpoint(unix_path=node.debug_socket), "/debug/state?calls=0")["nri"]["session"]


def finish(node: LocalNode, ns: str, pods: list[str], claim_uid: str) -> None:
    for name in pods:
        w.delete_pod(node, ns, name)
    w.wait_for(lambda: not node.claim_dir(claim_uid).exists(), what="claim directory removed")
    w.release_claim(node, ns, "gpu")


def test_three_plugins_adjust_in_index_order_and_a_sample_restart_leaves_vgpud_undisturbed(
    node: LocalNode, sample: UlimitAdjuster, side: SidePlugin
) -> None:
    print(f"invocation order: {wait_order(node, sample, side)}")
    ns = w.namespace(node, "co")
    uid = claim(node, ns)
    annotated_pod(node, ns, "before", plain=True)
    pod = w.wait_running(node, ns, "before")
    check_vgpud(node, pod, uid)
    check_limits(node, pod, "main")
    check_side(node, side, pod, "main", vgpu=True)
    # the claim-less container: the other plugins' adjustments alone, nothing of vgpud's
    assert "VGPU_POD_UID" not in w.container_env(node, w.container_id(pod, "plain"))
    check_limits(node, pod, "plain")
    check_side(node, side, pod, "plain", vgpu=False)

    # the sample restarted: vgpud keeps its session, a new pod gets both adjustments
    registered, session = registrations(node), nri_session(node)
    sample.stop()
    print(f"the sample registered and synchronized {sample.start():.2f} s after its start")
    wait_order(node, sample, side)
    annotated_pod(node, ns, "after")
    pod = w.wait_running(node, ns, "after")
    check_vgpud(node, pod, uid)
    check_limits(node, pod, "main")
    assert registrations(node) == registered
    assert nri_session(node) == session
    finish(node, ns, ["before", "after"], uid)


def test_vgpud_restart_leaves_the_sample_connected(node: LocalNode, sample: UlimitAdjuster) -> None:
    assert sample.proc is not None
    pid = sample.proc.pid
    registered = registrations(node)
    began = time.monotonic()
    node.stop_vgpud()
    node.start_vgpud()
    w.wait_for(lambda: registrations(node) > registered, timeout=60, what="vgpud to register again")
    print(f"vgpud registered again {time.monotonic() - began:.2f} s after its SIGTERM")
    node.wait_vgpud(time.monotonic() + 60)
    wait_order(node, sample)  # vgpud registered after the sample, and is still first: by index

    ns = w.namespace(node, "co")
    uid = claim(node, ns)
    annotated_pod(node, ns, "p")
    pod = w.wait_running(node, ns, "p")
    check_vgpud(node, pod, uid)
    check_limits(node, pod, "main")
    # one connection all along: the sample's stub exits when the runtime closes its connection
    assert sample.running() and sample.proc.pid == pid
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
