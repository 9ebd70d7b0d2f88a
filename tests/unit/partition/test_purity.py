"""The algorithm modules do no I/O: imported and run in a process where the filesystem and the
network raise (DESIGN §3: `partition` is pure)."""

from __future__ import annotations

from tests.purity import run_without_io

PURE_MODULES = ["model", "eager", "lazy", "assigner", "layout", "edits", "libfiles"]

BODY = """
    import importlib
    for name in MODULES:
        importlib.import_module(f"vgpud.partition.{name}")
    from tests import objects as o
    from vgpud.partition.assigner import ContainerContext, RegisterQuery, ResolveFacts
    from vgpud.partition.eager import EagerAssigner
    from vgpud.partition.edits import device_env
    from vgpud.partition.layout import Layout
    from vgpud.partition.lazy import LazyAssigner
    from vgpud.partition.model import ClaimView, PodView

    pod = PodView.from_dict(o.pod("trainer", o.POD1_UID, containers=[o.container("main", o.ref("gpu"))]))
    claim_dict = o.claim(requests=[o.exactly("gpu")], results=[o.result("gpu")],
                         reserved_for=[{"resource": "pods", "name": "trainer", "uid": o.POD1_UID}])
    claim = ClaimView.from_dict(claim_dict, o.DRIVER)
    layout = Layout("/etc/vgpu-manager")

    eager = EagerAssigner(layout, driver=o.DRIVER, client_mode=True)  # the real uuid4 minting
    prepared = eager.prepare(claim, [pod])
    (register_uuid,) = prepared.record.register_uuids.values()
    claim = ClaimView.from_dict({**claim_dict, "metadata": {**claim_dict["metadata"],
                                 "annotations": dict(prepared.annotations)}}, o.DRIVER)
    target = eager.resolve(RegisterQuery(register_uuid=register_uuid), ResolveFacts(claim=claim, pods=(pod,)))
    assert eager.conflicts(prepared.record, claim, [pod]) == ()

    lazy = LazyAssigner(layout, driver=o.DRIVER)
    lazy.prepare(claim, [pod])
    plan = lazy.inject(ContainerContext(claim.uid, pod.uid, pod.name, pod.namespace, "main"))
    assert lazy.resolve(RegisterQuery(pod_uid=pod.uid, container="main"),
                        ResolveFacts(cached_claim_uid=claim.uid, cache_synced=True)) == plan.target
    device_env(0, "GPU-x", total_memory=1 << 34, consumed_capacity={"cores": "40", "memory": "4Gi"})
    from vgpud.partition import libfiles as F
    assert F.parse_vmem_node(F.build_vmem_node({1: [F.LedgerEntry(5, 6)]})).used(1) == 6
    assert F.parse_vgpu_config(F.build_vgpu_config(F.VgpuConfig(pod_uid="p"))).pod_uid == "p"
    assert F.parse_sm_node(F.build_sm_node(F.SmNode(sampler_pid=2))).sampler_pid == 2

    loaded = [m for m in set(sys.modules) - before
              if m.startswith(("vgpud.partition.pidsfile", "trio", "kubernetes", "grpclib"))]
    assert not loaded, loaded
    print("pure", target.config_dir, plan.target.config_dir)
"""


def test_algorithm_modules_run_without_filesystem_or_network() -> None:
    done = run_without_io(BODY, MODULES=PURE_MODULES)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("pure /etc/vgpu-manager/claims/"), done.stdout
