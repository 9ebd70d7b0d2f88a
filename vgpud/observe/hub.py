"""The `/debug/stream` websocket: every matching hook call as one JSON text message, as recorded.

The stream's rules:

- a client gets its own recorder subscription; the recorder never waits for it, so hooks are never
  slowed: a client whose buffer fills (`STREAM_BUFFER` calls behind) is dropped by the recorder, gets
  what was buffered and then close code 1008 with the reason (a client that reads nothing at all is
  disconnected by the server's write bound instead, vgpud.observe.serve);
- on shutdown every client gets close code 1001 (going away) before the server stops;
- a bad filter is refused before the upgrade with HTTP 400 and the reason.
"""

from __future__ import annotations

import functools
import json
import logging

import trio

from vgpud.observe.asgi import Receive, Scope, Send, reject_upgrade
from vgpud.observe.filters import CallFilter
from vgpud.observe.state import StreamStats
from vgpud.recorder import CloseReason, HookCall, Recorder, Subscription

log = logging.getLogger("vgpud.observe.http")

#: calls a stream client may be behind before the recorder drops it
STREAM_BUFFER = 1024

CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_INTERNAL = 1011
CLOSE_NORMAL = 1000
#: a close frame's reason is at most 123 bytes
MAX_REASON = 123


@functools.lru_cache(maxsize=4096)
def encode_call(call: HookCall) -> str:
    """One stream message; cached, so three clients encode each call once."""
    return json.dumps(call.to_dict(), separators=(",", ":"))


def close_for(reason: CloseReason | None, *, stopping: bool, buffer: int) -> tuple[int, str, str]:
    """(close code, close reason, metric label) for a stream that ended."""
    if stopping or reason is CloseReason.RECORDER_CLOSED:
        return CLOSE_GOING_AWAY, "vgpud is shutting down", "shutdown"
    if reason is CloseReason.SLOW:
        return CLOSE_POLICY, f"too slow: more than {buffer} calls behind; reconnect to resume", "slow"
    if reason is CloseReason.FILTER_FAILED:
        return CLOSE_INTERNAL, "the stream filter failed", "filter-failed"
    return CLOSE_NORMAL, "", "closed"


class StreamHub:
    """The `/debug/stream` websocket handler, and its clients at shutdown."""

    def __init__(self, recorder: Recorder, stats: StreamStats, *, buffer: int = STREAM_BUFFER) -> None:
        self._recorder = recorder
        self.stats = stats
        self.buffer = buffer
        self.stopping = trio.Event()
        self._changed = trio.Event()

    def reopen(self) -> None:
        """Accept clients again (a new session of the debug server after a failure)."""
        self.stopping = trio.Event()

    async def close_all(self) -> None:
        """Close every client with 1001 and wait until their handlers have finished."""
        self.stopping.set()
        while self.stats.clients:
            await self._changed.wait()

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        try:
            where = CallFilter.from_query(scope.get("query_string", b""))
        except ValueError as err:
            await reject_upgrade(send, 400, str(err))
            return
        if self.stopping.is_set():
            await reject_upgrade(send, 503, "vgpud is shutting down")
            return
        subscription = self._recorder.subscribe(where=where, buffer=self.buffer)
        await send({"type": "websocket.accept"})
        self.stats.clients += 1
        try:
            async with subscription, trio.open_nursery() as nursery:
                nursery.start_soon(_until_disconnect, receive, nursery.cancel_scope)
                nursery.start_soon(self._until_stopping, subscription)
                async for call in subscription:
                    await send({"type": "websocket.send", "text": encode_call(call)})
                code, reason, label = close_for(
                    subscription.close_reason, stopping=self.stopping.is_set(), buffer=self.buffer
                )
                self.stats.closed[label] += 1
                if label != "shutdown":
                    log.info("debug stream: closing a client (%s): %s", code, reason)
                await send({"type": "websocket.close", "code": code, "reason": reason[:MAX_REASON]})
                nursery.cancel_scope.cancel()
        finally:
            self.stats.clients -= 1
            self._changed.set()
            self._changed = trio.Event()

    async def _until_stopping(self, subscription: Subscription) -> None:
        await self.stopping.wait()
        subscription.close()


async def _until_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    """Read (and ignore) what the client sends; end the handler when it goes."""
    while (await receive())["type"] != "websocket.disconnect":
        pass
    scope.cancel()
