"""The NRI plugin's admission against the real claim index: reservations (bug 3), the guard against
Unprepare (bug 8) and per-claim modes (bug 2). Real files in a temp dir, the in-memory API."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from tests import objects as o
from tests.draharness import REF, Harness, single_container_claim
from tests.events import recording
from tests.unit.nri.fakeruntime import injected
from tests.unit.registry.world import run_cache
from vgpud._pb.nri.pkg.api.v1alpha1 import Container, CreateContainerRequest, PodSandbox, SynchronizeRequest
from vgpud.dra.checkpoint import CheckpointStore
from vgpud.dra.claimwatch import ClaimWatch
from vgpud.kube.events import EventSink
from vgpud.kube.informer import claim_informer
from vgpud.nri import hooks as hooks_module
from vgpud.nri.hooks import NriHooks
from vgpud.nri.sync import SyncBatch, decode_sync
from vgpud.partition.assigner import InjectionPlan
from vgpud.partition.lazy import LazyAssigner
from vgpud.recorder import Outcome


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return Harness(tmp_path, lazy=True)


def nri(h: Harness, events: EventSink | None = None) -> NriHooks:
    return NriHooks(
        assigner=LazyAssigner(h.layout, driver=o.DRIVER),
        admission=h.driver.index,
        recorder=h.recorder,
        events=events,
    )


def pod_of(pod_uid: str, namespace: str = o.NAMESPACE) -> PodSandbox:
    return PodSandbox(id=f"sb-{pod_uid}", name="p", namespace=namespace, uid=pod_uid)


def container_of(pod_uid: str, claim: str = o.CLAIM_UID) -> Container:
    env = [f"MANAGER_VGPU_CLAIM_UID={claim}"]
    return Container(id=f"ctr-{pod_uid}", pod_sandbox_id=f"sb-{pod_uid}", name="main", env=env)


def sync(**fields: object) -> SyncBatch:
    """A Synchronize as the session hands it to the hook: decoded from its wire bytes."""
    return decode_sync(bytes(SynchronizeRequest(**fields)))


def request(pod_uid: str, namespace: str = o.NAMESPACE, claim: str = o.CLAIM_UID) -> CreateContainerRequest:
    return CreateContainerRequest(pod=pod_of(pod_uid, namespace), container=container_of(pod_uid, claim))


async def prepared(h: Harness) -> dict:
    claim, pod = single_container_claim()
    h.kube.add_claim(claim)
    h.kube.add_pod(pod)
    assert (await h.driver.prepare([REF]))[o.CLAIM_UID].error == ""
    return claim


# ---------------------------------------------------------------------------------------------------
# Bug 3: only a pod the claim is reserved for


async def test_a_pod_the_claim_is_not_reserved_for_gets_nothing(h: Harness) -> None:
    await prepared(h)
    async with recording() as record:
        hooks = nri(h, record.recorder)
        for namespace in (o.NAMESPACE, "other"):
            reply = await hooks.create_container(request(o.POD2_UID, namespace))
            assert reply.adjust is None, namespace
            assert not (h.claim_dir() / f"{o.POD2_UID}_main").exists()
        assert list(h.claim_dir().iterdir()) == []
        assert hooks.stats.rejected_not_reserved == 1 and hooks.stats.rejected_unprepared == 1
        same, other = [c for c in h.recorder.recent(10) if c.call == "CreateContainer"]
        assert same.outcome is Outcome.REJECTED and "is not reserved for pod" in same.detail
        assert other.outcome is Outcome.REJECTED and "namespace other" in other.detail
        # each pod is told, with the same reason
        for namespace, why in ((o.NAMESPACE, same.detail), ("other", other.detail)):
            [event] = await record.events(namespace)
            assert (event["type"], event["reason"]) == ("Warning", "VGPUContainerRefused")
            assert event["involvedObject"]["uid"] == o.POD2_UID
            reason = why.removesuffix(": nothing injected")
            assert event["message"] == f"container main gets no vGPU: {reason}"
        # the pod it is reserved for is injected, and told nothing
        reply = await hooks.create_container(request(o.POD1_UID))
        assert reply.adjust is not None and (h.claim_dir() / f"{o.POD1_UID}_main").is_dir()
        assert len(await record.events()) == 2


async def test_a_pod_that_joins_after_prepare_is_injected_once_the_watch_sees_it(h: Harness) -> None:
    await prepared(h)
    claim = await h.kube.get_resource_claim(REF.namespace, REF.name)  # with the label Prepare wrote
    assert h.claim_labels.items() <= claim["metadata"]["labels"].items()
    hooks = nri(h)
    claims = claim_informer(h.kube, labels=h.claim_labels)
    watch = ClaimWatch(claims, h.driver.index, h.kube, h.claim_labels)
    async with trio.open_nursery() as nursery:
        await nursery.start(run_cache, watch)
        assert len(claims) == 1
        # the hook arrives first: it waits (bounded) for the watch rather than asking the API
        replies = []
        answered = trio.Event()
        calls_before = dict(h.kube.calls)

        async def create() -> None:
            replies.append(await hooks.create_container(request(o.POD2_UID)))
            answered.set()

        nursery.start_soon(create)
        await trio.testing.wait_all_tasks_blocked()
        joined = o.pod("infer", o.POD2_UID, containers=[o.container("main", o.ref("gpu"))])
        claim["status"]["reservedFor"] += o.reserved(joined)
        h.kube.add_claim(claim)
        await answered.wait()
        assert replies[0].adjust is not None
        assert (h.claim_dir() / f"{o.POD2_UID}_main").is_dir()
        assert {k: v for k, v in h.kube.calls.items() if calls_before.get(k) != v} == {}, "no API call"
        # and a pod removed from reservedFor is refused from then on
        claim["status"]["reservedFor"] = o.reserved(joined)
        h.kube.add_claim(claim)
        await trio.testing.wait_all_tasks_blocked()
        reply = await hooks.create_container(request(o.POD1_UID))
        assert reply.adjust is None
        nursery.cancel_scope.cancel()


async def test_the_reservation_survives_a_restart_without_the_watch(h: Harness) -> None:
    """Prepare's reservedFor is in the checkpoint, so a restarted vgpud admits the pod before its
    claim watch has listed anything."""
    await prepared(h)
    restarted = h.new_driver()
    await restarted.load()
    assert restarted.index.check(o.CLAIM_UID, o.NAMESPACE, o.POD1_UID).inject
    assert not restarted.index.check(o.CLAIM_UID, o.NAMESPACE, o.POD2_UID).inject


# ---------------------------------------------------------------------------------------------------
# Bug 8: Unprepare between the admission check and the directory


def waiting(h: Harness) -> bool:
    """Someone waits for the claim's guard (09fd371 has no guard: never)."""
    waiters = getattr(h.driver.index, "guard_waiters", None)
    return bool(waiters and waiters(o.CLAIM_UID))


async def test_unprepare_waits_for_a_create_container_already_admitted(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    await prepared(h)
    hooks = nri(h)
    entered, release = trio.Event(), trio.Event()
    real = hooks_module.make_directories_soon

    async def held_mkdir(plan: InjectionPlan) -> None:  # the window, widened: held until the test lets go
        entered.set()
        await release.wait()
        await real(plan)

    monkeypatch.setattr(hooks_module, "make_directories_soon", held_mkdir)
    done: dict[str, object] = {}

    async def create() -> None:
        done["create"] = await hooks.create_container(request(o.POD1_UID))

    async def unprepare() -> None:
        done["unprepare"] = await h.driver.unprepare([REF])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(create)
        await entered.wait()  # admitted, making the directory
        nursery.start_soon(unprepare)
        # the Unprepare either finished (the race lost) or waits for the claim's guard
        # a lock's waiters have no event to wait on: poll the condition itself
        while "unprepare" not in done and not waiting(h):  # noqa: ASYNC110
            await trio.sleep(0.01)
        release.set()
    assert done["unprepare"] == {o.CLAIM_UID: ""}
    assert not h.claim_dir().exists(), "a directory with no checkpoint entry was left behind"
    assert o.CLAIM_UID not in h.checkpoint()
    # and a CreateContainer after the Unprepare gets nothing
    assert (await hooks.create_container(request(o.POD1_UID))).adjust is None
    assert not h.claim_dir().exists()


# ---------------------------------------------------------------------------------------------------
# Bug 2: the mode is recorded per claim, and served where it can be


async def test_the_mode_is_recorded_and_an_eager_claim_is_not_injected_lazily(tmp_path: Path) -> None:
    eager = Harness(tmp_path)  # prepared by an eager vgpud (e.g. the NRI socket was slow at start)
    claim, pod = single_container_claim()
    eager.kube.add_claim(claim)
    eager.kube.add_pod(pod)
    assert (await eager.driver.prepare([REF]))[o.CLAIM_UID].error == ""
    partition = sorted(eager.claim_dir().iterdir())
    lazy = Harness(tmp_path, lazy=True)  # restarted with NRI: same dirs
    await lazy.driver.load()
    async with recording() as record:
        hooks = nri(lazy, record.recorder)
        reply = await hooks.create_container(request(o.POD1_UID))
        assert await record.events() == [], "served by its CDI spec: nothing to tell the pod"
    assert reply.adjust is None, "the CDI spec already carries the eager mounts"
    assert sorted(eager.claim_dir().iterdir()) == partition, "no lazy directory"
    (call,) = [c for c in lazy.recorder.recent(5) if c.call == "CreateContainer"]
    assert call.outcome is Outcome.SKIPPED and "prepared in eager mode" in call.detail
    assert hooks.stats.other_mode == 1
    assert eager.checkpoint()[o.CLAIM_UID]["mode"] == "eager"
    assert [(m.claim.uid, m.prepared.value, m.current.value) for m in lazy.driver.index.mismatches()] == [
        (o.CLAIM_UID, "eager", "lazy")
    ]


async def test_a_lazy_claim_in_an_eager_vgpud_is_reported(tmp_path: Path) -> None:
    lazy = Harness(tmp_path, lazy=True)
    claim, pod = single_container_claim()
    lazy.kube.add_claim(claim)
    lazy.kube.add_pod(pod)
    assert (await lazy.driver.prepare([REF]))[o.CLAIM_UID].error == ""
    assert lazy.checkpoint()[o.CLAIM_UID]["mode"] == "lazy"
    eager = Harness(tmp_path)
    await eager.driver.load()
    (mismatch,) = eager.driver.index.mismatches()
    assert (mismatch.prepared.value, mismatch.current.value) == ("lazy", "eager")
    assert "no per-container directory" in mismatch.consequence


async def test_an_entry_without_a_mode_loads_as_the_current_mode(h: Harness) -> None:
    await prepared(h)
    store = CheckpointStore(h.plugin_dir / "checkpoint.json", "boot-1")
    old = store.load()
    store.save(
        old.with_claim(
            o.CLAIM_UID,
            type(old.claims[o.CLAIM_UID])(
                **{
                    **{
                        f: getattr(old.claims[o.CLAIM_UID], f)
                        for f in (
                            "state",
                            "name",
                            "namespace",
                            "prepared_devices",
                            "partition",
                            "vgpu",
                            "status",
                        )
                    },
                    "mode": None,
                }
            ),
        )
    )
    assert "mode" not in h.checkpoint()[o.CLAIM_UID]
    restarted = h.new_driver()
    await restarted.load()
    assert restarted.index.mode_of(o.CLAIM_UID).value == "lazy"
    assert restarted.index.mismatches() == []
    assert [r.uid for r in restarted.index.unrecorded_modes()] == [o.CLAIM_UID]
    assert restarted.index.check(o.CLAIM_UID, o.NAMESPACE, o.POD1_UID).inject


async def test_synchronize_keeps_a_joined_pod_before_the_watch_has_listed(h: Harness) -> None:
    """After a restart, Synchronize may come before the claim watch's first list: a container of a pod
    that joined after Prepare keeps its cache entry (its directory proves it was admitted); a pod that
    never was admitted (no directory) is still not cached."""
    await prepared(h)
    joined = nri(h)
    h.driver.index.set_reserved(o.CLAIM_UID, {o.POD1_UID, o.POD2_UID})  # what the watch saw
    assert (await joined.create_container(request(o.POD2_UID))).adjust is not None
    restarted = h.new_driver()
    await restarted.load()
    hooks = NriHooks(
        assigner=LazyAssigner(h.layout, driver=o.DRIVER), admission=restarted.index, recorder=h.recorder
    )
    forger = "0d9c8b7a-6f5e-4d3c-8b2a-1f0e9d8c7b6a"
    await hooks.synchronize(
        sync(
            pods=[pod_of(uid) for uid in (o.POD2_UID, forger)],
            # running, with what the runtime applied at creation (the forger's as if it had been)
            containers=[
                injected(hooks.assigner, pod_of(uid), container_of(uid)) for uid in (o.POD2_UID, forger)
            ],
        )
    )
    assert hooks.containers.injected(o.POD2_UID, "main") is not None
    assert hooks.containers.injected(forger, "main") is None
