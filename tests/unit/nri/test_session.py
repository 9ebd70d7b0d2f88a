"""The NRI session (conn.py) against a Python runtime side, and its supervision in virtual time."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import trio
import trio.testing

from tests.admission import StaticAdmission
from tests.unit.nri.fakeruntime import fake_runtime, injected
from tests.unit.nri.test_hooks import CLAIM, POD_UID, container, pod
from vgpud._pb.nri.pkg.api.v1alpha1 import (
    CreateContainerRequest,
    CreateContainerResponse,
    Empty,
    RemoveContainerRequest,
    RemoveContainerResponse,
    SynchronizeRequest,
)
from vgpud.componenthealth import HealthState
from vgpud.nri.conn import COUNTED_METHODS, Dialer, Identity, SessionEnded, probe, run_session
from vgpud.nri.hooks import NriHooks
from vgpud.nri.ttrpc import Code, TtrpcError
from vgpud.partition.layout import Layout
from vgpud.partition.lazy import LazyAssigner
from vgpud.ready import Ready
from vgpud.recorder import Recorder
from vgpud.supervisor import Backoff, HealthAfter, Restart, Supervisor

IDENTITY = Identity("manager.nvidia.com", "00")


def make_hooks(root: Path) -> NriHooks:
    return NriHooks(
        assigner=LazyAssigner(Layout(root), driver=IDENTITY.name),
        admission=StaticAdmission(lambda uid, _namespace: uid == CLAIM),
        recorder=Recorder(),
    )


async def test_register_configure_synchronize_create_remove(short_tmp: Path) -> None:
    hooks = make_hooks(short_tmp / "root")
    socket_path = short_tmp / "nri.sock"
    ready = trio.Event()
    async with fake_runtime(socket_path) as plugins, trio.open_nursery() as nursery:
        nursery.start_soon(run_session, str(socket_path), hooks, IDENTITY, ready.set)
        with trio.fail_after(10):
            runtime = await plugins.receive()
            configured = await runtime.handshake(
                SynchronizeRequest(
                    pods=[pod()], containers=[injected(hooks.assigner, pod(), container("old"))]
                )
            )
            await ready.wait()
        assert runtime.registered is not None
        assert (runtime.registered.plugin_name, runtime.registered.plugin_idx) == ("manager.nvidia.com", "00")
        assert configured.events == 1614  # 1038 + post-start (64) + stop container (512)
        assert hooks.containers.synced and hooks.containers.injected(POD_UID, "old") is not None

        reply = await runtime.call(
            "CreateContainer",
            CreateContainerRequest(pod=pod(), container=container()),
            CreateContainerResponse,
        )
        assert {kv.key for kv in reply.adjust.env} >= {"VGPU_POD_UID", "VGPU_CONTAINER_NAME"}
        directory = Path(hooks.assigner.paths(CLAIM, POD_UID, "main").base)
        assert directory.is_dir()
        await runtime.call(
            "RemoveContainer",
            RemoveContainerRequest(pod=pod(), container=container()),
            RemoveContainerResponse,
        )
        assert not directory.exists()

        with pytest.raises(TtrpcError) as info:
            await runtime.call("NoSuchMethod", Empty(), Empty)
        assert info.value.code == Code.UNIMPLEMENTED
        assert hooks.stats.requests == {
            "Configure": 1,
            "Synchronize": 1,
            "CreateContainer": 1,
            "RemoveContainer": 1,
            "NoSuchMethod": 1,
        }
        nursery.cancel_scope.cancel()


async def test_a_hook_failure_is_an_error_status_and_the_session_goes_on(short_tmp: Path) -> None:
    root = short_tmp / "root"
    (root / "claims").mkdir(parents=True)
    (root / "claims" / CLAIM).write_text("not a directory")
    hooks = make_hooks(root)
    async with fake_runtime(short_tmp / "nri.sock") as plugins, trio.open_nursery() as nursery:
        nursery.start_soon(run_session, str(short_tmp / "nri.sock"), hooks, IDENTITY, lambda: None)
        with trio.fail_after(10):
            runtime = await plugins.receive()
            await runtime.handshake()
            with pytest.raises(TtrpcError) as info:
                await runtime.call(
                    "CreateContainer",
                    CreateContainerRequest(pod=pod(), container=container()),
                    CreateContainerResponse,
                )
            assert info.value.code == Code.FAILED_PRECONDITION
            plain = await runtime.call(
                "CreateContainer",
                CreateContainerRequest(pod=pod(), container=container("x", claim=None)),
                CreateContainerResponse,
            )
        assert plain.adjust is None
        nursery.cancel_scope.cancel()


async def test_request_counts_by_method_are_bounded(short_tmp: Path) -> None:
    """A runtime that sends ever new method names cannot grow the counts without bound."""
    hooks = make_hooks(short_tmp / "root")
    async with fake_runtime(short_tmp / "nri.sock") as plugins, trio.open_nursery() as nursery:
        nursery.start_soon(run_session, str(short_tmp / "nri.sock"), hooks, IDENTITY, lambda: None)
        with trio.fail_after(10):
            runtime = await plugins.receive()
            await runtime.handshake()
            for i in range(COUNTED_METHODS + 5):
                with pytest.raises(TtrpcError):
                    await runtime.call(f"Unknown{i}", Empty(), Empty)
        assert len(hooks.stats.requests) == COUNTED_METHODS + 1
        assert hooks.stats.requests["(other)"] == 2 + 5  # Configure and Synchronize came first
        assert hooks.stats.requests["Configure"] == 1
        nursery.cancel_scope.cancel()


async def test_the_session_ends_when_the_runtime_closes(short_tmp: Path) -> None:
    hooks = make_hooks(short_tmp / "root")
    async with fake_runtime(short_tmp / "nri.sock") as plugins, trio.open_nursery() as nursery:

        async def session() -> None:
            with pytest.raises(SessionEnded, match="closed the connection"):
                await run_session(str(short_tmp / "nri.sock"), hooks, IDENTITY, lambda: None)

        nursery.start_soon(session)
        with trio.fail_after(10):
            runtime = await plugins.receive()
            await runtime.handshake()
            await runtime.stream.aclose()


async def test_no_runtime_is_a_clear_error(short_tmp: Path) -> None:
    with pytest.raises(SessionEnded, match=r"cannot connect to .*nri\.sock"):
        await run_session(str(short_tmp / "nri.sock"), make_hooks(short_tmp), IDENTITY, lambda: None)


@pytest.fixture
def autojump() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


async def test_reconnect_backoff_and_health_in_virtual_time(
    short_tmp: Path, autojump: trio.testing.MockClock
) -> None:
    """Backoff 1, 2, 4, ... 30 s between attempts while the runtime is away; health FAILING only after
    180 s of continuous failure; the first successful session clears it."""
    socket_path = short_tmp / "nri.sock"
    hooks = make_hooks(short_tmp / "root")
    attempts: list[float] = []

    async def session(ready: Ready) -> None:
        attempts.append(trio.current_time())
        await run_session(str(socket_path), hooks, IDENTITY, ready)

    async with Supervisor() as supervisor:
        supervisor.supervise("nri-plugin", session, Restart(), HealthAfter())
        await trio.sleep(179.5)
        assert supervisor.health.get("nri-plugin").state is HealthState.STARTING
        await trio.sleep(1)
        assert supervisor.health.get("nri-plugin").state is HealthState.FAILING
        start = attempts[0]
        assert [t - start for t in attempts] == [0, 1, 3, 7, 15, 31, 61, 91, 121, 151]
        failing_since = supervisor.health.get("nri-plugin").since
        assert failing_since - start == 180
        supervisor.cancel()


async def test_recovery_clears_failing_health(short_tmp: Path) -> None:
    """Real time with small timings: the runtime appears after the grace period; health recovers."""
    socket_path = short_tmp / "nri.sock"
    hooks = make_hooks(short_tmp / "root")
    async with Supervisor() as supervisor:
        supervisor.supervise(
            "nri-plugin",
            partial(run_session, str(socket_path), hooks, IDENTITY),
            Restart(Backoff(initial=0.05, cap=0.1)),
            HealthAfter(grace=0.3),
        )
        with trio.fail_after(10):
            while supervisor.health.get("nri-plugin").state is not HealthState.FAILING:
                await supervisor.health.wait_changed()
            async with fake_runtime(socket_path) as plugins:
                runtime = await plugins.receive()
                await runtime.handshake()
                while supervisor.health.get("nri-plugin").state is not HealthState.HEALTHY:
                    await supervisor.health.wait_changed()
                supervisor.cancel()


async def test_the_probe_connection_is_the_first_session(short_tmp: Path) -> None:
    """The start-up probe's socket registers (a hang-up would be a broken plugin to the runtime);
    the next session dials anew."""
    socket_path = short_tmp / "nri.sock"
    assert probe(str(socket_path)) == "No such file or directory"
    hooks = make_hooks(short_tmp / "root")
    async with fake_runtime(socket_path) as plugins, trio.open_nursery() as nursery:
        connected = await trio.to_thread.run_sync(probe, str(socket_path))
        assert not isinstance(connected, str)
        dialer = Dialer(str(socket_path), connected)
        ready = trio.Event()

        async def two_sessions() -> None:
            for _ in range(2):
                with pytest.raises(SessionEnded):
                    await run_session(dialer, hooks, IDENTITY, ready.set)

        with trio.fail_after(10):
            first = await plugins.receive()  # accepted at the probe, before any session
            nursery.start_soon(two_sessions)
            await first.handshake()
            await ready.wait()
        assert first.registered is not None
        await first.stream.aclose()
        with trio.fail_after(10):
            second = await plugins.receive()  # the supervisor's next session, on a new connection
        assert second is not first
        nursery.cancel_scope.cancel()


# --- a restarted runtime is dialed at once (Dialer.replaced as the supervisor's Restart.wake) ------


async def _connected_stays_quiet(plugins: trio.MemoryReceiveChannel, seconds: float) -> bool:
    """No plugin connects within `seconds`."""
    with trio.move_on_after(seconds):
        await plugins.receive()
        return False
    return True


async def test_a_restarted_runtime_is_dialed_at_once_whatever_the_backoff(short_tmp: Path) -> None:
    """Real sockets, a 30 s backoff: the runtime drops the plugin (no new socket: the backoff holds),
    then restarts on a new socket (dialed at once), as containerd does after a kill."""
    socket_path = short_tmp / "nri.sock"
    hooks = make_hooks(short_tmp / "root")
    dialer = Dialer(str(socket_path))
    async with Supervisor() as supervisor:
        async with fake_runtime(socket_path) as plugins:
            supervisor.supervise(
                "nri-plugin",
                partial(run_session, dialer, hooks, IDENTITY),
                Restart(Backoff(initial=30, cap=30), wake=dialer.replaced),
                HealthAfter(),
            )
            with trio.fail_after(10):
                runtime = await plugins.receive()
                await runtime.handshake()
                while supervisor.health.get("nri-plugin").state is not HealthState.HEALTHY:
                    await supervisor.health.wait_changed()
            await runtime.stream.aclose()  # dropped; the same socket still listens
            assert await _connected_stays_quiet(plugins, 1.5)
        assert socket_path.is_socket()  # the killed runtime's socket is left behind: refused now
        assert await trio.to_thread.run_sync(probe, str(socket_path)) == "Connection refused"
        socket_path.unlink()  # a restarted runtime replaces its stale socket
        async with fake_runtime(socket_path) as plugins:
            started = trio.current_time()
            with trio.fail_after(10):
                runtime = await plugins.receive()
            assert trio.current_time() - started < 2  # the poll, not the 30 s backoff
            with trio.fail_after(10):
                await runtime.handshake()
                while supervisor.health.get("nri-plugin").state is not HealthState.HEALTHY:
                    await supervisor.health.wait_changed()
        supervisor.cancel()


async def test_replaced_waits_for_a_socket_other_than_the_one_dialed(short_tmp: Path) -> None:
    socket_path = short_tmp / "nri.sock"
    dialer = Dialer(str(socket_path), poll=0.01)
    with pytest.raises(SessionEnded, match="No such file or directory"):
        await dialer.connect()  # nothing dialed: any socket is new
    socket_path.write_text("not a socket")
    with trio.move_on_after(0.3) as waited:
        await dialer.replaced()
    assert waited.cancelled_caught  # a file is not a socket
    socket_path.unlink()
    async with fake_runtime(socket_path):
        with trio.fail_after(2):
            assert await dialer.replaced() == f"the runtime bound a new socket at {socket_path}"
        stream = await dialer.connect()
        with trio.move_on_after(0.3) as waited:
            await dialer.replaced()
        assert waited.cancelled_caught  # the socket it dialed
        await stream.aclose()
    socket_path.unlink()
    with trio.move_on_after(0.3) as waited:
        await dialer.replaced()
    assert waited.cancelled_caught  # gone, and nothing new
    async with fake_runtime(socket_path):
        with trio.fail_after(2):
            await dialer.replaced()
