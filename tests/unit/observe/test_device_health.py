"""Device health in the metrics and the debug state, with the watcher running on a scripted NVML."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from tests.draharness import GPUS
from tests.unit.observe.node import make_node

U0, U1 = GPUS[0].uuid, GPUS[1].uuid


@pytest.fixture
def clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0.01)  # the watcher waits in worker threads


async def test_health_and_xids_show_in_metrics_and_state(
    short_tmp: Path, clock: trio.testing.MockClock
) -> None:
    node = make_node(short_tmp)
    watcher, board = node.watcher, node.board
    assert watcher is not None and board is not None
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: watcher.run(task_status.started))
        node.gpu_shim.xid(0, 13)
        node.gpu_shim.xid(0, 79)
        with trio.fail_after(60):
            await board.wait_changed(0)
            # the XID marks the GPU before the first periodic check (a worker thread) has to end
            while watcher.stats.checks < 1:  # noqa: ASYNC110 (a counter: no event to wait on)
                await trio.sleep(0.01)
        text = node.metrics.exposition()[0].decode()
        state = await node.state.snapshot()
        nursery.cancel_scope.cancel()
    assert f'vgpud_device_healthy{{index="0",uuid="{U0}"}} 0.0' in text
    assert f'vgpud_device_healthy{{index="1",uuid="{U1}"}} 1.0' in text
    assert f'vgpud_device_xid_events_total{{kind="ignored",uuid="{U0}",xid="13"}} 1.0' in text
    assert f'vgpud_device_xid_events_total{{kind="fatal",uuid="{U0}",xid="79"}} 1.0' in text
    health = state["device_health"]
    assert health["ignored_xids"] == [13, 31, 43, 45, 68, 109] and health["recovery_seconds"] == 60
    assert health["sessions"] == 1 and health["checks"] >= 1
    sick = health["devices"][U0]
    assert {k: sick[k] for k in ("index", "healthy", "reason", "xid")} == {
        "index": 0,
        "healthy": False,
        "reason": "XID 79 (GPU has fallen off the bus)",
        "xid": 79,
    }
    assert sick["since"] == board.snapshot()[U0].since
    assert health["devices"][U1] == {
        "index": 1,
        "healthy": True,
        "reason": "",
        "since": board.snapshot()[U1].since,
        "xid": None,
    }
    assert health["xids"] == [
        {"uuid": U0, "xid": 13, "kind": "ignored", "count": 1},
        {"uuid": U0, "xid": 79, "kind": "fatal", "count": 1},
    ]


async def test_without_a_watcher_there_is_no_section_and_no_device_series(short_tmp: Path) -> None:
    node = make_node(short_tmp)
    node.watcher = None
    node.rebuild()
    assert (await node.state.snapshot())["device_health"] is None
    assert "vgpud_device_healthy{" not in node.metrics.exposition()[0].decode()
