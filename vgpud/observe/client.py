"""`vgpud debug tail` and `vgpud debug state`: clients of a running vgpud's debug endpoint.

The stream is read with trio-websocket (over the unix socket or TCP), the JSON routes with the
standard library's http.client, so the CLI needs nothing the daemon does not already have.

`tail` exits 0 when the stream ends because vgpud stops (close 1001) or after `--count` calls, and 1
when it cannot connect, is refused (a bad filter), or is dropped as too slow (close 1008).
"""

from __future__ import annotations

import http.client
import json
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import trio
import trio_websocket

from vgpud.observe.filters import CallFilter

EXIT_OK, EXIT_FAILURE = 0, 1
GOING_AWAY = 1001
#: trio-websocket's per-connection message queue: small, so a slow terminal backs up into the socket
#: (and the server drops this client) instead of into our memory
MESSAGE_QUEUE = 64


@dataclass(frozen=True)
class Endpoint:
    """Where the debug endpoint listens: a unix socket, or a TCP address."""

    unix_path: Path | None = None
    address: tuple[str, int] | None = None

    def __post_init__(self) -> None:
        if (self.unix_path is None) == (self.address is None):
            raise ValueError("an endpoint is a unix socket or a TCP address")

    def __str__(self) -> str:
        if self.unix_path is not None:
            return f"unix:{self.unix_path}"
        assert self.address is not None
        return f"{self.address[0]}:{self.address[1]}"

    @property
    def host(self) -> str:
        return self.address[0] if self.address is not None else "vgpud"

    async def connect(self) -> trio.abc.Stream:
        if self.unix_path is not None:
            return await trio.open_unix_socket(str(self.unix_path))
        assert self.address is not None
        return await trio.open_tcp_stream(*self.address)


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("vgpud", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(str(self._path))


def get_json(endpoint: Endpoint, target: str, timeout: float = 10.0) -> Any:
    """GET `target` (path and query); the decoded JSON. OSError when unreachable, RuntimeError with
    the server's message for an error status."""
    if endpoint.unix_path is not None:
        conn: http.client.HTTPConnection = _UnixHTTPConnection(endpoint.unix_path, timeout)
    else:
        assert endpoint.address is not None
        conn = http.client.HTTPConnection(*endpoint.address, timeout=timeout)
    try:
        conn.request("GET", target)
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    if response.status != 200:
        raise RuntimeError(f"GET {target}: HTTP {response.status}: {body.decode(errors='replace').strip()}")
    return json.loads(body)


def format_call(call: dict[str, Any]) -> str:
    """One human-readable line per call."""
    stamp = (
        time.strftime("%H:%M:%S", time.localtime(call["time"])) + f".{int(call['time'] * 1000) % 1000:03d}"
    )
    pod = call["pod_uid"]
    if call["pod_name"]:
        pod = f"{call['pod_namespace']}/{call['pod_name']}" if call["pod_namespace"] else call["pod_name"]
    parts = [
        stamp,
        f"#{call['seq']}",
        call["component"],
        call["call"],
        call["outcome"],
        f"{call['latency_seconds'] * 1000:.2f}ms",
    ]
    parts += [
        text
        for text in (
            f"pod={pod}" if pod else "",
            f"container={call['container']}" if call["container"] else "",
        )
        if text
    ]
    if call["claim_uid"]:
        parts.append(f"claim={call['claim_uid']}")
    if call["detail"]:
        parts.append(f"- {call['detail']}")
    return " ".join(parts)


async def tail(
    endpoint: Endpoint,
    where: CallFilter,
    *,
    as_json: bool = False,
    last: int = 0,
    count: int | None = None,
    out: TextIO = sys.stdout,
    err: TextIO = sys.stderr,
) -> int:
    """Print the last `last` matching calls, then every new one as it is recorded."""
    query = where.to_query()
    resource = "/debug/stream" + (f"?{query}" if query else "")
    printed = 0
    newest = 0

    def show(call: dict[str, Any]) -> bool:
        """Print one call; False once `count` calls are printed."""
        nonlocal printed, newest
        if call["seq"] <= newest:
            return True  # already printed from the ring buffer
        newest = call["seq"]
        out.write((json.dumps(call) if as_json else format_call(call)) + "\n")
        out.flush()
        printed += 1
        return count is None or printed < count

    try:
        stream = await endpoint.connect()
    except OSError as exc:
        err.write(f"vgpud debug tail: cannot connect to {endpoint}: {exc.strerror or exc}\n")
        return EXIT_FAILURE
    async with trio.open_nursery() as nursery:
        try:
            return await _follow(
                nursery, stream, endpoint, resource, where=where, last=last, show=show, err=err
            )
        finally:
            nursery.cancel_scope.cancel()  # trio-websocket's reader task, whatever ended the stream


async def _follow(
    nursery: trio.Nursery,
    stream: trio.abc.Stream,
    endpoint: Endpoint,
    resource: str,
    *,
    where: CallFilter,
    last: int,
    show: Callable[[dict[str, Any]], bool],
    err: TextIO,
) -> int:
    try:
        ws = await trio_websocket.wrap_client_stream(
            nursery,
            stream,  # type: ignore[arg-type]  # a unix SocketStream works as well as a TCP one
            endpoint.host,
            resource,
            message_queue_size=MESSAGE_QUEUE,
        )
    except trio_websocket.ConnectionRejected as exc:
        body = (exc.body or b"").decode(errors="replace").strip()
        err.write(f"vgpud debug tail: refused: HTTP {exc.status_code}: {body}\n")
        return EXIT_FAILURE
    except (trio_websocket.HandshakeError, OSError) as exc:
        err.write(f"vgpud debug tail: no stream at {endpoint}: {exc}\n")
        return EXIT_FAILURE
    try:
        if last > 0:  # subscribed first, so nothing falls between the ring buffer and the stream
            recent = await trio.to_thread.run_sync(get_json, endpoint, _calls_target(where, last))
            if not all(show(call) for call in recent["calls"]):
                await ws.aclose()
                return EXIT_OK
        while show(json.loads(await ws.get_message())):
            pass
        await ws.aclose()
        return EXIT_OK
    except trio_websocket.ConnectionClosed as exc:
        reason = exc.reason
        code = reason.code if reason is not None else None
        why = f"{reason.name} ({code})" if reason is not None else "connection lost"
        if reason is not None and reason.reason:
            why += f": {reason.reason}"
        err.write(f"vgpud debug tail: the stream ended: {why}\n")
        return EXIT_OK if code == GOING_AWAY else EXIT_FAILURE
    except (OSError, RuntimeError) as exc:
        err.write(f"vgpud debug tail: {exc}\n")
        return EXIT_FAILURE


def _calls_target(where: CallFilter, n: int) -> str:
    query = where.to_query()
    return f"/debug/calls?n={n}" + (f"&{query}" if query else "")


def state(endpoint: Endpoint, *, calls: int, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """Print the state document as indented JSON."""
    try:
        document = get_json(endpoint, f"/debug/state?calls={calls}")
    except (OSError, RuntimeError, ValueError) as exc:
        err.write(f"vgpud debug state: {endpoint}: {exc}\n")
        return EXIT_FAILURE
    out.write(json.dumps(document, indent=2) + "\n")
    return EXIT_OK
