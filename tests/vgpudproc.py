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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from tests.kubeapi import ApiServer, api_request, free_port
from tests.stdproto import message_class

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
