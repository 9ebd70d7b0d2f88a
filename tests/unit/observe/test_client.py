"""`vgpud debug tail` and `vgpud debug state` against the debug server in this process."""

from __future__ import annotations

import io
import json
from pathlib import Path

import trio

from tests.kubeapi import free_port
from tests.unit.observe.node import Node, make_node, serving
from vgpud.observe.client import Endpoint, format_call, state, tail
from vgpud.observe.filters import CallFilter
from vgpud.recorder import HookCall

TIMEOUT = 20


def call(seq: int, **fields: object) -> dict:
    base = HookCall(component="nri", call="CreateContainer").to_dict()
    return {**base, "seq": seq, "time": 1700000000.25, **fields}


def test_format_call_is_one_readable_line() -> None:
    line = format_call(
        call(
            7,
            pod_namespace="ml",
            pod_name="train",
            pod_uid="u",
            container="main",
            claim_uid="c1",
            latency_seconds=0.0012,
            detail="/m/claims/c1/u_main",
        )
    )
    assert line.endswith(
        " #7 nri CreateContainer ok 1.20ms pod=ml/train container=main claim=c1 - /m/claims/c1/u_main"
    )
    assert line[:12].count(":") == 2 and line[8] == "."  # HH:MM:SS.mmm
    assert format_call(call(8, pod_uid="u")).endswith("#8 nri CreateContainer ok 0.00ms pod=u")


async def run_tail(
    endpoint: Endpoint, where: CallFilter | None = None, **options: object
) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with trio.fail_after(TIMEOUT):
        code = await tail(endpoint, where or CallFilter(), out=out, err=err, **options)  # type: ignore[arg-type]
    return code, out.getvalue(), err.getvalue()


async def wait_for_clients(node: Node, n: int) -> None:
    with trio.fail_after(TIMEOUT):
        while node.stream.clients < n:  # noqa: ASYNC110  # the server's tasks count them
            await trio.sleep(0.005)


async def test_tail_prints_the_last_calls_then_new_ones_once_each(short_tmp: Path) -> None:
    """The stream is opened before the ring buffer is read, so a call recorded in between is printed
    once: from the ring buffer, and skipped when the stream brings it too."""
    node = make_node(short_tmp)
    sock = short_tmp / "debug.sock"
    recorder = node.recorder
    for i in range(5):
        recorder.record(HookCall(component="nri", call="CreateContainer", pod_uid=f"p{i}"))
    out, err = io.StringIO(), io.StringIO()
    codes: list[int] = []

    async def follow() -> None:
        endpoint = Endpoint(unix_path=sock)
        codes.append(await tail(endpoint, CallFilter(), as_json=True, last=3, count=6, out=out, err=err))

    async with serving(node, sock), trio.open_nursery() as nursery:
        nursery.start_soon(follow)
        await wait_for_clients(node, 1)
        recorder.record(HookCall(component="dra", call="Prepare", claim_uid="c5"))  # maybe before -n's read
        with trio.fail_after(TIMEOUT):
            while out.getvalue().count("\n") < 3:  # noqa: ASYNC110  # printed by the tail task
                await trio.sleep(0.005)
        recorder.record(HookCall(component="dra", call="Prepare", claim_uid="c6"))
        recorder.record(HookCall(component="dra", call="Prepare", claim_uid="c7"))
        recorder.record(HookCall(component="dra", call="Prepare", claim_uid="c8"))  # not printed: --count 6
    assert codes == [0] and err.getvalue() == ""
    seqs = [json.loads(line)["seq"] for line in out.getvalue().splitlines()]
    assert seqs in ([3, 4, 5, 6, 7, 8], [4, 5, 6, 7, 8, 9])


async def test_tail_filters_and_ends_cleanly_when_vgpud_stops(short_tmp: Path) -> None:
    node = make_node(short_tmp)
    sock = short_tmp / "debug.sock"
    recorder = node.recorder
    out, err = io.StringIO(), io.StringIO()
    codes: list[int] = []

    async def follow() -> None:
        codes.append(await tail(Endpoint(unix_path=sock), CallFilter(hook="Prepare"), out=out, err=err))

    async with trio.open_nursery() as nursery, serving(node, sock):
        nursery.start_soon(follow)
        await wait_for_clients(node, 1)
        recorder.record(HookCall(component="nri", call="CreateContainer"))
        recorder.record(HookCall(component="dra", call="Prepare", claim_uid="c1", pod_namespace="ml"))
        with trio.fail_after(TIMEOUT):
            while not out.getvalue():  # noqa: ASYNC110  # printed by the tail task
                await trio.sleep(0.005)
        # leaving `serving` stopped the server: the tail ends on its own
    assert codes == [0]
    (line,) = out.getvalue().splitlines()
    assert "#2 dra Prepare ok" in line and "claim=c1" in line
    assert err.getvalue() == "vgpud debug tail: the stream ended: GOING_AWAY (1001): vgpud is shutting down\n"


async def test_tail_that_cannot_connect_exits_1(short_tmp: Path) -> None:
    code, out, err = await run_tail(Endpoint(unix_path=short_tmp / "debug.sock"))
    assert (code, out) == (1, "")
    assert err.startswith("vgpud debug tail: cannot connect to unix:") and "debug.sock" in err


async def test_state_prints_the_document(short_tmp: Path) -> None:
    node = make_node(short_tmp)
    sock = short_tmp / "debug.sock"
    node.recorder.record(HookCall(component="nri", call="CreateContainer"))
    out, err = io.StringIO(), io.StringIO()
    async with serving(node, sock):
        code = await trio.to_thread.run_sync(
            lambda: state(Endpoint(unix_path=sock), calls=1, out=out, err=err)
        )
    assert (code, err.getvalue()) == (0, "")
    document = json.loads(out.getvalue())
    assert document["calls"]["recent"][0]["call"] == "CreateContainer" and document["mode"] == "lazy"
    code = state(Endpoint(unix_path=sock), calls=1, out=io.StringIO(), err=err)
    assert code == 1 and "No such file" in err.getvalue()


async def test_the_loopback_address_serves_the_same_routes(short_tmp: Path) -> None:
    node = make_node(short_tmp)
    port = free_port()
    node.recorder.record(HookCall(component="dra", call="Prepare", claim_uid="c1"))
    endpoint = Endpoint(address=("127.0.0.1", port))
    out, err = io.StringIO(), io.StringIO()
    async with serving(node, None, ("127.0.0.1", port)):
        code = await trio.to_thread.run_sync(lambda: state(endpoint, calls=1, out=out, err=err))
        assert code == 0 and json.loads(out.getvalue())["calls"]["last_seq"] == 1
        tail_out = io.StringIO()
        code = await tail(endpoint, CallFilter(claim="c1"), last=5, count=1, out=tail_out, err=err)
        assert code == 0 and "#1 dra Prepare ok" in tail_out.getvalue()
    assert err.getvalue() == ""
