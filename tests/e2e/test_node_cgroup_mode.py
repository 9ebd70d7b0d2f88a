"""Cgroup mode on a real node: NRISupport on, DevicePluginClientMode off. Nothing registers; the control
library decides which of the GPU's processes are its container's by cgroup (v1 here: the `memory` path
of the host PID, read through the host /proc vgpud mounts at /etc/vgpu-manager/.host_proc, equal to its
own). The pods have their own PID namespace, as every pod on the node does, so NVML's host PIDs are not the
container's PIDs: the fakes record host PIDs as the real kernel module does (tests/e2e/fakegpu.py).

Exact numbers prove the rule: a container's free memory and fill depend on which processes it counts,
and the same probe run with another MANAGER_COMPATIBILITY_MODE in the same container counts others."""

from __future__ import annotations

import pytest

from tests.e2e import fakegpu
from tests.e2e import workload as w
from tests.e2e.conftest import CGROUP_TRACKS
from tests.e2e.node import LocalNode
from tests.e2e.test_node_limits import first_gpu_uuid, pinned_request, wait_used
from vgpud import metrics_names as names
from vgpud.nodesetup import cgroup_v2
from vgpud.partition.layout import CONT_HOST_PROC, ENV_COMPATIBILITY_MODE

MiB, GiB = 1 << 20, 1 << 30
CHUNK = 256 * MiB
CUDA_ERROR_OUT_OF_MEMORY = 2
RESULT_KEYS = ("count", "total", "error")
#: where vgpud mounts the host /proc in cgroup mode (no client registration)
HOST_PROC_IN_CONTAINER = str(CONT_HOST_PROC)

pytestmark = pytest.mark.parametrize("node", sorted(CGROUP_TRACKS), indirect=True)


def probe_in(node: LocalNode, cid: str, command: str, mode: str | None = None) -> dict[str, str]:
    """memprobe COMMAND run in the container (a second process of it, through containerd's exec),
    with MANAGER_COMPATIBILITY_MODE=`mode` instead of vgpud's value when given."""
    env = f"{ENV_COMPATIBILITY_MODE}={mode} " if mode is not None else ""
    return fakegpu.parse(w.exec_in(node, cid, f"{env}{fakegpu.PROBE} {command}").stdout)


def registrations(node: LocalNode) -> float:
    return node.metric(names.REGISTRY_REQUESTS.name) or 0.0


def test_env_says_cgroup_mode_and_nothing_registers(node: LocalNode) -> None:
    ns = w.namespace(node)
    claim = w.create_claim(node, ns, "gpu", [w.vgpu_request("gpu", "4Gi", "10")])
    uid = claim["metadata"]["uid"]
    before = registrations(node)
    probe = fakegpu.probe_container(node, "main", "gpu", "fill", "direct", str(CHUNK), "hold")
    fakegpu.create_probe_pod(node, ns, "p", [probe], "gpu")
    pod = w.wait_running(node, ns, "p")
    cid = w.container_id(pod, "main")

    env = w.container_env(node, cid)
    # the contracts' values: cgroup v1 | open kernel = 101 (this host), cgroup v2 | open kernel = 102
    assert env[ENV_COMPATIBILITY_MODE] == ("102" if cgroup_v2() else "101"), env
    assert env["MANAGER_CLIENT_REGISTER_UUID"] == "", env
    assert HOST_PROC_IN_CONTAINER in w.container_mounts(node, cid)
    # its own PID namespace: the probe is PID 1 there, and another number on the host
    host_pid = w.task_pid(node, cid)
    assert w.ns_pid(host_pid) == 1 and host_pid != 1

    out = fakegpu.probe_result(node, ns, pod, "main", RESULT_KEYS)
    assert (int(out["error"]), int(out["total"])) == (CUDA_ERROR_OUT_OF_MEMORY, 4 * GiB), out
    assert int(out["count"]) == 4 * GiB // CHUNK, out
    wait_used(node, uid, [4 * GiB])  # vgpud sees the probe's host PID in the container's cgroup

    # nothing registered: no register call reached vgpud and pids.config stayed empty
    assert registrations(node) == before
    (subdir,) = w.claim_subdirs(node, uid)
    assert (node.claim_dir(uid) / subdir / "config" / "pids.config").read_text() == ""

    w.delete_pod(node, ns, "p")
    w.release_claim(node, ns, "gpu")


def test_two_containers_on_one_gpu_count_only_their_own_processes(node: LocalNode) -> None:
    """ca (2 GiB) and cb (3 GiB) fill to their own limits whatever the other holds; cc (1 GiB) holds
    256 MiB in its main process and sees the rest of its 1 GiB free while 5 GiB of the GPU are the
    others'. A process that forks in cc is counted with its child: the child gets 2 chunks."""
    ns = w.namespace(node)
    uuid = first_gpu_uuid(node)
    requests = [
        pinned_request("a", "2Gi", uuid),
        pinned_request("b", "3Gi", uuid),
        pinned_request("c", "1Gi", uuid),
    ]
    uid = w.create_claim(node, ns, "gpu", requests)["metadata"]["uid"]
    containers = [
        fakegpu.probe_container(node, "ca", "a", "fill", "direct", str(CHUNK), "hold"),
        fakegpu.probe_container(node, "cb", "b", "fill", "direct", str(CHUNK), "hold"),
        fakegpu.probe_container(node, "cc", "c", "take", str(CHUNK)),
    ]
    fakegpu.create_probe_pod(node, ns, "p", containers, "gpu")
    pod = w.wait_running(node, ns, "p")
    for name, limit in (("ca", 2 * GiB), ("cb", 3 * GiB)):
        out = fakegpu.probe_result(node, ns, pod, name, RESULT_KEYS)
        assert (int(out["error"]), int(out["total"])) == (CUDA_ERROR_OUT_OF_MEMORY, limit), (name, out)
    assert fakegpu.probe_result(node, ns, pod, "cc", ("rc",))["rc"] == "0"
    wait_used(node, uid, [CHUNK, 2 * GiB, 3 * GiB])

    # each container in a cgroup of its own: what the library compares
    paths = {name: own_cgroup(w.task_pid(node, w.container_id(pod, name))) for name in ("ca", "cb", "cc")}
    assert len(set(paths.values())) == 3, paths
    assert all(path.endswith(w.container_id(pod, name)) for name, path in paths.items()), paths

    cc = w.container_id(pod, "cc")
    info = probe_in(node, cc, "info")
    assert (int(info["meminfo_total"]), int(info["meminfo_free"])) == (GiB, GiB - CHUNK), info
    # the same process with other rules, in the same container: the cgroup rule alone counts the same;
    # host mode counts everything on the GPU (nothing free); the open kernel rule alone looks NVML's
    # host PIDs up in the container's own /proc, finds none of them and counts nothing (all free)
    cgroup_bit = "2" if cgroup_v2() else "1"
    for mode, free in ((cgroup_bit, GiB - CHUNK), ("0", 0), ("100", GiB)):
        got = probe_in(node, cc, "info", mode)
        assert int(got["meminfo_free"]) == free, (mode, got)

    # fork in cc: the parent takes 256 MiB, the child fills the rest: 1 GiB - 2 x 256 MiB
    forked = probe_in(node, cc, f"fork {CHUNK}")
    assert (forked["parent_rc"], forked["count"], forked["child_status"]) == ("0", "2", "0"), forked

    w.delete_pod(node, ns, "p")
    w.release_claim(node, ns, "gpu")


def own_cgroup(host_pid: int) -> str:
    """The cgroup the library's rule reads for a host PID: the v1 `memory` path, or the v2 one."""
    v2 = cgroup_v2()
    with open(f"/proc/{host_pid}/cgroup") as f:
        for line in f:
            hierarchy, controllers, path = line.rstrip("\n").split(":", 2)
            if (v2 and hierarchy == "0") or (not v2 and "memory" in controllers.split(",")):
                return path
    raise AssertionError(f"no {'v2' if v2 else 'memory'} cgroup for {host_pid}")
