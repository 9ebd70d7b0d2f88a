"""The soak's pure parts: the sequence generator (tests/soak/plan.py) and the invariant checks
(tests/soak/invariants.py), on hand-made snapshots."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from tests.soak import invariants as inv
from tests.soak.plan import KINDS, SHAPES, SLOW, plan

CLAIM, POD, CID = "claim-1", "pod-1", "c" * 64


# -- the sequence ------------------------------------------------------------------------------------


def test_the_same_seed_gives_the_same_sequence() -> None:
    assert plan(7, 200) == plan(7, 200)
    assert plan(7, 200) != plan(8, 200)


def test_a_sequence_is_a_prefix_free_draw_of_its_seed() -> None:
    # a replay with the same N gets the same steps in the same order, numbered from 0
    steps = plan(12345, 50)
    assert [s.index for s in steps] == list(range(50))
    assert all(0 <= s.pick < 1 and s.shape in SHAPES and 0 <= s.delay <= 2.5 for s in steps)


@pytest.mark.parametrize("seed", range(20))
def test_every_kind_appears_once_there_are_enough_steps(seed: int) -> None:
    counts = Counter(s.name for s in plan(seed, len(KINDS)))
    assert set(counts) == set(KINDS)
    short = Counter(s.name for s in plan(seed, 15, exclude=SLOW))
    assert set(short) == set(KINDS) - SLOW


def test_a_long_sequence_follows_the_weights() -> None:
    counts = Counter(s.name for s in plan(3, 5000))
    assert counts["create_pod"] > counts["container_exit"] > counts["kill_vgpud"] > counts["nri_outage"] > 0
    assert Counter(s.shape for s in plan(3, 5000)).keys() == set(SHAPES)


def test_bad_plans_are_refused() -> None:
    with pytest.raises(ValueError, match="no such soak operation: nope"):
        plan(1, 10, exclude=frozenset({"nope"}))
    with pytest.raises(ValueError, match="every soak operation excluded"):
        plan(1, 10, exclude=frozenset(KINDS))
    with pytest.raises(ValueError, match="a soak of -1 steps"):
        plan(1, -1)


# -- the invariants ----------------------------------------------------------------------------------


def lazy_snapshot() -> inv.Snapshot:
    """One running container of one pod on one claim, everything in place (NRI track)."""
    container = inv.Container("ns", "p", POD, "main", CID, CLAIM)
    rel = inv.container_dir(CLAIM, POD, "main")
    return inv.Snapshot(
        mode="lazy",
        health=inv.SERVING,
        running=[container],
        pod_uids={POD},
        needed_claims={CLAIM},
        claim_dirs={CLAIM: {f"{POD}_main"}},
        cdi_specs={CLAIM},
        checkpoint={CLAIM: "PrepareCompleted"},
        nri_cache={rel: {CID}},
    )


def eager_snapshot() -> inv.Snapshot:
    snap = lazy_snapshot()
    return replace(
        snap,
        mode="eager",
        nri_cache={},
        claim_dirs={CLAIM: {"cg-abc"}},
        partitions={f"{CLAIM}/cg-abc": {inv.partition_node(POD, "main")}},
    )


@pytest.mark.parametrize("make", [lazy_snapshot, eager_snapshot])
def test_a_consistent_node_passes(make: object) -> None:
    verdict = inv.check(make())  # type: ignore[operator]
    assert verdict.ok and not verdict.reported and not verdict.pending, verdict


def test_a_running_container_without_its_cache_entry_fails() -> None:
    snap = replace(lazy_snapshot(), nri_cache={})
    assert inv.check(snap).violations == [
        f"ns/p/main ({CID[:12]}): no NRI cache entry {CLAIM}/{POD}_main lists it"
    ]


def test_a_running_container_without_its_registration_target_fails() -> None:
    snap = replace(lazy_snapshot(), claim_dirs={CLAIM: set()})
    assert inv.check(snap).violations == [
        f"ns/p/main ({CID[:12]}): directory {CLAIM}/{POD}_main or its config/pids.config is missing"
    ]
    eager = replace(eager_snapshot(), claim_dirs={CLAIM: set()})
    assert "cg-abc or its config/pids.config is missing" in inv.check(eager).violations[0]


def test_an_eager_container_in_no_partition_fails() -> None:
    snap = replace(eager_snapshot(), partitions={f"{CLAIM}/cg-abc": {"other/app/main"}})
    assert inv.check(snap).violations == [f"ns/p/main ({CID[:12]}): in no partition of claim {CLAIM}"]


def test_a_container_vgpud_reports_as_not_injected_is_reported_not_failed() -> None:
    snap = replace(lazy_snapshot(), nri_cache={}, claim_dirs={CLAIM: set()}, not_injected={CID})
    verdict = inv.check(snap)
    assert verdict.ok and len(verdict.reported) == 1 and "not_injected" in verdict.reported[0]


def test_leftovers_of_a_gone_claim_fail() -> None:
    snap = replace(lazy_snapshot(), running=[], pod_uids=set(), needed_claims=set(), nri_cache={})
    assert inv.check(snap).violations == [
        f"claim directory {CLAIM} left without a claim that needs it",
        f"CDI spec of claim {CLAIM} left without a claim that needs it",
        f"checkpoint entry {CLAIM} (PrepareCompleted) left without a claim that needs it",
        f"container directory {CLAIM}/{POD}_main left after its pod is gone",
    ]


def test_a_container_directory_or_cache_entry_of_a_gone_pod_fails_on_the_nri_track() -> None:
    snap = replace(lazy_snapshot(), running=[], pod_uids={"another-pod"})
    assert inv.check(snap).violations == [
        f"container directory {CLAIM}/{POD}_main left after its pod is gone",
        f"NRI cache entry {CLAIM}/{POD}_main (1 containers) left after its pod is gone",
    ]


def test_an_interrupted_prepare_of_a_gone_claim_is_pending_not_failed() -> None:
    snap = replace(lazy_snapshot(), checkpoint={CLAIM: "PrepareCompleted", "gone": inv.PREPARE_STARTED})
    verdict = inv.check(snap)
    assert verdict.ok and verdict.pending == ["checkpoint entry gone (PrepareStarted) awaits vgpud's cleanup"]


def test_health_and_an_unreadable_state_fail() -> None:
    assert inv.check(replace(lazy_snapshot(), health=None)).violations == [
        "vgpud health is None (not SERVING)"
    ]
    broken = replace(lazy_snapshot(), state_error="ConnectionRefusedError: [Errno 111]")
    assert inv.check(broken).violations == [
        "vgpud's debug state unreadable: ConnectionRefusedError: [Errno 111]"
    ]


# -- resource growth ---------------------------------------------------------------------------------


def test_growth_within_the_bound_passes_and_beyond_it_fails() -> None:
    flat = inv.growth([40.0] * 20, [100_000.0] * 20)
    assert all(g.ok for g in flat)
    leaking = inv.growth([40.0] * 10 + [60.0] * 10, [100_000.0] * 10 + [140_000.0] * 10)
    assert [(g.name, g.ok, g.limit) for g in leaking] == [
        ("open fds", False, 48.0),
        ("RSS KiB", False, 130_000.0),
    ]
    table = inv.growth_table(leaking)
    assert "GROWN" in table and "open fds" in table


def test_growth_needs_samples() -> None:
    with pytest.raises(ValueError, match="no samples"):
        inv.quarters([])
    assert inv.quarters([5.0]) == (5.0, 5.0)
