"""The health watcher on the real NVML path: vgpud.gpu.nvml's session through nvidia-ml-py into the fake
libnvidia-ml.so.1, in real worker threads and real time; the test makes GPUs sick through the shared
state file (tests.fakegpu_state), as the e2e does. Also: which settings start a watcher at all."""

from __future__ import annotations

import argparse
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import trio

from tests.fakegpu_state import raise_xid, set_lost
from tests.support import built
from tests.unit.fakes.gpu import UUID_A, UUID_B, profile_text
from vgpud.config import add_settings_arguments, settings_from
from vgpud.gpu.health import HealthBoard
from vgpud.gpu.healthrules import APPLICATION_XIDS
from vgpud.gpu.healthwatch import HealthRules, HealthWatcher
from vgpud.gpu.nvml import NvmlHealthSession, NvmlInventory
from vgpud.node.build import build_health_watch

FAKE = "fakenvml/libnvidia-ml.so.1"
RULES = HealthRules(frozenset(APPLICATION_XIDS), recovery_seconds=1, check_interval=0.2, wait_ms=100)
DEADLINE = 10  # seconds for anything to show on the board (it takes about a wait or a check)


@dataclass
class Fake:
    library: Path
    state: Path
    inventory: NvmlInventory


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Fake]:
    """The fake NVML serving two GPUs (NVML index 0: UUID_A, 1: UUID_B) with a state file."""
    library = built(FAKE)
    profile = tmp_path / "profile.yaml"
    profile.write_text(profile_text())
    monkeypatch.setenv("FAKE_NVML_PROFILE", str(profile))
    monkeypatch.setenv("FAKE_GPU_STATE", str(tmp_path / "gpu.state"))
    inventory = NvmlInventory(str(library))
    yield Fake(library, tmp_path / "gpu.state", inventory)


@pytest.fixture
async def watching(fake: Fake) -> AsyncIterator[tuple[Fake, HealthWatcher]]:
    gpus = await trio.to_thread.run_sync(fake.inventory.gpus)  # creates the state file
    board = HealthBoard(g.uuid for g in gpus)
    watcher = HealthWatcher(board, gpus, partial(NvmlHealthSession, fake.inventory), RULES)
    async with trio.open_nursery() as nursery:
        ready = trio.Event()
        nursery.start_soon(watcher.run, ready.set)
        with trio.fail_after(DEADLINE):
            await ready.wait()
        yield fake, watcher
        nursery.cancel_scope.cancel()


async def changed(board: HealthBoard) -> dict[str, tuple[bool, str, int | None]]:
    with trio.fail_after(DEADLINE):
        await board.wait_changed(board.version)
    return {u: (h.healthy, h.reason, h.xid) for u, h in board.snapshot().items()}


async def test_an_xid_through_the_state_file_makes_the_gpu_unhealthy_then_it_recovers(
    watching: tuple[Fake, HealthWatcher], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    fake, watcher = watching
    raise_xid(fake.state, 1, 13)  # an application's error: counted, ignored
    raise_xid(fake.state, 1, 79)
    sick = await changed(watcher.board)
    assert sick == {UUID_A: (True, "", None), UUID_B: (False, "XID 79 (GPU has fallen off the bus)", 79)}
    assert watcher.stats.xids == {(UUID_B, 13, "ignored"): 1, (UUID_B, 79, "fatal"): 1}
    sick_since = watcher.board.snapshot()[UUID_B].since
    healthy = await changed(watcher.board)
    assert healthy[UUID_B] == (True, "", None)
    # not at once: a recovery time (1 s) after the XID (both times are the board's wall clock)
    assert watcher.board.snapshot()[UUID_B].since - sick_since >= RULES.recovery_seconds - 0.05
    lines = [r.getMessage() for r in caplog.records if r.name == "vgpud.gpu.healthwatch"]
    assert lines[0].startswith(
        f"{UUID_B} (1) unhealthy: XID 79 (GPU has fallen off the bus): marked unhealthy"
    )
    assert lines[1].startswith(f"{UUID_B} (1) healthy again")


async def test_a_lost_gpu_is_unhealthy_and_healthy_again_after_it_is_restored(
    watching: tuple[Fake, HealthWatcher],
) -> None:
    fake, watcher = watching
    set_lost(fake.state, 0, True)
    try:
        sick = await changed(watcher.board)
        assert sick[UUID_A][0] is False
        assert sick[UUID_A][1] == "GPU lost: nvmlDeviceGetMemoryInfo: GPU is lost (NVML error 15)"
        assert sick[UUID_B] == (True, "", None)
    finally:
        set_lost(fake.state, 0, False)
    assert (await changed(watcher.board))[UUID_A] == (True, "", None)


async def test_a_gpu_lost_at_start_is_registered_once_it_answers(fake: Fake) -> None:
    gpus = await trio.to_thread.run_sync(fake.inventory.gpus)
    set_lost(fake.state, 0, True)
    board = HealthBoard(g.uuid for g in gpus)
    watcher = HealthWatcher(board, gpus, partial(NvmlHealthSession, fake.inventory), RULES)
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: watcher.run(task_status.started))
        assert board.snapshot()[UUID_A].reason.startswith(
            "GPU lost: registering XID events of GPU 0: GPU is lost"
        )
        set_lost(fake.state, 0, False)
        assert (await changed(board))[UUID_A][0] is True
        raise_xid(fake.state, 0, 48)  # its events were registered when it came back
        assert (await changed(board))[UUID_A] == (False, "XID 48 (double-bit ECC error)", 48)
        nursery.cancel_scope.cancel()


def _settings(*argv: str):
    parser = argparse.ArgumentParser()
    add_settings_arguments(parser)
    return settings_from(parser.parse_args(["--node-name", "n", *argv]), {})


def test_the_gate_decides_whether_a_watcher_runs(fake: Fake) -> None:
    gpus = fake.inventory.gpus()
    board = HealthBoard(g.uuid for g in gpus)
    on = _settings("--nvml-library", str(fake.library), "--health-recovery-seconds", "7")
    watcher = build_health_watch(on, fake.inventory, gpus, board)
    assert watcher is not None and watcher.board is board and watcher.rules.recovery_seconds == 7
    off = _settings("--nvml-library", str(fake.library), "--feature-gates", "NVMLDeviceHealthCheck=false")
    assert build_health_watch(off, fake.inventory, gpus, board) is None
    mock = _settings("--gpu-backend", "mock", "--gpu-profile", "a100-40gb-x2")
    assert build_health_watch(mock, None, gpus, board) is None  # on by default: not applicable, no NVML
    assert board.version == 0 and not board.unhealthy()
