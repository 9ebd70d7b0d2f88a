"""The GPU itself reaches a vGPU pod only through vgpud's CDI edits: on both tracks, on containerd 1.7
and 2.x, and with vgpud installed by the chart (on the nvml backend over the node's driver root).

The pod has no hostPath volume, no host PID namespace and nothing of the driver in its spec, and its
image says `NVIDIA_VISIBLE_DEVICES=all` as NVIDIA's CUDA images do. Its claim is on the node's second
GPU. It must get that GPU's device node (195:1) and not the first's, a device cgroup that admits only
the edits' nodes, `libcuda.so.1` resolving to the driver root's file (the link and the linker cache
made by nvidia-cdi-hook), nvidia-smi showing one GPU with the claim's memory, and the memory limit.
"""

from __future__ import annotations

import json
import os
import stat
import tarfile
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import fakegpu
from tests.e2e import workload as w
from tests.e2e.conftest import CD2_TRACKS, CHART_TRACKS, FAKE_GPU_TRACKS
from tests.e2e.node import LocalNode
from tests.e2e.test_node_limits import used_by_partition, wait_used

MiB, GiB = 1 << 20, 1 << 30
CHUNK = 256 * MiB
CUDA_ERROR_OUT_OF_MEMORY = 2
NVIDIA_MAJOR = 195
#: the claim's GPU, and the other one the pod must not see
MINOR, OTHER_MINOR = 1, 0
LIB_DIR = "/usr/lib/x86_64-linux-gnu"

pytestmark = pytest.mark.parametrize(
    "node", [*sorted(FAKE_GPU_TRACKS), *sorted(CD2_TRACKS), *CHART_TRACKS], indirect=True
)


def image_env(node: LocalNode) -> list[str]:
    """The cudaprobe image's config env, read from its OCI tarball."""
    with tarfile.open(node.env["CUDA_IMAGE_TAR"]) as tar:

        def blob(digest: str) -> dict[str, Any]:
            member = tar.extractfile(f"blobs/sha256/{digest.split(':', 1)[1]}")
            assert member is not None
            return json.loads(member.read())

        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        manifest = blob(index["manifests"][0]["digest"])
        return blob(manifest["config"]["digest"])["config"]["Env"]


def device_cgroup_rules(pid: int) -> list[str]:
    """The devices.list of the process's cgroup: the v1 devices controller, which these hosts run (a
    v2 device program cannot be read back as rules)."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "devices" in controllers.split(","):
            return Path(f"/sys/fs/cgroup/devices{path}/devices.list").read_text().split("\n")
    pytest.fail(f"no devices cgroup (v1) for pid {pid}: the e2e hosts run the v1 devices controller")


def test_a_vgpu_pod_gets_its_gpu_and_only_its_gpu(node: LocalNode) -> None:
    assert node.driver is not None
    assert "NVIDIA_VISIBLE_DEVICES=all" in image_env(node)
    ns = w.namespace(node)
    claim = w.create_claim(node, ns, "gpu", [w.on_gpu(w.vgpu_request("gpu", "4Gi", "10"), MINOR)])
    uid = claim["metadata"]["uid"]
    probe = fakegpu.probe_container(node, "main", None, "fill", "direct", str(CHUNK), "hold")
    created = fakegpu.create_probe_pod(node, ns, "p", [probe], "gpu")
    spec = created["spec"]
    assert not spec.get("hostPID") and not any("hostPath" in v for v in spec.get("volumes", [])), spec
    pod = w.wait_running(node, ns, "p")
    cid = w.container_id(pod, "main")
    pid = w.task_pid(node, cid)
    root = Path(f"/proc/{pid}/root")

    # its GPU's node and the control nodes, from the edits; not the other GPU's
    dev = set(os.listdir(root / "dev"))
    assert {f"nvidia{MINOR}", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"} <= dev, dev
    assert f"nvidia{OTHER_MINOR}" not in dev, dev
    node_stat = os.stat(root / "dev" / f"nvidia{MINOR}")
    assert stat.S_ISCHR(node_stat.st_mode)
    assert (os.major(node_stat.st_rdev), os.minor(node_stat.st_rdev)) == (NVIDIA_MAJOR, MINOR)
    rules = device_cgroup_rules(pid)
    assert f"c {NVIDIA_MAJOR}:{MINOR} rwm" in rules and f"c {NVIDIA_MAJOR}:255 rwm" in rules, rules
    assert not any(r.startswith(f"c {NVIDIA_MAJOR}:{OTHER_MINOR} ") for r in rules), rules
    assert "a *:* rwm" not in rules, rules

    # the image's NVIDIA_VISIBLE_DEVICES=all replaced by the edits' void; the limits name the one GPU
    env = w.container_env(node, cid)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void", env
    limits = w.vgpu_limits(env)
    assert set(limits) == {
        f"CUDA_MEM_LIMIT_{MINOR}",
        f"CUDA_CORE_LIMIT_{MINOR}",
        f"MANAGER_VISIBLE_DEVICE_{MINOR}",
    }

    # libcuda.so.1 is the driver root's file: the hook's link to the mounted libcuda.so.<version>
    version = node.driver.version
    resolved = w.exec_in(node, cid, f"readlink -f {LIB_DIR}/libcuda.so.1").stdout.strip()
    assert resolved == f"{LIB_DIR}/libcuda.so.{version}", resolved
    inside, host = os.stat(root / resolved.lstrip("/")), os.stat(node.driver.libcuda)
    assert (inside.st_dev, inside.st_ino) == (host.st_dev, host.st_ino)
    assert b"libcuda.so.1" in (root / "etc/ld.so.cache").read_bytes()  # update-ldcache ran

    # the limit holds, and nvidia-smi (the root's, through the library) shows one GPU of 4 GiB
    out = fakegpu.probe_result(node, ns, pod, "main", ("count", "total", "error"))
    assert (int(out["error"]), int(out["total"])) == (CUDA_ERROR_OUT_OF_MEMORY, 4 * GiB), out
    gpus = w.exec_in(node, cid, "nvidia-smi -L").stdout.splitlines()
    (line,) = gpus
    assert limits[f"MANAGER_VISIBLE_DEVICE_{MINOR}"] in line, gpus
    query = "nvidia-smi --query-gpu=uuid,memory.total,memory.used --format=csv,noheader,nounits"
    uuid, total, used = (field.strip() for field in w.exec_in(node, cid, query).stdout.split(","))
    assert (uuid, int(total), int(used)) == (limits[f"MANAGER_VISIBLE_DEVICE_{MINOR}"], 4096, 4096)

    if node.fake_gpu:  # vgpud's own NVML view: the container's host PID holds the 4 GiB
        wait_used(node, uid, [4 * GiB])
    w.delete_pod(node, ns, "p")
    w.release_claim(node, ns, "gpu")
    if node.fake_gpu:  # the fake kernel freed the dead process's memory
        w.wait_for(lambda: not used_by_partition(node, uid), what="the claim's usage gone")
