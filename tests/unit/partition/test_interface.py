"""One suite, both assigners (seed §9): every case runs through `PartitionAssigner` in eager and lazy
mode; where the modes legitimately differ, the case says what each must do.

Each case is a claim and its pods at Prepare time, the pods when the containers start, and which
containers start. Common to both modes: a started container has exactly one directory and one set
of partition mounts, nothing collides, its register call resolves back to that directory with it as
a candidate, Prepare/CreateContainer create that directory, and Unprepare removes it.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import pytest

from tests import objects as o
from tests.unit.partition.runtime import ContainerView, resolve_facts, start_container
from vgpud.partition.assigner import Candidate, ClaimRefused, Mode, PartitionAssigner, PrepareResult
from vgpud.partition.eager import EagerAssigner
from vgpud.partition.layout import (
    CONT_PIDS_FILE,
    CONT_SM_NODE,
    CONT_VGPU_LOCK,
    CONT_VMEM_NODE,
    ENV_REGISTER_UUID,
    ENV_VISIBLE_DEVICE,
    Layout,
    indexed,
)
from vgpud.partition.lazy import LazyAssigner
from vgpud.partition.model import ClaimView, PodView

# vgpud sees the manager root somewhere else than the runtime does, so a mix-up shows
LAYOUT = Layout(root=PurePosixPath("/run/vgpud/manager"), host_root=PurePosixPath("/etc/vgpu-manager"))


def counting_uuids() -> Callable[[], str]:
    counter = itertools.count(1)
    return lambda: str(uuid.UUID(int=next(counter)))


def make_assigner(mode: Mode) -> PartitionAssigner:
    if mode is Mode.EAGER:
        return EagerAssigner(LAYOUT, driver=o.DRIVER, client_mode=True, new_uuid=counting_uuids())
    return LazyAssigner(LAYOUT, driver=o.DRIVER)


@pytest.fixture(params=[Mode.EAGER, Mode.LAZY], ids=str)
def assigner(request: pytest.FixtureRequest) -> PartitionAssigner:
    return make_assigner(request.param)


Name = tuple[str, str]  # (pod name, container name)
REFUSED = "refused"


@dataclass(frozen=True)
class Case:
    id: str
    claim: dict[str, Any]
    pods: list[dict[str, Any]]
    start: list[Name]
    #: eager: the groups of started containers that share one directory (lazy: each alone), or REFUSED
    eager_groups: list[set[Name]] | str
    #: the pods Prepare sees, when fewer than at start
    prepare_pods: list[dict[str, Any]] | None = None
    #: the claim at start, when reservedFor grew after Prepare
    claim_later: dict[str, Any] | None = None
    #: containers of the pods that must get no vGPU edits at all
    untouched: list[Name] = field(default_factory=list)


def _single() -> Case:
    p1 = o.pod("trainer", o.POD1_UID, containers=[o.container("main", o.ref("gpu"))])
    return Case(
        "single-container",
        o.claim(requests=[o.exactly("gpu")], results=[o.result("gpu")], reserved_for=o.reserved(p1)),
        [p1],
        [("trainer", "main")],
        [{("trainer", "main")}],
    )


def _init_and_app() -> Case:
    p1 = o.pod(
        "trainer",
        o.POD1_UID,
        init=[o.container("prep", o.ref("gpu", "gpu"))],
        containers=[o.container("main", o.ref("gpu"))],
    )
    return Case(
        "init-and-app-share-a-request",
        o.claim(requests=[o.exactly("gpu")], results=[o.result("gpu")], reserved_for=o.reserved(p1)),
        [p1],
        [("trainer", "prep"), ("trainer", "main")],
        [{("trainer", "prep"), ("trainer", "main")}],
    )


def _sidecar() -> Case:
    p1 = o.pod(
        "server",
        o.POD1_UID,
        templates={"gpu": "server-gpu-x7k2p"},
        init=[o.container("agent", o.ref("gpu"), restart="Always")],
        containers=[o.container("main")],
    )
    return Case(
        "sidecar-alone",
        o.claim(
            name="server-gpu-x7k2p",
            requests=[o.exactly("gpu")],
            results=[o.result("gpu")],
            reserved_for=o.reserved(p1),
        ),
        [p1],
        [("server", "agent")],
        [{("server", "agent")}],
        untouched=[("server", "main")],
    )


def _two_apps() -> Case:
    p1 = o.pod(
        "pair",
        o.POD1_UID,
        containers=[o.container("a", o.ref("gpu", "r1")), o.container("b", o.ref("gpu", "r2"))],
    )
    return Case(
        "two-apps-on-different-requests",
        o.claim(
            requests=[o.exactly("r1"), o.exactly("r2")],
            results=[o.result("r1", "vgpu-0"), o.result("r2", "vgpu-1")],
            reserved_for=o.reserved(p1),
        ),
        [p1],
        [("pair", "a"), ("pair", "b")],
        [{("pair", "a")}, {("pair", "b")}],
    )


def _two_pods() -> Case:
    p1 = o.pod("left", o.POD1_UID, containers=[o.container("main", o.ref("gpu", "r1"))])
    p2 = o.pod("right", o.POD2_UID, containers=[o.container("main", o.ref("gpu", "r2"))])
    return Case(
        "two-pods-on-different-requests",
        o.claim(
            requests=[o.exactly("r1"), o.exactly("r2")],
            results=[o.result("r1", "vgpu-0"), o.result("r2", "vgpu-0")],
            reserved_for=o.reserved(p1, p2),
        ),
        [p1, p2],
        [("left", "main"), ("right", "main")],
        REFUSED,
    )


def _late_consumer() -> Case:
    p1 = o.pod("first", o.POD1_UID, containers=[o.container("main", o.ref("gpu", "r1"))])
    p2 = o.pod("second", o.POD2_UID, containers=[o.container("main", o.ref("gpu", "r2"))])
    requests = [o.exactly("r1"), o.exactly("r2")]
    results = [o.result("r1", "vgpu-0"), o.result("r2", "vgpu-1")]
    return Case(
        "request-without-consumer-then-consumer-joins",
        o.claim(requests=requests, results=results, reserved_for=o.reserved(p1)),
        [p1, p2],
        [("first", "main"), ("second", "main")],
        [{("first", "main")}, {("second", "main")}],
        prepare_pods=[p1],
        claim_later=o.claim(requests=requests, results=results, reserved_for=o.reserved(p1, p2)),
    )


def _first_available() -> Case:
    p1 = o.pod("trainer", o.POD1_UID, containers=[o.container("main", o.ref("gpu", "gpu"))])
    return Case(
        "first-available",
        o.claim(
            requests=[o.first_available("gpu", "big", "small")],
            results=[o.result("gpu/small")],
            reserved_for=o.reserved(p1),
        ),
        [p1],
        [("trainer", "main")],
        [{("trainer", "main")}],
    )


def _other_driver() -> Case:
    p1 = o.pod(
        "trainer",
        o.POD1_UID,
        containers=[o.container("main", o.ref("gpu")), o.container("net", o.ref("gpu", "nic"))],
    )
    return Case(
        "other-driver-in-the-same-claim",
        o.claim(
            requests=[o.exactly("gpu"), o.exactly("nic", "dranet")],
            results=[o.result("gpu"), o.result("nic", "eth1", driver=o.OTHER_DRIVER)],
            reserved_for=o.reserved(p1),
        ),
        [p1],
        [("trainer", "main")],
        [{("trainer", "main")}],
        untouched=[("trainer", "net")],
    )


CASES = [
    _single(),
    _init_and_app(),
    _sidecar(),
    _two_apps(),
    _two_pods(),
    _late_consumer(),
    _first_available(),
    _other_driver(),
]


def _views(pods: list[dict[str, Any]]) -> dict[str, PodView]:
    return {p["metadata"]["name"]: PodView.from_dict(p) for p in pods}


def _with_annotations(claim: dict[str, Any], added: dict[str, str]) -> ClaimView:
    """The claim as the DRA plugin leaves it: Prepare's annotations patched in."""
    view = ClaimView.from_dict(claim, o.DRIVER)
    return ClaimView(**{**view.__dict__, "annotations": {**view.annotations, **added}})


@dataclass
class Run:
    prepared: PrepareResult
    claim: ClaimView
    pods: dict[str, PodView]
    views: dict[Name, ContainerView]


def run(assigner: PartitionAssigner, case: Case) -> Run:
    prepare_pods = list(_views(case.pods if case.prepare_pods is None else case.prepare_pods).values())
    prepared = assigner.prepare(ClaimView.from_dict(case.claim, o.DRIVER), prepare_pods)
    claim = _with_annotations(case.claim_later or case.claim, dict(prepared.annotations))
    pods = _views(case.pods)
    views = {
        name: start_container(assigner, prepared, claim, pods[name[0]], name[1])
        for name in case.start + case.untouched
    }
    return Run(prepared, claim, pods, views)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_each_container_gets_one_directory_that_its_registration_resolves_to(
    assigner: PartitionAssigner, case: Case
) -> None:
    if assigner.mode is Mode.EAGER and case.eager_groups == REFUSED:
        with pytest.raises(ClaimRefused, match="reserved for 2 pods"):
            assigner.prepare(ClaimView.from_dict(case.claim, o.DRIVER), list(_views(case.pods).values()))
        return
    r = run(assigner, case)
    created = (
        {p.config for p in r.prepared.partition_dirs}
        if assigner.mode is Mode.EAGER
        else {v.injection.paths.config for v in r.views.values() if v.injection}
    )
    (claim_dir,) = assigner.unprepare(r.claim.uid, r.claim.annotations).paths

    for name in case.start:
        view = r.views[name]
        assert not view.env_collisions and not view.mount_collisions, name
        (config,) = view.config_mounts
        assert not config.read_only
        for destination in (CONT_VGPU_LOCK, CONT_VMEM_NODE, CONT_SM_NODE):
            (mount,) = view.mounts_at(destination)
            assert PurePosixPath(mount.host_path).parent == PurePosixPath(config.host_path).parent
        (pids,) = view.mounts_at(CONT_PIDS_FILE)
        assert pids.read_only and pids.host_path == f"{config.host_path}/pids.config"

        target = assigner.resolve(view.register_query(), resolve_facts(r.claim, list(r.pods.values()), view))
        assert str(LAYOUT.host(target.config_dir)) == config.host_path
        assert Candidate(r.pods[name[0]].uid, name[1]) in target.candidates
        assert target.config_dir in created
        assert target.config_dir.is_relative_to(claim_dir)

    for name in case.untouched:
        assert not r.views[name].devices and not r.views[name].mounts and not r.views[name].env
    assert assigner.conflicts(r.prepared.record, r.claim, list(r.pods.values())) == ()


@pytest.mark.parametrize("case", [c for c in CASES if c.eager_groups != REFUSED], ids=lambda c: c.id)
def test_which_containers_share_a_directory(assigner: PartitionAssigner, case: Case) -> None:
    r = run(assigner, case)
    groups: dict[str, set[Name]] = {}
    for name in case.start:
        groups.setdefault(r.views[name].config_mounts[0].host_path, set()).add(name)
    expected = case.eager_groups if assigner.mode is Mode.EAGER else [{n} for n in case.start]
    assert sorted(map(sorted, groups.values())) == sorted(map(sorted, expected))


def test_two_pods_on_one_claim_get_separate_directories_in_lazy_mode() -> None:
    """The case eager refuses (seed §12.6: the one-pod guard is an algorithm constraint of eager)."""
    case = _two_pods()
    r = run(make_assigner(Mode.LAZY), case)
    dirs = {r.views[n].config_mounts[0].host_path for n in case.start}
    assert len(dirs) == 2


def test_remove_container(assigner: PartitionAssigner) -> None:
    r = run(assigner, _init_and_app())
    cleanup = assigner.remove_container(r.claim.uid, o.POD1_UID, "prep")
    if assigner.mode is Mode.EAGER:
        assert cleanup.paths == ()  # the directory is shared with "main"; Unprepare removes it
    else:
        assert cleanup.paths == (r.views[("trainer", "prep")].injection.paths.base,)
        assert cleanup.paths[0] != r.views[("trainer", "main")].injection.paths.base


def test_unprepare_removes_the_claim_directory_and_register_annotations(assigner: PartitionAssigner) -> None:
    r = run(assigner, _two_apps())
    cleanup = assigner.unprepare(
        r.claim.uid, {**r.claim.annotations, "nvidia.com/vgpu-compute-policy": "none"}
    )
    assert cleanup.paths == (LAYOUT.root / "claims" / o.CLAIM_UID,)
    assert set(cleanup.annotations_to_remove) == set(r.prepared.annotations)
    assert bool(cleanup.annotations_to_remove) is (assigner.mode is Mode.EAGER)


def test_prepare_claim_env_marks_the_claim_only_in_lazy_mode(assigner: PartitionAssigner) -> None:
    r = run(assigner, _single())
    expected = "" if assigner.mode is Mode.EAGER else o.CLAIM_UID
    assert r.prepared.claim_env == {"MANAGER_VGPU_CLAIM_UID": expected}
    assert r.prepared.claim_dir == LAYOUT.root / "claims" / o.CLAIM_UID


# --------------------------------------------------------------------------------------------------
# bug-2: one container, two requests, both prepared before the container was visible


def _bug2() -> tuple[dict[str, Any], dict[str, Any]]:
    p1 = o.pod(
        "trainer", o.POD1_UID, containers=[o.container("main", o.ref("gpu", "r1"), o.ref("gpu", "r2"))]
    )
    claim = o.claim(
        requests=[o.exactly("r1"), o.exactly("r2")],
        results=[o.result("r1", "vgpu-0"), o.result("r2", "vgpu-1", cores="30", memory="2Gi")],
        reserved_for=o.reserved(p1),
    )
    return claim, p1


def test_bug2_through_the_interface(assigner: PartitionAssigner) -> None:
    """Prepare ran before the pod was in the informer cache, so neither request had a consumer.

    Eager: each request became its own fallback partition; the container receives both devices, two
    register UUIDs for one variable and two directories for one set of destinations — the known
    collision — and `conflicts` reports it. Lazy: one directory, one set of mounts, no UUID, and the
    two devices' env differ only in their _<idx> suffixes.
    """
    claim_dict, pod_dict = _bug2()
    r = run(assigner, Case("bug-2", claim_dict, [pod_dict], [("trainer", "main")], [], prepare_pods=[]))
    view = r.views[("trainer", "main")]
    assert len(view.devices) == 2
    conflicts = assigner.conflicts(r.prepared.record, r.claim, list(r.pods.values()))

    if assigner.mode is Mode.EAGER:
        assert [d.partition_key for d in view.devices] == ["r1", "r2"]
        uuids = [d.env[ENV_REGISTER_UUID] for d in view.devices]
        assert uuids[0] != uuids[1]
        assert view.env_collisions == {ENV_REGISTER_UUID: uuids}
        assert len(view.config_mounts) == 2
        assert set(view.mount_collisions) == {
            "/etc/vgpu-manager/config",
            "/tmp/.vgpu_lock",
            "/tmp/.vmem_node",
            "/tmp/.sm_node",
            "/etc/vgpu-manager/config/pids.config",
        }
        (conflict,) = conflicts
        assert conflict.container == PodView.from_dict(pod_dict).containers[0].ref
        assert conflict.partitions == ("r1", "r2")
        assert "bug-2" in conflict.reason and all(u in conflict.reason for u in uuids)
        assert "/etc/vgpu-manager/config" in conflict.reason
        # one UUID reaches the library (which one is the runtime's choice): only its partition's
        # pids.config is ever written, the other stays empty
        target = assigner.resolve(view.register_query(), resolve_facts(r.claim, list(r.pods.values()), view))
        assert (
            target.partition_key == dict(zip(uuids, ["r1", "r2"], strict=True))[view.env[ENV_REGISTER_UUID]]
        )
    else:
        assert conflicts == ()
        assert not view.env_collisions and not view.mount_collisions
        assert len(view.config_mounts) == 1
        assert r.prepared.partition_dirs == () and view.injection is not None
        assert view.env[ENV_REGISTER_UUID] == ""
        assert not r.prepared.annotations
        assert view.env[indexed(ENV_VISIBLE_DEVICE, 0)] != view.env[indexed(ENV_VISIBLE_DEVICE, 1)]
        assert view.env["CUDA_CORE_LIMIT_0"] == "40" and view.env["CUDA_CORE_LIMIT_1"] == "30"
        assert view.env["CUDA_MEM_LIMIT_0"] == "4096m" and view.env["CUDA_MEM_LIMIT_1"] == "2048m"
        target = assigner.resolve(view.register_query(), resolve_facts(r.claim, list(r.pods.values()), view))
        assert str(LAYOUT.host(target.config_dir)) == view.config_mounts[0].host_path
