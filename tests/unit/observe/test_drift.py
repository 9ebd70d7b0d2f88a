"""The drift self-check: the pure comparison rule by rule, confirmation over two checks, the disk scan,
and the component over real NRI hooks and directories (never fixing anything)."""

from __future__ import annotations

import logging
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
from vgpud.nri.cache import CacheEntry, NotInjected, RuntimeContainer
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


def entry(claim: str, pod: str, ctr: str) -> CacheEntry:
    return CacheEntry(pod, ctr, claim, ROOT / claim / f"{pod}_{ctr}")


def running(claim: str, namespace: str = "ml") -> RuntimeContainer:
    return RuntimeContainer("p1", "main", claim, namespace, "train")


def disk(*dirs: PurePosixPath, claims: tuple[str, ...] = (A,)) -> DiskState:
    return DiskState(frozenset(claims), frozenset(dirs))


VGPU = {A: "ml", B: "ml"}  # prepared vGPU claims -> their namespace
HEALTHY_CACHE = {"c1": entry(A, "p1", "main")}  # by container ID
HEALTHY_RUNTIME = {"c1": running(A)}


def kinds(found: list[Difference]) -> list[tuple[str, str]]:
    return [(d.kind.value, d.subject) for d in found]


@pytest.mark.parametrize(
    ("cache", "runtime", "on_disk", "expected"),
    [
        pytest.param(HEALTHY_CACHE, HEALTHY_RUNTIME, disk(ROOT / A / "p1_main"), [], id="agreeing"),
        pytest.param(
            HEALTHY_CACHE,
            {},
            disk(ROOT / A / "p1_main"),
            [("cached-not-in-runtime", "p1/main c1")],
            id="cached, gone from the runtime",
        ),
        pytest.param(
            {},
            HEALTHY_RUNTIME,
            disk(),
            [("runtime-not-cached", "p1/main c1")],
            id="running vGPU container not cached",
        ),
        pytest.param(
            {},
            {"c1": running("not-prepared")},
            disk(),
            [],
            id="unprepared claim: rejected by design",
        ),
        pytest.param(
            HEALTHY_CACHE, HEALTHY_RUNTIME, disk(), [("directory-missing", "p1/main c1")], id="directory gone"
        ),
        pytest.param(
            HEALTHY_CACHE,
            HEALTHY_RUNTIME,
            disk(ROOT / A / "p1_main", ROOT / A / "p9_old"),
            [("orphan-directory", "/m/claims/claim-a/p9_old")],
            id="leftover directory",
        ),
    ],
)
def test_nri_rules(cache, runtime, on_disk, expected) -> None:  # type: ignore[no-untyped-def]
    nri = NriView(cache=cache, runtime=runtime, synced=True)
    found = compare(nri=nri, disk=on_disk, prepared=frozenset({A, B}), vgpu_claims={A: "ml"})
    assert kinds(found) == expected


def test_a_container_without_its_injection_is_reported_once_and_owns_its_directory() -> None:
    """Created while vgpud was away (or after the runtime dropped it): one not-injected difference,
    not also runtime-not-cached, and its directory is not an orphan."""
    found = NotInjected(
        "p1", "main", A, "ml", "train", ROOT / A / "p1_main", ("mount /etc/vgpu-manager/config",)
    )
    nri = NriView(cache={}, runtime=HEALTHY_RUNTIME, synced=True, not_injected={"c1": found})
    differences = compare(
        nri=nri, disk=disk(ROOT / A / "p1_main"), prepared=frozenset({A}), vgpu_claims={A: "ml"}
    )
    assert kinds(differences) == [("not-injected", "p1/main c1")]
    assert differences[0].detail == "ml/train, claim claim-a, missing mount /etc/vgpu-manager/config"


def test_claims_that_disagree() -> None:
    nri = NriView(cache=HEALTHY_CACHE, runtime={"c1": running(B)}, synced=True)
    found = compare(
        nri=nri,
        disk=disk(ROOT / A / "p1_main", claims=(A, B)),
        prepared=frozenset({A, B}),
        vgpu_claims=VGPU,
    )
    assert kinds(found) == [("claim-mismatch", "p1/main c1")]
    assert found[0].detail == "cache: claim claim-a, runtime: claim claim-b"


def test_claim_directory_rules_apply_in_both_modes() -> None:
    found = compare(
        nri=None,
        disk=DiskState(frozenset({A, "stale"})),
        prepared=frozenset({A, B, "no-vgpu"}),
        vgpu_claims=VGPU,
    )
    assert kinds(found) == [("claim-directory-missing", B), ("orphan-claim-directory", "stale")]


def test_nothing_about_nri_before_the_first_synchronize() -> None:
    nri = NriView(cache={}, runtime=HEALTHY_RUNTIME, synced=False)
    assert compare(nri=nri, disk=disk(), prepared=frozenset({A}), vgpu_claims={A: "ml"}) == []


def test_eager_directories_are_not_container_directories() -> None:
    nri = NriView(cache={}, runtime={}, synced=True, lazy=False)
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
    node.nri.cache.replace([])  # as after the first Synchronize of an empty node
    await node.nri.create_container(CreateContainerRequest(pod=POD, container=vgpu("main")))
    await node.nri.create_container(CreateContainerRequest(pod=POD, container=vgpu("side")))
    assert (await node.drift.check()).differences == ()

    # Drift: a directory removed behind vgpud's back, a leftover directory, an entry the runtime lost.
    main_dir = Path(node.nri.cache.get(o.POD1_UID, "main").directory)  # type: ignore[union-attr]
    main_dir.rename(main_dir.with_name("leftover"))
    node.nri.runtime.pop("side")
    caplog.set_level(logging.INFO, logger="vgpud.observe.drift")
    first = await node.drift.check()
    assert first.differences == ()  # seen once: maybe a hook in flight
    second = await node.drift.check()
    assert kinds(list(second.differences)) == [
        ("cached-not-in-runtime", f"{o.POD1_UID}/side side"),
        ("directory-missing", f"{o.POD1_UID}/main main"),
        ("orphan-directory", str(main_dir.with_name("leftover"))),
    ]
    assert second.detected == {"cached-not-in-runtime": 1, "directory-missing": 1, "orphan-directory": 1}
    third = await node.drift.check()
    assert third.checks == 4 and third.detected["orphan-directory"] == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3  # each difference logged once, when first confirmed
    assert all(w.endswith("not fixed") for w in warnings)
    assert main_dir.with_name("leftover").is_dir()  # never fixed
    assert node.nri.cache.get(o.POD1_UID, "side") is not None

    # The runtime removes the container: cache and runtime agree again.
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
