"""Restarts on a real node, both tracks, on containerd 1.7 and 2.x: vgpud while pods run (NRI
Synchronize rebuilds the cache; a new process in an old container still registers) and containerd (the
NRI plugin reconnects; new pods are injected), also several times in a row."""

from __future__ import annotations

import re
import time
from pathlib import Path

from tests.e2e import workload as w
from tests.e2e.conftest import NRI_TRACKS, WITH_CD2
from tests.e2e.node import LocalNode


def _running_vgpu_containers(node: LocalNode) -> int:
    """Running containers whose env carries a non-empty MANAGER_VGPU_CLAIM_UID, as the runtime has them."""
    count = 0
    for line in node.ctr("tasks", "ls").stdout.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 3 or fields[2] != "RUNNING":
            continue
        try:
            environ = Path(f"/proc/{fields[1]}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(
            e.startswith(b"MANAGER_VGPU_CLAIM_UID=") and len(e) > len(b"MANAGER_VGPU_CLAIM_UID=")
            for e in environ
        ):
            count += 1
    return count


def _log_matches(node: LocalNode, pattern: str) -> list[re.Match[str]]:
    return list(re.finditer(pattern, node.log("vgpud").read_text()))


@WITH_CD2
def test_restart_vgpud_while_pods_run(node: LocalNode) -> None:
    ns = w.namespace(node)
    claim = w.create_claim(
        node, ns, "gpu", [w.vgpu_request("a", "1Gi", "5"), w.vgpu_request("b", "1Gi", "5")]
    )
    uid = claim["metadata"]["uid"]
    w.create_pod(
        node, ns, "p", [w.container("ca", [("gpu", "a")]), w.container("cb", [("gpu", "b")])], {"gpu": "gpu"}
    )
    pod = w.wait_running(node, ns, "p")
    synced_before = len(_log_matches(node, r"NRI: synchronized: (\d+) vGPU containers"))

    node.stop_vgpud()
    node.start_vgpud()
    node.wait_vgpud(time.monotonic() + 60)

    if node.nri:
        matches = w.wait_for(
            lambda: _log_matches(node, r"NRI: synchronized: (\d+) vGPU containers")[synced_before:],
            what="a Synchronize after the restart",
        )
        assert int(matches[-1].group(1)) == _running_vgpu_containers(node) >= 2
    for name in ("ca", "cb"):
        reg = w.register_from_container(node, w.container_id(pod, name), hold_s=5)
        assert reg.returncode == 0, reg.output
        assert reg.shell_host_pid in reg.pids
    w.delete_pod(node, ns, "p")
    w.wait_for(lambda: not node.claim_dir(uid).exists(), what="claim directory removed")
    assert uid not in w.checkpoint_claims(node)
    w.release_claim(node, ns, "gpu")


@WITH_CD2
def test_restart_containerd(node: LocalNode) -> None:
    registered_before = len(_log_matches(node, r"NRI: registered as"))
    node.stop_containerd()
    started = time.monotonic()
    node.start_containerd()
    if node.nri:
        w.wait_for(
            lambda: len(_log_matches(node, r"NRI: registered as")) > registered_before,
            timeout=35,
            what="vgpud's NRI plugin to reconnect",
        )
        print(f"NRI plugin reconnected {time.monotonic() - started:.1f} s after containerd started")
    ns = w.namespace(node)
    claim = w.create_claim(node, ns, "gpu", [w.vgpu_request("gpu", "1Gi", "5")])
    uid = claim["metadata"]["uid"]
    w.create_pod(node, ns, "p", [w.container("main", [("gpu", "gpu")])], {"gpu": "gpu"})
    pod = w.wait_running(node, ns, "p")
    cid = w.container_id(pod, "main")
    env = w.container_env(node, cid)
    assert env["CUDA_MEM_LIMIT_0" if "CUDA_MEM_LIMIT_0" in env else "CUDA_MEM_LIMIT_1"] == "1024m"
    if node.nri:
        assert env["VGPU_POD_UID"] == pod["metadata"]["uid"]
    reg = w.register_from_container(node, cid, hold_s=5)
    assert reg.returncode == 0, reg.output
    w.delete_pod(node, ns, "p")
    w.wait_for(lambda: not node.claim_dir(uid).exists(), what="claim directory removed")
    w.release_claim(node, ns, "gpu")


@NRI_TRACKS
def test_containerd_restarted_again_and_again_is_redialed_at_once(node: LocalNode) -> None:
    """Four containerd restarts seconds apart: each session ends before it could reset vgpud's
    restart backoff (1, 2, 4, 8 s...), yet vgpud dials each new NRI socket at once, and a pod created
    right after the last restart is injected (a container created while no plugin is connected would
    run without vgpud's env and mounts)."""
    ns = w.namespace(node)
    reconnects: list[float] = []
    for restart in range(4):
        registered_before = len(_log_matches(node, r"NRI: registered as"))
        node.stop_containerd()
        node.start_containerd()
        started = time.monotonic()
        if restart == 3:
            w.create_claim(node, ns, "gpu", [w.vgpu_request("gpu", "1Gi", "5")])
            w.create_pod(node, ns, "p", [w.container("main", [("gpu", "gpu")])], {"gpu": "gpu"})
        w.wait_for(
            lambda before=registered_before: len(_log_matches(node, r"NRI: registered as")) > before,
            timeout=35,
            interval=0.1,
            what="vgpud's NRI plugin to reconnect",
        )
        reconnects.append(time.monotonic() - started)
    print(f"NRI plugin reconnected {', '.join(f'{s:.1f}' for s in reconnects)} s after containerd started")
    assert max(reconnects) < 3, reconnects
    assert _log_matches(node, r"component nri-plugin: restart \d+ now, before its \d+s backoff ended")
    pod = w.wait_running(node, ns, "p")
    env = w.container_env(node, w.container_id(pod, "main"))
    assert env["VGPU_POD_UID"] == pod["metadata"]["uid"]
    w.delete_pod(node, ns, "p")
    w.release_claim(node, ns, "gpu")
