"""The debug server on a unix socket in a temp dir: its HTTP routes (read with the standard library's
http.client and with curl) and the live hook stream (read with trio-websocket: the client `vgpud debug
tail` uses, another implementation than hypercorn's server side)."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import stat
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
import trio
import trio.lowlevel
import trio_websocket
from prometheus_client.parser import text_string_to_metric_families

from tests.support import require
from tests.unit.observe.node import Node, make_node, serving
from vgpud.observe import serve
from vgpud.recorder import HookCall, Recorder
from vgpud.sockpath import private_unix_listener

TIMEOUT = 20


class UnixHTTP(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("vgpud", timeout=10)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(str(self._path))


def request(path: Path, target: str, method: str = "GET") -> tuple[int, str, bytes]:
    conn = UnixHTTP(path)
    try:
        conn.request(method, target)
        response = conn.getresponse()
        return response.status, response.getheader("content-type") or "", response.read()
    finally:
        conn.close()


async def get(path: Path, target: str, method: str = "GET") -> tuple[int, str, bytes]:
    return await trio.to_thread.run_sync(request, path, target, method)


def nri_call(i: int, call: str = "CreateContainer", **fields: str) -> HookCall:
    return HookCall(component="nri", call=call, pod_uid=f"pod-{i % 7}", container="main", **fields)


class Client:
    """One stream client: what it received (seq numbers, in order) and how the stream ended."""

    def __init__(self, ws: trio_websocket.WebSocketConnection) -> None:
        self.ws = ws
        self.seqs: list[int] = []
        self.calls: list[dict] = []
        self.closed: trio_websocket.CloseReason | None = None
        self.done = trio.Event()

    async def read(self) -> None:
        try:
            while True:
                call = json.loads(await self.ws.get_message())
                self.seqs.append(call["seq"])
                self.calls.append(call)
        except trio_websocket.ConnectionClosed as exc:
            self.closed = exc.reason
        finally:
            self.done.set()


async def connect(nursery: trio.Nursery, path: Path, query: str = "", queue: int = 64) -> Client:
    stream = await trio.open_unix_socket(str(path))
    resource = "/debug/stream" + (f"?{query}" if query else "")
    ws = await trio_websocket.wrap_client_stream(nursery, stream, "vgpud", resource, message_queue_size=queue)
    return Client(ws)


async def wait_until(condition: Callable[[], object], what: str) -> None:
    """Poll: what is awaited happens in the server's tasks and in the kernel's socket buffers."""
    with trio.fail_after(TIMEOUT):
        while not condition():  # noqa: ASYNC110
            await trio.sleep(0.001)


async def record_in_bursts(recorder: Recorder, live: list[Client], total: int, burst: int) -> None:
    """Record `total` calls, `burst` at a time (fewer than a client's buffer), waiting after each burst
    until every live client has them: a reader that keeps up is never dropped."""
    while recorder.last_seq < total:
        for _ in range(min(burst, total - recorder.last_seq)):
            recorder.record(nri_call(recorder.last_seq))
        recorded = recorder.last_seq
        await wait_until(partial(_all_have, live, recorded), f"{recorded} calls")


def _all_have(clients: list[Client], n: int) -> bool:
    return all(len(c.seqs) >= n for c in clients)


@pytest.fixture
async def node(short_tmp: Path) -> Node:
    return make_node(short_tmp, stream_buffer=16)


@pytest.fixture
def sock(short_tmp: Path) -> Path:
    return short_tmp / "run" / "debug.sock"


# --- HTTP ------------------------------------------------------------------------------------------


async def test_routes_answer_json_and_the_exposition(node: Node, sock: Path) -> None:
    async with serving(node, sock):
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
        for i in range(5):
            node.recorder.record(nri_call(i, claim_uid="c1" if i % 2 else "c2"))
        node.recorder.record(HookCall(component="dra", call="Prepare", claim_uid="c1"))

        status, content_type, body = await get(sock, "/metrics")
        assert status == 200 and content_type.startswith("text/plain")
        assert "vgpud_hook_calls" in {f.name for f in text_string_to_metric_families(body.decode())}

        status, content_type, body = await get(sock, "/debug/state?calls=3")
        assert status == 200 and content_type == "application/json"
        state = json.loads(body)
        assert state["mode"] == "lazy" and state["node"] == "node-a"
        assert [c["seq"] for c in state["calls"]["recent"]] == [4, 5, 6]
        assert state["components"]["dra-plugin"]["state"] == "healthy"

        status, _, body = await get(sock, "/debug/calls?n=2&hook=createcontainer&claim=c1")
        calls = json.loads(body)
        assert status == 200 and calls["last_seq"] == 6
        assert [(c["seq"], c["call"], c["claim_uid"]) for c in calls["calls"]] == [
            (2, "CreateContainer", "c1"),
            (4, "CreateContainer", "c1"),
        ]
        status, _, body = await get(sock, "/debug/calls?pod=pod-3")
        assert [c["seq"] for c in json.loads(body)["calls"]] == [4]

        assert (await get(sock, "/nothing"))[0] == 404
        assert (await get(sock, "/debug/state", method="POST"))[0] == 405
        status, _, body = await get(sock, "/debug/calls?podd=x")
        assert status == 400 and b"unknown parameter 'podd'" in body
        status, _, body = await get(sock, "/debug/calls?n=-1")
        assert status == 400 and b"not a non-negative integer" in body
        status, _, body = await get(sock, "/debug/calls?outcome=fine")
        assert status == 400 and b"is not one of" in body
    assert not sock.exists()  # removed when the server stops


async def test_curl_reads_the_unix_socket(node: Node, sock: Path) -> None:
    require(shutil.which("curl") is not None, "curl", "install curl (apt-get install curl)")
    async with serving(node, sock):
        node.recorder.record(nri_call(1))
        result = await trio.run_process(
            ["curl", "-sS", "--unix-socket", str(sock), "http://vgpud/debug/calls?n=1"], capture_stdout=True
        )
    assert json.loads(result.stdout)["calls"][0]["call"] == "CreateContainer"


def test_a_stale_socket_is_replaced_and_anything_else_kept(short_tmp: Path) -> None:
    path = short_tmp / "debug.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # the file stays, as after a crash
    listener = private_unix_listener(path)
    try:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    finally:
        listener.close()
    path.unlink()
    path.write_text("not a socket")
    with pytest.raises(FileExistsError, match="not a socket"):
        private_unix_listener(path)
    assert path.read_text() == "not a socket"


async def test_a_successors_socket_survives_the_stop(node: Node, sock: Path) -> None:
    """A new vgpud that replaced the socket path while this one was stopping keeps its socket."""
    successor = socket.socket(socket.AF_UNIX)
    try:
        async with serving(node, sock):
            sock.unlink()
            successor.bind(str(sock))
        assert stat.S_ISSOCK(sock.lstat().st_mode)
    finally:
        successor.close()


# --- The live stream -------------------------------------------------------------------------------


async def test_three_clients_receive_every_call_in_order_and_a_clean_close(node: Node, sock: Path) -> None:
    async with trio.open_nursery() as clients:
        async with serving(node, sock):
            live = [await connect(clients, sock) for _ in range(3)]
            for client in live:
                clients.start_soon(client.read)
            await wait_until(lambda: node.stream.clients == 3, "three clients")
            await record_in_bursts(node.recorder, live, total=3000, burst=12)
            for client in live:
                assert client.seqs == list(range(1, 3001))
            assert live[0].calls[-1] == node.recorder.recent(1)[0].to_dict()
        # the server stopped: each client got a close frame, 1001 going away (not 1006)
        for client in live:
            with trio.fail_after(TIMEOUT):
                await client.done.wait()
            assert client.closed is not None
            assert (client.closed.code, client.closed.reason) == (1001, "vgpud is shutting down")
    assert node.stream.closed["shutdown"] == 3 and node.stream.clients == 0


async def test_a_stalled_client_is_dropped_while_the_others_keep_receiving(node: Node, sock: Path) -> None:
    """The stalled client reads nothing (trio-websocket stops reading its socket once one message
    waits): the recorder drops it when its buffer of 16 fills; the two others receive every call."""
    recorder = node.recorder
    async with trio.open_nursery() as clients, serving(node, sock):
        live = [await connect(clients, sock) for _ in range(2)]
        stalled = await connect(clients, sock, queue=1)
        for client in live:
            clients.start_soon(client.read)
        await wait_until(lambda: node.stream.clients == 3, "three clients")
        total = 0
        while recorder.subscribers == 3:  # until the recorder drops the stalled one
            total += 8
            await record_in_bursts(recorder, live, total=total, burst=8)
            assert total < 100_000, "the stalled client was never dropped"
        total += 400
        await record_in_bursts(recorder, live, total=total, burst=8)
        for client in live:
            assert client.seqs == list(range(1, total + 1))
            assert client.closed is None
        # It reads again: an unbroken run of calls from the first, then the reason it was dropped.
        clients.start_soon(stalled.read)
        with trio.fail_after(TIMEOUT):
            await stalled.done.wait()
        assert stalled.seqs == list(range(1, len(stalled.seqs) + 1))
        assert 16 < len(stalled.seqs) < total
        assert stalled.closed is not None and stalled.closed.code == 1008
        assert stalled.closed.reason.startswith("too slow: more than 16 calls behind")
        assert node.stream.closed["slow"] == 1
        clients.cancel_scope.cancel()


async def test_a_client_that_never_reads_cannot_hold_up_the_stop(node: Node, sock: Path) -> None:
    recorder = node.recorder
    async with trio.open_nursery() as clients:
        async with serving(node, sock):
            stalled = await connect(clients, sock, queue=1)
            await wait_until(lambda: node.stream.clients == 1, "a client")
            for i in range(5000):  # far more than its socket buffers hold
                recorder.record(nri_call(i))
                if i % 8 == 0:
                    await trio.lowlevel.checkpoint()
            began = time.monotonic()
        stopped_in = time.monotonic() - began
        assert stopped_in < serve.CLOSE_TIMEOUT + serve.GRACEFUL_TIMEOUT + 2
        assert node.stream.clients == 0
        clients.start_soon(stalled.read)
        with trio.fail_after(TIMEOUT):
            await stalled.done.wait()
        assert stalled.seqs == list(range(1, len(stalled.seqs) + 1))  # what it got is still in order


async def test_a_connection_that_reads_nothing_is_closed_after_the_write_timeout(
    node: Node, sock: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(serve, "WRITE_TIMEOUT", 0.3)
    node.hub.buffer = 100_000  # so that only the write timeout can end it
    recorder = node.recorder
    async with trio.open_nursery() as clients, serving(node, sock):
        await connect(clients, sock, queue=1)
        await wait_until(lambda: node.stream.clients == 1, "a client")
        while node.stream.clients:
            for i in range(64):
                recorder.record(nri_call(i))
            await trio.sleep(0.01)
            assert recorder.last_seq < 90_000, "the connection was never closed"
        assert recorder.subscribers == 0
        clients.cancel_scope.cancel()


async def test_stream_filters_and_a_refused_filter(node: Node, sock: Path) -> None:
    recorder = node.recorder
    async with trio.open_nursery() as clients, serving(node, sock):
        prepare = await connect(clients, sock, "hook=Prepare&claim=c1")
        pod = await connect(clients, sock, "pod=ml/train&outcome=error")
        for client in (prepare, pod):
            clients.start_soon(client.read)
        await wait_until(lambda: node.stream.clients == 2, "two clients")
        recorder.record(HookCall(component="dra", call="Prepare", claim_uid="c1"))
        recorder.record(HookCall(component="dra", call="Prepare", claim_uid="c2"))
        recorder.record(nri_call(1, pod_namespace="ml", pod_name="train", outcome="error"))
        recorder.record(nri_call(2, pod_namespace="ml", pod_name="train"))
        recorder.record(HookCall(component="dra", call="Unprepare", claim_uid="c1"))
        # a last call both filters pass: once each client has it, it has had every call before it
        both = {"claim_uid": "c1", "pod_namespace": "ml", "pod_name": "train", "outcome": "error"}
        recorder.record(HookCall(component="dra", call="Prepare", **both))
        await wait_until(lambda: 6 in prepare.seqs and 6 in pod.seqs, "the last call on both streams")
        assert (prepare.seqs, pod.seqs) == ([1, 6], [3, 6])

        with pytest.raises(BaseExceptionGroup) as refused:
            async with trio.open_nursery() as handshake:
                await connect(handshake, sock, "hook=Prepare&colour=blue")
        rejected, _ = refused.value.split(trio_websocket.ConnectionRejected)
        assert rejected is not None
        rejection = rejected.exceptions[0]
        assert isinstance(rejection, trio_websocket.ConnectionRejected)
        assert rejection.status_code == 400
        assert rejection.body is not None and b"unknown parameter 'colour'" in rejection.body
        clients.cancel_scope.cancel()


async def test_a_restarted_server_accepts_stream_clients_again(node: Node, sock: Path) -> None:
    """The supervisor restarts a failed debug server with the same hub: the stop of the last session
    must not refuse the clients of the next."""
    for _ in range(2):
        async with trio.open_nursery() as clients, serving(node, sock):
            client = await connect(clients, sock)
            clients.start_soon(client.read)
            await wait_until(lambda: node.stream.clients == 1, "a client")
            node.recorder.record(nri_call(1))
            await wait_until(partial(len, client.seqs), "a call")
            clients.cancel_scope.cancel()
