"""The observability ASGI app: the routes of the metrics and debug servers.

Routes (GET; anything else is 404 or 405):

    /metrics                  the Prometheus text exposition
    /debug/state?calls=N      the state document (vgpud.observe.state), with the last N calls (20)
    /debug/calls?n=N&FILTER   {"last_seq", "calls": [...]}: the last N (100) matching calls, oldest first
    /debug/stream?FILTER      websocket: every matching call as one JSON text message (vgpud.observe.hub)

FILTER: hook=, component=, pod=, claim=, outcome= (vgpud.observe.filters).

Without a state and a hub the app is the metrics server's: `/metrics` only.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs

from vgpud.observe.asgi import JSON_TYPE, TEXT_TYPE, Receive, Scope, Send, lifespan, reject_upgrade, respond
from vgpud.observe.filters import CallFilter
from vgpud.observe.hub import StreamHub
from vgpud.observe.metrics import NodeMetrics
from vgpud.observe.state import DebugState

DEFAULT_CALLS = 100
DEFAULT_STATE_CALLS = 20

INDEX = (
    "vgpud observability\n"
    "  GET /metrics\n"
    "  GET /debug/state?calls=N\n"
    "  GET /debug/calls?n=N&hook=&component=&pod=&claim=&outcome=\n"
    "  websocket /debug/stream?hook=&component=&pod=&claim=&outcome=\n"
)


class ObserveApp:
    """The ASGI app. Without `state` and `hub` it is the metrics server: `/metrics` only."""

    def __init__(
        self, metrics: NodeMetrics, *, state: DebugState | None = None, hub: StreamHub | None = None
    ) -> None:
        self._metrics = metrics
        self._state = state
        self._hub = hub

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            await lifespan(receive, send)
        elif kind == "websocket":
            if scope["path"] == "/debug/stream" and self._hub is not None:
                await self._hub.serve(scope, receive, send)
            else:
                await receive()
                await reject_upgrade(send, 404, f"no websocket at {scope['path']}")
        elif kind == "http":
            status, body, content_type = await self._http(scope)
            await respond(send, status, body, content_type)

    async def _http(self, scope: Scope) -> tuple[int, bytes, str]:
        path, method = scope["path"], scope["method"]
        routes = {"/metrics"} | ({"/", "/debug/state", "/debug/calls"} if self._state is not None else set())
        if path not in routes:
            return 404, f"not found: {path}\n".encode(), TEXT_TYPE
        if method not in ("GET", "HEAD"):
            return 405, f"{method} not allowed: GET only\n".encode(), TEXT_TYPE
        if path == "/metrics":
            body, content_type = self._metrics.exposition()
            return 200, body, content_type
        if path == "/":
            return 200, INDEX.encode(), TEXT_TYPE
        query = scope.get("query_string", b"")
        try:
            document = await (self._debug_state(query) if path == "/debug/state" else self._calls(query))
        except ValueError as err:
            return 400, f"{err}\n".encode(), TEXT_TYPE
        return 200, json.dumps(document, indent=1).encode() + b"\n", JSON_TYPE

    async def _debug_state(self, query: bytes) -> dict[str, Any]:
        assert self._state is not None
        calls = _int_param(query, "calls", DEFAULT_STATE_CALLS, allowed={"calls"})
        return await self._state.snapshot(calls=calls)

    async def _calls(self, query: bytes) -> dict[str, Any]:
        assert self._state is not None
        where = CallFilter.from_query(query, extra=frozenset({"n"}))
        n = _int_param(query, "n", DEFAULT_CALLS, allowed=frozenset(CallFilter.names()) | {"n"})
        recorder = self._state.recorder
        return {
            "last_seq": recorder.last_seq,
            "calls": [c.to_dict() for c in recorder.recent(n, where=where)],
        }


def _int_param(query: bytes, name: str, default: int, *, allowed: set[str] | frozenset[str]) -> int:
    params = parse_qs(query.decode("latin-1"), keep_blank_values=True)
    unknown = set(params) - set(allowed)
    if unknown:
        raise ValueError(f"unknown parameter(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    raw = params.get(name, [str(default)])[-1]
    if not (raw.isascii() and raw.isdigit()):
        raise ValueError(f"{name}={raw!r} is not a non-negative integer")
    return int(raw)
