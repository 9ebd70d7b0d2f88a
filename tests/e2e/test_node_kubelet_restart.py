"""Kubelet restarts on a real node, both tracks: while vGPU pods run (on containerd 1.7 and 2.x), and
while one is being created.

What the kubelet (1.36) does on a restart with a DRA plugin: it deletes every ResourceSlice of its
node at start (vgpud puts its slice back), re-registers the plugin found in its plugins_registry
directory (GetInfo, then NotifyRegistrationStatus), and reloads its DRA claim cache from its
checkpoint with every claim marked not prepared. It calls NodePrepareResources only where it creates
a pod sandbox: a running pod's claims are not prepared again, but the next pod sandbox that uses one of
them is, and vgpud must answer that replay from its checkpoint with the same devices and CDI IDs
without touching the claim's files."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from tests.e2e import kubeletdra as k
from tests.e2e import workload as w
from tests.e2e.conftest import WITH_CD2
from tests.e2e.node import DRIVER, LocalNode
from vgpud.dra.cdi import CDI_CLASS, cdi_vendor
from vgpud.dra.prepare import REPLAYED


def _assert_one_each(node: LocalNode, uid: str, subdirs: int) -> k.ClaimFiles:
    """Exactly one directory per container or partition, one CDI spec, one completed checkpoint entry."""
    files = k.claim_files(node, uid)
    assert len(files.subdirs) == subdirs, files
    assert files.specs == (node.cdi_spec(uid).name,), files
    assert files.checkpoint_keys == 1 and files.checkpoint_state == "PrepareCompleted", files
    return files


def _injected(node: LocalNode, pod: dict[str, Any], name: str, memory: str) -> None:
    """The container got its limit (and, on NRI, its identity), and a new process in it registers."""
    cid = w.container_id(pod, name)
    env = w.container_env(node, cid)
    index = "0" if "CUDA_MEM_LIMIT_0" in env else "1"
    assert env[f"CUDA_MEM_LIMIT_{index}"] == memory, env
    if node.nri:
        assert env["VGPU_POD_UID"] == pod["metadata"]["uid"]
        assert env["VGPU_CONTAINER_NAME"] == name
    reg = w.register_from_container(node, cid, hold_s=1)
    assert reg.returncode == 0, reg.output
    assert reg.shell_host_pid in reg.pids, reg.output


@WITH_CD2
def test_kubelet_restart_while_pods_run(node: LocalNode) -> None:
    ns = w.namespace(node)
    claim = w.create_claim(
        node, ns, "gpu", [w.vgpu_request("a", "1Gi", "5"), w.vgpu_request("b", "2Gi", "5")]
    )
    uid = claim["metadata"]["uid"]
    containers = [w.container("ca", [("gpu", "a")]), w.container("cb", [("gpu", "b")])]
    w.create_pod(node, ns, "p", containers, {"gpu": "gpu"})
    pod = w.wait_running(node, ns, "p")
    before = _assert_one_each(node, uid, subdirs=2)
    cdi_ids = k.kubelet_cdi_ids(node, uid)
    assert cdi_ids and all(i.startswith(f"{cdi_vendor(DRIVER)}/{CDI_CLASS}=") for i in cdi_ids), cdi_ids
    prepares = len(k.prepare_calls(node, uid))
    slice_uid = node.wait_slices(time.monotonic() + 30)[0]["metadata"]["uid"]

    started = time.monotonic()
    node.restart_kubelet()
    print(f"kubelet restarted: Ready and plugin registered in {time.monotonic() - started:.1f} s")

    # the new kubelet deleted the node's slices at start; vgpud published its slice again
    slices = node.wait_slices(time.monotonic() + 30)
    print(f"slice {'re-created' if slices[0]['metadata']['uid'] != slice_uid else 'kept'}")
    # a running pod's claims are not prepared again, and nothing of them changed
    after = w.wait_running(node, ns, "p")
    assert [w.container_id(after, n) for n in ("ca", "cb")] == [w.container_id(pod, n) for n in ("ca", "cb")]
    assert all(s["restartCount"] == 0 for s in after["status"]["containerStatuses"])
    assert len(k.prepare_calls(node, uid)) == prepares
    assert _assert_one_each(node, uid, subdirs=2) == before
    for name, memory in (("ca", "1024m"), ("cb", "2048m")):
        _injected(node, after, name, memory)

    # a new pod sandbox using the claim makes the kubelet prepare it again (its cache lost "prepared"):
    # vgpud answers from its checkpoint with the same devices
    w.create_pod(node, ns, "q", [w.container("plain")], {"gpu": "gpu"})
    w.wait_running(node, ns, "q")
    replays = k.prepare_calls(node, uid)[prepares:]
    assert [(c["outcome"], c["detail"]) for c in replays] == [("ok", REPLAYED)], replays
    assert k.kubelet_cdi_ids(node, uid) == cdi_ids
    assert _assert_one_each(node, uid, subdirs=2) == before

    w.delete_pod(node, ns, "q")
    w.delete_pod(node, ns, "p")
    w.wait_for(lambda: k.cleaned_up(node, uid), what="the claim's files and checkpoint entries removed")
    w.release_claim(node, ns, "gpu")


#: where the kubelet is killed while the pod is being created: as soon as vgpud has prepared the claim
#: (the new kubelet prepares it again if the old one had not created the sandbox yet; here it had not,
#: so far), or with the sandbox running and the container not created (its image is missing until the
#: kubelet is down: nothing is prepared again)
KILL_POINTS = ("prepared", "sandbox")


@pytest.mark.parametrize("point", KILL_POINTS)
def test_kubelet_killed_while_pod_is_created(node: LocalNode, point: str) -> None:
    ns = w.namespace(node)
    claim = w.create_claim(node, ns, "gpu", [w.vgpu_request("gpu", "3Gi", "5")])
    uid = claim["metadata"]["uid"]
    image = w.IMAGE if point == "prepared" else f"{w.IMAGE.rsplit(':', 1)[0]}:{w.unique('absent')}"
    w.create_pod(node, ns, "p", [w.container("main", [("gpu", "gpu")], image=image)], {"gpu": "gpu"})
    if point == "prepared":
        w.wait_for(
            lambda: k.claim_files(node, uid).checkpoint_state == "PrepareCompleted",
            interval=0.01,
            what="vgpud to prepare the claim",
        )
    else:
        w.wait_for(
            lambda: _waiting_reason(node, ns, "p") == "ErrImageNeverPull", what="the container to wait"
        )
        assert k.claim_files(node, uid).checkpoint_state == "PrepareCompleted"
    prepares = len(k.prepare_calls(node, uid))
    node.stop_kubelet(signal.SIGKILL)
    if point == "sandbox":
        node.ctr("images", "tag", w.IMAGE, image)
    node.restart_kubelet()

    pod = w.wait_running(node, ns, "p")
    replays = k.prepare_calls(node, uid)[prepares:]
    print(f"{point}: {len(replays)} Prepare call(s) for the claim after the kubelet's restart")
    assert all((c["outcome"], c["detail"]) == ("ok", REPLAYED) for c in replays), replays
    if point == "sandbox":
        assert not replays
    files = _assert_one_each(node, uid, subdirs=1)
    cdi_ids = k.kubelet_cdi_ids(node, uid)
    assert len(cdi_ids) == 1 and cdi_ids[0].split("=", 1)[1] in files.spec, (cdi_ids, files.spec)
    _injected(node, pod, "main", "3072m")

    w.delete_pod(node, ns, "p")
    w.wait_for(lambda: k.cleaned_up(node, uid), what="the claim's files and checkpoint entries removed")
    w.release_claim(node, ns, "gpu")
    if point == "sandbox":
        node.ctr("images", "rm", image)


def _waiting_reason(node: LocalNode, ns: str, pod: str) -> str:
    statuses = w.get_pod(node, ns, pod)["status"].get("containerStatuses", [])
    return next((s["state"].get("waiting", {}).get("reason", "") for s in statuses), "")
