"""The drift self-check: the pure comparison rule by rule, confirmation over two checks, the disk scan,
and the component over real NRI hooks and directories (never fixing anything)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path, PurePosixPath

import pytest

from tests import objects as o
from tests.draharness import REF, single_container_claim
from tests.unit.observe.node import make_node
from vgpud._pb.nri.pkg.api.v1alpha1 import (
    Container,
    CreateContainerRequest,
    PodSandbox,
    RemoveContainerRequest,
)
from vgpud.containers.record import Injection, NodeContainer
from vgpud.observe.drift import (
    Difference,
    DiskState,
    DriftKind,
    NriView,
    compare,
    confirmed,
    scan_disk,
)

ROOT = PurePosixPath("/m/claims")
A, B = "claim-a", "claim-b"


def injected(claim: str, pod: str, ctr: str, cid: str = "c1") -> NodeContainer:
    """A container vgpud injected: its record names its claim and directory."""
    return NodeContainer(
        cid,
        pod,
        ctr,
        "ml",
        "train",
        running=True,
        claim_uid=claim,
        injection=Injection.INJECTED,
        directory=ROOT / claim / f"{pod}_{ctr}",
    )


def refused(claim: str, namespace: str = "ml") -> NodeContainer:
    """A container the runtime runs with a claim UID in its env that vgpud did not inject."""
    return NodeContainer(
        "c1", "p1", "main", namespace, "train", running=True, claim_uid=claim, injection=Injection.REFUSED
    )


def disk(*dirs: PurePosixPath, claims: tuple[str, ...] = (A,)) -> DiskState:
    return DiskState(frozenset(claims), frozenset(dirs))


VGPU = {A: "ml", B: "ml"}  # prepared vGPU claims -> their namespace
HEALTHY = [injected(A, "p1", "main")]


def kinds(found: list[Difference]) -> list[tuple[str, str]]:
    return [(d.kind.value, d.subject) for d in found]


@pytest.mark.parametrize(
    ("containers", "on_disk", "expected"),
    [
        pytest.param(HEALTHY, disk(ROOT / A / "p1_main"), [], id="agreeing"),
        pytest.param(
            [refused(A)],
            disk(),
            [("runtime-not-cached", "p1/main c1")],
            id="running vGPU container not cached",
        ),
        pytest.param(
            [refused("not-prepared")],
            disk(),
            [],
            id="unprepared claim: rejected by design",
        ),
        pytest.param(HEALTHY, disk(), [("directory-missing", "p1/main c1")], id="directory gone"),
        pytest.param(
            HEALTHY,
            disk(ROOT / A / "p1_main", ROOT / A / "p9_old"),
            [("orphan-directory", "/m/claims/claim-a/p9_old")],
            id="leftover directory",
        ),
    ],
)
def test_nri_rules(containers, on_disk, expected) -> None:  # type: ignore[no-untyped-def]
    nri = NriView(containers, synced=True)
    found = compare(nri=nri, disk=on_disk, prepared=frozenset({A, B}), vgpu_claims={A: "ml"})
    assert kinds(found) == expected


def test_a_container_without_its_injection_is_reported_once_and_owns_its_directory() -> None:
    """Created while vgpud was away (or after the runtime dropped it): one not-injected difference,
    not also runtime-not-cached, and its directory is not an orphan."""
    found = injected(A, "p1", "main")._replace(
        injection=Injection.MISSING, missing=("mount /etc/vgpu-manager/config",)
    )
    nri = NriView([found], synced=True)
    differences = compare(
        nri=nri, disk=disk(ROOT / A / "p1_main"), prepared=frozenset({A}), vgpu_claims={A: "ml"}
    )
    assert kinds(differences) == [("not-injected", "p1/main c1")]
    assert differences[0].detail == "ml/train, claim claim-a, missing mount /etc/vgpu-manager/config"


def test_claim_directory_rules_apply_in_both_modes() -> None:
    found = compare(
        nri=None,
        disk=DiskState(frozenset({A, "stale"})),
        prepared=frozenset({A, B, "no-vgpu"}),
        vgpu_claims=VGPU,
    )
    assert kinds(found) == [("claim-directory-missing", B), ("orphan-claim-directory", "stale")]


def test_nothing_about_nri_before_the_first_synchronize() -> None:
    nri = NriView([refused(A)], synced=False)
    assert compare(nri=nri, disk=disk(), prepared=frozenset({A}), vgpu_claims={A: "ml"}) == []


def test_eager_directories_are_not_container_directories() -> None:
    nri = NriView([], synced=True, lazy=False)
    on_disk = disk(ROOT / A / "pod-0123456789ab-app" / "main")
    assert compare(nri=nri, disk=on_disk, prepared=frozenset({A}), vgpu_claims={A: "ml"}) == []


def test_only_differences_seen_twice_are_confirmed() -> None:
    first = [
        Difference(DriftKind.ORPHAN_DIRECTORY, "/x", "a"),
        Difference(DriftKind.RUNTIME_NOT_CACHED, "p/c"),
    ]
    second = [
        Difference(DriftKind.ORPHAN_DIRECTORY, "/x", "detail may change"),
        Difference(DriftKind.DIRECTORY_MISSING, "p/c"),
    ]
    assert confirmed([], first) == []
    assert confirmed(first, second) == [second[0]]


def test_scan_disk_lists_claims_and_their_directories(tmp_path: Path) -> None:
    (tmp_path / "c1" / "p1_main" / "config").mkdir(parents=True)
    (tmp_path / "c1" / "not-a-dir").write_text("")
    (tmp_path / "c2").mkdir()
    (tmp_path / "c3").symlink_to(tmp_path / "c2")
    state = scan_disk(tmp_path, containers=True)
    assert state.claim_dirs == {"c1", "c2"}
    assert state.container_dirs == {PurePosixPath(tmp_path / "c1" / "p1_main")}
    assert scan_disk(tmp_path, containers=False).container_dirs == frozenset()
    assert scan_disk(tmp_path / "absent", containers=True) == DiskState()


POD = PodSandbox(id="sb", name="train", namespace=o.NAMESPACE, uid=o.POD1_UID)


def vgpu(name: str) -> Container:
    return Container(id=name, pod_sandbox_id="sb", name=name, env=[f"MANAGER_VGPU_CLAIM_UID={o.CLAIM_UID}"])


async def test_the_component_logs_and_counts_what_persists_and_fixes_nothing(
    short_tmp: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = make_node(short_tmp)
    claim, pod = single_container_claim()
    node.harness.kube.add_claim(claim)
    node.harness.kube.add_pod(pod)
    assert (await node.harness.driver.prepare([REF]))[o.CLAIM_UID].error == ""
    node.nri.containers.replace([])  # as after the first Synchronize of an empty node
    await node.nri.create_container(CreateContainerRequest(pod=POD, container=vgpu("main")))
    await node.nri.create_container(CreateContainerRequest(pod=POD, container=vgpu("side")))
    assert (await node.drift.check()).differences == ()

    # Drift: a directory moved behind vgpud's back (missing, and a leftover), one removed.
    main_dir = Path(node.nri.containers.injected(o.POD1_UID, "main").directory)  # type: ignore[union-attr]
    main_dir.rename(main_dir.with_name("leftover"))
    side_dir = Path(node.nri.containers.injected(o.POD1_UID, "side").directory)  # type: ignore[union-attr]
    shutil.rmtree(side_dir)
    caplog.set_level(logging.INFO, logger="vgpud.observe.drift")
    first = await node.drift.check()
    assert first.differences == ()  # seen once: maybe a hook in flight
    second = await node.drift.check()
    assert kinds(list(second.differences)) == [
        ("directory-missing", f"{o.POD1_UID}/main main"),
        ("directory-missing", f"{o.POD1_UID}/side side"),
        ("orphan-directory", str(main_dir.with_name("leftover"))),
    ]
    assert second.detected == {"directory-missing": 2, "orphan-directory": 1}
    third = await node.drift.check()
    assert third.checks == 4 and third.detected["orphan-directory"] == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3  # each difference logged once, when first confirmed
    assert all(w.endswith("not fixed") for w in warnings)
    assert main_dir.with_name("leftover").is_dir()  # never fixed
    assert not side_dir.exists()
    assert node.nri.containers.injected(o.POD1_UID, "side") is not None

    # The runtime removes the container: its difference goes with it.
    await node.nri.remove_container(RemoveContainerRequest(pod=POD, container=vgpu("side")))
    await node.drift.check()
    fifth = await node.drift.check()
    assert kinds(list(fifth.differences)) == [
        ("directory-missing", f"{o.POD1_UID}/main main"),
        ("orphan-directory", str(main_dir.with_name("leftover"))),
    ]
    assert "no longer found" in caplog.text


async def test_eager_mode_counts_partition_conflicts(short_tmp: Path) -> None:
    """bug-2: Prepare ran before the pod was visible, so two requests became two partitions; the pod
    that appears afterwards uses both from one container."""
    node = make_node(short_tmp, lazy=False)
    pod = o.pod(
        "trainer", o.POD1_UID, containers=[o.container("main", o.ref("gpu", "r1"), o.ref("gpu", "r2"))]
    )
    claim = o.claim(
        requests=[o.exactly("r1"), o.exactly("r2")],
        results=[o.result("r1", "vgpu-0", share_id="s1"), o.result("r2", "vgpu-1", share_id="s2")],
        reserved_for=o.reserved(pod),
    )
    node.harness.kube.add_claim(claim)
    assert (await node.harness.driver.prepare([REF]))[o.CLAIM_UID].error == ""  # no pod yet
    assert (await node.drift.check()).conflicts == 0
    node.harness.kube.add_pod(pod)
    status = await node.drift.check()
    assert status.conflicts == 1 and status.last_error == ""
    state = await node.state.snapshot()
    (conflict,) = state["partition_conflicts"]
    assert conflict["partitions"] == ["r1", "r2"] and "bug-2" in conflict["reason"]
    assert sorted(state["partitions"]) == [f"{o.CLAIM_UID}/r1", f"{o.CLAIM_UID}/r2"]
    assert state["partitions"][f"{o.CLAIM_UID}/r1"]["containers"] == [f"{o.POD1_UID}/app/main"]
