"""vgpud.heap: start-up's objects are frozen once every cache has listed, once, and only then."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import trio

from tests.unit.registry.world import run_cache
from vgpud.heap import freeze_start_up, freeze_when_listed
from vgpud.kube.fake import FakeKube
from vgpud.kube.informer import claim_informer, pod_informer


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_freeze_takes_what_is_alive_out_of_full_collections() -> None:
    kept = [{"n": i} for i in range(10_000)]  # dicts the collector tracks
    frozen = freeze_start_up()
    assert frozen >= len(kept) and gc.get_freeze_count() == frozen
    assert not any(obj is kept[0] for obj in gc.get_objects())  # a full collection no longer sees them


async def test_frozen_once_both_caches_have_listed() -> None:
    kube = FakeKube()
    pods, claims = pod_informer(kube, "n"), claim_informer(kube)
    freeze_when_listed([pods, claims])
    async with trio.open_nursery() as nursery:
        await nursery.start(run_cache, pods)
        assert gc.get_freeze_count() == 0  # one of two listed: not yet
        await nursery.start(run_cache, claims)
        frozen = gc.get_freeze_count()
        assert frozen > 0
        gc.unfreeze()
        for handler in pods.list_handlers:  # what a later list (a resync) calls
            handler()
        assert gc.get_freeze_count() == 0
        nursery.cancel_scope.cancel()


def test_without_caches_it_freezes_at_once() -> None:
    freeze_when_listed([])
    assert gc.get_freeze_count() > 0
