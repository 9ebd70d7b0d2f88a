"""The control library enforces a claim's memory on a real node, both tracks: a dynamic-libc container
runs a CUDA program (memprobe) with libvgpu-control.so preloaded and the fake driver handed over by
vgpud's edits, as NVIDIA's container toolkit hands over the real one (tests/e2e/fakegpu.py). vgpud runs
on the fake NVML of the same driver root, so its metrics and debug state show what each container
holds, by the host PIDs the fake kernel records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e import fakegpu
from tests.e2e import workload as w
from tests.e2e.conftest import FAKE_GPU_TRACKS
from tests.e2e.node import DRIVER, LocalNode
from vgpud import metrics_names as names
from vgpud.observe.client import Endpoint, get_json

MiB, GiB = 1 << 20, 1 << 30
CHUNK = 256 * MiB
CUDA_ERROR_OUT_OF_MEMORY = 2
RESULT_KEYS = ("count", "total", "error")


#: every test here runs on both tracks with vgpud and the containers on the simulated GPUs
pytestmark = pytest.mark.parametrize("node", sorted(FAKE_GPU_TRACKS), indirect=True)


def pinned_request(name: str, memory: str, uuid: str) -> dict[str, Any]:
    """A vGPU request of `memory` (10 cores) on the GPU with `uuid`."""
    req = w.vgpu_request(name, memory, "10")
    expression = f"device.attributes['{DRIVER}'].uuid == '{uuid}'"
    req["exactly"]["selectors"] = [{"cel": {"expression": expression}}]
    return req


def first_gpu_uuid(node: LocalNode) -> str:
    devices = sorted((d for s in node.slices() for d in s["spec"]["devices"]), key=lambda d: d["name"])
    return devices[0]["attributes"]["uuid"]["string"]


def used_by_partition(node: LocalNode, claim_uid: str) -> dict[str, tuple[str, float]]:
    """partition -> (uuid, used bytes) of the claim's containers, from vgpud's metrics."""
    return {
        labels["partition"]: (labels["uuid"], value)
        for labels, value in node.metric_samples(names.CONTAINER_MEMORY_USED.name)
        if labels["claim_uid"] == claim_uid
    }


def debug_usage(node: LocalNode, claim_uid: str) -> dict[str, dict[str, Any]]:
    """partition -> its usage entry in vgpud's debug state."""
    state = get_json(Endpoint(unix_path=node.debug_socket), "/debug/state?calls=0")
    containers = (state.get("usage") or {}).get("containers", {})
    return {v["partition"]: v for k, v in containers.items() if k.startswith(f"{claim_uid}/")}


def wait_used(node: LocalNode, claim_uid: str, expect: list[float]) -> dict[str, tuple[str, float]]:
    return w.wait_for(
        lambda: (
            (got := used_by_partition(node, claim_uid))
            and sorted(v for _, v in got.values()) == expect
            and got
        ),
        what=f"vgpud's used-memory metric of claim {claim_uid} at {expect}",
    )


def test_container_gets_oom_at_its_claims_memory(node: LocalNode) -> None:
    ns = w.namespace(node)
    claim = w.create_claim(node, ns, "gpu", [w.vgpu_request("gpu", "4Gi", "10")])
    uid = claim["metadata"]["uid"]
    probe = fakegpu.probe_container(node, "main", None, "fill", "direct", str(CHUNK), "hold")
    fakegpu.create_probe_pod(node, ns, "p", [probe], "gpu")
    pod = w.wait_running(node, ns, "p")

    # the probe's own environment, read from the host
    cid = w.container_id(pod, "main")
    environ = Path(f"/proc/{w.task_pid(node, cid)}/environ").read_bytes()
    env = dict(item.split("=", 1) for item in environ.decode().split("\0") if "=" in item)
    assert env["LD_PRELOAD"] == "/etc/vgpu-manager/driver/libvgpu-control.so", env
    out = fakegpu.probe_result(node, ns, pod, "main", RESULT_KEYS)
    # the fake GPU has 40 GiB free: only the library refuses at the claim's 4 GiB
    assert int(out["error"]) == CUDA_ERROR_OUT_OF_MEMORY, out
    assert int(out["total"]) == 4 * GiB, out
    assert int(out["count"]) == 4 * GiB // CHUNK, out

    used = wait_used(node, uid, [4 * GiB])
    (partition,) = used
    entry = debug_usage(node, uid)[partition]
    (device,) = [d for d in entry["devices"].values() if d["memory_limit_bytes"] is not None]
    assert device["memory_limit_bytes"] == 4 * GiB, entry
    assert device["used_bytes"] == 4 * GiB and device["nvml_bytes"] == 4 * GiB, entry

    # a second process of the container shares the limit: it sees the limited view, full, and is refused
    info = fakegpu.parse(w.exec_in(node, cid, f"{fakegpu.PROBE} info").stdout)
    assert int(info["meminfo_total"]) == 4 * GiB and int(info["meminfo_free"]) == 0, info
    more = fakegpu.parse(w.exec_in(node, cid, f"{fakegpu.PROBE} fill direct {CHUNK}").stdout)
    assert (int(more["count"]), int(more["error"])) == (0, CUDA_ERROR_OUT_OF_MEMORY), more

    w.delete_pod(node, ns, "p")
    w.release_claim(node, ns, "gpu")


def test_two_containers_on_one_gpu_are_limited_independently(node: LocalNode) -> None:
    ns = w.namespace(node)
    uuid = first_gpu_uuid(node)
    requests = [pinned_request("a", "2Gi", uuid), pinned_request("b", "3Gi", uuid)]
    uid = w.create_claim(node, ns, "gpu", requests)["metadata"]["uid"]
    containers = [
        fakegpu.probe_container(node, "ca", "a", "fill", "direct", str(CHUNK), "hold"),
        fakegpu.probe_container(node, "cb", "b", "fill", "direct", str(CHUNK), "hold"),
    ]
    fakegpu.create_probe_pod(node, ns, "p", containers, "gpu")
    pod = w.wait_running(node, ns, "p")

    for name, limit in (("ca", 2 * GiB), ("cb", 3 * GiB)):
        out = fakegpu.probe_result(node, ns, pod, name, RESULT_KEYS)
        assert int(out["error"]) == CUDA_ERROR_OUT_OF_MEMORY, (name, out)
        assert int(out["total"]) == limit, (name, out)

    used = wait_used(node, uid, [2 * GiB, 3 * GiB])
    # both on the one GPU (the slice's uuid attribute is lower case, NVML's UUID is not)
    assert {u.lower() for u, _ in used.values()} == {uuid.lower()}, used
    usage = debug_usage(node, uid)
    assert sorted(
        d["used_bytes"] for entry in usage.values() for d in entry["devices"].values() if d["used_bytes"]
    ) == [2 * GiB, 3 * GiB], usage

    w.delete_pod(node, ns, "p")
    w.release_claim(node, ns, "gpu")
    # the fake driver drops a dead process's memory: nothing is left charged on the GPU
    w.wait_for(lambda: not used_by_partition(node, uid), what="the claim's usage gone from the metrics")
