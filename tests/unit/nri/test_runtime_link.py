"""The unsolicited UpdateContainers (`RuntimeLink.update_devices`) over a real session against the Python
runtime side: what goes on the wire, and every way it fails without ending the session."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from tests.unit.nri.fakeruntime import RuntimeConnection, fake_runtime
from tests.unit.nri.test_hooks import container, pod
from tests.unit.nri.test_session import IDENTITY, make_hooks
from vgpud._pb.nri.pkg.api.v1alpha1 import (
    ContainerUpdate,
    CreateContainerRequest,
    CreateContainerResponse,
    LinuxContainerUpdate,
    LinuxDeviceCgroup,
    LinuxResources,
    OptionalInt64,
    UpdateContainersRequest,
    UpdateContainersResponse,
)
from vgpud.containers.values import DeviceRule
from vgpud.nri.conn import SessionEnded, run_session
from vgpud.nri.hooks import NriHooks
from vgpud.nri.runtime_link import RuntimeLink, RuntimeUpdateError
from vgpud.nri.ttrpc import Code, TtrpcError

RULES = (
    DeviceRule(True, "c", 195, 0, "rw"),
    DeviceRule(True, "c", 195, 255, "rw"),
    DeviceRule(False, "a", None, None, "m"),
)


@asynccontextmanager
async def connected(short_tmp: Path) -> AsyncIterator[tuple[RuntimeLink, RuntimeConnection]]:
    """A session, synchronized, its link attached; cancelled at the end."""
    hooks, link = make_hooks(short_tmp / "root"), RuntimeLink()
    ready = trio.Event()
    async with fake_runtime(short_tmp / "nri.sock") as plugins, trio.open_nursery() as nursery:
        nursery.start_soon(session, str(short_tmp / "nri.sock"), hooks, link, ready.set)
        with trio.fail_after(10):
            runtime = await plugins.receive()
            await runtime.handshake()
            await ready.wait()
        yield link, runtime
        nursery.cancel_scope.cancel()


async def session(path: str, hooks: NriHooks, link: RuntimeLink, ready: Callable[[], None]) -> None:
    """One session; its end because the runtime left is part of some tests."""
    with contextlib.suppress(SessionEnded):
        await run_session(path, hooks, IDENTITY, ready, link)


async def still_serves(runtime: RuntimeConnection) -> None:
    """The session goes on: the runtime's next hook call is answered."""
    with trio.fail_after(5):
        reply = await runtime.call(
            "CreateContainer",
            CreateContainerRequest(pod=pod(), container=container("x", claim=None)),
            CreateContainerResponse,
        )
    assert reply.adjust is None


async def test_the_update_carries_the_container_and_its_rules(short_tmp: Path) -> None:
    async with connected(short_tmp) as (link, runtime):
        assert link.connected
        await link.update_devices("ctr-1", RULES, timeout=2)
    assert runtime.updates == [
        UpdateContainersRequest(
            update=[
                ContainerUpdate(
                    container_id="ctr-1",
                    linux=LinuxContainerUpdate(
                        resources=LinuxResources(
                            devices=[
                                LinuxDeviceCgroup(
                                    allow=True,
                                    type="c",
                                    major=OptionalInt64(value=195),
                                    minor=OptionalInt64(value=0),
                                    access="rw",
                                ),
                                LinuxDeviceCgroup(
                                    allow=True,
                                    type="c",
                                    major=OptionalInt64(value=195),
                                    minor=OptionalInt64(value=255),
                                    access="rw",
                                ),
                                LinuxDeviceCgroup(allow=False, type="a", access="m"),  # any major, any minor
                            ]
                        )
                    ),
                    ignore_failure=False,
                )
            ]
        )
    ]


async def test_an_error_status_carries_the_runtimes_text_and_the_session_goes_on(short_tmp: Path) -> None:
    async with connected(short_tmp) as (link, runtime):
        runtime.update_reply = lambda _r: TtrpcError(Code.UNKNOWN, "NRI update of some containers failed")
        with pytest.raises(RuntimeUpdateError, match=r"ctr-1: .*NRI update of some containers failed"):
            await link.update_devices("ctr-1", RULES, timeout=2)
        await still_serves(runtime)
        runtime.update_reply = lambda _r: UpdateContainersResponse()
        await link.update_devices("ctr-1", RULES, timeout=2)  # the link still works too
        assert len(runtime.updates) == 2


async def test_a_failed_list_is_an_error(short_tmp: Path) -> None:
    async with connected(short_tmp) as (link, runtime):
        runtime.update_reply = lambda r: UpdateContainersResponse(failed=r.update)
        with pytest.raises(RuntimeUpdateError, match="the runtime reports ctr-1 failed"):
            await link.update_devices("ctr-1", RULES, timeout=2)
        await still_serves(runtime)


async def test_no_answer_in_time_is_an_error_and_the_session_goes_on(short_tmp: Path) -> None:
    async with connected(short_tmp) as (link, runtime):
        runtime.update_reply = lambda _r: None
        with (
            trio.fail_after(5),
            pytest.raises(RuntimeUpdateError, match=r"did not answer UpdateContainers within 0\.2s"),
        ):
            await link.update_devices("ctr-1", RULES, timeout=0.2)
        await still_serves(runtime)


async def test_the_session_ending_fails_a_waiting_call_at_once(short_tmp: Path) -> None:
    async with connected(short_tmp) as (link, runtime):
        arrived = trio.Event()

        def never_answer(_request: UpdateContainersRequest) -> None:
            arrived.set()

        runtime.update_reply = never_answer
        failure: list[BaseException] = []

        async def update() -> None:
            try:
                await link.update_devices("ctr-1", RULES, timeout=60)
            except RuntimeUpdateError as err:
                failure.append(err)

        async with trio.open_nursery() as callers:
            callers.start_soon(update)
            with trio.fail_after(5):
                await arrived.wait()  # the request has reached the runtime, which then leaves
                await runtime.stream.aclose()
        assert "the NRI connection ended (the runtime closed the connection)" in str(failure[0])
        assert not link.connected
        with pytest.raises(RuntimeUpdateError, match="not connected"):
            await link.update_devices("ctr-1", RULES, timeout=2)


async def test_not_connected_is_an_error() -> None:
    with pytest.raises(RuntimeUpdateError, match="ctr-1: vgpud's NRI plugin is not connected"):
        await RuntimeLink().update_devices("ctr-1", RULES, timeout=2)


@pytest.mark.parametrize(
    ("container_id", "rules", "timeout", "message"),
    [
        ("", RULES, 2, "no container ID"),
        ("ctr-1", (), 2, "would change nothing"),
        ("ctr-1", RULES, 0, "positive number"),
        ("ctr-1", (DeviceRule(True, "x", 1, 1, "rw"),), 2, "type must be a, b or c"),
        ("ctr-1", (DeviceRule(True, "c", -1, 1, "rw"),), 2, "negative major"),
        ("ctr-1", (DeviceRule(True, "c", 1, 1, "rx"),), 2, "access must be"),
        ("ctr-1", (DeviceRule(True, "c", 1, 1, ""),), 2, "access must be"),
    ],
)
async def test_bad_arguments_are_refused_before_anything_is_sent(
    short_tmp: Path,
    container_id: str,
    rules: tuple[DeviceRule, ...],
    timeout: float,  # noqa: ASYNC109 (the argument under test)
    message: str,
) -> None:
    async with connected(short_tmp) as (link, runtime):
        with pytest.raises(ValueError, match=message):
            await link.update_devices(container_id, rules, timeout=timeout)
        assert runtime.updates == []


async def test_a_caller_that_gives_up_leaves_the_session_and_the_link_working(short_tmp: Path) -> None:
    async with connected(short_tmp) as (link, runtime):
        runtime.update_reply = lambda _r: None
        with trio.move_on_after(0.2) as gave_up:
            await link.update_devices("ctr-1", RULES, timeout=60)
        assert gave_up.cancelled_caught
        await still_serves(runtime)
        runtime.update_reply = lambda _r: UpdateContainersResponse()
        await link.update_devices("ctr-2", RULES, timeout=2)
        assert [u.update[0].container_id for u in runtime.updates] == ["ctr-1", "ctr-2"]


async def test_each_new_session_carries_the_link(short_tmp: Path) -> None:
    hooks, link = make_hooks(short_tmp / "root"), RuntimeLink()
    async with fake_runtime(short_tmp / "nri.sock") as plugins, trio.open_nursery() as nursery:
        for n in (1, 2):
            ready = trio.Event()
            nursery.start_soon(session, str(short_tmp / "nri.sock"), hooks, link, ready.set)
            with trio.fail_after(10):
                runtime = await plugins.receive()
                await runtime.handshake()
                await ready.wait()
            await link.update_devices(f"ctr-{n}", RULES, timeout=2)
            assert [u.update[0].container_id for u in runtime.updates] == [f"ctr-{n}"]
            await runtime.stream.aclose()
            await trio.testing.wait_all_tasks_blocked()  # the session has seen the end
            assert not link.connected
        nursery.cancel_scope.cancel()


def test_a_stale_session_does_not_detach_the_current_one() -> None:
    class Caller:
        async def call_runtime(self, method: str, payload: bytes, seconds: float) -> bytes:
            return b""

    link, old, new = RuntimeLink(), Caller(), Caller()
    link.attach(old)
    link.attach(new)
    link.detach(old)
    assert link.connected
    link.detach(new)
    assert not link.connected
