"""The registry's caches against a real kube-apiserver: a registration that arrives before its pod is
on this node waits, and resolves when the pod watch delivers the pod (here: when it is bound to the
node, as the scheduler does), with no API request of its own."""

from __future__ import annotations

import functools
import secrets
import urllib.error
from pathlib import Path
from typing import Any

import trio

from tests import objects as o
from tests.kubeapi import ApiServer, api_request
from tests.unit.registry.world import Ref, World, container_id, injected, running
from vgpud.kube.client import KubeClient
from vgpud.kube.informer import claim_informer, pod_informer
from vgpud.partition.assigner import RegisterQuery
from vgpud.partition.pidsfile import reset_pids_file
from vgpud.registry.identity import identify
from vgpud.registry.resolve import Resolved

PID = 4242
DEADLINE_S = 30


def call(server: ApiServer, method: str, path: str, body: Any = None) -> dict[str, Any]:
    return api_request(server, method, path, body)


async def acall(server: ApiServer, method: str, path: str, body: Any = None) -> dict[str, Any]:
    return await trio.to_thread.run_sync(functools.partial(call, server, method, path, body))


def unbound_running_pod(server: ApiServer, ns: str, claim_name: str, cid: str) -> dict[str, Any]:
    """A pod not bound to any node yet whose status already says `main` runs as `cid`."""
    pod = call(
        server,
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        {
            "metadata": {"name": "p"},
            "spec": {
                "containers": [
                    {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            },
        },
    )
    pod["status"] = {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "main",
                "ready": True,
                "restartCount": 0,
                "image": "busybox",
                "imageID": "",
                "containerID": f"containerd://{cid}",
                "state": {"running": {"startedAt": "2025-01-01T00:00:00Z"}},
            }
        ],
    }
    return call(server, "PUT", f"/api/v1/namespaces/{ns}/pods/p/status", pod)


def claim_reserved_for(
    server: ApiServer, ns: str, name: str, pod: dict[str, Any], node: str
) -> dict[str, Any]:
    try:
        call(
            server,
            "POST",
            "/apis/resource.k8s.io/v1/deviceclasses",
            {"metadata": {"name": "vgpu-manager"}, "spec": {}},
        )
    except urllib.error.HTTPError as err:
        if err.code != 409:
            raise
    path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
    request = {"name": "gpu", "exactly": {"deviceClassName": "vgpu-manager"}}
    claim = call(
        server, "POST", path, {"metadata": {"name": name}, "spec": {"devices": {"requests": [request]}}}
    )
    claim["status"] = {
        "allocation": {
            "devices": {"results": [{"request": "gpu", "driver": o.DRIVER, "pool": node, "device": "vgpu-0"}]}
        },
        "reservedFor": [{"resource": "pods", "name": "p", "uid": pod["metadata"]["uid"]}],
    }
    return call(server, "PUT", f"{path}/{name}/status", claim)


async def test_a_registration_waiting_for_its_pod_resolves_when_the_watch_delivers_it(
    kube_apiserver: ApiServer, short_tmp: Path
) -> None:
    server, tag = kube_apiserver, secrets.token_hex(4)
    ns, node, cid = f"reg-{tag}", f"node-{tag}", container_id(7)
    call(server, "POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    pod = unbound_running_pod(server, ns, "c", cid)
    claim = claim_reserved_for(server, ns, "c", pod, node)
    uid, claim_uid = pod["metadata"]["uid"], claim["metadata"]["uid"]

    world = World(short_tmp)  # this node's /proc, cgroups, containers, checkpoint index and directories
    world.containers.replace([])
    world.claims.prepared[claim_uid] = Ref(ns, claim_uid, "c")
    paths = world.assigner.paths(claim_uid, uid, "main")
    for directory in paths.directories:
        Path(directory).mkdir(parents=True, exist_ok=True)
    reset_pids_file(Path(paths.config))
    world.containers.set(injected(cid, uid, "main", claim_uid, paths.base, namespace=ns))
    world.place(PID, uid, cid)
    caller = identify(world.proc, PID)

    kube = KubeClient.from_config(server.kubeconfig)
    world.pods, world.claim_objects = pod_informer(kube, node), claim_informer(kube)
    resolver = world.resolver()
    try:
        with trio.fail_after(DEADLINE_S):
            async with running(world.pods, world.claim_objects), trio.open_nursery() as nursery:
                lists_and_watches = (world.pods.lists, world.pods.watches)
                results: list[Resolved] = []

                async def register() -> None:
                    results.append(
                        await resolver.resolve(RegisterQuery(pod_uid=uid, container="main"), caller)
                    )

                nursery.start_soon(register)
                await trio.sleep(0.5)  # it waits: the pod is on no node yet
                assert results == [] and world.pods.get(ns, "p") is None
                binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}}
                binding["target"] = {"apiVersion": "v1", "kind": "Node", "name": node}
                await acall(server, "POST", f"/api/v1/namespaces/{ns}/pods/p/binding", binding)
        (resolved,) = results
        assert Path(resolved.target.config_dir) == Path(paths.config)
        assert resolved.pids == (PID,) and resolved.target.claim_uid == claim_uid
        # the pod came by the open watch: no list, no new watch
        assert (world.pods.lists, world.pods.watches) == lists_and_watches
    finally:
        kube.close()
