"""Lazy (NRI) mode: the per-container directory, the injected env, and §12.8's resolution rules."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

from tests import objects as o
from vgpud.partition.assigner import (
    Candidate,
    ContainerContext,
    RegisterQuery,
    ResolveError,
    ResolveFacts,
    TargetNotFound,
)
from vgpud.partition.layout import Layout, LayoutError
from vgpud.partition.lazy import LazyAssigner
from vgpud.partition.model import ClaimView

LAYOUT = Layout(PurePosixPath("/run/vgpud/manager"), PurePosixPath("/etc/vgpu-manager"))
ASSIGNER = LazyAssigner(LAYOUT, driver=o.DRIVER)
CONTEXT = ContainerContext(
    claim_uid=o.CLAIM_UID, pod_uid=o.POD1_UID, pod_name="trainer", pod_namespace="default", container="main"
)
BASE = f"{o.CLAIM_UID}/{o.POD1_UID}_main"


def test_inject_creates_one_directory_per_container_and_mounts_it() -> None:
    plan = ASSIGNER.inject(CONTEXT)
    assert plan.paths.base == LAYOUT.root / "claims" / BASE
    assert [str(p) for p in plan.paths.directories] == [
        f"/run/vgpud/manager/claims/{BASE}{suffix}"
        for suffix in ("", "/config", "/vgpu_lock", "/vmem_node", "/sm_node")
    ]
    assert [(m.host_path, m.container_path, m.options) for m in plan.mounts] == [
        (
            f"/etc/vgpu-manager/claims/{BASE}/config",
            "/etc/vgpu-manager/config",
            ("rw", "nosuid", "nodev", "bind"),
        ),
        (f"/etc/vgpu-manager/claims/{BASE}/vgpu_lock", "/tmp/.vgpu_lock", ("rw", "nosuid", "nodev", "bind")),
        (f"/etc/vgpu-manager/claims/{BASE}/vmem_node", "/tmp/.vmem_node", ("rw", "nosuid", "nodev", "bind")),
        (f"/etc/vgpu-manager/claims/{BASE}/sm_node", "/tmp/.sm_node", ("rw", "nosuid", "nodev", "bind")),
        (
            f"/etc/vgpu-manager/claims/{BASE}/config/pids.config",
            "/etc/vgpu-manager/config/pids.config",
            ("ro", "nosuid", "nodev", "bind"),
        ),
    ]
    assert plan.env == {
        "VGPU_POD_NAME": "trainer",
        "VGPU_POD_NAMESPACE": "default",
        "VGPU_POD_UID": o.POD1_UID,
        "VGPU_CONTAINER_NAME": "main",
        "MANAGER_CLIENT_REGISTER_UUID": "",
    }
    assert plan.target.config_dir == plan.paths.config
    assert plan.target.candidates == (Candidate(o.POD1_UID, "main"),)
    assert plan.target.partition_key == f"{o.POD1_UID}_main"


def test_prepare_mints_nothing_and_marks_the_claim() -> None:
    p = o.pod("trainer", o.POD1_UID, containers=[o.container("main", o.ref("gpu"))])
    claim = ClaimView.from_dict(
        o.claim(requests=[o.exactly("gpu")], results=[o.result("gpu")], reserved_for=o.reserved(p)), o.DRIVER
    )
    result = ASSIGNER.prepare(claim, [])
    assert result.claim_env == {"MANAGER_VGPU_CLAIM_UID": o.CLAIM_UID}
    assert [(d.env, d.mounts, d.annotations, d.partition_key) for d in result.devices] == [({}, (), {}, None)]
    assert result.annotations == {} and result.partition_dirs == () and not result.record.request_partitions


def test_resolve_follows_the_nri_cache() -> None:
    query = RegisterQuery(pod_uid=o.POD1_UID, container="main")
    hit = ASSIGNER.resolve(query, ResolveFacts(cached_claim_uid=o.CLAIM_UID, cache_synced=True))
    assert hit == ASSIGNER.inject(CONTEXT).target
    # miss before the first Synchronize: retryable, never NotFound (seed §12.13.5)
    with pytest.raises(ResolveError) as caught:
        ASSIGNER.resolve(query, ResolveFacts(cache_synced=False))
    assert not isinstance(caught.value, TargetNotFound)
    # miss after it: a container we did not inject -> the device-plugin directory
    miss = ASSIGNER.resolve(query, ResolveFacts(cache_synced=True))
    assert miss.config_dir == LAYOUT.root / f"{o.POD1_UID}_main" / "config"
    # a UUID alone means nothing in this mode; with pod UID + container the pod path is used
    with pytest.raises(TargetNotFound, match="mints no register UUIDs"):
        ASSIGNER.resolve(RegisterQuery(register_uuid="00000000-0000-0000-0000-000000000001"), ResolveFacts())
    both = RegisterQuery("00000000-0000-0000-0000-000000000001", o.POD1_UID, "main")
    assert ASSIGNER.resolve(both, ResolveFacts(cached_claim_uid=o.CLAIM_UID)) == hit
    with pytest.raises(TargetNotFound, match="not a safe path component"):
        ASSIGNER.resolve(RegisterQuery(pod_uid="..", container="main"), ResolveFacts(cached_claim_uid="c"))


@pytest.mark.parametrize(
    ("field", "value"),
    [("container", "../x"), ("container", "a_b"), ("pod_uid", ".."), ("pod_uid", "a/b"), ("claim_uid", "")],
)
def test_inject_refuses_names_that_would_escape_the_claim_dir(field: str, value: str) -> None:
    context = ContainerContext(**{**CONTEXT.__dict__, field: value})
    with pytest.raises(LayoutError):
        ASSIGNER.inject(context)
