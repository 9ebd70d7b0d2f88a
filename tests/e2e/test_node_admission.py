"""Who the NRI plugin injects, on a real node, both tracks: only a pod its claim is reserved for
(issue 12 item 3), also one that joins a shared claim after Prepare; and a restart into the other
partition mode is reported (item 2)."""

from __future__ import annotations

import pytest

from tests.e2e import workload as w
from tests.e2e.node import LocalNode

INJECTED_ENV = ("VGPU_", "CUDA_", "MANAGER_VISIBLE", "LD_PRELOAD", "MANAGER_COMPATIBILITY_MODE")
INJECTED_MOUNTS = ("/etc/vgpu-manager", "/tmp/.v")


def owner_with_claim(node: LocalNode, ns: str) -> str:
    claim = w.create_claim(node, ns, "gpu", [w.vgpu_request("gpu", "1Gi", "5")])
    w.create_pod(node, ns, "owner", [w.container("main", [("gpu", "gpu")])], {"gpu": "gpu"})
    w.wait_running(node, ns, "owner")
    return claim["metadata"]["uid"]


def release(node: LocalNode, ns: str, uid: str, pods: list[tuple[str, str]]) -> None:
    for pod_ns, pod in pods:
        w.delete_pod(node, pod_ns, pod)
    w.wait_for(lambda: not node.claim_dir(uid).exists(), what="claim directory removed")
    w.wait_for(lambda: uid not in w.checkpoint_claims(node), what="checkpoint entry removed")
    w.release_claim(node, ns, "gpu")


@pytest.mark.parametrize("shape", ["same-namespace", "other-namespace"])
def test_a_pod_cannot_attach_itself_to_another_pods_claim(node: LocalNode, shape: str) -> None:
    owner_ns = w.namespace(node)
    ns = owner_ns if shape == "same-namespace" else w.namespace(node)
    uid = owner_with_claim(node, owner_ns)
    before = w.claim_subdirs(node, uid)
    rejected = node.metric("vgpud_nri_rejected_containers_total") or 0
    try:
        forged = w.container("main", env=[{"name": "MANAGER_VGPU_CLAIM_UID", "value": uid}])
        w.create_pod(node, ns, "forger", [forged])
        forger = w.wait_running(node, ns, "forger")
        cid = w.container_id(forger, "main")
        env, mounts = w.container_env(node, cid), w.container_mounts(node, cid)
        assert env["MANAGER_VGPU_CLAIM_UID"] == uid  # its own, untouched
        assert not [k for k in env if k.startswith(INJECTED_ENV)], env
        assert not [m for m in mounts if m.startswith(INJECTED_MOUNTS)], mounts
        assert w.claim_subdirs(node, uid) == before, "nothing created under the claim"
        assert not [d for d in before if forger["metadata"]["uid"] in d]
        if node.nri:
            assert (node.metric("vgpud_nri_rejected_containers_total") or 0) == rejected + 1
    finally:
        release(node, owner_ns, uid, [(ns, "forger"), (owner_ns, "owner")])


def test_a_pod_that_joins_a_shared_claim_after_prepare_gets_its_vgpu(node: LocalNode) -> None:
    """The kubelet prepares a claim once; a second pod reserved later must still be injected (the
    claim watch tells the plugin, no API call on the hook path)."""
    ns = w.namespace(node)
    uid = owner_with_claim(node, ns)
    try:
        w.create_pod(node, ns, "joiner", [w.container("main", [("gpu", "gpu")])], {"gpu": "gpu"})
        joiner = w.wait_running(node, ns, "joiner")
        env = w.container_env(node, w.container_id(joiner, "main"))
        assert [k for k in env if k.startswith("CUDA_MEM_LIMIT_") and env[k] == "1024m"], env
        if node.nri:
            assert env["VGPU_POD_UID"] == joiner["metadata"]["uid"]
            assert f"{joiner['metadata']['uid']}_main" in w.claim_subdirs(node, uid)
    finally:
        release(node, ns, uid, [(ns, "joiner"), (ns, "owner")])


def test_a_restart_into_the_other_mode_is_reported(node: LocalNode) -> None:
    """NRI track: a claim prepared lazily, then vgpud restarted without NRI (as when the socket is slow
    at start): the mismatch is in the log, the metrics and the health detail; the node still serves.
    Eager track: a restart in the same mode reports none."""
    ns = w.namespace(node)
    uid = owner_with_claim(node, ns)
    nri = node.nri
    try:
        node.nri = False  # only vgpud's gates: containerd keeps its NRI
        node.restart_vgpud()
        w.wait_for(lambda: node.metric("vgpud_claim_mode_mismatches") is not None, what="metrics served")
        mismatches = node.metric("vgpud_claim_mode_mismatches")
        failing = [
            line
            for line in node.metrics().splitlines()
            if line.startswith('vgpud_component_health{component="claim-modes",state="failing"}')
        ]
        if nri:
            assert mismatches == 1
            assert failing and failing[0].endswith(" 1.0"), failing
            log = node.log("vgpud").read_text()
            assert f"mode mismatch: claim {ns}/gpu ({uid}) prepared in lazy mode" in log
        else:
            assert mismatches == 0
            assert failing and failing[0].endswith(" 0.0"), failing
        assert node.vgpud_health() == 1  # SERVING: a detail, not a failure
    finally:
        node.nri = nri
        node.restart_vgpud()
        w.wait_for(lambda: node.metric("vgpud_claim_mode_mismatches") == 0, what="metrics served again")
        release(node, ns, uid, [(ns, "owner")])
