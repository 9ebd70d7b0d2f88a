"""What becomes of one Kubernetes Event vgpud wants to write: a new Event, a count bump of the Event
already written, folded into a "(combined from similar events)" Event, or nothing (spam). Pure: plain
values in, a decision out; the caller passes the time.

The rules are client-go's EventCorrelator (k8s.io/client-go/tools/record/events_cache.go), the one
the kubelet's Events go through, with its defaults, so an operator sees vgpud's Events behave like
the kubelet's (docs/decisions.md):

- aggregation: Events of one object, type and reason with different messages, each within
  AGGREGATE_WINDOW_S of the one before: from the AGGREGATE_MAX_EVENTS-th different message on, they
  are one Event, "(combined from similar events): " and the latest message;
- dedup: an Event identical to one written before (same object, type, reason and message: its key)
  is that Event again, its `count` one higher and its `lastTimestamp` now (a patch, not a new object);
- spam filter: a token bucket per object, SPAM_BURST Events at once, then one more every
  SPAM_REFILL_S; what finds the bucket empty is dropped (it still counts in the Event's `count`, as
  in client-go, so the next one that passes says how often it happened; unlike client-go, an Event
  whose every occurrence was dropped so far is created, not patched).

The source (component and host) is the same for every Event of one correlator, so it is in no key.
Each cache keeps its LRU_ENTRIES most recently used keys, as client-go's.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Generic, TypeVar

#: different messages of one (object, type, reason) within the window before they are combined
AGGREGATE_MAX_EVENTS = 10
#: seconds a group of similar Events stays open after its latest one
AGGREGATE_WINDOW_S = 600.0
#: Events one object may get at once
SPAM_BURST = 25
#: seconds until the spam filter lets one more Event of an object through
SPAM_REFILL_S = 300.0
#: keys each cache remembers
LRU_ENTRIES = 4096
#: what a combined Event's message starts with
COMBINED_PREFIX = "(combined from similar events): "
#: the longest object name an Event name is built from: `<name>.<16 hex digits>` must stay a DNS
#: subdomain of at most 253 characters
_NAME_PREFIX_MAX = 253 - 17


class EventType(StrEnum):
    """core/v1 Event types."""

    NORMAL = "Normal"
    WARNING = "Warning"


@dataclass(frozen=True)
class ObjectRef:
    """An Event's involvedObject. A cluster-scoped object has namespace ""."""

    kind: str
    name: str
    uid: str
    namespace: str = ""
    api_version: str = "v1"


@dataclass(frozen=True)
class Occurrence:
    """One Event as a caller reports it."""

    obj: ObjectRef
    type: EventType
    reason: str
    message: str

    def __post_init__(self) -> None:
        if not self.obj.kind or not self.obj.name or not self.reason:
            raise ValueError(f"an Event needs its object's kind and name, and a reason: {self!r}")


class Action(StrEnum):
    #: a new Event object
    CREATE = "create"
    #: the Event written before, its count and lastTimestamp (and message, when combined) patched
    PATCH = "patch"


@dataclass(frozen=True)
class Decision:
    """What to write for one Occurrence: the Event `name` with these fields."""

    action: Action
    occurrence: Occurrence
    name: str
    #: the message to write: the occurrence's, or the combined one
    message: str
    count: int
    #: unix seconds
    first_timestamp: float
    last_timestamp: float
    #: folded into an Event of similar ones
    combined: bool


K = TypeVar("K")
V = TypeVar("V")


class _Lru(Generic[K, V]):
    """A dict that forgets its least recently used key beyond `size` keys."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self._size:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


@dataclass
class TokenBucket:
    """client-go's passive token bucket: `burst` tokens at first, `rate` more per second, at most
    `burst`; `take` spends one if there is one."""

    burst: int
    rate: float
    tokens: float = field(init=False)
    last: float | None = None

    def __post_init__(self) -> None:
        self.tokens = float(self.burst)

    def take(self, now: float) -> bool:
        if self.last is not None:
            # a clock that went back refills nothing
            self.tokens = min(float(self.burst), self.tokens + max(0.0, now - self.last) * self.rate)
        self.last = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


@dataclass
class _Similar:
    """The different messages of one (object, type, reason) seen within the window."""

    messages: set[str]
    last: float


@dataclass(frozen=True)
class _Written:
    """The Event of one key: what its next patch builds on."""

    name: str
    #: occurrences so far, those the spam filter dropped included
    count: int
    first_timestamp: float
    #: a decision to write it passed the spam filter (else the next one creates it)
    created: bool


_GroupKey = tuple[ObjectRef, EventType, str]
_EventKey = tuple[ObjectRef, EventType, str, str]


class EventCorrelator:
    """One per event source; `correlate` decides for each Event in the order they are written."""

    def __init__(
        self,
        *,
        max_similar: int = AGGREGATE_MAX_EVENTS,
        window_s: float = AGGREGATE_WINDOW_S,
        burst: int = SPAM_BURST,
        refill_s: float = SPAM_REFILL_S,
        lru_entries: int = LRU_ENTRIES,
    ) -> None:
        if max_similar < 1 or window_s <= 0 or burst < 1 or refill_s <= 0 or lru_entries < 1:
            raise ValueError(
                f"bad correlator settings: max_similar={max_similar} window_s={window_s} burst={burst} "
                f"refill_s={refill_s} lru_entries={lru_entries}"
            )
        self._max_similar = max_similar
        self._window_s = window_s
        self._burst = burst
        self._rate = 1.0 / refill_s
        self._similar: _Lru[_GroupKey, _Similar] = _Lru(lru_entries)
        self._written: _Lru[_GroupKey | _EventKey, _Written] = _Lru(lru_entries)
        self._buckets: _Lru[ObjectRef, TokenBucket] = _Lru(lru_entries)
        self._last_name_ns = 0

    def correlate(self, occurrence: Occurrence, now: float) -> Decision | None:
        """The Event to write for `occurrence` at `now` (unix seconds); None when the spam filter
        drops it."""
        obj, type_, reason, message = occurrence.obj, occurrence.type, occurrence.reason, occurrence.message
        group: _GroupKey = (obj, type_, reason)
        similar = self._similar.get(group)
        if similar is None or now - similar.last > self._window_s:
            similar = _Similar(set(), now)
        similar.messages.add(message)
        similar.last = now
        self._similar.put(group, similar)
        key: _GroupKey | _EventKey = (obj, type_, reason, message)
        combined = len(similar.messages) >= self._max_similar
        if combined:
            similar.messages.pop()  # held below the threshold: every later one is combined too
            key, message = group, COMBINED_PREFIX + message
        seen = self._written.get(key)
        if seen is None:
            seen = _Written(self._new_name(obj.name, now), 0, now, created=False)
        bucket = self._buckets.get(obj)
        if bucket is None:
            bucket = TokenBucket(self._burst, self._rate)
            self._buckets.put(obj, bucket)
        passed = bucket.take(now)
        # a dropped one still counts: the Event written next says how often it happened
        self._written.put(
            key, _Written(seen.name, seen.count + 1, seen.first_timestamp, seen.created or passed)
        )
        if not passed:
            return None
        action = Action.PATCH if seen.created else Action.CREATE
        return Decision(
            action, occurrence, seen.name, message, seen.count + 1, seen.first_timestamp, now, combined
        )

    def _new_name(self, object_name: str, now: float) -> str:
        """`<object name>.<nanoseconds, hex>` as client-go names an Event; strictly increasing, so two
        Events in one clock tick never share a name."""
        ns = max(int(now * 1e9), self._last_name_ns + 1)
        self._last_name_ns = ns
        prefix = object_name[:_NAME_PREFIX_MAX].rstrip(".-")
        return f"{prefix}.{ns:x}"
