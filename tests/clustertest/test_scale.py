"""Scale on the real scheduler (issue 35, item 4): three nodes of two simulated A100s each, 100 vGPU
pods with random memory and core requests submitted at once. More is asked than the six GPUs hold, so
some pods must wait.

- Every pod is either Running with the limits it asked for, or unscheduled with a FailedScheduling
  event; none is left waiting while a GPU still has room for it.
- No GPU is allocated past its published capacity; every allocation is on a device of the node the
  pod runs on.
- The time from the first submission to every placed pod Running is printed (`make cluster-test`).
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.clustertest.placement import (
    NOTHING,
    Amount,
    DeviceKey,
    amount,
    capacities,
    consumed,
    overcommitted,
    room_for,
)
from tests.e2e import workload as w
from tests.e2e.cluster import LocalCluster, NodeSpec, started
from tests.e2e.node import DRIVER, LocalNode, node_available
from tests.support import require

NODES = 3
PODS = 100
#: random requests: memory in 512 MiB steps up to 6 GiB, 1 to 12 cores (the six GPUs hold 240 GiB
#: and 600 cores; the mean asks are about 325 GiB and 650 cores)
MEMORY_STEPS_MIB = range(512, 6 * 1024 + 1, 512)
CORES = range(1, 13)
SETTLE_TIMEOUT_S = 900.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    require(node_available(), "the local node's runtime", "run make node-deps (make cluster-test does)")
    with started([NodeSpec(f"node-{i}", nri=True) for i in range(NODES)]) as local:
        yield local


def listed(node: LocalNode, path: str) -> list[dict[str, Any]]:
    return node.get(path)["items"]


def test_a_hundred_random_pods_are_placed_within_capacity(cluster: LocalCluster) -> None:
    node = cluster.nodes["node-0"]
    ns = w.namespace(node, "scale")
    seed = int(os.environ.get("CLUSTER_SCALE_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    asked: dict[str, dict[str, str]] = {}  # pod (and its claim) -> its requests
    started = time.monotonic()
    for i in range(PODS):
        name = f"p{i:03d}"
        asked[name] = {"memory": f"{rng.choice(MEMORY_STEPS_MIB)}Mi", "cores": str(rng.choice(CORES))}
        w.create_claim(node, ns, name, [w.vgpu_request("gpu", **asked[name])])
        w.create_pod(node, ns, name, [w.container("main", [("gpu", None)])], {"gpu": name})
    submitted = time.monotonic() - started
    capacity = capacities(listed(node, "/apis/resource.k8s.io/v1/resourceslices"), DRIVER)
    assert len(capacity) == 2 * NODES, capacity

    def settled() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]] | None:
        pods = {p["metadata"]["name"]: p for p in listed(node, f"/api/v1/namespaces/{ns}/pods")}
        claims = {
            c["metadata"]["name"]: c
            for c in listed(node, f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")
        }
        failed = {
            e["involvedObject"]["name"]: e
            for e in listed(node, f"/api/v1/namespaces/{ns}/events")
            if e["reason"] == "FailedScheduling"
        }
        used = consumed(claims.values(), DRIVER)
        for name, pod in pods.items():
            if pod["spec"].get("nodeName"):
                if not running(pod):
                    return None
            elif name not in failed or room_for(amount(asked[name]), capacity, used):
                return None
        return pods, claims, failed

    state = w.wait_for(
        settled, timeout=SETTLE_TIMEOUT_S, interval=2, what=f"the {PODS} pods placed or waiting (seed {seed})"
    )
    elapsed = time.monotonic() - started
    pods, claims, failed = state
    placed = {name: pod for name, pod in pods.items() if pod["spec"].get("nodeName")}
    used = consumed(claims.values(), DRIVER)
    assert overcommitted(capacity, used) == [], seed
    for name, pod in placed.items():
        results = claims[name]["status"]["allocation"]["devices"]["results"]
        assert [r["pool"] for r in results] == [pod["spec"]["nodeName"]], (name, results)
        assert amount(results[0]["consumedCapacity"]) == amount(asked[name]), (
            name,
            results,
        )
        limits = w.vgpu_limits(
            w.container_env(cluster.nodes[pod["spec"]["nodeName"]], w.container_id(pod, "main"))
        )
        index = results[0]["device"].removeprefix("vgpu-")  # limits are indexed by the GPU minor
        assert limits.get(f"CUDA_MEM_LIMIT_{index}") == asked[name]["memory"].replace("Mi", "m"), (
            name,
            limits,
        )
        assert limits.get(f"CUDA_CORE_LIMIT_{index}") == asked[name]["cores"], (name, limits)
    for name in set(pods) - set(placed):
        assert not claims[name].get("status", {}).get("allocation"), name
    per_node = {n: sum(p["spec"]["nodeName"] == n for p in placed.values()) for n in cluster.nodes}
    reasons = sorted({e["message"] for e in failed.values()})
    print(
        f"\ncluster scale (seed {seed}): {PODS} pods submitted in {submitted:.1f} s; {len(placed)} placed "
        f"{per_node}, all Running {elapsed:.1f} s after the first submission; {PODS - len(placed)} waiting "
        f"with FailedScheduling: {reasons}; GPU use: {gpu_use(capacity, used)}",
        flush=True,
    )


def running(pod: dict[str, Any]) -> bool:
    statuses = pod["status"].get("containerStatuses", [])
    return (
        pod["status"].get("phase") == "Running" and bool(statuses) and all(s.get("ready") for s in statuses)
    )


def gpu_use(capacity: dict[DeviceKey, Amount], used: dict[DeviceKey, Amount]) -> str:
    parts = []
    for key, total in sorted(capacity.items()):
        taken = used.get(key, NOTHING)
        memory = f"{taken.memory >> 20}/{total.memory >> 20} MiB"
        parts.append(f"{key[0]}/{key[1]} {memory} {taken.cores}/{total.cores} cores")
    return ", ".join(parts)
