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

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.kubeapi import ApiServer, free_port, start_apiserver  # noqa: E402
from tests.vgpudproc import Vgpud, create_allocated_claim, dra_call, ensure_node, node_slices  # noqa: E402
from vgpud.dra.cdi import spec_path  # noqa: E402

DRIVER = "manager.nvidia.com"
NODE = "demo-node"
NAMESPACE = "default"
VGPUD = [sys.executable, "-m", "vgpud"]
BOLD, RESET = ("\033[1m", "\033[0m") if sys.stdout.isatty() else ("", "")


def section(title: str) -> None:
    print(f"\n{BOLD}== {title}{RESET}", flush=True)


def show_slice(api: ApiServer) -> None:
    for item in node_slices(api, NODE):
        print(f"ResourceSlice {item['metadata']['name']} (pool {item['spec']['pool']['name']}):")
        for device in item["spec"]["devices"]:
            attrs = device["attributes"]
            caps = {name: cap["value"] for name, cap in device["capacity"].items()}
            print(
                f"  {device['name']}: {attrs['productName']['string']} uuid={attrs['uuid']['string']} "
                f"capacity={caps} allowMultipleAllocations={device.get('allowMultipleAllocations')}"
            )


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
    vgpud: Vgpud | None = None
    try:
        section("Starting etcd + kube-apiserver on 127.0.0.1")
        api = start_apiserver(root / "kube")
        print(f"API server {api.url}, kubeconfig {api.kubeconfig}")
        ensure_node(api, NODE)

        section("GPUs (mock profile a100-40gb-x2)")
        subprocess.run([*VGPUD, "gpus", "--gpu-backend", "mock", "--gpu-profile", "a100-40gb-x2"], check=True)

        vgpud = Vgpud(root, node=NODE, port=free_port(), kubeconfig=api.kubeconfig)
        section(f"Starting vgpud run (log {vgpud.log})")
        vgpud.wait_serving()
        status = subprocess.run(
            [*VGPUD, "health", "--address", f"127.0.0.1:{vgpud.port}"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        print(f"vgpud health --address 127.0.0.1:{vgpud.port}: {status}")

        section("What vgpud published")
        show_slice(api)

        section("A pod with two containers on two requests of one vGPU claim, allocated on vgpu-0")
        pod, claim = create_allocated_claim(
            api,
            namespace=NAMESPACE,
            name="shared-gpu",
            node=NODE,
            containers={
                "trainer": {"memory": "8Gi", "cores": "50"},
                "sidecar-eval": {"memory": "4Gi", "cores": "20"},
            },
        )
        print(
            f"pod {pod['metadata']['name']}, claim {claim['metadata']['name']} ({claim['metadata']['uid']})"
        )
        reply = dra_call(vgpud.dra_socket, "Prepare", [claim])

        section("NodePrepareResources (as the kubelet calls it): what each container gets")
        show_injection(root, pod, claim, reply)

        if sys.stdin.isatty():
            section(f"vgpud is running (pid {vgpud.proc.pid}, log {vgpud.log}). Press Ctrl-C to clean up.")
            try:
                signal.pause()
            except KeyboardInterrupt:
                print()
        else:
            time.sleep(float(os.environ.get("DEMO_SECONDS", "2")))

        section("NodeUnprepareResources, then SIGTERM")
        unprepared = dra_call(vgpud.dra_socket, "Unprepare", [claim])
        print(f"unprepare errors: {[e.error for e in unprepared.claims.values() if e.error] or 'none'}")
        print(
            f"claim directory left: {(root / 'etc/vgpu-manager/claims' / claim['metadata']['uid']).exists()}"
        )
        rc = vgpud.stop()
        print(f"vgpud exit code {rc}; log tail:")
        print("".join(vgpud.output().splitlines(keepends=True)[-4:]), end="")
        left = [str(p) for p in root.rglob("*.sock") if p.is_socket()]
        print(f"sockets left behind: {left or 'none'}")
        return rc
    finally:
        if vgpud is not None:
            vgpud.kill()
        if api is not None:
            api.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
