"""The hook-call recorder: the one place where every hook and RPC call is recorded (DESIGN.md §3).

One writer, several readers: ``recent()`` serves the debug ring buffer; subscribers (the websocket
stream) get every call over a Trio memory channel; listeners (the metrics) are called synchronously
from ``record`` with every call, so they can never be dropped and never lag.

``record`` is synchronous and never waits: a subscriber whose buffer is full is dropped rather than
slowing the hook that records. A dropped subscription still yields what was already buffered (an
unbroken run of calls, in order), then its iteration ends and ``close_reason`` says why, so a
websocket handler can tell "too slow" (``SLOW``) from "daemon shutting down" (``RECORDER_CLOSED``).

Use from the Trio thread only (a worker thread goes through ``trio.from_thread.run_sync``).
"""

from __future__ import annotations

import enum
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from types import TracebackType
from typing import Any

import trio

logger = logging.getLogger("vgpud.recorder")


class Outcome(enum.StrEnum):
    OK = "ok"
    ERROR = "error"  # the hook raised
    SKIPPED = "skipped"  # nothing to do (not a vGPU container, unknown claim...)
    REJECTED = "rejected"  # refused on purpose (fail-closed, bad input)
    CANCELLED = "cancelled"  # interrupted (shutdown)


@dataclass(frozen=True, kw_only=True)
class HookCall:
    """One finished hook or RPC call. Identity fields are "" when they do not apply."""

    seq: int = 0  # set by Recorder.record: 1, 2, 3... (gaps in a stream mean missed calls)
    time: float = 0.0  # set by Recorder.record: wall clock (epoch seconds) when recorded
    component: str  # "nri", "dra", "registry", "webhook"
    call: str  # "CreateContainer", "NodePrepareResources"...
    pod_namespace: str = ""
    pod_name: str = ""
    pod_uid: str = ""
    container: str = ""
    claim_uid: str = ""
    outcome: Outcome = Outcome.OK
    detail: str = ""  # error message, why skipped/rejected, or how an ok call was answered
    latency_seconds: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", Outcome(self.outcome))  # accepts "ok"; rejects typos

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the outcome as its plain string)."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["outcome"] = self.outcome.value
        return data


FILTER_FIELDS = frozenset(
    {"component", "call", "pod_namespace", "pod_name", "pod_uid", "container", "claim_uid", "outcome"}
)
Predicate = Callable[[HookCall], bool]
#: called by ``record`` with every stamped call: must be O(1) and must not block
Listener = Callable[[HookCall], None]


def matcher(where: Predicate | None = None, **equals: str) -> Predicate:
    """A predicate: every ``field=value`` in ``equals`` matches and ``where`` (if any) holds."""
    unknown = set(equals) - FILTER_FIELDS
    if unknown:
        raise TypeError(f"cannot filter on {sorted(unknown)}; fields: {sorted(FILTER_FIELDS)}")
    pairs = tuple(equals.items())

    def match(call: HookCall) -> bool:
        return all(getattr(call, name) == value for name, value in pairs) and (where is None or where(call))

    return match


class CloseReason(enum.StrEnum):
    SLOW = "slow"  # its buffer was full: dropped so that record() never waits
    FILTER_FAILED = "filter-failed"  # its predicate raised
    RECORDER_CLOSED = "recorder-closed"  # the daemon is shutting down
    UNSUBSCRIBED = "unsubscribed"  # the subscriber closed it


class Subscription:
    """A live stream of HookCalls: an async iterator and an async context manager (leaving it
    unsubscribes). After iteration ends, ``close_reason`` says why."""

    def __init__(self, match: Predicate, buffer: int) -> None:
        self._match = match
        self._send, self._receive = trio.open_memory_channel[HookCall](buffer)
        self.close_reason: CloseReason | None = None

    @property
    def dropped(self) -> bool:
        """Ended by the recorder because of this subscriber (slow, or a failing filter)."""
        return self.close_reason in (CloseReason.SLOW, CloseReason.FILTER_FAILED)

    def _offer(self, call: HookCall) -> bool:
        """Hand over one call without waiting; False when the subscription has ended."""
        if self.close_reason is not None:
            return False
        try:
            if not self._match(call):
                return True
        except Exception:
            logger.exception("subscriber filter failed on call %d; dropping the subscriber", call.seq)
            self._end(CloseReason.FILTER_FAILED)
            return False
        try:
            self._send.send_nowait(call)
        except trio.WouldBlock:
            logger.warning("dropping a slow hook-call subscriber at call %d", call.seq)
            self._end(CloseReason.SLOW)
            return False
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._end(CloseReason.UNSUBSCRIBED)
            return False
        return True

    def _end(self, reason: CloseReason) -> None:
        """End the stream; what is buffered can still be read. The first reason wins."""
        if self.close_reason is None:
            self.close_reason = reason
        self._send.close()

    def close(self) -> None:
        """Unsubscribe: the iteration ends now, buffered calls are discarded."""
        self._end(CloseReason.UNSUBSCRIBED)
        self._receive.close()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> HookCall:
        try:
            return await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class TimedCall:
    """The call being timed by ``Recorder.timed``: set ``outcome`` / ``detail`` and, when learnt
    during the call, identity fields with ``update``. ``recorded`` is the HookCall once it ended."""

    def __init__(self, recorder: Recorder, draft: HookCall) -> None:
        self._recorder = recorder
        self._draft = draft
        self._started = 0.0
        self.outcome: Outcome | str = draft.outcome
        self.detail = draft.detail
        self.recorded: HookCall | None = None

    def update(self, **identity: str) -> None:
        self._draft = replace(self._draft, **identity)

    def __enter__(self) -> TimedCall:
        self._started = self._recorder._timer()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        latency = self._recorder._timer() - self._started
        if exc is not None:
            if not isinstance(exc, Exception):
                self.outcome = Outcome.CANCELLED
            elif self.outcome == Outcome.OK:  # an outcome the hook chose (e.g. rejected) stays
                self.outcome = Outcome.ERROR
            self.detail = self.detail or str(exc) or type(exc).__name__
        self.recorded = self._recorder.record(
            replace(self._draft, outcome=self.outcome, detail=self.detail, latency_seconds=latency)
        )


class Recorder:
    """Bounded ring buffer of recent calls plus fan-out to subscribers."""

    def __init__(
        self,
        capacity: int = 1024,
        subscriber_buffer: int = 256,
        *,
        clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        """``clock`` stamps ``HookCall.time``; ``timer`` measures latency in ``timed``."""
        if capacity < 1 or subscriber_buffer < 1:
            raise ValueError("capacity and subscriber_buffer must be >= 1")
        self._ring: deque[HookCall] = deque(maxlen=capacity)
        self._subscriber_buffer = subscriber_buffer
        self._clock = clock
        self._timer = timer
        self._seq = itertools.count(1)
        self._subscribers: dict[Subscription, None] = {}  # an ordered set
        self._listeners: list[Listener] = []
        self._closed = False

    @property
    def last_seq(self) -> int:
        """The ``seq`` of the newest recorded call (0 before the first)."""
        return self._ring[-1].seq if self._ring else 0

    @property
    def subscribers(self) -> int:
        """Live subscriptions (the websocket stream's clients, among others)."""
        return sum(1 for sub in self._subscribers if sub.close_reason is None)

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(call)`` from ``record`` with every call from now on, before the subscribers.

        For readers that must see every call and cost O(1) (metrics). A listener that raises is logged
        and kept: the hook that records never sees the error.
        """
        self._listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        self._listeners.remove(listener)

    def record(self, call: HookCall) -> HookCall:
        """Stamp ``seq`` and ``time``, keep it, offer it to every subscriber; never waits, and a
        subscriber cannot make it raise. Returns the stamped call."""
        stamped = replace(call, seq=next(self._seq), time=self._clock())
        self._ring.append(stamped)
        for listener in self._listeners:
            try:
                listener(stamped)
            except Exception:
                logger.exception("hook-call listener %r failed on call %d", listener, stamped.seq)
        ended = [sub for sub in self._subscribers if not sub._offer(stamped)]
        for sub in ended:
            del self._subscribers[sub]
        return stamped

    def timed(self, component: str, call: str, **identity: str) -> TimedCall:
        """``with recorder.timed("nri", "CreateContainer", pod_uid=...) as c:`` records the call when
        the block ends: ok, the outcome the block set, or error (the exception's message; it is
        re-raised). A sync context manager, so it serves sync and async hooks alike."""
        return TimedCall(self, HookCall(component=component, call=call, **identity))

    def recent(
        self, n: int | None = None, *, where: Predicate | None = None, **equals: str
    ) -> list[HookCall]:
        """The last ``n`` (default all) recorded calls that match, oldest first."""
        if n is not None and n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        match = matcher(where, **equals)
        newest_first = (c for c in reversed(self._ring) if match(c))
        return list(itertools.islice(newest_first, n))[::-1]

    def subscribe(
        self, *, where: Predicate | None = None, buffer: int | None = None, **equals: str
    ) -> Subscription:
        """A stream of the calls recorded from now on that match. After ``close()`` the subscription
        is already ended (RECORDER_CLOSED), so a late websocket handler just ends."""
        if buffer is not None and buffer < 1:
            raise ValueError(f"buffer must be >= 1, got {buffer}")
        sub = Subscription(matcher(where, **equals), buffer or self._subscriber_buffer)
        if self._closed:
            sub._end(CloseReason.RECORDER_CLOSED)
        else:
            self._subscribers[sub] = None
        return sub

    def close(self) -> None:
        """End every subscription (they still yield what they buffered). Later calls are still kept
        in the ring buffer."""
        self._closed = True
        for sub in self._subscribers:
            sub._end(CloseReason.RECORDER_CLOSED)
        self._subscribers.clear()
