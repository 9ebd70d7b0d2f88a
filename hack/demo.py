"""`make demo`: vgpud on a local control plane, preparing a vGPU claim the way the kubelet does.

1. starts a real etcd + kube-apiserver on loopback (from hack/install-kube.sh) and registers a Node;
2. runs `vgpud run` with mock GPUs (2x A100-40GB), as the DaemonSet runs it, paths under a temp root;
3. shows its health and the ResourceSlice it published (consumable memory and cores);
4. creates a pod whose two containers use two requests of one vGPU claim, allocates the claim by hand
   (what the scheduler does: a device, a share ID and the consumed capacity per request), and calls
   NodePrepareResources on vgpud's DRA socket, as the kubelet would;
5. prints what each container receives (the CDI devices: env and mounts) and the directories made;
6. waits (Ctrl-C when interactive, DEMO_SECONDS otherwise), unprepares, stops everything.

Until the local node with containerd and kubelet exists, this is how far the main job can be watched.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from grpclib.client import Channel  # noqa: E402

from tests.kubeapi import ApiServer, api_request, free_port, start_apiserver  # noqa: E402
from vgpud._pb.k8s.io.kubelet.pkg.apis.dra import v1 as dra  # noqa: E402
from vgpud.dra.cdi import spec_path  # noqa: E402

DRIVER = "manager.nvidia.com"
NODE = "demo-node"
NAMESPACE = "default"
VGPUD = [sys.executable, "-m", "vgpud"]
BOLD, RESET = ("\033[1m", "\033[0m") if sys.stdout.isatty() else ("", "")


def section(title: str) -> None:
    print(f"\n{BOLD}== {title}{RESET}", flush=True)


def create(api: ApiServer, path: str, body: dict) -> dict:
    return api_request(api, "POST", path, body)


def wait_serving(port: int, proc: subprocess.Popen[bytes], log: Path) -> str:
    status = ""
    for _ in range(150):
        if proc.poll() is not None:
            sys.exit(f"vgpud exited early:\n{log.read_text()}")
        status = subprocess.run(
            [*VGPUD, "health", "--address", f"127.0.0.1:{port}", "--timeout", "1"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        if status == "SERVING":
            break
        time.sleep(0.2)
    return status


def show_slice(api: ApiServer) -> None:
    selector = f"spec.driver%3D{DRIVER},spec.nodeName%3D{NODE}"
    for item in api_request(api, "GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector={selector}")[
        "items"
    ]:
        print(f"ResourceSlice {item['metadata']['name']} (pool {item['spec']['pool']['name']}):")
        for device in item["spec"]["devices"]:
            attrs = device["attributes"]
            caps = {name: cap["value"] for name, cap in device["capacity"].items()}
            print(
                f"  {device['name']}: {attrs['productName']['string']} uuid={attrs['uuid']['string']} "
                f"capacity={caps} allowMultipleAllocations={device.get('allowMultipleAllocations')}"
            )


def make_pod_and_claim(api: ApiServer) -> tuple[dict, dict]:
    """A pod with containers `trainer` (request r-train) and `sidecar-eval` (r-eval), one claim."""
    create(
        api,
        "/apis/resource.k8s.io/v1/deviceclasses",
        {
            "metadata": {"name": "vgpu-manager"},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
        },
    )
    requests = [
        {
            "name": "r-train",
            "exactly": {
                "deviceClassName": "vgpu-manager",
                "capacity": {"requests": {"memory": "8Gi", "cores": "50"}},
            },
        },
        {
            "name": "r-eval",
            "exactly": {
                "deviceClassName": "vgpu-manager",
                "capacity": {"requests": {"memory": "4Gi", "cores": "20"}},
            },
        },
    ]
    claim = create(
        api,
        f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims",
        {"metadata": {"name": "shared-gpu"}, "spec": {"devices": {"requests": requests}}},
    )

    def container(name: str, request: str) -> dict:
        return {
            "name": name,
            "image": "busybox",
            "resources": {"claims": [{"name": "gpu", "request": request}]},
        }

    pod = create(
        api,
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        {
            "metadata": {"name": "vgpu-demo"},
            "spec": {
                "nodeName": NODE,
                "containers": [container("trainer", "r-train"), container("sidecar-eval", "r-eval")],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "shared-gpu"}],
            },
        },
    )
    # What the scheduler writes: one share of vgpu-0 per request, with the capacity it consumed.
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": r["name"],
                        "driver": DRIVER,
                        "pool": NODE,
                        "device": "vgpu-0",
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
        api, "PUT", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/shared-gpu/status", claim
    )
    return pod, claim


async def kubelet_call(socket: Path, claim: dict, prepare: bool) -> object:
    channel = Channel(path=str(socket))
    meta = claim["metadata"]
    claims = [dra.Claim(namespace=meta["namespace"], uid=meta["uid"], name=meta["name"])]
    try:
        stub = dra.DraPluginStub(channel)
        if prepare:
            return await stub.node_prepare_resources(dra.NodePrepareResourcesRequest(claims=claims))
        return await stub.node_unprepare_resources(dra.NodeUnprepareResourcesRequest(claims=claims))
    finally:
        channel.close()


def show_injection(root: Path, pod: dict, claim: dict, reply: object) -> None:
    uid = claim["metadata"]["uid"]
    entry = reply.claims[uid]  # type: ignore[attr-defined]
    if entry.error:
        sys.exit(f"Prepare failed: {entry.error}")
    spec = json.loads(spec_path(root / "var/run/cdi", DRIVER, uid).read_text())
    by_id = {f"{spec['kind']}={d['name']}": d for d in spec["devices"]}
    print(f"(host paths below are relative to the demo root {root})")
    print("Claim-wide edits (every container of the claim):")
    for env in spec["containerEdits"]["env"]:
        print(f"    env   {env}")
    for mount in spec["containerEdits"]["mounts"]:
        host = mount["hostPath"].removeprefix(str(root))
        print(f"    mount {host} -> {mount['containerPath']} ({','.join(mount['options'])})")
    for container in pod["spec"]["containers"]:
        request = container["resources"]["claims"][0]["request"]
        print(f"Container {container['name']} (request {request}):")
        for device in entry.devices:
            if request not in device.request_names:
                continue
            print(
                f"  device {device.device_name} share {device.share_id}\n  CDI id {device.cdi_device_ids[0]}"
            )
            edits = by_id[device.cdi_device_ids[0]]["containerEdits"]
            for env in edits["env"]:
                print(f"    env   {env}")
            for mount in edits.get("mounts", []):
                print(f"    mount {mount['hostPath'].removeprefix(str(root))} -> {mount['containerPath']}")
    claim_dir = root / "etc/vgpu-manager/claims" / uid
    print(f"Directories under {claim_dir.relative_to(root)}:")
    for path in sorted(claim_dir.rglob("*")):
        print(f"    {path.relative_to(claim_dir)}{'/' if path.is_dir() else ''}")


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="vgdemo", dir="/tmp"))
    api: ApiServer | None = None
    proc: subprocess.Popen[bytes] | None = None
    try:
        section("Starting etcd + kube-apiserver on 127.0.0.1")
        api = start_apiserver(root / "kube")
        print(f"API server {api.url}, kubeconfig {api.kubeconfig}")
        create(api, "/api/v1/nodes", {"metadata": {"name": NODE}})

        section("GPUs (mock profile a100-40gb-x2)")
        subprocess.run([*VGPUD, "gpus", "--gpu-backend", "mock", "--gpu-profile", "a100-40gb-x2"], check=True)

        port = free_port()
        log = root / "vgpud.log"
        section(f"Starting vgpud run (log {log})")
        proc = subprocess.Popen(
            [
                *VGPUD,
                "run",
                "--gpu-backend",
                "mock",
                "--gpu-profile",
                "a100-40gb-x2",
                "--root-prefix",
                str(root),
                "--node-name",
                NODE,
                "--kubeconfig",
                str(api.kubeconfig),
                "--healthcheck-address",
                "127.0.0.1",
                "--healthcheck-port",
                str(port),
            ],
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        print(f"health (grpc.health.v1 'liveness' on 127.0.0.1:{port}): {wait_serving(port, proc, log)}")

        section("What vgpud published")
        show_slice(api)

        section("A pod with two containers on two requests of one vGPU claim, allocated on vgpu-0")
        pod, claim = make_pod_and_claim(api)
        dra_socket = root / f"var/lib/kubelet/plugins/{DRIVER}/dra.sock"
        reply = asyncio.run(kubelet_call(dra_socket, claim, prepare=True))

        section("NodePrepareResources (as the kubelet calls it): what each container gets")
        show_injection(root, pod, claim, reply)

        if sys.stdin.isatty():
            section(f"vgpud is running (pid {proc.pid}, log {log}). Press Ctrl-C to clean up.")
            try:
                signal.pause()
            except KeyboardInterrupt:
                print()
        else:
            time.sleep(float(os.environ.get("DEMO_SECONDS", "2")))

        section("NodeUnprepareResources, then SIGTERM")
        unprepared = asyncio.run(kubelet_call(dra_socket, claim, prepare=False))
        print(f"unprepare errors: {[e.error for e in unprepared.claims.values() if e.error] or 'none'}")
        print(
            f"claim directory left: {(root / 'etc/vgpu-manager/claims' / claim['metadata']['uid']).exists()}"
        )
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
        print(f"vgpud exit code {rc}; log tail:")
        print("".join(log.read_text().splitlines(keepends=True)[-6:]), end="")
        left = [str(p) for p in root.rglob("*.sock") if p.is_socket()]
        print(f"sockets left behind: {left or 'none'}")
        return rc
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if api is not None:
            api.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
