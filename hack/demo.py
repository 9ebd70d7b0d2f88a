"""`make demo`: the main job on a real local node (tests/e2e/node.py), NRI on, client registration on.

1. brings up etcd + kube-apiserver, kube-controller-manager, kube-scheduler, containerd (NRI + CDI)
   and the kubelet (DRA), everything under one temp dir, then installs vgpud as a user does: the vgpud
   image (make image) imported into containerd and `helm install` of helm/vgpud, so vgpud runs as the
   chart's DaemonSet pod with its service account and the webhook as its Deployment; the node is laid
   out like a GPU node with simulated GPUs (2x A100-40GB): a driver root with the fake libcuda.so and
   libnvidia-ml.so (csrc/fakecuda, csrc/fakenvml) under their versioned names, nvidia-smi, NVIDIA's
   nvidia-cdi-hook, device nodes, and a fake kernel behind them; vgpud reads the GPUs through NVML
   from that root (the chart's `node.driverRoot`); prints where each log is;
2. shows the chart's pods, the GPUs, what a vGPU container receives from the driver (`vgpud driver`),
   and the ResourceSlice vgpud published (consumable memory and cores);
3. creates a claim with two requests (8Gi + 50 cores, 4Gi + 20 cores) and ONE pod whose two containers
   use one request each; the scheduler allocates, the kubelet prepares through vgpud, containerd asks
   vgpud's NRI plugin for each container's edits;
4. prints what each container received: its GPU (device nodes), its vGPU env, its vgpud mounts, and
   the pids.config it sees after running vgpu-register inside it (as libvgpu does at CUDA init);
5. shows the memory limit enforced: a pod on a 4096Mi claim runs a CUDA program (a dynamic-libc image
   whose env says NVIDIA_VISIBLE_DEVICES=all, with no volume and no host PID namespace: the GPU's node,
   the driver's libraries and nvidia-smi come from vgpud's CDI edits, libvgpu-control.so preloaded by
   them) that allocates 256 MiB at a time; the library refuses the allocation
   that would pass 4096 MiB with CUDA_ERROR_OUT_OF_MEMORY (2), though the GPU has 40 GiB free, and
   vgpud's metrics show what the container holds;
6. prints where the live hook stream is, waits (Ctrl-C when interactive, DEMO_SECONDS otherwise, default
   2) and tears the whole node down. Needs root, hack/install-kube.sh, hack/install-node.sh,
   hack/install-nvidia-ctk.sh and make image.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.e2e import chart, fakegpu  # noqa: E402
from tests.e2e import workload as w  # noqa: E402
from tests.e2e.leftovers import stop_on_signals  # noqa: E402
from tests.e2e.node import (  # noqa: E402
    DEVICE_CLASS,
    GPU_PROFILE,
    INSTALL_HINT,
    LocalNode,
    node_available,
)
from vgpud import metrics_names as names  # noqa: E402

VGPUD = [sys.executable, "-m", "vgpud"]
BOLD, RESET = ("\033[1m", "\033[0m") if sys.stdout.isatty() else ("", "")
NAMESPACE = "demo"
CLAIM, POD = "shared-gpu", "trainer-and-eval"
CONTAINERS = {"trainer": ("8Gi", "50"), "sidecar-eval": ("4Gi", "20")}
ENV_PREFIXES = ("MANAGER_", "CUDA_", "VGPU_")
MOUNT_PREFIXES = ("/etc/vgpu-manager", "/tmp/.vgpu")
LIMITED_CLAIM, LIMITED_POD, LIMIT_MIB = "small-gpu", "allocator", 4096
LIMITED_MEMORY = f"{LIMIT_MIB}Mi"
CHUNK = 256 << 20
ENFORCED = """What the control library (libvgpu-control.so, preloaded into every vGPU container) enforces:
  memory  each container's device memory: usage (NVML's memory of the container's registered
          processes + the library's ledger of what NVML cannot see) plus the new allocation may not
          pass the claim's memory; past it every allocation call returns CUDA_ERROR_OUT_OF_MEMORY (2)
          before the driver is called, and cuMemGetInfo / nvmlDeviceGetMemoryInfo show the limit;
  cores   kernel launches are throttled by a token bucket so the container's SM utilization
          averages to its claim's cores (an average over a window, not a per-kernel cap)."""


def section(title: str) -> None:
    print(f"\n{BOLD}== {title}{RESET}", flush=True)


def short(path: str, node: LocalNode) -> str:
    return path.replace(str(node.workdir), "<node>")


def show_release(node: LocalNode) -> None:
    for pod in node.get(f"/api/v1/namespaces/{chart.NAMESPACE}/pods")["items"]:
        ready = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}.get("Ready")
        owner = pod["metadata"]["ownerReferences"][0]["kind"]
        spec = pod["spec"]
        print(
            f"  pod {pod['metadata']['name']:32} ({owner}) {pod['status']['phase']}, Ready={ready}, "
            f"image {spec['containers'][0]['image']}, service account {spec['serviceAccountName']}"
        )


def show_slices(node: LocalNode) -> None:
    for item in node.slices():
        print(f"ResourceSlice {item['metadata']['name']} (pool {item['spec']['pool']['name']}):")
        for device in item["spec"]["devices"]:
            attrs = device["attributes"]
            caps = {name: cap["value"] for name, cap in device["capacity"].items()}
            print(
                f"  {device['name']}: {attrs['productName']['string']} uuid={attrs['uuid']['string']} "
                f"capacity={caps} allowMultipleAllocations={device.get('allowMultipleAllocations')}"
            )


def show_allocation(node: LocalNode) -> None:
    claim = w.get_claim(node, NAMESPACE, CLAIM)
    print(f"claim {NAMESPACE}/{CLAIM} uid {claim['metadata']['uid']}, allocated by the scheduler:")
    for result in claim["status"]["allocation"]["devices"]["results"]:
        consumed = result.get("consumedCapacity", {})
        print(
            f"  request {result['request']:8} -> {result['device']} share {result.get('shareID', '-')} "
            f"consumed {consumed}"
        )


def show_container(node: LocalNode, pod: dict, name: str) -> None:
    cid = w.container_id(pod, name)
    memory, cores = CONTAINERS[name]
    print(f"{BOLD}container {name}{RESET} (request {memory} memory + {cores} cores, id {cid[:12]})")
    env = w.container_env(node, cid)
    gpu_nodes = w.exec_in(node, cid, "ls /dev | grep nvidia | tr '\\n' ' '").stdout.strip()
    visible = env.get("NVIDIA_VISIBLE_DEVICES")
    print(f"  GPU device nodes (vgpud's CDI edits): {gpu_nodes}; NVIDIA_VISIBLE_DEVICES={visible}")
    print("  vGPU environment (empty ones left out):")
    for key in sorted(k for k in env if k.startswith(ENV_PREFIXES) and env[k]):
        print(f"    {key}={env[key]}")
    print("  vgpud mounts (container path <- host path):")
    for dest, source in w.oci_mounts(node, cid):
        if dest.startswith(MOUNT_PREFIXES):
            print(f"    {dest} <- {short(source, node)}")
    reg = w.register_from_container(node, cid, hold_s=1)
    print(f"  vgpu-register inside the container: exit {reg.returncode}")
    print(f"  {w.PIDS_FILE} seen from inside (host PIDs of the container's processes): {reg.pids}")
    if reg.shell_host_pid is not None:
        print(
            f"    the registering shell is host PID {reg.shell_host_pid}: "
            f"listed {reg.shell_host_pid in reg.pids}"
        )


def show_enforced(node: LocalNode) -> None:
    print(ENFORCED)
    w.create_claim(node, NAMESPACE, LIMITED_CLAIM, [w.vgpu_request("gpu", LIMITED_MEMORY, "20")])
    args = ("fill", "direct", str(CHUNK), "hold")
    probe = fakegpu.probe_container(node, "alloc", None, *args)
    fakegpu.create_probe_pod(node, NAMESPACE, LIMITED_POD, [probe], LIMITED_CLAIM)
    pod = w.wait_running(node, NAMESPACE, LIMITED_POD)
    print(
        f"\npod {LIMITED_POD} (image {fakegpu.image(node)}, a dynamic libc) on claim {LIMITED_CLAIM} "
        f"({LIMITED_MEMORY} memory), runs: memprobe {' '.join(args)}"
    )
    spec = pod["spec"]
    volumes = [v["name"] for v in spec.get("volumes", [])]
    print(f"  pod spec: volumes {volumes} (no hostPath), hostPID {spec.get('hostPID', False)}")
    cid = w.container_id(pod, "alloc")
    lib = f"{fakegpu.DRIVER_LIB_DIR}/libcuda.so.1"
    target = w.exec_in(node, cid, f"readlink -f {lib}").stdout.strip()
    env = w.container_env(node, cid)
    print(f"  from vgpud's CDI edits: {lib} -> {target} (the driver root's file), ", end="")
    print(f"NVIDIA_VISIBLE_DEVICES={env.get('NVIDIA_VISIBLE_DEVICES')} (the image says all)")
    print("  nvidia-smi -L in the container:", w.exec_in(node, cid, "nvidia-smi -L").stdout.strip())
    out = fakegpu.probe_result(node, NAMESPACE, pod, "alloc", ("count", "total", "error"))
    total, error = int(out["total"]), int(out["error"])
    print(f"  limit enforced:  {LIMIT_MIB} MiB (the claim's memory)")
    print(f"  allocated:       {out['count']} x {CHUNK >> 20} MiB = {total >> 20} MiB")
    name = "CUDA_ERROR_OUT_OF_MEMORY" if error == 2 else "not an out-of-memory error"
    claim = w.get_claim(node, NAMESPACE, LIMITED_CLAIM)
    uid, (result,) = claim["metadata"]["uid"], claim["status"]["allocation"]["devices"]["results"]
    devices = {d["name"]: d for item in node.slices() for d in item["spec"]["devices"]}
    physical = int(devices[result["device"]]["capacity"]["memory"]["value"])
    print(f"  next allocation: CUDA error {error} ({name}); {result['device']} has {physical >> 20} MiB")

    def used() -> list[float]:
        return [
            v
            for labels, v in node.metric_samples(names.CONTAINER_MEMORY_USED.name)
            if labels["claim_uid"] == uid and v > 0
        ]

    seen = w.wait_for(used, what="vgpud's usage metric")
    print(f"  vgpud sees:      {names.CONTAINER_MEMORY_USED.name} = {int(seen[0]) >> 20} MiB")


def hook_stream(node: LocalNode) -> str:
    has_debug = (
        subprocess.run([*VGPUD, "debug", "--help"], capture_output=True, check=False, cwd=REPO).returncode
        == 0
    )
    if has_debug and node.debug_socket.exists():
        return (
            f"live hook stream: {sys.executable} -m vgpud debug tail --socket {node.debug_socket}\n"
            f"vgpud state:      {sys.executable} -m vgpud debug state --socket {node.debug_socket}\n"
            f"metrics:          curl -s {node.metrics_url}\n"
            f"vgpud log:        {node.vgpud_log()}"
        )
    return f"vgpud has no debug endpoint here; its hook calls are in the log: {node.vgpud_log()}"


def wait_for_user() -> None:
    if sys.stdin.isatty():
        section("The node keeps running. Press Ctrl-C to tear it down.")
        try:
            signal.pause()
        except KeyboardInterrupt:
            print()
    else:
        seconds = float(os.environ.get("DEMO_SECONDS", "2"))
        section(f"Non-interactive: tearing down in {seconds:g} s (DEMO_SECONDS)")
        time.sleep(seconds)


def main() -> int:
    if os.geteuid() != 0:
        sys.exit("make demo needs root (containerd, runc and the kubelet do)")
    if not node_available():
        sys.exit(f"the local node is not installed: {INSTALL_HINT}")
    if not chart.chart_available():
        sys.exit(f"no vgpud image or helm: {chart.INSTALL_HINT}")
    node = LocalNode(nri=True, client_mode=True, fake_gpu=True, chart=True)
    with stop_on_signals():  # SIGTERM and SIGHUP tear the node down like Ctrl-C
        return run_demo(node)


def run_demo(node: LocalNode) -> int:
    try:
        section(f"Starting a local node (NRI on, client registration on) in {node.workdir}")
        started = time.monotonic()
        try:
            node.start()
        except KeyboardInterrupt:
            print()
            return 130
        print(f"ready in {time.monotonic() - started:.1f} s")
        print(node.describe())

        section("vgpud, installed with its Helm chart")
        print(f"$ {node.install_command}")
        show_release(node)

        section(f"GPUs (simulated, profile {GPU_PROFILE}), through NVML in the node's driver root")
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
        root = ["--driver-root", str(node.driver_root)]
        subprocess.run([*VGPUD, "gpus", *root], check=False, cwd=REPO, env=env)

        section("What every vGPU container receives from the driver (vgpud driver)")
        subprocess.run([*VGPUD, "driver", *root], check=False, cwd=REPO, env=env)

        section("What vgpud published")
        print(f"DeviceClass {DEVICE_CLASS} (the chart's; selects the vGPUs of manager.nvidia.com)")
        show_slices(node)

        section(f"A pod with two containers on two requests of one vGPU claim ({NAMESPACE}/{POD})")
        node.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        w.wait_default_service_account(node, NAMESPACE)
        requests = [w.vgpu_request(name, *capacity) for name, capacity in CONTAINERS.items()]
        w.create_claim(node, NAMESPACE, CLAIM, requests)
        containers = [
            w.container(name, [("gpu", name)], command=["sh", "-c", "while :; do sleep 3600; done"])
            for name in CONTAINERS
        ]
        w.create_pod(node, NAMESPACE, POD, containers, {"gpu": CLAIM})
        pod = w.wait_running(node, NAMESPACE, POD)
        print(f"pod {POD} Running on {pod['spec']['nodeName']} (uid {pod['metadata']['uid']})")
        show_allocation(node)

        section("What each container received")
        for name in CONTAINERS:
            show_container(node, pod, name)
        uid = w.get_claim(node, NAMESPACE, CLAIM)["metadata"]["uid"]
        print(f"directories under {short(str(node.claim_dir(uid)), node)}: {w.claim_subdirs(node, uid)}")

        section("The memory limit, enforced")
        show_enforced(node)

        section("Watching vgpud")
        print(hook_stream(node))
        wait_for_user()
    except KeyboardInterrupt:
        print()
    finally:
        section("Tearing the node down")
        node.stop()
        print(f"stopped; {node.workdir} removed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
