"""The Event correlator on plain values: a repeat is a count bump, many similar Events one combined
Event, each object's spam dropped after its burst and let through again as the bucket refills, every
object on its own; the time is the caller's."""

from __future__ import annotations

import re

import pytest

from vgpud.kube.eventcorrelate import (
    AGGREGATE_MAX_EVENTS,
    AGGREGATE_WINDOW_S,
    COMBINED_PREFIX,
    SPAM_BURST,
    SPAM_REFILL_S,
    Action,
    Decision,
    EventCorrelator,
    EventType,
    ObjectRef,
    Occurrence,
    TokenBucket,
)

T0 = 1_800_000_000.0
POD = ObjectRef("Pod", "train", "uid-1", "ml")
OTHER = ObjectRef("Pod", "infer", "uid-2", "ml")


def occ(
    message: str = "m", obj: ObjectRef = POD, reason: str = "R", type_: EventType = EventType.WARNING
) -> Occurrence:
    return Occurrence(obj, type_, reason, message)


def written(decision: Decision | None) -> Decision:
    assert decision is not None, "the spam filter dropped it"
    return decision


def test_an_identical_event_bumps_the_count_of_the_one_written() -> None:
    c = EventCorrelator()
    first = written(c.correlate(occ(), T0))
    assert (first.action, first.count, first.combined, first.message) == (Action.CREATE, 1, False, "m")
    assert first.first_timestamp == first.last_timestamp == T0
    again = written(c.correlate(occ(), T0 + 30))
    assert (again.action, again.name, again.count) == (Action.PATCH, first.name, 2)
    assert (again.first_timestamp, again.last_timestamp) == (T0, T0 + 30)
    third = written(c.correlate(occ(), T0 + 3600))  # identical stays identical, however late
    assert (third.action, third.name, third.count) == (Action.PATCH, first.name, 3)


@pytest.mark.parametrize(
    "different",
    [occ("other message"), occ(reason="Other"), occ(type_=EventType.NORMAL), occ(obj=OTHER)],
    ids=["message", "reason", "type", "object"],
)
def test_an_event_that_differs_in_anything_is_a_new_one(different: Occurrence) -> None:
    c = EventCorrelator()
    first = written(c.correlate(occ(), T0))
    new = written(c.correlate(different, T0 + 1))
    assert (new.action, new.count) == (Action.CREATE, 1)
    assert new.name != first.name


def test_similar_events_are_combined_from_the_tenth_different_message() -> None:
    c = EventCorrelator()
    alone = [written(c.correlate(occ(f"m{i}"), T0 + i)) for i in range(AGGREGATE_MAX_EVENTS - 1)]
    assert [d.action for d in alone] == [Action.CREATE] * (AGGREGATE_MAX_EVENTS - 1)
    assert len({d.name for d in alone}) == AGGREGATE_MAX_EVENTS - 1
    combined = written(c.correlate(occ("m-10"), T0 + 10))
    assert (combined.action, combined.combined, combined.count) == (Action.CREATE, True, 1)
    assert combined.message == COMBINED_PREFIX + "m-10"
    more = written(c.correlate(occ("m-11"), T0 + 11))
    assert (more.action, more.name, more.count) == (Action.PATCH, combined.name, 2)
    assert more.message == COMBINED_PREFIX + "m-11"
    assert more.first_timestamp == T0 + 10
    # another reason of the same object is a group of its own
    assert written(c.correlate(occ("m-12", reason="Other"), T0 + 12)).combined is False


def test_a_quiet_window_starts_the_similar_events_afresh() -> None:
    c = EventCorrelator(burst=100)
    for i in range(AGGREGATE_MAX_EVENTS):
        c.correlate(occ(f"m{i}"), T0)
    later = T0 + AGGREGATE_WINDOW_S + 1
    fresh = written(c.correlate(occ("new"), later))
    assert (fresh.action, fresh.combined, fresh.message) == (Action.CREATE, False, "new")
    # a window is measured from the group's latest Event: one a little inside it keeps the group open
    c2 = EventCorrelator(burst=100)
    for i in range(AGGREGATE_MAX_EVENTS - 1):
        c2.correlate(occ(f"m{i}"), T0 + i * (AGGREGATE_WINDOW_S - 1))
    assert written(c2.correlate(occ("last"), T0 + 9 * (AGGREGATE_WINDOW_S - 1))).combined


def test_the_spam_filter_lets_a_burst_through_then_one_per_refill() -> None:
    c = EventCorrelator()
    through = [c.correlate(occ(f"m{i}", reason=f"R{i}"), T0) for i in range(SPAM_BURST)]
    assert all(d is not None for d in through)
    assert c.correlate(occ("late", reason="Late"), T0) is None
    assert c.correlate(occ("late", reason="Late"), T0 + SPAM_REFILL_S - 1) is None
    one = written(c.correlate(occ("late", reason="Late"), T0 + SPAM_REFILL_S + 1))
    # the dropped ones still count: the Event written says how often it happened
    assert (one.action, one.count) == (Action.CREATE, 3)
    assert c.correlate(occ("late", reason="Late"), T0 + SPAM_REFILL_S + 2) is None
    # a long quiet refills at most the burst
    quiet = T0 + 100 * SPAM_REFILL_S
    assert sum(c.correlate(occ(f"q{i}", reason=f"Q{i}"), quiet) is not None for i in range(40)) == SPAM_BURST


def test_each_object_has_its_own_spam_filter_and_events() -> None:
    c = EventCorrelator(burst=2)
    assert written(c.correlate(occ("a"), T0)) and written(c.correlate(occ("b"), T0))
    assert c.correlate(occ("c"), T0) is None
    other = written(c.correlate(occ("a", obj=OTHER), T0))
    assert (other.action, other.count) == (Action.CREATE, 1)
    assert other.name.startswith("infer.")


def test_a_forgotten_key_is_written_anew() -> None:
    """Each cache keeps its most recent keys only (client-go's LRU): an old Event is created again."""
    c = EventCorrelator(lru_entries=2)
    first = written(c.correlate(occ("a"), T0))
    c.correlate(occ("b", obj=OTHER), T0 + 1)
    c.correlate(occ("c", obj=ObjectRef("Pod", "third", "uid-3", "ml")), T0 + 2)
    again = written(c.correlate(occ("a"), T0 + 3))
    assert (again.action, again.count) == (Action.CREATE, 1)
    assert again.name != first.name


def test_event_names_are_the_object_name_and_unique_hex() -> None:
    c = EventCorrelator(burst=100)
    names = [written(c.correlate(occ(f"m{i}"), T0)).name for i in range(5)]  # one clock tick
    assert len(set(names)) == 5 and names == sorted(names)
    assert all(re.fullmatch(r"train\.[0-9a-f]{16}", name) for name in names), names
    long_name = ObjectRef("Node", "n" * 235 + ".-" + "x" * 30, "u")
    name = written(c.correlate(occ(obj=long_name), T0)).name
    assert len(name) <= 253 and re.fullmatch(r"n+\.[0-9a-f]{16}", name), name


def test_the_token_bucket_ignores_a_clock_that_goes_back() -> None:
    bucket = TokenBucket(burst=1, rate=1.0)
    assert bucket.take(100.0)
    assert not bucket.take(50.0)  # earlier: nothing refilled
    assert not bucket.take(50.5)
    assert bucket.take(51.5)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="kind and name, and a reason"):
        Occurrence(ObjectRef("Pod", "", "u"), EventType.WARNING, "R", "m")
    with pytest.raises(ValueError, match="kind and name, and a reason"):
        Occurrence(POD, EventType.WARNING, "", "m")
    with pytest.raises(ValueError, match="burst=0"):
        EventCorrelator(burst=0)
