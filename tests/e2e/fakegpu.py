"""Pods that run a CUDA program on the simulated GPUs of a local node.

The image is localhost/vgpud-cudaprobe (hack/install-node.sh): bookworm's libc6, busybox and
tests/unit/libvgpu/c/memprobe.c linked against libcuda.so.1 by soname, as a CUDA program is, and
`NVIDIA_VISIBLE_DEVICES=all` in its config as NVIDIA's CUDA base images have. The driver is not in the
image and the pod names none of it: no volume, no host PID namespace, no env. Everything GPU reaches
the container through vgpud's CDI edits, as on a GPU node: the GPU's device node, the driver root's
libcuda.so.<version> and libnvidia-ml.so.<version> with their links and linker cache (nvidia-cdi-hook),
nvidia-smi, and the persistence daemon's socket, behind which the node's fake kernel gives the fakes
their simulated GPUs and each process's host PID (tests/fakedriver.py); and what the control library
needs (LD_PRELOAD, /etc/ld.so.preload, the limits).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.e2e import workload as w
from tests.e2e.node import LocalNode

#: where the driver's libraries are in the container (the driver root's layout, as the toolkit keeps it)
DRIVER_LIB_DIR = "/usr/lib/x86_64-linux-gnu"
PROBE = "/usr/local/bin/memprobe"
RESULT_TIMEOUT_S = 60.0


def image(node: LocalNode) -> str:
    return node.env["CUDA_IMAGE"]


def probe_container(node: LocalNode, name: str, request: str | None, *args: str) -> dict[str, Any]:
    """A container running `memprobe ARGS` on pod claim "gpu" (request `request`); its stdin stays open,
    so a HOLD command keeps what it allocated until the pod goes."""
    spec = w.container(name, [("gpu", request)], command=[PROBE, *args], stdin=True)
    spec["image"] = image(node)
    return spec


def create_probe_pod(
    node: LocalNode, ns: str, name: str, containers: list[dict[str, Any]], claim: str
) -> dict[str, Any]:
    """A host-network pod with its pod claim "gpu" = `claim`, and nothing else of the GPU's."""
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "terminationGracePeriodSeconds": 1,
        "containers": containers,
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
