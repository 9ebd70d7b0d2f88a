"""`vgpud run` as a child process, as a node daemon runs it: mock GPUs (or the GPU flags given),
every host path under one temp root, a real API server. Shared by the conformance and e2e tests and
by `make demo`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import trio

from tests.kubeapi import ApiServer, api_request, free_port
from tests.stdproto import message_class
from vgpud.dra.slices import SliceKeeper
from vgpud.gpu.health import HealthBoard
from vgpud.gpu.model import GpuInfo
from vgpud.kube.client import KubeClient

DRIVER = "manager.nvidia.com"
SERVING = 1  # grpc.health.v1.HealthCheckResponse.ServingStatus
MOCK_GPUS = ("--gpu-backend", "mock", "--gpu-profile", "a100-40gb-x2")


def ensure_node(api: ApiServer, name: str) -> None:
    """The Node object that owns this node's ResourceSlice (created once; 409 means it exists)."""
    try:
        api_request(api, "POST", "/api/v1/nodes", {"metadata": {"name": name}})
    except urllib.error.HTTPError as err:
        if err.code != 409:
            raise


def node_slices(api: ApiServer, node: str, driver: str = DRIVER) -> list[dict[str, Any]]:
    selector = urllib.parse.quote(f"spec.driver={driver},spec.nodeName={node}")
    return api_request(api, "GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector={selector}")[
        "items"
    ]


class Vgpud:
    """One `vgpud run` child process; `stop` sends a signal and returns the exit code."""

    def __init__(
        self,
        root: Path,
        *,
        node: str,
        port: int,
        kubeconfig: Path,
        extra: Sequence[str] = (),
        prefix: Sequence[str] = (),
        gpus: Sequence[str] = MOCK_GPUS,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.root, self.node, self.port = root, node, port
        self.log = root / "vgpud.log"
        argv = [
            *prefix,
            sys.executable,
            "-m",
            "vgpud",
            "run",
            *gpus,
            "--root-prefix",
            str(root),
            "--node-name",
            node,
            "--kubeconfig",
            str(kubeconfig),
            "--healthcheck-address",
            "127.0.0.1",
            "--healthcheck-port",
            str(port),
            "--metrics-address",
            f"127.0.0.1:{free_port()}",  # never the default 9464 another daemon may hold
            *extra,
        ]
        self.proc = subprocess.Popen(
            argv,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )

    @property
    def dra_socket(self) -> Path:
        return self.root / f"var/lib/kubelet/plugins/{DRIVER}/dra.sock"

    def output(self) -> str:
        return self.log.read_text()

    def health(self, service: str = "liveness") -> int:
        """Health.Check through grpcio with protoc-built classes; the status number."""
        request_cls = message_class("grpc.health.v1.HealthCheckRequest")
        response_cls = message_class("grpc.health.v1.HealthCheckResponse")
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as channel:
            call = channel.unary_unary(
                "/grpc.health.v1.Health/Check",
                request_serializer=request_cls.SerializeToString,
                response_deserializer=response_cls.FromString,
            )
            return call(request_cls(service=service), timeout=2).status

    def wait_serving(self, deadline: float = 30) -> None:
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"vgpud exited early:\n{self.output()}")
            try:
                if self.health() == SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"vgpud never became SERVING:\n{self.output()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def dra_call(socket: Path, kind: str, claims: Sequence[dict[str, Any]], version: str = "v1") -> Any:
    """NodePrepareResources / NodeUnprepareResources (`kind` Prepare / Unprepare) through grpcio, as the
    kubelet makes it, for claims given as API objects."""
    package = f"k8s.io.kubelet.pkg.apis.dra.{version}"
    request = message_class(f"{package}.Node{kind}ResourcesRequest")()
    for claim in claims:
        meta = claim["metadata"]
        request.claims.add(namespace=meta["namespace"], uid=meta["uid"], name=meta["name"])
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        call = channel.unary_unary(
            f"/{package}.DRAPlugin/Node{kind}Resources",
            request_serializer=request.SerializeToString,
            response_deserializer=message_class(f"{package}.Node{kind}ResourcesResponse").FromString,
        )
        return call(request, timeout=30)


def create_allocated_claim(
    api: ApiServer,
    *,
    namespace: str,
    name: str,
    node: str,
    containers: dict[str, dict[str, str]],
    device: str = "vgpu-0",
) -> tuple[dict, dict]:
    """A pod whose containers each use one request of one vGPU claim (`containers`: container ->
    capacity request), and the claim allocated as the scheduler would: one share of `device` per request,
    with its consumed capacity, reserved for the pod. Returns (pod, claim) as the API server has them."""
    try:
        api_request(
            api,
            "POST",
            "/apis/resource.k8s.io/v1/deviceclasses",
            {
                "metadata": {"name": "vgpu-manager"},
                "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
            },
        )
    except urllib.error.HTTPError as err:
        if err.code != 409:
            raise
    requests = [
        {"name": f"r-{ctr}", "exactly": {"deviceClassName": "vgpu-manager", "capacity": {"requests": cap}}}
        for ctr, cap in containers.items()
    ]
    claim = api_request(
        api,
        "POST",
        f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims",
        {"metadata": {"name": name}, "spec": {"devices": {"requests": requests}}},
    )
    pod = api_request(
        api,
        "POST",
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "metadata": {"name": f"{name}-pod"},
            "spec": {
                "nodeName": node,
                "containers": [
                    {
                        "name": ctr,
                        "image": "busybox",
                        "resources": {"claims": [{"name": "gpu", "request": f"r-{ctr}"}]},
                    }
                    for ctr in containers
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            },
        },
    )
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": r["name"],
                        "driver": DRIVER,
                        "pool": node,
                        "device": device,
                        "shareID": str(uuid.uuid4()),
                        "consumedCapacity": r["exactly"]["capacity"]["requests"],
                    }
                    for r in requests
                ]
            }
        },
        "reservedFor": [{"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}],
    }
    claim = api_request(
        api, "PUT", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}/status", claim
    )
    return pod, claim


async def run_keeper(
    api: ApiServer,
    node: str,
    driver: str,
    body: Callable[[], Awaitable[object]],
    *,
    gpus: Sequence[GpuInfo],
    board: HealthBoard | None = None,
    nri_mode: bool = False,
) -> SliceKeeper:
    """SliceKeeper (a daemon's slice publisher) with the real client, published, while `body` runs;
    stopped after it. `nri_mode`: the mode the daemon would run in."""
    await trio.to_thread.run_sync(ensure_node, api, node)
    client = KubeClient.from_config(api.kubeconfig)
    keeper = SliceKeeper(
        client,
        driver=driver,
        node_name=node,
        gpus=gpus,
        cores_ratio=100,
        memory_ratio=100,
        nri_mode=nri_mode,
        sysfs=None,
        health=board,
    )
    try:
        async with trio.open_nursery() as nursery:

            async def serve(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                await keeper.run(task_status.started)

            await nursery.start(serve)  # started once the server holds the slice
            await body()
            nursery.cancel_scope.cancel()
    finally:
        client.close()
    return keeper
