"""vgpu-register (csrc/libvgpu) against independent gRPC servers built from protos/registry/api.proto.

The C client has its own HTTP/2 and HPACK; these tests run it against three other stacks:
grpclib (h2 + python hpack: Huffman-codes and indexes every header) serving vgpud's betterproto2
`VDeviceRegistryBase`; grpcio (C-core's HTTP/2 and HPACK: raw literals indexed into its dynamic
table, Huffman only for binary metadata, a BDP PING mid-call; protoc-built message classes); and
bare `h2` connections scripted frame by frame for the answers the other two never give. Every
failure class has its own exit code (csrc/libvgpu/README.md) and one stderr line naming the gRPC
status.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpclib.server
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import pytest
from grpclib import GRPCError, Status

from tests.stdproto import message_class
from tests.support import built
from vgpud._pb.registry import ContainerDeviceRequest, ContainerDeviceResponse, VDeviceRegistryBase

EXIT_OK, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_DEADLINE, EXIT_STATUS, EXIT_PROTOCOL = 0, 2, 3, 4, 5, 6
PREFIX = "vgpu-register: RegisterContainerDevice failed: "
POD_UID = "0b5e3c1a-7f2d-4c55-9a8e-3d1f2b6c7e90"
# '%', a space, non-ASCII and a colon: the server percent-encodes, the client must decode.
NOT_FOUND_MESSAGE = "pod 0b5e3c1a not found: 100% sure, ü"


@pytest.fixture
def tmp() -> Iterator[Path]:
    """Short, because a unix socket path holds at most 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="vgr", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def register(sock: Path, *args: str, timeout: str = "5s") -> subprocess.CompletedProcess[str]:
    argv = [str(built("libvgpu/vgpu-register")), "--address", str(sock), "--timeout", timeout, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def identity(uuid: str = "") -> list[str]:
    """The flags as the library passes them: all four, empty values included."""
    return ["--pod-uid", POD_UID, "--container-name", "main", "--register-uuid", uuid]


@dataclass
class Registry:
    """What the servers under test do, whichever stack serves it."""

    behaviour: str = "ok"  # ok | not_found | exhausted | slow
    requests: list[tuple[str, str, str]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)  # ends a "slow" call at teardown

    def record(self, pod_uid: str, container_name: str, register_uuid: str) -> None:
        self.requests.append((pod_uid, container_name, register_uuid))


# ---- grpclib + betterproto2 (vgpud's own stack), on an asyncio loop in a thread ----


class _GrpclibService(VDeviceRegistryBase):
    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    async def register_container_device(self, message: ContainerDeviceRequest) -> ContainerDeviceResponse:
        self.registry.record(message.pod_uid, message.container_name, message.register_uuid)
        if self.registry.behaviour == "not_found":
            raise GRPCError(Status.NOT_FOUND, NOT_FOUND_MESSAGE)
        if self.registry.behaviour == "exhausted":
            raise GRPCError(Status.RESOURCE_EXHAUSTED, "8 requests in flight for this caller")
        if self.registry.behaviour == "slow":
            await asyncio.sleep(10)
        return ContainerDeviceResponse()


class _GrpclibThread:
    def __init__(self, path: Path, registry: Registry) -> None:
        self.path = path
        self.registry = registry
        # a plain selector loop: once trio-asyncio is imported (other tests), its policy's new_event_loop()
        # returns a trio-asyncio loop that cannot run in a second thread
        self.loop = asyncio.SelectorEventLoop()
        self.server: grpclib.server.Server | None = None
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def _run(self, coro: Coroutine[Any, Any, None]) -> None:
        asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def start(self) -> None:
        async def start() -> None:
            # Built on its loop: grpclib binds the running loop when the server is created.
            self.server = grpclib.server.Server([_GrpclibService(self.registry)])
            await self.server.start(path=str(self.path))

        self.thread.start()
        self._run(start())

    def stop(self) -> None:
        async def close() -> None:
            assert self.server is not None
            self.server.close()
            await self.server.wait_closed()

        self._run(close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def _serve_grpclib(path: Path, registry: Registry) -> Callable[[], None]:
    server = _GrpclibThread(path, registry)
    server.start()
    return server.stop


# ---- grpcio (C-core), standard protobuf classes from protoc ----


def _serve_grpcio(path: Path, registry: Registry) -> Callable[[], None]:
    request_cls = message_class("registry.ContainerDeviceRequest")
    response_cls = message_class("registry.ContainerDeviceResponse")

    def handle(request: Any, context: grpc.ServicerContext) -> Any:
        registry.record(request.pod_uid, request.container_name, request.register_uuid)
        if registry.behaviour == "not_found":
            context.abort(grpc.StatusCode.NOT_FOUND, NOT_FOUND_MESSAGE)
        if registry.behaviour == "exhausted":
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "8 requests in flight for this caller")
        if registry.behaviour == "slow":
            registry.release.wait(10)
        # C-core sends its own headers as raw literals; a binary ("-bin") value is the one it
        # base64-encodes and Huffman-codes for a peer that did not offer true binary metadata.
        context.set_trailing_metadata((("vgpud-test-bin", b"\x00\x01registry\xff"),))
        return response_cls()

    handler = grpc.method_handlers_generic_handler(
        "registry.VDeviceRegistry",
        {
            "RegisterContainerDevice": grpc.unary_unary_rpc_method_handler(
                handle,
                request_deserializer=request_cls.FromString,
                response_serializer=response_cls.SerializeToString,
            )
        },
    )
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix:{path}")
    server.start()

    def stop() -> None:
        registry.release.set()
        server.stop(grace=None).wait(10)

    return stop


SERVERS = {"grpclib": _serve_grpclib, "grpcio": _serve_grpcio}


@dataclass
class Served:
    kind: str
    path: Path
    registry: Registry
    shutdown: Callable[[], None]
    stopped: bool = False

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.registry.release.set()
            self.shutdown()


@pytest.fixture(params=sorted(SERVERS))
def served(request: pytest.FixtureRequest, tmp: Path) -> Iterator[Served]:
    path = tmp / "socket.sock"
    registry = Registry()
    s = Served(request.param, path, registry, SERVERS[request.param](path, registry))
    try:
        yield s
    finally:
        s.stop()


def _trace(stderr: str) -> list[str]:
    return [line.removeprefix("vgpu-register: ") for line in stderr.splitlines()]


# ---- the four answers, from both servers ----


@pytest.mark.parametrize("uuid", ["", "5d0c8f9e-1b2a-4e3f-8d7c-6b5a49382716"])
def test_ok_delivers_the_exact_identity(served: Served, uuid: str) -> None:
    result = register(served.path, *identity(uuid))
    assert (result.returncode, result.stderr) == (EXIT_OK, "")
    assert served.registry.requests == [(POD_UID, "main", uuid)]


def test_uuid_only(served: Served) -> None:
    result = register(served.path, "--register-uuid", "u-1")
    assert (result.returncode, result.stderr) == (EXIT_OK, "")
    assert served.registry.requests == [("", "", "u-1")]


def test_not_found_names_the_status_and_decodes_the_message(served: Served) -> None:
    served.registry.behaviour = "not_found"
    result = register(served.path, *identity())
    assert result.returncode == EXIT_STATUS
    assert result.stderr == f"{PREFIX}NOT_FOUND: {NOT_FOUND_MESSAGE}\n"


def test_resource_exhausted(served: Served) -> None:
    served.registry.behaviour = "exhausted"
    result = register(served.path, *identity())
    assert result.returncode == EXIT_STATUS
    assert result.stderr == f"{PREFIX}RESOURCE_EXHAUSTED: 8 requests in flight for this caller\n"


def test_deadline(served: Served) -> None:
    served.registry.behaviour = "slow"
    started = time.monotonic()
    result = register(served.path, *identity(), timeout="700ms")
    elapsed = time.monotonic() - started
    assert result.returncode == EXIT_DEADLINE, result.stderr
    assert result.stderr.startswith(f"{PREFIX}DEADLINE_EXCEEDED")
    assert len(result.stderr.splitlines()) == 1
    assert 0.6 < elapsed < 3


def test_errors_come_as_trailers_only(served: Served) -> None:
    """Both servers answer an error raised before any message with one HEADERS + END_STREAM."""
    served.registry.behaviour = "not_found"
    result = register(served.path, *identity(), "--verbose")
    assert result.returncode == EXIT_STATUS
    trace = _trace(result.stderr)
    response = [line for line in trace if line.startswith("< HEADERS") or line.startswith("< DATA")]
    assert len(response) == 1 and response[0].endswith("END_STREAM END_HEADERS"), trace
    assert "<   grpc-status: 5" in "\n".join(trace)
    assert trace[-1] == f"RegisterContainerDevice failed: NOT_FOUND: {NOT_FOUND_MESSAGE}"


def test_full_response_and_huffman_headers(served: Served) -> None:
    """OK is HEADERS, DATA (the empty message), trailers. Both stacks make us decode Huffman and
    the dynamic table, each its own way (see the trace lines asserted)."""
    result = register(served.path, *identity(), "--verbose")
    assert result.returncode == EXIT_OK, result.stderr
    trace = _trace(result.stderr)
    frames = [line.split(" length=")[0] for line in trace if line.startswith("< ") and "stream=1" in line]
    assert frames == ["< HEADERS stream=1", "< DATA stream=1", "< HEADERS stream=1"], trace
    if served.kind == "grpclib":
        # python hpack Huffman-codes every string it can shorten, and indexes what it sends.
        assert "<   content-type: application/grpc+proto [huffman] [+table]" in trace
        assert "<   grpc-status: 0 [huffman] [+table]" in trace
    else:
        # C-core sends raw literals but adds them to the dynamic table; only the base64 form of a
        # binary value is Huffman-coded (we do not offer true-binary metadata, setting 0xfe03).
        assert "<   content-type: application/grpc [+table]" in trace
        assert "<   vgpud-test-bin: AAFyZWdpc3Ryef8 [huffman]" in trace
    assert trace[-1] == "registered"


def test_server_gone_after_it_served(served: Served) -> None:
    assert register(served.path, *identity()).returncode == EXIT_OK
    served.stop()
    result = register(served.path, *identity())
    assert result.returncode == EXIT_UNAVAILABLE
    assert result.stderr.startswith(f"{PREFIX}UNAVAILABLE: cannot connect to {served.path}: ")


# ---- no server ----


def test_socket_path_does_not_exist(tmp: Path) -> None:
    path = tmp / "socket.sock"
    result = register(path, *identity())
    assert result.returncode == EXIT_UNAVAILABLE
    assert result.stderr == f"{PREFIX}UNAVAILABLE: cannot connect to {path}: No such file or directory\n"


def test_socket_exists_but_nobody_listens(tmp: Path) -> None:
    path = tmp / "socket.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))  # the file stays after close, as after a crashed server
    result = register(path, *identity())
    assert result.returncode == EXIT_UNAVAILABLE
    assert result.stderr == f"{PREFIX}UNAVAILABLE: cannot connect to {path}: Connection refused\n"


# ---- scripted servers: raw sockets and bare h2 connections ----


Serve = Callable[[socket.socket], None]
Listen = Callable[[Serve], Path]


class _Listener:
    """Accept connections on a unix socket and hand each to `serve` in a thread."""

    def __init__(self, path: Path, serve: Serve) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.serve = serve
        self.protocol_errors: list[h2.exceptions.ProtocolError] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                try:
                    self.serve(conn)
                except OSError:
                    pass  # the client hung up first: the test's assertions say whether it should have
                except h2.exceptions.ProtocolError as e:  # h2 refused what the client sent
                    self.protocol_errors.append(e)

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(5)


@pytest.fixture
def listen(tmp: Path) -> Iterator[Listen]:
    listeners: list[_Listener] = []

    def start(serve: Serve) -> Path:
        path = tmp / f"s{len(listeners)}.sock"
        listeners.append(_Listener(path, serve))
        return path

    yield start
    for listener in listeners:
        listener.close()
    assert [e for listener in listeners for e in listener.protocol_errors] == []


def test_server_accepts_and_hangs_up(listen: Listen) -> None:
    path = listen(lambda conn: None)
    result = register(path, *identity())
    assert result.returncode == EXIT_UNAVAILABLE
    # "(write: Broken pipe)" follows when the hang-up beat our request out: a race, either is right.
    assert result.stderr.startswith(
        f"{PREFIX}UNAVAILABLE: connection closed by the server before its HTTP/2 preface"
    )
    assert len(result.stderr.splitlines()) == 1


def test_server_accepts_and_says_nothing(listen: Listen) -> None:
    path = listen(lambda conn: conn.recv(65536) and time.sleep(1))
    result = register(path, *identity(), timeout="300ms")
    assert result.returncode == EXIT_DEADLINE
    assert result.stderr == f"{PREFIX}DEADLINE_EXCEEDED: no answer within 300 ms\n"


def test_http1_server_is_a_protocol_error(listen: Listen) -> None:
    def http1(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    result = register(listen(http1), *identity())
    assert result.returncode == EXIT_PROTOCOL
    assert result.stderr == f"{PREFIX}INTERNAL: protocol error: the server speaks HTTP/1, not HTTP/2\n"


@dataclass
class _Seen:
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


def _h2_server(
    respond: Callable[[h2.connection.H2Connection, int], None], seen: _Seen | None = None
) -> Serve:
    """A bare h2 server connection: read the whole request, then let `respond` script the answer."""

    def serve(conn: socket.socket) -> None:
        h = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        h.initiate_connection()
        conn.sendall(h.data_to_send())
        while True:
            data = conn.recv(65536)
            if not data:
                return
            for event in h.receive_data(data):
                if isinstance(event, h2.events.RequestReceived) and seen is not None:
                    seen.headers = dict(event.headers)
                if isinstance(event, h2.events.DataReceived):
                    h.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    if seen is not None:
                        seen.body += event.data
                if isinstance(event, h2.events.StreamEnded):
                    respond(h, event.stream_id)
                    conn.sendall(h.data_to_send())
                    time.sleep(0.2)  # let the client read before the close
                    return
            conn.sendall(h.data_to_send())

    return serve


GRPC_HEADERS = [(":status", "200"), ("content-type", "application/grpc")]


def test_request_as_an_independent_h2_stack_parses_it(listen: Listen) -> None:
    seen = _Seen()

    def ok(h: h2.connection.H2Connection, sid: int) -> None:
        h.send_headers(sid, GRPC_HEADERS)
        h.send_data(sid, b"\0\0\0\0\0")
        h.send_headers(sid, [("grpc-status", "0")], end_stream=True)

    result = register(listen(_h2_server(ok, seen)), *identity("u-9"))
    assert (result.returncode, result.stderr) == (EXIT_OK, "")
    assert {k: v for k, v in seen.headers.items() if k != "grpc-timeout"} == {
        ":method": "POST",
        ":scheme": "http",
        ":path": "/registry.VDeviceRegistry/RegisterContainerDevice",
        ":authority": "localhost",
        "content-type": "application/grpc",
        "te": "trailers",
        "user-agent": "vgpu-register/1 (vgpud)",
    }
    assert (
        seen.headers["grpc-timeout"].endswith("m") and 4000 < int(seen.headers["grpc-timeout"][:-1]) <= 5000
    )
    request = message_class("registry.ContainerDeviceRequest")()
    assert seen.body[0] == 0 and int.from_bytes(seen.body[1:5], "big") == len(seen.body) - 5
    request.ParseFromString(seen.body[5:])
    assert (request.pod_uid, request.container_name, request.register_uuid) == (POD_UID, "main", "u-9")


@pytest.mark.parametrize(
    ("status", "message", "exit_code", "line"),
    [
        ("8", "slow%20down", EXIT_STATUS, "RESOURCE_EXHAUSTED: slow down"),
        # The server's own deadline (it got our grpc-timeout) fired first: same class as ours.
        ("4", "Deadline%20Exceeded", EXIT_DEADLINE, "DEADLINE_EXCEEDED: Deadline Exceeded"),
        ("16", "", EXIT_STATUS, "UNAUTHENTICATED"),
    ],
)
def test_scripted_trailers_only_after_a_ping(
    listen: Listen, status: str, message: str, exit_code: int, line: str
) -> None:
    def trailers_only(h: h2.connection.H2Connection, sid: int) -> None:
        h.ping(b"12345678")
        h.send_headers(
            sid, [*GRPC_HEADERS, ("grpc-status", status), ("grpc-message", message)], end_stream=True
        )

    result = register(listen(_h2_server(trailers_only)), *identity())
    assert result.returncode == exit_code
    assert result.stderr == f"{PREFIX}{line}\n"


@pytest.mark.parametrize(
    ("error_code", "exit_code", "status"),
    [
        (h2.errors.ErrorCodes.REFUSED_STREAM, EXIT_STATUS, "UNAVAILABLE"),
        (h2.errors.ErrorCodes.ENHANCE_YOUR_CALM, EXIT_STATUS, "RESOURCE_EXHAUSTED"),
        (h2.errors.ErrorCodes.CANCEL, EXIT_STATUS, "CANCELLED"),
    ],
)
def test_stream_reset(listen: Listen, error_code: h2.errors.ErrorCodes, exit_code: int, status: str) -> None:
    result = register(listen(_h2_server(lambda h, sid: h.reset_stream(sid, error_code))), *identity())
    assert result.returncode == exit_code
    assert result.stderr == f"{PREFIX}{status}: stream reset by the server ({error_code.name})\n"


def test_goaway_before_the_call_was_handled(listen: Listen) -> None:
    def goaway(h: h2.connection.H2Connection, sid: int) -> None:
        h.close_connection(last_stream_id=0, additional_data=b"draining")

    result = register(listen(_h2_server(goaway)), *identity())
    assert result.returncode == EXIT_UNAVAILABLE
    assert (
        result.stderr
        == f"{PREFIX}UNAVAILABLE: server sent GOAWAY (NO_ERROR: draining) before handling the call\n"
    )


def test_usage_errors_and_help() -> None:
    binary = str(built("libvgpu/vgpu-register"))
    bare = subprocess.run([binary], capture_output=True, text=True, timeout=10, check=False)
    assert bare.returncode == EXIT_USAGE
    assert bare.stderr.startswith("vgpu-register: nothing to register")
    bad = subprocess.run(
        [binary, "--register-uuid", "u", "--timeout", "soon"], capture_output=True, text=True, check=False
    )
    assert bad.returncode == EXIT_USAGE
    helped = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=10, check=False)
    assert helped.returncode == EXIT_OK and "--register-uuid" in helped.stdout


def test_is_static() -> None:
    """No program interpreter, so no LD_PRELOAD: the library never loads into its own register client."""
    binary = built("libvgpu/vgpu-register")
    assert not _has_interp(binary.read_bytes())
    env = {**os.environ, "LD_PRELOAD": "/nonexistent/libvgpu-control.so"}
    result = subprocess.run([str(binary), "--help"], capture_output=True, text=True, env=env, check=False)
    assert (result.returncode, result.stderr) == (EXIT_OK, "")


def _has_interp(elf: bytes) -> bool:
    """Whether an ELF64 little-endian file has a PT_INTERP program header."""
    assert elf[:4] == b"\x7fELF" and elf[4] == 2 and elf[5] == 1
    phoff = int.from_bytes(elf[0x20:0x28], "little")
    entsize = int.from_bytes(elf[0x36:0x38], "little")
    count = int.from_bytes(elf[0x38:0x3A], "little")
    pt_interp = 3
    return any(
        int.from_bytes(elf[phoff + i * entsize : phoff + i * entsize + 4], "little") == pt_interp
        for i in range(count)
    )
