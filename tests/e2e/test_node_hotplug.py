"""The hot-plug API on a real node (containerd 1.7 and 2.x): device-mounter's flow.

A slave pod holds a vGPU claim on one GPU; a target pod's running vGPU container (its own claim on the
other GPU) makes the slave GPU's device node itself (as device-mounter does) and is refused it by its
device cgroup (EPERM). Attach gives it access: opening the node then reaches the driver (this node has
none: ENXIO, "No such device or address"; on a GPU node the open succeeds), and the target's
vgpu.config holds the slave's limits for its library. Detach takes both back (EPERM again). What vgpud
sent the runtime through NRI UpdateContainers is dropped by containerd on the way to runc: the
container's OCI spec never lists the rule (docs/hotplug.md). Refusals, idempotency, a vgpud restart,
and the cleanup when the target container or the slave pod goes are checked on the same node."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import grpc

from tests import hotplugclient
from tests.e2e import workload as w
from tests.e2e.conftest import NRI_TRACKS
from tests.e2e.node import LocalNode
from vgpud import metrics_names as names
from vgpud.observe.client import Endpoint, get_json
from vgpud.partition.libfiles import DeviceLimits, parse_vgpu_config

pytestmark = NRI_TRACKS

EPERM_TEXT = "Operation not permitted"
#: this node has no NVIDIA driver: past the device cgroup, the open fails in the driver lookup
ENXIO_TEXT = "No such device or address"
NVIDIA_MAJOR = 195


def call(node: LocalNode, method: str, **fields: str) -> tuple[grpc.StatusCode, str, Any]:
    assert node.hotplug_socket is not None
    return hotplugclient.call(node.hotplug_socket, method, **fields)


def slave_minor(node: LocalNode, ns: str, claim: str) -> int:
    """The GPU minor of the slave claim's allocated device (`vgpu-<minor>`)."""
    (result,) = w.get_claim(node, ns, claim)["status"]["allocation"]["devices"]["results"]
    match = re.fullmatch(r"vgpu-(\d+)", result["device"])
    assert match, result
    return int(match[1])


def open_node(node: LocalNode, cid: str, minor: int) -> str:
    """Make /dev/nvidia<minor> in the container (mknod is allowed for every device by runc's
    defaults) and open it read-write; what the shell says."""
    path = f"/dev/nvidia{minor}"
    script = f"[ -e {path} ] || mknod {path} c {NVIDIA_MAJOR} {minor}; (exec 3<>{path}) 2>&1 && echo opened"
    return w.exec_in(node, cid, script, check=False).stdout.strip()


def devices_list(node: LocalNode, cid: str) -> list[str]:
    """The container's devices cgroup rules as the kernel holds them (v1)."""
    pid = w.task_pid(node, cid)
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "devices" in controllers.split(","):
            return Path(f"/sys/fs/cgroup/devices{path}/devices.list").read_text().split("\n")[:-1]
    raise AssertionError(f"no devices cgroup for {cid}")


def spec_device_rules(node: LocalNode, cid: str) -> list[dict[str, Any]]:
    """linux.resources.devices of the container's OCI spec as containerd keeps it."""
    info = json.loads(node.ctr("containers", "info", cid).stdout)
    return info["Spec"]["linux"]["resources"].get("devices", [])


def debug(node: LocalNode, path: str) -> dict[str, Any]:
    return get_json(Endpoint(unix_path=node.debug_socket), path)


def hotplug_calls(node: LocalNode, target_pod_uid: str) -> list[dict[str, Any]]:
    """The hot-plug calls about one target pod (the node, and its ring buffer, serve every test)."""
    return debug(node, f"/debug/calls?n=1000&component=hotplug&pod={target_pod_uid}")["calls"]


def vgpu_pods(node: LocalNode, ns: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """A slave pod on GPU 1 and a running target pod (container `app`) on GPU 0, each with its own
    vGPU claim; (slave, target, the target container's ID)."""
    w.create_claim(node, ns, "slave-gpu", [w.on_gpu(w.vgpu_request("gpu", "2Gi", "20"), 1)])
    w.create_claim(node, ns, "own-gpu", [w.on_gpu(w.vgpu_request("gpu", "1Gi", "10"), 0)])
    slave = w.create_pod(node, ns, "slave", [w.container("hold", [("gpu", None)])], {"gpu": "slave-gpu"})
    target = w.create_pod(node, ns, "target", [w.container("app", [("gpu", None)])], {"gpu": "own-gpu"})
    w.wait_running(node, ns, "slave")
    return slave, target, w.container_id(w.wait_running(node, ns, "target"), "app")


def hotplugged(node: LocalNode, claim_uid: str) -> list[DeviceLimits]:
    """The hot-plugged entries of the target's vgpu.config (the file in its directory on the host)."""
    (subdir,) = w.claim_subdirs(node, claim_uid)
    path = node.claim_dir(claim_uid) / subdir / "config" / "vgpu.config"
    if not path.exists():
        return []
    return [d for d in parse_vgpu_config(path.read_bytes()).devices if d.activate and d.hotplug]


def attachments(node: LocalNode) -> list[Any]:
    code, details, reply = call(node, "List")
    assert code is grpc.StatusCode.OK, details
    return list(reply.attachments)


def test_attach_opens_the_slaves_gpu_and_detach_closes_it(node: LocalNode) -> None:
    ns = w.namespace(node)
    slave, target, cid = vgpu_pods(node, ns)
    own_claim = w.get_claim(node, ns, "own-gpu")["metadata"]["uid"]
    minor = slave_minor(node, ns, "slave-gpu")
    assert minor == 1
    request = {
        "target_pod_uid": target["metadata"]["uid"],
        "container_name": "app",
        "slave_pod_uid": slave["metadata"]["uid"],
    }
    rule = f"c {NVIDIA_MAJOR}:{minor} rw"
    spec_before = spec_device_rules(node, cid)

    assert EPERM_TEXT in open_node(node, cid, minor)
    assert rule not in devices_list(node, cid)

    code, details, reply = call(node, "Attach", **request)
    assert code is grpc.StatusCode.OK, details
    assert not reply.already_attached and reply.attachment.container_id == cid
    assert [list(c.devices) for c in reply.attachment.claims] == [[f"vgpu-{minor}"]]
    assert ENXIO_TEXT in open_node(node, cid, minor)  # past the cgroup: the driver (none here) answers
    assert rule in devices_list(node, cid)
    # the slave's limits for the target's library: 2 GiB, 20 % of the slave's GPU
    (added,) = hotplugged(node, own_claim)
    assert (added.total_memory, added.hard_core, added.memory_limit) == (2 << 30, 20, True), added
    # containerd accepted the NRI update and dropped its device rules: the spec is unchanged
    assert spec_device_rules(node, cid) == spec_before

    code, _, again = call(node, "Attach", **request)
    assert code is grpc.StatusCode.OK and again.already_attached
    assert [a.container_id for a in attachments(node)] == [cid]
    assert node.metric_samples(names.HOTPLUG_ATTACHMENTS.name).count(({"state": "attached"}, 1.0)) == 1
    state = debug(node, "/debug/state?calls=0")["hotplug"]
    assert [(a["containerId"], a["state"]) for a in state["attachments"]] == [(cid, "attached")]

    attached = [c for c in hotplug_calls(node, request["target_pod_uid"]) if c["call"] == "Attach"]
    assert [c["outcome"] for c in attached] == ["ok", "ok"], attached
    assert attached[1]["detail"].startswith(f"slave pod {request['slave_pod_uid']}: already attached: claim")

    # a vgpud restart keeps the table and the grant
    node.restart_vgpud()
    assert [a.container_id for a in attachments(node)] == [cid]
    assert ENXIO_TEXT in open_node(node, cid, minor)

    code, details, _ = call(node, "Detach", **request)
    assert code is grpc.StatusCode.OK, details
    assert EPERM_TEXT in open_node(node, cid, minor)
    assert rule not in devices_list(node, cid)
    assert hotplugged(node, own_claim) == []
    assert attachments(node) == []
    code, details, _ = call(node, "Detach", **request)
    assert code is grpc.StatusCode.NOT_FOUND and "is not attached" in details

    # the calls since the restart (the recorder's ring buffer is in memory)
    calls = [(c["call"], c["outcome"]) for c in hotplug_calls(node, request["target_pod_uid"])]
    assert calls[-2:] == [("Detach", "ok"), ("Detach", "rejected")], calls
    samples = node.metric_samples(names.HOOK_CALLS.name)
    assert any(
        labels.get("component") == "hotplug" and labels.get("call") == "Detach" for labels, _ in samples
    )

    w.delete_pod(node, ns, "target")
    w.delete_pod(node, ns, "slave")
    w.release_claim(node, ns, "slave-gpu")
    w.release_claim(node, ns, "own-gpu")


def test_refusals(node: LocalNode) -> None:
    ns = w.namespace(node)
    slave, target, _ = vgpu_pods(node, ns)
    plain = w.create_pod(node, ns, "plain", [w.container("c")])
    w.wait_running(node, ns, "plain")
    uid, plain_uid = target["metadata"]["uid"], plain["metadata"]["uid"]
    cases = [
        (
            {"target_pod_uid": uid, "container_name": "app", "slave_pod_uid": plain_uid},
            grpc.StatusCode.FAILED_PRECONDITION,
            f"slave pod {plain_uid} has no vGPU claim prepared on this node",
        ),
        (
            {"target_pod_uid": plain_uid, "container_name": "c", "slave_pod_uid": slave["metadata"]["uid"]},
            grpc.StatusCode.FAILED_PRECONDITION,
            "is not a vGPU container",
        ),
        (
            {"target_pod_uid": uid, "container_name": "nope", "slave_pod_uid": slave["metadata"]["uid"]},
            grpc.StatusCode.NOT_FOUND,
            "container nope of pod",
        ),
        (
            {"target_pod_uid": "x", "container_name": "app", "slave_pod_uid": uid},
            grpc.StatusCode.INVALID_ARGUMENT,
            "not a pod UID",
        ),
    ]
    for fields, status, text in cases:
        code, details, _ = call(node, "Attach", **fields)
        assert (code, text in details) == (status, True), (fields, code, details)
    assert attachments(node) == []
    for pod in ("plain", "target", "slave"):
        w.delete_pod(node, ns, pod)
    w.release_claim(node, ns, "slave-gpu")
    w.release_claim(node, ns, "own-gpu")


def test_the_grant_goes_with_the_slave_pod_and_with_the_target(node: LocalNode) -> None:
    ns = w.namespace(node)
    slave, target, cid = vgpu_pods(node, ns)
    minor = slave_minor(node, ns, "slave-gpu")
    request = {
        "target_pod_uid": target["metadata"]["uid"],
        "container_name": "app",
        "slave_pod_uid": slave["metadata"]["uid"],
    }
    assert call(node, "Attach", **request)[0] is grpc.StatusCode.OK
    assert ENXIO_TEXT in open_node(node, cid, minor)

    # the slave pod goes: its claim is unprepared, and the target loses the GPU
    w.delete_pod(node, ns, "slave")
    w.wait_for(lambda: attachments(node) == [], what="the attachment removed after the slave pod went")
    assert EPERM_TEXT in open_node(node, cid, minor)
    w.release_claim(node, ns, "slave-gpu")

    # the target goes: the record goes with it
    w.create_claim(node, ns, "slave-gpu2", [w.on_gpu(w.vgpu_request("gpu", "2Gi", "20"), 1)])
    slave = w.create_pod(node, ns, "slave2", [w.container("hold", [("gpu", None)])], {"gpu": "slave-gpu2"})
    w.wait_running(node, ns, "slave2")
    request["slave_pod_uid"] = slave["metadata"]["uid"]
    assert call(node, "Attach", **request)[0] is grpc.StatusCode.OK
    w.delete_pod(node, ns, "target")
    w.wait_for(lambda: attachments(node) == [], what="the attachment forgotten after the target went")
    calls = [c for c in hotplug_calls(node, request["target_pod_uid"]) if c["call"] == "Reconcile"]
    assert any("no longer runs" in c["detail"] for c in calls), calls
    assert any("is no longer prepared" in c["detail"] for c in calls), calls
    w.delete_pod(node, ns, "slave2")
    w.release_claim(node, ns, "slave-gpu2")
    w.release_claim(node, ns, "own-gpu")
