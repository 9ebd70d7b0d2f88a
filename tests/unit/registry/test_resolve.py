"""Target resolution and its waiting, in virtual time (every assertion on exact virtual times): woken by
the pod and claim caches' watch events, re-checked on the 40 ms grid for local facts; plus the
request checks and the in-flight limits."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing
from grpclib.const import Status

from tests import objects as o
from tests.draharness import REF, Harness, single_container_claim
from tests.unit.registry.world import NODE, World, claim_uid, injected, running, with_status
from vgpud.kube.informer import claim_informer, pod_informer
from vgpud.partition.assigner import RegisterQuery, ResolveError, register_annotations
from vgpud.partition.eager import EagerAssigner
from vgpud.registry.identity import Caller, identify
from vgpud.registry.request import (
    Admission,
    BadRequest,
    CallerRefused,
    Overloaded,
    ResolveTimeout,
    TargetGone,
    parse_query,
)
from vgpud.registry.resolve import Reads, Resolved, Resolver

PID = 4242


@pytest.fixture
def autojump() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


def caller_in(world: World, uid: str, cid: str, pid: int = PID) -> Caller:
    world.place(pid, uid, cid)
    return identify(world.proc, pid)


async def timed(coro: object) -> tuple[float, object]:
    """(virtual seconds taken, result or the exception raised)."""
    start = trio.current_time()
    try:
        result = await coro  # type: ignore[misc]
    except Exception as err:
        result = err
    return trio.current_time() - start, result


# --------------------------------------------------------------------------------------------------
# Lazy (NRI) mode


async def test_waits_for_the_first_synchronize_then_succeeds_at_the_next_poll(
    tmp_path: Path, autojump: trio.testing.MockClock
) -> None:
    world = World(tmp_path)
    uid, cid, config = world.add_container(1, cached=False)
    caller = caller_in(world, uid, cid)

    async def synchronize() -> None:
        await trio.sleep(0.5)
        world.containers.replace([injected("ctr-1", uid, "main", claim_uid(1), config.parent)])

    async with world.caches(), trio.open_nursery() as nursery:
        nursery.start_soon(synchronize)
        took, result = await timed(
            world.resolver().resolve(RegisterQuery(pod_uid=uid, container="main"), caller)
        )
    assert isinstance(result, Resolved), result
    assert took == pytest.approx(0.52)  # polls at 0, 0.04, ... 0.48: not synced; 0.52: hit
    assert result.pids == (PID,) and Path(result.target.config_dir) == config


class Counting(Resolver):
    """Records when each attempt starts."""

    attempts: list[float]

    async def attempt(self, query: RegisterQuery, caller: Caller, reads: Reads) -> Resolved:
        self.attempts.append(trio.current_time())
        return await super().attempt(query, caller, reads)


def counting(world: World, **kwargs: object) -> Counting:
    resolver = world.resolver(Counting, **kwargs)
    assert isinstance(resolver, Counting)
    resolver.attempts = []
    return resolver


async def test_a_container_not_running_yet_is_woken_by_the_pod_update(
    tmp_path: Path, autojump: trio.testing.MockClock
) -> None:
    """No polling: one attempt at once, the next when the watch delivers the pod update; and no API
    request from the registration at all (the caches only list and watch)."""
    world = World(tmp_path)
    uid, cid, _ = world.add_container(1, running=False)
    caller = caller_in(world, uid, cid)

    async def kubelet_relists() -> None:
        await trio.sleep(1.0)
        pod = await world.kube.get_pod(o.NAMESPACE, "pod-1")
        world.kube.add_pod(with_status(pod, {"main": cid}))

    resolver = counting(world)
    async with world.caches(), trio.open_nursery() as nursery:
        world.kube.calls.clear()
        nursery.start_soon(kubelet_relists)
        took, result = await timed(resolver.resolve(RegisterQuery(pod_uid=uid, container="main"), caller))
    assert isinstance(result, Resolved), result
    assert took == pytest.approx(1.0)
    assert resolver.attempts == pytest.approx([0.0, 1.0])
    assert world.kube.calls == {"get_pod": 1}  # the test's own read, as the kubelet


async def test_a_registration_before_the_caches_listed_waits_for_them(
    tmp_path: Path, autojump: trio.testing.MockClock
) -> None:
    world = World(tmp_path)
    uid, cid, config = world.add_container(1)
    caller = caller_in(world, uid, cid)
    resolver = counting(world)

    async def start_caches(task_status: trio.TaskStatus[None]) -> None:
        task_status.started()
        await trio.sleep(0.3)  # the API server answers late
        async with world.caches():
            await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        await nursery.start(start_caches)
        took, result = await timed(resolver.resolve(RegisterQuery(pod_uid=uid, container="main"), caller))
        nursery.cancel_scope.cancel()
    assert isinstance(result, Resolved), result
    assert took == pytest.approx(0.3) and resolver.attempts == pytest.approx([0.3])  # no attempt before
    assert Path(result.target.config_dir) == config


async def test_caches_that_never_list_end_in_a_timeout_that_says_so(
    tmp_path: Path, autojump: trio.testing.MockClock
) -> None:
    world = World(tmp_path)
    uid, cid, _ = world.add_container(1)
    resolver = counting(world, timeout=5.0)
    took, result = await timed(
        resolver.resolve(RegisterQuery(pod_uid=uid, container="main"), caller_in(world, uid, cid))
    )
    assert took == 5.0 and resolver.attempts == []
    assert isinstance(result, ResolveTimeout) and result.status is Status.DEADLINE_EXCEEDED
    assert "caches have not listed" in str(result)


async def test_a_pod_the_cache_has_not_seen_yet_is_resolved_when_it_arrives(
    tmp_path: Path, autojump: trio.testing.MockClock
) -> None:
    """The claim already reserves the pod, but the pod's watch event comes later."""
    world = World(tmp_path)
    uid, cid, _ = world.add_container(1)
    pod = await world.kube.get_pod(o.NAMESPACE, "pod-1")
    world.kube.remove_pod(o.NAMESPACE, "pod-1")
    caller = caller_in(world, uid, cid)
    resolver = counting(world)

    async def bind() -> None:
        await trio.sleep(2.5)
        world.kube.add_pod(pod)

    async with world.caches(), trio.open_nursery() as nursery:
        nursery.start_soon(bind)
        took, result = await timed(resolver.resolve(RegisterQuery(pod_uid=uid, container="main"), caller))
    assert isinstance(result, Resolved), result
    assert took == pytest.approx(2.5) and resolver.attempts == pytest.approx([0.0, 2.5])


async def test_not_found_ends_the_wait_at_once(tmp_path: Path, autojump: trio.testing.MockClock) -> None:
    world = World(tmp_path)
    uid, cid, _ = world.add_container(1)
    caller = caller_in(world, uid, cid)
    async with world.caches():
        took, result = await timed(world.resolver().resolve(RegisterQuery(register_uuid=o.CLAIM_UID), caller))
        assert took == 0 and isinstance(result, TargetGone) and result.status is Status.NOT_FOUND
        assert "NRI mode mints no register UUIDs" in str(result)
        # the pod is gone from the claim (deleted): its target can never exist again
        claim = await world.kube.get_resource_claim(o.NAMESPACE, "claim-1")
        claim["status"]["reservedFor"] = []
        world.kube.add_claim(claim)
        await trio.testing.wait_all_tasks_blocked()  # the watch delivered it
        took, result = await timed(
            world.resolver().resolve(RegisterQuery(pod_uid=uid, container="main"), caller)
        )
    assert took == 0 and isinstance(result, TargetGone), result
    assert "no longer uses claim" in str(result)


async def test_gives_up_after_60_seconds(tmp_path: Path, autojump: trio.testing.MockClock) -> None:
    world = World(tmp_path)
    uid, cid, _ = world.add_container(1, cached=False)  # and no Synchronize ever comes
    caller = caller_in(world, uid, cid)
    async with world.caches():
        took, result = await timed(
            world.resolver().resolve(RegisterQuery(pod_uid=uid, container="main"), caller)
        )
    assert took == 60.0
    assert isinstance(result, ResolveTimeout) and result.status is Status.DEADLINE_EXCEEDED
    assert "last attempt: the NRI cache is not synchronized yet" in str(result)


async def test_a_caller_of_another_pod_is_refused_at_once(
    tmp_path: Path, autojump: trio.testing.MockClock
) -> None:
    world = World(tmp_path)
    uid, _, _ = world.add_container(1)
    other_uid, other_cid, _ = world.add_container(2)
    intruder = caller_in(world, other_uid, other_cid)
    async with world.caches():
        took, result = await timed(
            world.resolver().resolve(RegisterQuery(pod_uid=uid, container="main"), intruder)
        )
    assert took == 0 and isinstance(result, CallerRefused), result
    assert "belongs to another pod" in str(result)


async def test_another_container_of_the_pod_is_refused_at_the_deadline(
    tmp_path: Path, autojump: trio.testing.MockClock
) -> None:
    """The pod status may lag a restart, so a container-ID mismatch is retried; at the deadline the
    answer is PERMISSION_DENIED, not a timeout."""
    world = World(tmp_path)
    uid, _, _ = world.add_container(1)
    sidecar = caller_in(world, uid, "f" * 64)
    resolver = counting(world)
    async with world.caches():
        took, result = await timed(resolver.resolve(RegisterQuery(pod_uid=uid, container="main"), sidecar))
    assert took == 60.0 and resolver.attempts == [0.0]  # only a pod update could change the answer
    assert isinstance(result, ResolveTimeout) and result.status is Status.PERMISSION_DENIED
    assert "is not container main" in str(result)


async def test_a_caller_outside_any_pod_is_refused(tmp_path: Path) -> None:
    world = World(tmp_path)
    uid, _, _ = world.add_container(1)
    world.place_outside(PID)
    with pytest.raises(CallerRefused, match="not a process of any pod"):
        await world.resolver().resolve(
            RegisterQuery(pod_uid=uid, container="main"), identify(world.proc, PID)
        )


async def test_after_synchronize_a_miss_is_the_device_plugin_directory(
    tmp_path: Path, autojump: trio.testing.MockClock
) -> None:
    """A pod vgpud did not inject (co-installed device plugin): only the kernel's facts count, and
    the directory must already exist; vgpud never creates it."""
    world = World(tmp_path)
    world.containers.replace([])
    uid, cid = "0badc0de-1111-4222-8333-444455556666", "e" * 64
    caller = caller_in(world, uid, cid)
    config = Path(world.layout.device_plugin_config_dir(uid, "main"))

    async def device_plugin_allocates() -> None:
        await trio.sleep(0.19)
        config.mkdir(parents=True)

    async with world.caches(), trio.open_nursery() as nursery:
        nursery.start_soon(device_plugin_allocates)
        took, result = await timed(
            world.resolver().resolve(RegisterQuery(pod_uid=uid, container="main"), caller)
        )
    assert isinstance(result, Resolved), result
    assert took == pytest.approx(0.2) and Path(result.target.config_dir) == config
    assert result.pids == (PID,) and result.target.claim_uid is None


# --------------------------------------------------------------------------------------------------
# Eager mode (client registration): the checkpoint is the UUID index


async def test_eager_register_uuid_resolves_through_the_checkpoint(tmp_path: Path) -> None:
    h = Harness(tmp_path, client_mode=True)
    claim, pod = single_container_claim()
    h.kube.add_claim(claim)
    cid = "c" * 64
    h.kube.add_pod(with_status(pod, {"main": cid}))
    assert not (await h.driver.prepare([REF]))[o.CLAIM_UID].error
    pods, claims = pod_informer(h.kube, NODE), claim_informer(h.kube)
    annotations = (await h.kube.get_resource_claim(o.NAMESPACE, "gpu-claim"))["metadata"]["annotations"]
    ((register_uuid, key),) = register_annotations(annotations, o.DRIVER).items()
    assert h.driver.index.claim_for_register_uuid(register_uuid) == REF
    assert h.driver.index.prepared_claim(o.CLAIM_UID) == REF
    world = World(tmp_path)
    caller = caller_in(world, o.POD1_UID, cid)
    resolver = Resolver(
        assigner=EagerAssigner(h.layout, driver=o.DRIVER, client_mode=True),
        pods=pods,
        claim_objects=claims,
        claims=h.driver.index,
        containers=None,
        cgroup_root=world.cgroup,
        driver_name=o.DRIVER,
    )
    async with running(pods, claims):
        await eager_resolutions(h, resolver, caller, register_uuid, key)


async def eager_resolutions(
    h: Harness, resolver: Resolver, caller: Caller, register_uuid: str, key: str
) -> None:
    resolved = await resolver.resolve(RegisterQuery(register_uuid=register_uuid), caller)
    assert resolved.target.partition_key == key and resolved.target.claim_uid == o.CLAIM_UID
    assert Path(resolved.target.config_dir) == h.claim_dir() / key / "config"
    assert resolved.pids == (PID,)

    # a UUID this node never minted: NOT_FOUND at once ...
    unknown = "00000000-0000-4000-8000-000000000000"
    with pytest.raises(TargetGone, match="no claim carries register UUID"):
        await resolver.resolve(RegisterQuery(register_uuid=unknown), caller)
    # ... unless the request also names the pod and container: then the pod-UID path decides
    fallback = Path(h.layout.device_plugin_config_dir(o.POD1_UID, "main"))
    fallback.mkdir(parents=True)
    resolved = await resolver.resolve(RegisterQuery(unknown, o.POD1_UID, "main"), caller)
    assert Path(resolved.target.config_dir) == fallback and resolved.target.claim_uid is None

    # Unprepare drops the UUID from the index
    await h.driver.unprepare([REF])
    assert h.driver.index.claim_for_register_uuid(register_uuid) is None
    with pytest.raises(TargetGone):
        await resolver.resolve(RegisterQuery(register_uuid=register_uuid), caller)


# --------------------------------------------------------------------------------------------------
# Requests and limits


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (("", "", ""), "needs register_uuid, or pod_uid and container_name"),
        ((o.POD1_UID, "", ""), "come together"),
        (("", "main", ""), "come together"),
        (("", "", "not-a-uuid"), "not a lower-case UUID"),
        (("../etc", "main", ""), "not a pod UID"),
        (("x" * 40, "main", ""), "not a pod UID"),
        ((o.POD1_UID.upper(), "main", ""), "not a pod UID"),
        ((o.POD1_UID, "Main_Container", ""), "not a DNS label"),
    ],
)
def test_bad_requests(fields: tuple[str, str, str], message: str) -> None:
    with pytest.raises(BadRequest, match=message) as info:
        parse_query(*fields)
    assert info.value.status is Status.INVALID_ARGUMENT


def test_good_requests() -> None:
    assert parse_query(o.POD1_UID, "main", "") == RegisterQuery(pod_uid=o.POD1_UID, container="main")
    assert parse_query("c" * 32, "main", "").pod_uid == "c" * 32  # a static pod's UID
    assert parse_query("", "", o.CLAIM_UID) == RegisterQuery(register_uuid=o.CLAIM_UID)


def test_admission_limits_per_caller_and_in_total() -> None:
    admission = Admission(total=4, per_caller=2)
    with admission.slot("a"), admission.slot("a"):
        with pytest.raises(Overloaded, match="2 register calls of a in flight"), admission.slot("a"):
            pass
        with admission.slot("b"), admission.slot("c"):
            assert admission.in_flight == 4
            with pytest.raises(Overloaded, match="the node's limit"), admission.slot("d"):
                pass
        with admission.slot("d"):  # one of the four is free again
            pass
    assert admission.in_flight == 0 and not admission._counts
    with admission.slot("a"), admission.slot("a"):  # released slots are usable again
        pass


async def test_a_slow_attempt_skips_poll_points_instead_of_running_back_to_back(
    tmp_path: Path, autojump: trio.testing.MockClock
) -> None:
    """Attempts stay on the 40 ms grid: one that takes 100 ms is followed by the next grid point
    (0.12), not by catch-up attempts that would hammer the API server."""
    world = World(tmp_path)
    uid, cid, _ = world.add_container(1)
    started: list[float] = []

    class Slow(Resolver):
        async def attempt(self, query: RegisterQuery, caller: Caller, reads: Reads) -> Resolved:
            started.append(trio.current_time())
            await trio.sleep(0.1)
            raise ResolveError("the API server is slow")

    slow = world.resolver(Slow, timeout=0.5)
    async with world.caches():
        with pytest.raises(ResolveTimeout, match="the API server is slow"):
            await slow.resolve(RegisterQuery(pod_uid=uid, container="main"), caller_in(world, uid, cid))
    assert started == pytest.approx([0.0, 0.12, 0.24, 0.36, 0.48])
