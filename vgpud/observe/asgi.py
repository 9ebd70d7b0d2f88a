"""The few ASGI primitives the observability app and the stream hub share: message types, an HTTP
answer, an HTTP answer in place of a websocket upgrade, and the lifespan protocol."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

JSON_TYPE = "application/json"
TEXT_TYPE = "text/plain; charset=utf-8"


def _headers(content_type: str, body: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]


async def respond(send: Send, status: int, body: bytes, content_type: str) -> None:
    """A whole HTTP answer."""
    await send({"type": "http.response.start", "status": status, "headers": _headers(content_type, body)})
    await send({"type": "http.response.body", "body": body})


async def reject_upgrade(send: Send, status: int, message: str) -> None:
    """An HTTP answer instead of the upgrade (the ASGI websocket.http.response extension)."""
    body = (message + "\n").encode()
    await send(
        {"type": "websocket.http.response.start", "status": status, "headers": _headers(TEXT_TYPE, body)}
    )
    await send({"type": "websocket.http.response.body", "body": body})


async def lifespan(receive: Receive, send: Send) -> None:
    """Acknowledge start-up and shutdown: the app holds nothing that needs either."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
