"""The registry end to end: grpcio clients (an independent gRPC stack, classes from protoc) over the
real unix socket to `RegistryServer`, with the in-memory kube facade, a container store and a fake host
/proc + cgroup tree in which the test process (or a child) is placed in a pod's container.
Also the socket's lifecycle: staged bind, modes, take-over, re-publish, ownership-checked unlink."""

from __future__ import annotations

import fcntl
import os
import socket
import stat
import subprocess
import sys
import textwrap
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import h2.config
import h2.connection
import h2.events
import pytest
import trio
import trio_asyncio
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from tests import objects as o
from tests.stdproto import message_class
from tests.support import REPO, built
from tests.unit.registry.world import World, claim_uid, injected
from vgpud._pb.registry import ContainerDeviceRequest
from vgpud.recorder import Outcome
from vgpud.registry.identity import peer_pid
from vgpud.registry.request import Admission
from vgpud.registry.server import MAX_MESSAGE, RegistryServer
from vgpud.sockpath import SocketPathError

METHOD = "/registry.VDeviceRegistry/RegisterContainerDevice"
REQUEST = message_class("registry.ContainerDeviceRequest")
RESPONSE = message_class("registry.ContainerDeviceResponse")
ME = os.getpid()


def register(path: Path, timeout: float = 10.0, **fields: str) -> tuple[grpc.StatusCode, str]:
    """One call on a fresh channel (a re-published socket needs a new connection)."""
    with grpc.insecure_channel(f"unix://{path}") as channel:
        stub = channel.unary_unary(
            METHOD, request_serializer=REQUEST.SerializeToString, response_deserializer=RESPONSE.FromString
        )
        try:
            stub(REQUEST(**fields), timeout=timeout)
        except grpc.RpcError as err:
            return err.code(), err.details() or ""
    return grpc.StatusCode.OK, ""


async def aregister(path: Path, **fields: str) -> tuple[grpc.StatusCode, str]:
    return await trio.to_thread.run_sync(lambda: register(path, **fields))


def make_server(world: World, **kwargs: object) -> RegistryServer:
    return world.server(guard_interval=0.05, **kwargs)


async def serving(server: RegistryServer, body: Callable[[], Awaitable[None]]) -> None:
    async with trio_asyncio.open_loop(), trio.open_nursery() as nursery:
        ready = trio.Event()
        nursery.start_soon(server.run, ready.set)
        await ready.wait()
        await body()
        nursery.cancel_scope.cancel()


async def eventually(condition: Callable[[], bool]) -> None:
    with trio.fail_after(10):
        while True:
            if condition():
                return
            await trio.sleep(0.01)


@pytest.fixture
async def world(short_tmp: Path) -> AsyncIterator[World]:
    """A node with its pod and claim caches running for the whole test."""
    node = World(short_tmp)
    async with node.caches():
        yield node


async def test_a_container_registers_and_gets_its_pids(world: World) -> None:
    uid, cid, config = world.add_container(1)
    world.place(ME, uid, cid)
    world.place(ME + 100_000, uid, cid)  # another process of the same container
    server = make_server(world)

    async def body() -> None:
        assert await aregister(server.path, pod_uid=uid, container_name="main") == (grpc.StatusCode.OK, "")

    await serving(server, body)
    assert (config / "pids.config").read_text() == f"{ME}\n{ME + 100_000}\n"
    (call,) = world.recorder.recent(component="registry")
    assert (call.call, call.outcome, call.pod_uid, call.container) == (
        "RegisterContainerDevice",
        "ok",
        uid,
        "main",
    )
    assert call.claim_uid == claim_uid(1)
    assert not server.path.exists()  # unlinked at shutdown: it was ours


async def test_statuses(world: World) -> None:
    uid, cid, config = world.add_container(1)
    other_uid, _, other_config = world.add_container(2)
    world.place(ME, uid, cid)
    server = make_server(world)

    async def body() -> None:
        code, details = await aregister(server.path, register_uuid=o.CLAIM_UID)
        assert code is grpc.StatusCode.NOT_FOUND and "mints no register UUIDs" in details
        code, details = await aregister(server.path, pod_uid=other_uid, container_name="main")
        assert code is grpc.StatusCode.PERMISSION_DENIED and "belongs to another pod" in details
        code, details = await aregister(server.path, pod_uid=uid)
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "come together" in details
        code, details = await aregister(server.path, pod_uid="x" * (MAX_MESSAGE + 1), container_name="main")
        assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "exceeds the limit of 16384" in details
        # a message just under the limit is read (and then refused for what it says)
        code, details = await aregister(server.path, pod_uid="x" * (MAX_MESSAGE - 16), container_name="m")
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "is not a pod UID" in details

    await serving(server, body)
    assert (config / "pids.config").read_bytes() == b""
    assert (other_config / "pids.config").read_bytes() == b""
    calls = world.recorder.recent(component="registry")
    assert [c.outcome for c in calls] == [Outcome.REJECTED] * 5
    assert calls[3].detail.startswith("RESOURCE_EXHAUSTED: request message of 16")


async def test_malformed_bytes_and_a_planted_symlink(world: World) -> None:
    uid, cid, config = world.add_container(1)
    world.place(ME, uid, cid)
    precious = world.root / "precious"
    precious.write_text("keep\n")
    (config / "pids.config").unlink()
    (config / "pids.config").symlink_to(precious)  # the container's config dir is writable to it
    server = make_server(world)

    def raw(data: bytes) -> tuple[grpc.StatusCode, str]:
        with grpc.insecure_channel(f"unix://{server.path}") as channel:
            stub = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
            try:
                stub(data, timeout=10)
            except grpc.RpcError as err:
                return err.code(), err.details() or ""
        return grpc.StatusCode.OK, ""

    async def body() -> None:
        # field 1 (pod_uid) says 127 bytes follow; 1 does
        code, details = await trio.to_thread.run_sync(raw, b"\x0a\x7fx")
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "malformed ContainerDeviceRequest" in details
        code, details = await aregister(server.path, pod_uid=uid, container_name="main")
        assert code is grpc.StatusCode.INTERNAL and "symbolic link" in details

    await serving(server, body)
    assert precious.read_text() == "keep\n" and (config / "pids.config").is_symlink()


def raw_h2_call(path: Path, body: bytes) -> tuple[str, str]:
    """One call whose request body is exactly `body` (grpcio only sends whole messages): an
    independent HTTP/2 client (h2) on the unix socket; the (grpc-status, grpc-message) trailers."""
    connection = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        connection.initiate_connection()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", METHOD),
            (":authority", "localhost"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        connection.send_headers(1, headers)
        connection.send_data(1, body, end_stream=True)
        sock.sendall(connection.data_to_send())
        trailers: dict[str, str] = {}
        while "grpc-status" not in trailers:
            data = sock.recv(65536)
            assert data, "the server closed the connection without a status"
            for event in connection.receive_data(data):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    trailers.update((bytes(k).decode(), bytes(v).decode()) for k, v in event.headers)
            sock.sendall(connection.data_to_send())
    return trailers["grpc-status"], urllib.parse.unquote(trailers.get("grpc-message", ""))


async def test_a_request_that_ends_inside_its_prefix_or_its_message_is_invalid(world: World) -> None:
    """Raw HTTP/2 (h2): a stream that ends inside the 5-byte prefix, a prefix announcing bytes that
    never come (none, or fewer), and no message at all: each INVALID_ARGUMENT, recorded as rejected."""
    server = make_server(world)
    invalid = str(grpc.StatusCode.INVALID_ARGUMENT.value[0])
    sent_and_why = [
        (b"\x00\x00\x00", "truncated message prefix"),
        (b"\x00\x00\x00\x00\x0a", "truncated request message"),  # 10 bytes announced, none sent
        (b"\x00\x00\x00\x00\x0a\x0a\x01", "truncated request message"),
        (b"", "no request message"),
    ]

    async def body() -> None:
        for sent, why in sent_and_why:
            status, message = await trio.to_thread.run_sync(raw_h2_call, server.path, sent)
            assert (status, message) == (invalid, why), sent

    await serving(server, body)
    calls = world.recorder.recent(component="registry")
    assert [(c.outcome, c.detail) for c in calls] == [
        (Outcome.REJECTED, f"INVALID_ARGUMENT: {why}") for _, why in sent_and_why
    ]


def test_peer_pid_is_none_without_a_unix_socket() -> None:
    """Fail closed: a grpclib that no longer looks like 0.4, or a TCP peer, gives no PID."""
    assert peer_pid(object()) is None
    with socket.socket(socket.AF_INET) as tcp:

        class Transport:
            def get_extra_info(self, name: str) -> object:
                return tcp if name == "socket" else None

        class Peer:
            _transport = Transport()

        class Stream:
            peer = Peer()

        assert peer_pid(Stream()) is None


async def test_a_caller_outside_every_pod_is_refused(world: World) -> None:
    uid, _, _ = world.add_container(1)
    world.place_outside(ME)
    server = make_server(world)

    async def body() -> None:
        code, details = await aregister(server.path, pod_uid=uid, container_name="main")
        assert code is grpc.StatusCode.PERMISSION_DENIED and "not a process of any pod" in details

    await serving(server, body)


async def test_more_than_8_calls_from_one_caller_are_refused(world: World) -> None:
    """Eight calls wait for the first Synchronize; a ninth from the same pod is refused at once;
    after the Synchronize the eight succeed."""
    uid, cid, config = world.add_container(1, cached=False)
    world.place(ME, uid, cid)
    server = make_server(world)
    admission = server.service.admission
    results: list[tuple[grpc.StatusCode, str]] = []

    async def one() -> None:
        results.append(await aregister(server.path, pod_uid=uid, container_name="main"))

    async def body() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(one)
            await eventually(lambda: admission.in_flight == 8)
            code, details = await aregister(server.path, pod_uid=uid, container_name="main")
            assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "limit per caller" in details
            assert admission.in_flight == 8
            world.containers.replace([injected("ctr-1", uid, "main", claim_uid(1), config.parent)])
        assert results == [(grpc.StatusCode.OK, "")] * 8
        assert admission.in_flight == 0

    await serving(server, body)
    assert (config / "pids.config").read_text() == f"{ME}\n"


async def test_the_node_limit_counts_every_caller(world: World) -> None:
    uid, cid, config = world.add_container(1, cached=False)
    other_uid, other_cid, _ = world.add_container(2)
    world.place(ME, uid, cid)
    server = make_server(world, admission=Admission(total=2, per_caller=8))
    admission = server.service.admission
    results: list[tuple[grpc.StatusCode, str]] = []

    async def one() -> None:
        results.append(await aregister(server.path, pod_uid=uid, container_name="main"))

    async def body() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            nursery.start_soon(one)
            await eventually(lambda: admission.in_flight == 2)
            world.place(ME, other_uid, other_cid)  # now we are another pod: still over the node's limit
            code, details = await aregister(server.path, pod_uid=other_uid, container_name="main")
            assert code is grpc.StatusCode.RESOURCE_EXHAUSTED and "the node's limit" in details
            world.place(ME, uid, cid)
            world.containers.replace([injected("ctr-1", uid, "main", claim_uid(1), config.parent)])
        assert results == [(grpc.StatusCode.OK, "")] * 2

    await serving(server, body)


CHILD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {repo!r})
    from tests.unit.registry.test_server import register
    from pathlib import Path
    sys.stdin.readline()  # placed in its pod by the parent
    code, details = register(Path({path!r}), pod_uid={uid!r}, container_name="main")
    print(code.name, details)
    """
)


def spawn_client(path: Path, uid: str) -> subprocess.Popen[str]:
    """A grpcio client in a child process that registers once it reads a line on stdin."""
    script = CHILD.format(repo=str(REPO), path=str(path), uid=uid)
    return subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


async def test_the_caller_is_the_peer_process_not_the_request(world: World) -> None:
    """SO_PEERCRED gives the connecting process: a child placed in the pod registers, and its PID,
    not the test process's, lands in pids.config."""
    uid, cid, config = world.add_container(1)
    world.place_outside(ME)  # the test process itself would be refused
    server = make_server(world)

    async def body() -> None:
        child = spawn_client(server.path, uid)
        try:
            world.place(child.pid, uid, cid)
            out, _ = await trio.to_thread.run_sync(lambda: child.communicate("go\n", timeout=60))
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert out.strip() == "OK"
        assert (config / "pids.config").read_text() == f"{child.pid}\n"

    await serving(server, body)


# --------------------------------------------------------------------------------------------------
# The socket


def _bind(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.listen()
    return sock


async def test_modes_and_a_deleted_socket_is_republished(world: World) -> None:
    uid, cid, _ = world.add_container(1)
    world.place(ME, uid, cid)
    server = make_server(world)

    async def body() -> None:
        path = server.path
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o711
        assert stat.S_IMODE(path.lstat().st_mode) == 0o666
        assert [p.name for p in path.parent.iterdir()] == ["socket.sock"]  # no staging leftovers
        first = path.lstat().st_ino
        path.unlink()
        await eventually(path.exists)
        assert path.is_socket() and path.lstat().st_ino != first
        assert stat.S_IMODE(path.lstat().st_mode) == 0o666
        assert await aregister(path, pod_uid=uid, container_name="main") == (grpc.StatusCode.OK, "")

    await serving(server, body)
    assert not server.path.exists()


async def test_a_successors_socket_is_left_alone(world: World) -> None:
    server = make_server(world)
    successor: list[socket.socket] = []

    async def body() -> None:
        path = server.path
        staged = path.with_name("successor.staged")
        successor.append(_bind(staged))
        staged.rename(path)  # a new instance took over the path
        inode = path.lstat().st_ino
        await trio.sleep(0.3)  # several guard rounds
        assert path.lstat().st_ino == inode  # no rename war

    try:
        await serving(server, body)
        assert server.path.is_socket()  # our shutdown did not unlink the successor's socket
    finally:
        successor[0].close()


async def test_a_live_predecessor_is_taken_over_and_a_non_socket_refused(world: World) -> None:
    uid, cid, _ = world.add_container(1)
    world.place(ME, uid, cid)
    server = make_server(world)
    path = server.path
    path.parent.mkdir(parents=True)
    predecessor = _bind(path)
    try:

        async def body() -> None:
            assert await aregister(path, pod_uid=uid, container_name="main") == (grpc.StatusCode.OK, "")

        await serving(server, body)
    finally:
        predecessor.close()

    path.write_text("not a socket")
    async with trio_asyncio.open_loop():
        with pytest.raises(SocketPathError, match="is not a socket"):
            await server.run(lambda: None)
    assert path.read_text() == "not a socket"


def spawn_after_a_line(script: str) -> subprocess.Popen[str]:
    """A shell that runs `script` (which waits for a line on stdin first)."""
    return subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


async def test_the_c_register_client_registers_through_the_real_server(world: World) -> None:
    """The library's own client (csrc/libvgpu vgpu-register) against RegistryServer: the exec'd client
    is the peer, so its PID is what lands in pids.config."""
    binary = built("libvgpu/vgpu-register")
    uid, cid, config = world.add_container(1)
    world.place_outside(ME)
    server = make_server(world)

    async def body() -> None:
        script = f"read line; exec {binary} --address {server.path} --pod-uid {uid} --container-name main"
        child = spawn_after_a_line(script)
        try:
            world.place(child.pid, uid, cid)  # `exec` keeps the PID: the client is this process
            _, err = await trio.to_thread.run_sync(lambda: child.communicate("go\n", timeout=30))
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        assert child.returncode == 0, err
        assert (config / "pids.config").read_text() == f"{child.pid}\n"

        other_uid, _, _ = world.add_container(2)
        argv = [
            str(binary),
            "--address",
            str(server.path),
            "--pod-uid",
            other_uid,
            "--container-name",
            "main",
        ]
        refused = await trio.to_thread.run_sync(
            lambda: subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        )
        assert refused.returncode != 0
        assert "PERMISSION_DENIED" in refused.stderr, refused.stderr

    await serving(server, body)


async def test_a_held_pids_lock_is_waited_for_off_the_event_loop_then_refused(world: World) -> None:
    """The write runs on the Trio thread only while the lock is free; a lock another writer holds is
    waited for in a worker thread (the loop keeps serving), up to the budget, then UNAVAILABLE."""
    uid, cid, config = world.add_container(1)
    world.place(ME, uid, cid)
    service = world.service()
    request = ContainerDeviceRequest(pod_uid=uid, container_name="main")
    with (config / "pids.config").open("rb") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)
        released = trio.Event()
        ticks = 0

        async def release_soon() -> None:
            nonlocal ticks
            for _ in range(10):  # the loop is free while the register call waits for the lock
                await trio.sleep(0.01)
                ticks += 1
            fcntl.flock(holder, fcntl.LOCK_UN)
            released.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(release_soon)
            resolved = await service.register(request, ME)
        assert released.is_set() and ticks == 10 and resolved.pids == (ME,)
        assert (config / "pids.config").read_text() == f"{ME}\n"

        fcntl.flock(holder, fcntl.LOCK_EX)  # and held past the budget (1 s)
        with pytest.raises(GRPCError) as refused:
            await service.register(request, ME)
        assert refused.value.status is Status.UNAVAILABLE and "keeps its lock" in str(refused.value.message)
