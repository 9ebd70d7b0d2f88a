"""Eager mode: the reference's key scheme, CandidatesByKey with fallback aliases, register UUIDs."""

from __future__ import annotations

import hashlib
import itertools
import uuid
from collections.abc import Callable
from pathlib import PurePosixPath

import pytest

from tests import objects as o
from vgpud.partition.assigner import (
    Candidate,
    PartitionRecord,
    RegisterQuery,
    ResolveError,
    ResolveFacts,
    TargetNotFound,
)
from vgpud.partition.eager import (
    EagerAssigner,
    fallback_key,
    mint_register_uuids,
    resolve_partitions,
)
from vgpud.partition.layout import ENV_REGISTER_UUID, Layout
from vgpud.partition.model import ClaimView, ContainerKind, ContainerRef, PodView

LAYOUT = Layout(PurePosixPath("/etc/vgpu-manager"))


def sha12(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def uuids() -> Callable[[], str]:
    counter = itertools.count(1)
    return lambda: str(uuid.UUID(int=next(counter)))


def app(pod_uid: str, name: str) -> ContainerRef:
    return ContainerRef(pod_uid, ContainerKind.APP, name)


def init(pod_uid: str, name: str, sidecar: bool = False) -> ContainerRef:
    return ContainerRef(pod_uid, ContainerKind.INIT, name, sidecar)


def views(claim: dict, *pods: dict) -> tuple[ClaimView, list[PodView]]:
    return ClaimView.from_dict(claim, o.DRIVER), [PodView.from_dict(p) for p in pods]


U1, U2 = o.POD1_UID, o.POD2_UID
SINGLE = f"pod-{sha12(U1)}-app/main"


# --------------------------------------------------------------------------------------------------
# Table: claim + pods -> partitions (key -> containers, requests), fallback keys, candidates


def _table() -> list[tuple[str, dict, list[dict], dict, dict]]:
    """(id, claim, pods, {key: (containers, requests)}, {key: candidates})"""
    cases = []
    p = o.pod("trainer", U1, containers=[o.container("main", o.ref("gpu"))])
    cases.append(
        (
            "single-container",
            o.claim(requests=[o.exactly("gpu")], results=[o.result("gpu")], reserved_for=o.reserved(p)),
            [p],
            {SINGLE: ([app(U1, "main")], ["gpu"])},
            {SINGLE: [app(U1, "main")], "gpu": [app(U1, "main")]},
        )
    )

    p = o.pod(
        "trainer",
        U1,
        init=[o.container("prep", o.ref("gpu", "gpu"))],
        containers=[o.container("main", o.ref("gpu"))],
    )
    cg = "cg-" + sha12(f"{U1}/app/main,{U1}/init/prep|gpu")
    pair = [app(U1, "main"), init(U1, "prep")]
    cases.append(
        (
            "init-and-app-share-a-request",
            o.claim(requests=[o.exactly("gpu")], results=[o.result("gpu")], reserved_for=o.reserved(p)),
            [p],
            {cg: (pair, ["gpu"])},
            {cg: pair, "gpu": pair},
        )
    )

    p = o.pod(
        "server",
        U1,
        init=[o.container("agent", o.ref("gpu"), restart="Always")],
        containers=[o.container("main")],
    )
    key = f"pod-{sha12(U1)}-init/agent"
    agent = init(U1, "agent", sidecar=True)
    cases.append(
        (
            "sidecar-alone",
            o.claim(requests=[o.exactly("gpu")], results=[o.result("gpu")], reserved_for=o.reserved(p)),
            [p],
            {key: ([agent], ["gpu"])},
            {key: [agent], "gpu": [agent]},
        )
    )

    p = o.pod(
        "pair", U1, containers=[o.container("a", o.ref("gpu", "r1")), o.container("b", o.ref("gpu", "r2"))]
    )
    ka, kb = f"pod-{sha12(U1)}-app/a", f"pod-{sha12(U1)}-app/b"
    cases.append(
        (
            "two-apps-on-different-requests",
            o.claim(
                requests=[o.exactly("r1"), o.exactly("r2")],
                results=[o.result("r1", "vgpu-0"), o.result("r2", "vgpu-1")],
                reserved_for=o.reserved(p),
            ),
            [p],
            {ka: ([app(U1, "a")], ["r1"]), kb: ([app(U1, "b")], ["r2"])},
            {ka: [app(U1, "a")], kb: [app(U1, "b")], "r1": [app(U1, "a")], "r2": [app(U1, "b")]},
        )
    )

    p1 = o.pod("left", U1, containers=[o.container("main", o.ref("gpu", "r1"))])
    p2 = o.pod("right", U2, containers=[o.container("main", o.ref("gpu", "r2"))])
    k2 = f"pod-{sha12(U2)}-app/main"
    cases.append(
        (
            "two-pods-on-different-requests",
            o.claim(
                requests=[o.exactly("r1"), o.exactly("r2")],
                results=[o.result("r1", "vgpu-0"), o.result("r2", "vgpu-0")],
                reserved_for=o.reserved(p1, p2),
            ),
            [p1, p2],
            {SINGLE: ([app(U1, "main")], ["r1"]), k2: ([app(U2, "main")], ["r2"])},
            {
                SINGLE: [app(U1, "main")],
                k2: [app(U2, "main")],
                "r1": [app(U1, "main")],
                "r2": [app(U2, "main")],
            },
        )
    )

    p = o.pod("first", U1, containers=[o.container("main", o.ref("gpu", "r1"))])
    cases.append(
        (
            "request-without-consumer",
            o.claim(
                requests=[o.exactly("r1"), o.exactly("r2")],
                results=[o.result("r1", "vgpu-0"), o.result("r2", "vgpu-1")],
                reserved_for=o.reserved(p),
            ),
            [p],
            {SINGLE: ([app(U1, "main")], ["r1"]), "r2": ([], ["r2"])},
            {SINGLE: [app(U1, "main")], "r1": [app(U1, "main")]},
        )
    )

    p = o.pod("trainer", U1, containers=[o.container("main", o.ref("gpu", "gpu"))])
    cases.append(
        (
            "first-available",
            o.claim(
                requests=[o.first_available("gpu", "big", "small")],
                results=[o.result("gpu/small")],
                reserved_for=o.reserved(p),
            ),
            [p],
            {SINGLE: ([app(U1, "main")], ["gpu"])},
            {SINGLE: [app(U1, "main")], "gpu": [app(U1, "main")]},
        )
    )

    p = o.pod(
        "trainer", U1, containers=[o.container("main", o.ref("gpu")), o.container("net", o.ref("gpu", "nic"))]
    )
    cases.append(
        (
            "other-driver-in-the-same-claim",
            o.claim(
                requests=[o.exactly("gpu"), o.exactly("nic", "dranet")],
                results=[o.result("gpu"), o.result("nic", "eth1", driver=o.OTHER_DRIVER)],
                reserved_for=o.reserved(p),
            ),
            [p],
            {SINGLE: ([app(U1, "main")], ["gpu"])},
            {SINGLE: [app(U1, "main")], "gpu": [app(U1, "main")]},
        )
    )
    return cases


@pytest.mark.parametrize(
    ("claim", "pods", "partitions", "candidates"), [c[1:] for c in _table()], ids=[c[0] for c in _table()]
)
def test_partitions_keys_and_candidates(
    claim: dict, pods: list[dict], partitions: dict, candidates: dict
) -> None:
    info = resolve_partitions(*views(claim, *pods))
    got = {key: ([c for c in p.containers], list(p.requests)) for key, p in info.partitions.items()}
    assert got == {k: (sorted(cs, key=lambda c: c.node), rs) for k, (cs, rs) in partitions.items()}
    assert {k: list(v) for k, v in info.candidates_by_key.items()} == {
        k: sorted(v, key=lambda c: c.node) for k, v in candidates.items()
    }
    for key, partition in info.partitions.items():
        assert partition.fallback is (not partition.containers)
        assert all(info.request_to_partition[r] == key for r in partition.requests)


def test_no_reserved_pod_visible_means_fallback_partitions() -> None:
    p = o.pod("trainer", U1, containers=[o.container("main", o.ref("gpu"))])
    claim = o.claim(
        requests=[o.exactly("gpu"), o.exactly("aux")],
        results=[o.result("gpu"), o.result("aux")],
        reserved_for=o.reserved(p),
    )
    info = resolve_partitions(ClaimView.from_dict(claim, o.DRIVER), [])
    assert info.fallback and set(info.partitions) == {"gpu", "aux"}
    assert info.candidates_by_key == {}


def test_pods_not_in_reserved_for_are_ignored() -> None:
    reserved = o.pod("trainer", U1, containers=[o.container("main", o.ref("gpu"))])
    stranger = o.pod("other", U2, containers=[o.container("main", o.ref("gpu"))])
    wrong_ns = o.pod("trainer", U1, namespace="elsewhere", containers=[o.container("main", o.ref("gpu"))])
    claim = o.claim(requests=[o.exactly("gpu")], results=[o.result("gpu")], reserved_for=o.reserved(reserved))
    claim_view = ClaimView.from_dict(claim, o.DRIVER)
    assert set(resolve_partitions(claim_view, [PodView.from_dict(stranger)]).partitions) == {"gpu"}
    assert set(resolve_partitions(claim_view, [PodView.from_dict(wrong_ns)]).partitions) == {"gpu"}


def test_fallback_key_sanitizes_like_the_reference() -> None:
    assert fallback_key("gpu-0.a_b") == "gpu-0.a_b"
    assert fallback_key("a/b c\u00e9") == "a-b-c-"
    assert fallback_key("") == "unknown"


# --------------------------------------------------------------------------------------------------
# Prepare: per-device edits, UUIDs, stability


def _late_consumer() -> tuple[dict, dict, dict, dict]:
    p1 = o.pod("first", U1, containers=[o.container("main", o.ref("gpu", "r1"))])
    p2 = o.pod("second", U2, containers=[o.container("main", o.ref("gpu", "r2"))])
    requests = [o.exactly("r1"), o.exactly("r2")]
    results = [o.result("r1", "vgpu-0"), o.result("r2", "vgpu-1")]
    before = o.claim(requests=requests, results=results, reserved_for=o.reserved(p1))
    after = o.claim(requests=requests, results=results, reserved_for=o.reserved(p1, p2))
    return before, after, p1, p2


def test_prepare_emits_one_uuid_per_partition_and_its_annotation() -> None:
    before, _, p1, _ = _late_consumer()
    assigner = EagerAssigner(LAYOUT, driver=o.DRIVER, client_mode=True, new_uuid=uuids())
    result = assigner.prepare(*views(before, p1))
    u1, u2 = (str(uuid.UUID(int=i)) for i in (1, 2))
    assert [(d.device.device, d.partition_key, d.env) for d in result.devices] == [
        ("vgpu-0", SINGLE, {ENV_REGISTER_UUID: u1}),
        ("vgpu-1", "r2", {ENV_REGISTER_UUID: u2}),
    ]
    assert result.annotations == {f"{o.DRIVER}/{u1}": SINGLE, f"{o.DRIVER}/{u2}": "r2"}
    assert result.devices[0].annotations == {f"{o.DRIVER}/{u1}": SINGLE}
    assert result.record == PartitionRecord({"r1": SINGLE, "r2": "r2"}, {SINGLE: u1, "r2": u2})
    claim_dir = LAYOUT.root / "claims" / o.CLAIM_UID
    assert [p.base for p in result.partition_dirs] == [claim_dir / SINGLE, claim_dir / "r2"]
    assert result.devices[1].mounts[0].host_path == f"{claim_dir}/r2/config"


def test_keys_and_uuids_are_stable_across_repeated_prepare() -> None:
    before, _, p1, _ = _late_consumer()
    minted: list[str] = []
    source = uuids()

    def new_uuid() -> str:
        minted.append(source())
        return minted[-1]

    assigner = EagerAssigner(LAYOUT, driver=o.DRIVER, client_mode=True, new_uuid=new_uuid)
    first = assigner.prepare(*views(before, p1))
    patched = o.claim(
        requests=before["spec"]["devices"]["requests"],
        results=before["status"]["allocation"]["devices"]["results"],
        reserved_for=before["status"]["reservedFor"],
        annotations=dict(first.annotations),
    )
    second = assigner.prepare(*views(patched, p1))
    assert len(minted) == 2
    assert second.devices == first.devices and second.record == first.record
    assert second.annotations == {}


def test_a_key_minted_before_a_consumer_joined_still_resolves() -> None:
    """Prepare saw only `first`; `second` joined reservedFor later and uses r2's fallback partition."""
    before, after, p1, p2 = _late_consumer()
    assigner = EagerAssigner(LAYOUT, driver=o.DRIVER, client_mode=True, new_uuid=uuids())
    prepared = assigner.prepare(*views(before, p1))
    u2 = prepared.record.register_uuids["r2"]
    after["metadata"]["annotations"] = dict(prepared.annotations)
    claim, pods = views(after, p1, p2)

    info = resolve_partitions(claim, pods)
    k2 = f"pod-{sha12(U2)}-app/main"
    assert info.request_to_partition["r2"] == k2  # the current snapshot has a real key ...
    assert info.candidates_by_key["r2"] == (app(U2, "main"),)  # ... and the old one is an alias

    target = assigner.resolve(RegisterQuery(register_uuid=u2), ResolveFacts(claim=claim, pods=tuple(pods)))
    assert target.partition_key == "r2"
    assert target.config_dir == LAYOUT.root / "claims" / o.CLAIM_UID / "r2" / "config"
    assert target.candidates == (Candidate(U2, "main"),)
    assert assigner.conflicts(prepared.record, claim, pods) == ()


def test_client_mode_off_means_no_uuid_and_no_annotations() -> None:
    before, _, p1, _ = _late_consumer()
    result = EagerAssigner(LAYOUT, driver=o.DRIVER, client_mode=False).prepare(*views(before, p1))
    assert all(d.env == {} and d.annotations == {} for d in result.devices)
    assert result.annotations == {} and result.record.register_uuids == {}
    assert len(result.devices[0].mounts) == 5


def test_uuid_reuse_ignores_foreign_and_stale_annotations() -> None:
    u_old, u_other = str(uuid.UUID(int=7)), str(uuid.UUID(int=8))
    annotations = {
        f"{o.DRIVER}/{u_old}": "gone-key",
        f"{o.DRIVER}/vgpu-compute-policy": "gpu",
        f"other.io/{u_other}": "gpu",
        f"{o.DRIVER}/{u_other}": "gpu",
    }
    minted = mint_register_uuids(["gpu", "new"], annotations, o.DRIVER, uuids())
    assert minted == {"gpu": u_other, "new": str(uuid.UUID(int=1))}
    with pytest.raises(ValueError, match="not a lower-case UUID"):
        mint_register_uuids(["k"], {}, o.DRIVER, lambda: "not-a-uuid")


# --------------------------------------------------------------------------------------------------
# Registry resolution


def test_resolve_errors() -> None:
    before, _, p1, _ = _late_consumer()
    assigner = EagerAssigner(LAYOUT, driver=o.DRIVER, client_mode=True, new_uuid=uuids())
    prepared = assigner.prepare(*views(before, p1))
    u1 = prepared.record.register_uuids[SINGLE]
    before["metadata"]["annotations"] = {**prepared.annotations, f"{o.DRIVER}/{uuid.UUID(int=99)}": "../../x"}
    claim, pods = views(before, p1)
    facts = ResolveFacts(claim=claim, pods=tuple(pods))

    with pytest.raises(TargetNotFound, match="no claim carries"):
        assigner.resolve(RegisterQuery(register_uuid=u1), ResolveFacts())
    with pytest.raises(ResolveError, match="has no annotation"):
        assigner.resolve(RegisterQuery(register_uuid=str(uuid.UUID(int=50))), facts)
    with pytest.raises(ResolveError, match="no container"):  # a forged key resolves to nobody
        assigner.resolve(RegisterQuery(register_uuid=str(uuid.UUID(int=99))), facts)
    with pytest.raises(ResolveError, match="no container"):  # r2 has no consumer yet: retry
        assigner.resolve(RegisterQuery(register_uuid=prepared.record.register_uuids["r2"]), facts)
    with pytest.raises(TargetNotFound, match="needs register_uuid"):
        assigner.resolve(RegisterQuery(), facts)

    # a failed UUID lookup with pod UID + container retries by pod UID: the device-plugin directory
    target = assigner.resolve(RegisterQuery(str(uuid.UUID(int=50)), U1, "main"), facts)
    assert target.config_dir == LAYOUT.root / f"{U1}_main" / "config"
    assert target.candidates == (Candidate(U1, "main"),) and target.claim_uid is None
    assert assigner.resolve(RegisterQuery(register_uuid=u1), facts).candidates == (Candidate(U1, "main"),)


def test_partition_record_round_trips_through_the_checkpoint() -> None:
    record = PartitionRecord({"r1": "k1", "r2": "r2"}, {"k1": str(uuid.UUID(int=1))})
    assert PartitionRecord.from_dict(record.to_dict()) == record
    assert PartitionRecord.from_dict({}) == PartitionRecord()
    with pytest.raises(ValueError, match="requestPartitions"):
        PartitionRecord.from_dict({"requestPartitions": {"r1": 3}})
