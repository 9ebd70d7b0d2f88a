"""Pods that run a CUDA program on the fake GPUs of a `LocalNode(fake_gpu=True)`.

The image is localhost/vgpud-cudaprobe (hack/install-node.sh): bookworm's libc6, busybox and
tests/unit/libvgpu/c/memprobe.c linked against libcuda.so.1 by soname, as a CUDA program is. The
driver is not in the image: like the NVIDIA container toolkit with the real driver, the pod bind-mounts
the fake libcuda.so.1 and libnvidia-ml.so.1 into the container's library directory, and the fakes'
profile and the shared state directory beside them (the state file is the one the node's vgpud reads
through the fake NVML). They come in as hostPath volumes of the pod spec: the kubelet passes pod
annotations to the sandbox only, so a CDI device named by annotation would not reach the container,
and vgpud's own CDI spec must stay what it generates. What the library adds (LD_PRELOAD,
/etc/ld.so.preload, the limits) comes from vgpud's CDI edits and NRI adjustments, as for any pod.

The pod shares the host's PID namespace: the fake driver records `getpid()`, where a real driver's
kernel module records the host PID; with hostPID both are the same, so NVML (in vgpud and in the
library) reports the PIDs the registry writes into pids.config. In cgroup mode a pod can have its own
PID namespace (`host_pid=False`, `own_pid_namespace`): the fakes then record the host PID through the
host /proc vgpud mounts in.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.e2e import workload as w
from tests.e2e.node import (
    FAKE_CUDA_LIBRARY,
    FAKE_NVML_LIBRARY,
    FAKE_PROFILE_ENV,
    FAKE_STATE_ENV,
    FAKE_STATE_FILE,
    LocalNode,
)

#: where the toolkit puts the driver's user-space libraries in a Debian/Ubuntu-based image
DRIVER_LIB_DIR = "/usr/lib/x86_64-linux-gnu"
PROFILE_PATH = "/etc/fake-gpu/profile.yaml"
STATE_DIR = "/run/fake-gpu"
PROBE = "/usr/local/bin/memprobe"
RESULT_TIMEOUT_S = 60.0
#: the fakes' setting for a procfs of the host's PID namespace (csrc/fakestate/state.h)
FAKE_HOST_PROC_ENV = "FAKE_GPU_HOST_PROC"
#: where vgpud mounts the host /proc in cgroup mode (no client registration)
HOST_PROC_IN_CONTAINER = "/etc/vgpu-manager/.host_proc"


def image(node: LocalNode) -> str:
    return node.env["CUDA_IMAGE"]


def driver_volumes(node: LocalNode) -> list[dict[str, Any]]:
    """The pod's hostPath volumes for the fake driver, its profile and the shared state."""
    return [
        {"name": "fake-libcuda", "hostPath": {"path": str(FAKE_CUDA_LIBRARY), "type": "File"}},
        {"name": "fake-libnvml", "hostPath": {"path": str(FAKE_NVML_LIBRARY), "type": "File"}},
        {"name": "fake-profile", "hostPath": {"path": str(node.gpu_profile_path), "type": "File"}},
        {"name": "fake-state", "hostPath": {"path": str(node.fake_gpu_dir), "type": "Directory"}},
    ]


def driver_mounts() -> list[dict[str, Any]]:
    return [
        {"name": "fake-libcuda", "mountPath": f"{DRIVER_LIB_DIR}/libcuda.so.1", "readOnly": True},
        {"name": "fake-libnvml", "mountPath": f"{DRIVER_LIB_DIR}/libnvidia-ml.so.1", "readOnly": True},
        {"name": "fake-profile", "mountPath": PROFILE_PATH, "readOnly": True},
        {"name": "fake-state", "mountPath": STATE_DIR},
    ]


def probe_container(node: LocalNode, name: str, request: str | None, *args: str) -> dict[str, Any]:
    """A container running `memprobe ARGS` on pod claim "gpu" (request `request`); its stdin stays open,
    so a HOLD command keeps what it allocated until the pod goes."""
    spec = w.container(name, [("gpu", request)], command=[PROBE, *args], stdin=True)
    spec["image"] = image(node)
    spec["env"] = [
        {"name": FAKE_PROFILE_ENV, "value": PROFILE_PATH},
        {"name": FAKE_STATE_ENV, "value": f"{STATE_DIR}/{FAKE_STATE_FILE}"},
    ]
    spec["volumeMounts"] = driver_mounts()
    return spec


def own_pid_namespace(spec: dict[str, Any]) -> dict[str, Any]:
    """A probe container for a pod without hostPID: the fakes record the host PID through the host
    /proc that cgroup mode mounts at .host_proc (FAKE_GPU_HOST_PROC), as the real kernel module does."""
    spec["env"].append({"name": FAKE_HOST_PROC_ENV, "value": HOST_PROC_IN_CONTAINER})
    return spec


def create_probe_pod(
    node: LocalNode,
    ns: str,
    name: str,
    containers: list[dict[str, Any]],
    claim: str,
    *,
    host_pid: bool = True,
) -> dict[str, Any]:
    """A host-network pod with the fake driver volumes, its pod claim "gpu" = `claim`; host-PID unless
    `host_pid` is False (then its containers need own_pid_namespace)."""
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "hostPID": host_pid,
        "terminationGracePeriodSeconds": 1,
        "containers": containers,
        "volumes": driver_volumes(node),
        "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
    }
    return node.request("POST", f"/api/v1/namespaces/{ns}/pods", {"metadata": {"name": name}, "spec": spec})


def container_log(node: LocalNode, ns: str, pod: dict[str, Any], container: str) -> str:
    """What the container wrote so far (the kubelet's CRI log files, message text only)."""
    meta = pod["metadata"]
    directory = node.workdir / "pod-logs" / f"{ns}_{meta['name']}_{meta['uid']}" / container
    lines = []
    for path in sorted(Path(directory).glob("*.log")) if directory.is_dir() else []:
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split(" ", 3)  # <time> <stream> <P|F> <text>
            if len(parts) == 4:
                lines.append(parts[3])
    return "\n".join(lines)


def parse(text: str) -> dict[str, str]:
    """memprobe's `key value` lines."""
    return dict(line.split(" ", 1) for line in text.splitlines() if " " in line)


def probe_result(
    node: LocalNode, ns: str, pod: dict[str, Any], container: str, keys: tuple[str, ...]
) -> dict[str, str]:
    """memprobe's `key value` lines once every key in `keys` is there."""
    end = time.monotonic() + RESULT_TIMEOUT_S
    text = ""
    while time.monotonic() < end:
        text = container_log(node, ns, pod, container)
        got = parse(text)
        if all(k in got for k in keys):
            return got
        time.sleep(0.3)
    raise AssertionError(f"{ns}/{pod['metadata']['name']}/{container} printed no {keys} in time:\n{text}")
