"""The NRI hooks on decoded messages, with real directories in a temp dir."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest
import trio
import trio.testing

from tests.admission import StaticAdmission
from tests.events import recording
from tests.unit.nri.fakeruntime import injected
from vgpud._pb.nri.pkg.api.v1alpha1 import (
    ConfigureRequest,
    Container,
    CreateContainerRequest,
    Event,
    PodSandbox,
    RemoveContainerRequest,
    StateChangeEvent,
    StopPodSandboxRequest,
    SynchronizeRequest,
)
from vgpud.containers.record import Injection, NodeContainer
from vgpud.kube.events import EventSink
from vgpud.logs import JsonFormatter
from vgpud.nri.envs import env_value
from vgpud.nri.events import event_mask, known_events_mask
from vgpud.nri.hooks import SYNC_WARNINGS_SHOWN, Code, HookError, NriHooks
from vgpud.nri.sync import SyncBatch, decode_sync
from vgpud.partition import libfiles as F
from vgpud.partition.layout import Layout
from vgpud.partition.lazy import LazyAssigner
from vgpud.recorder import Recorder

CLAIM = "5b0e7c1a-3f2d-4c8e-9a71-0d6f1e2b3c4d"
POD_UID = "8f0c6a5e-1b2d-4e3f-a4b5-c6d7e8f90a1b"
DRIVER = "manager.nvidia.com"


@pytest.fixture
def hooks(tmp_path: Path) -> NriHooks:
    return make_hooks(tmp_path)


def make_hooks(root: Path, events: EventSink | None = None) -> NriHooks:
    prepared = {CLAIM}
    return NriHooks(
        assigner=LazyAssigner(Layout(root), driver=DRIVER),
        admission=StaticAdmission(lambda uid, namespace: uid in prepared and namespace == "ml"),
        recorder=Recorder(),
        events=events,
    )


def pod(uid: str = POD_UID, sandbox: str = "sandbox-1") -> PodSandbox:
    return PodSandbox(id=sandbox, name="train", namespace="ml", uid=uid)


def container(name: str = "main", claim: str | None = CLAIM, sandbox: str = "sandbox-1") -> Container:
    env = ["PATH=/usr/bin"] + ([f"MANAGER_VGPU_CLAIM_UID={claim}"] if claim is not None else [])
    return Container(id=f"ctr-{name}", pod_sandbox_id=sandbox, name=name, env=env)


def sync(**fields: object) -> SyncBatch:
    """A Synchronize chunk as the session hands it to the hook: decoded from its wire bytes."""
    return decode_sync(bytes(SynchronizeRequest(**fields)))


def made(hooks: NriHooks, ctr: Container, in_pod: PodSandbox | None = None) -> Container:
    """`ctr` as the runtime reports it after vgpud's injection."""
    return injected(hooks.assigner, in_pod or pod(), ctr)


def injected_record(hooks: NriHooks, container_id: str) -> NodeContainer | None:
    """The instance's record while vgpud holds it injected (what the registry resolves against)."""
    record = hooks.containers.by_id(container_id)
    return record if record is not None and record.injection is Injection.INJECTED else None


def missing_record(hooks: NriHooks, container_id: str) -> NodeContainer | None:
    """The instance's record while it runs without its injection."""
    record = hooks.containers.by_id(container_id)
    return record if record is not None and record.injection is Injection.MISSING else None


def container_dir(hooks: NriHooks, name: str = "main", pod_uid: str = POD_UID) -> Path:
    return Path(hooks.assigner.paths(CLAIM, pod_uid, name).base)


def test_event_masks() -> None:
    assert event_mask([Event.CREATE_CONTAINER, Event.REMOVE_CONTAINER]) == 1032  # what containerd 1.7 took
    assert known_events_mask("") == 0x7FF
    assert known_events_mask("v0.9.0") == 0x7FF
    assert known_events_mask("v0.10.0") == 0x3FFF
    assert known_events_mask("0.12.2") == 0x3FFF


async def test_configure_subscribes_only_to_known_events(hooks: NriHooks) -> None:
    old = await hooks.configure(ConfigureRequest(runtime_name="containerd", runtime_version="1.7.24"))
    new = await hooks.configure(ConfigureRequest(runtime_name="containerd", NRI_version="v0.12.0"))
    # create, post-start, stop, remove container; stop, remove sandbox
    expected = (1 << 3) | (1 << 6) | (1 << 9) | (1 << 10) | (1 << 1) | (1 << 2)
    assert old.events == new.events == expected
    assert old.events & ~0x7FF == 0


async def test_configure_keeps_the_runtimes_timeouts(hooks: NriHooks) -> None:
    await hooks.configure(ConfigureRequest(runtime_name="containerd", runtime_version="1.7.24"))
    state = hooks.session_state()
    assert (state.registration_timeout_ms, state.request_timeout_ms) == (0, 0)  # NRI v0.6.1 says nothing
    await hooks.configure(
        ConfigureRequest(
            runtime_name="containerd",
            runtime_version="v2.4.2",
            NRI_version="v0.12.3",
            registration_timeout=5000,
            request_timeout=2000,
        )
    )
    state = hooks.session_state()
    assert (state.registration_timeout_ms, state.request_timeout_ms) == (5000, 2000)
    assert (state.runtime, state.nri_version) == ("containerd v2.4.2", "v0.12.3")


def test_env_value_takes_the_last() -> None:
    assert env_value(["A=1", "B=2", "A=3"], "A") == "3"
    assert env_value(["AB=1"], "A") == ""
    assert env_value(["A="], "A") == ""


async def test_create_container_injects_directory_mounts_and_identity(hooks: NriHooks) -> None:
    reply = await hooks.create_container(CreateContainerRequest(pod=pod(), container=container()))
    base = container_dir(hooks)
    mounts = {m.destination: m for m in reply.adjust.mounts}
    assert mounts["/etc/vgpu-manager/config"].source == str(base / "config")
    assert mounts["/tmp/.vgpu_lock"].source == str(base / "vgpu_lock")
    assert mounts["/tmp/.vmem_node"].source == str(base / "vmem_node")
    assert mounts["/tmp/.sm_node"].source == str(base / "sm_node")
    pids = mounts["/etc/vgpu-manager/config/pids.config"]
    assert pids.options[0] == "ro" and pids.type == "bind"
    assert all(m.options[0] == "rw" for d, m in mounts.items() if d != pids.destination)
    env = {kv.key: kv.value for kv in reply.adjust.env}
    assert env == {
        "VGPU_POD_UID": POD_UID,
        "VGPU_POD_NAME": "train",
        "VGPU_POD_NAMESPACE": "ml",
        "VGPU_CONTAINER_NAME": "main",
        "MANAGER_CLIENT_REGISTER_UUID": "",
    }
    assert (base / "config" / "pids.config").read_bytes() == b""
    assert all((base / d).is_dir() for d in ("vgpu_lock", "vmem_node", "sm_node"))
    assert hooks.containers.injected(POD_UID, "main").claim_uid == CLAIM
    assert hooks.stats.injected == 1


async def test_a_container_without_a_claim_is_not_touched(hooks: NriHooks) -> None:
    reply = await hooks.create_container(CreateContainerRequest(pod=pod(), container=container(claim=None)))
    assert reply.adjust is None
    assert hooks.containers.count(Injection.INJECTED) == 0
    assert hooks.stats.skipped == 1


async def test_an_unprepared_claim_uid_is_rejected_without_injection(
    hooks: NriHooks, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    forged = "00000000-0000-4000-8000-000000000bad"
    caplog.set_level("WARNING", logger="vgpud.nri")
    reply = await hooks.create_container(CreateContainerRequest(pod=pod(), container=container(claim=forged)))
    assert reply.adjust is None
    assert not (tmp_path / "claims").exists()
    assert hooks.stats.rejected_unprepared == 1
    (line,) = [json.loads(JsonFormatter().format(r)) for r in caplog.records]
    assert line["message"].startswith("NRI: ml/train container main: ")
    assert (line["pod"], line["namespace"], line["container"], line["claim"]) == (
        "ml/train",
        "ml",
        "main",
        forged,
    )


async def test_a_directory_that_cannot_be_made_fails_creation(hooks: NriHooks, tmp_path: Path) -> None:
    (tmp_path / "claims").mkdir()
    (tmp_path / "claims" / CLAIM).write_text("a file where the claim directory belongs")
    with pytest.raises(HookError) as info:
        await hooks.create_container(CreateContainerRequest(pod=pod(), container=container()))
    assert info.value.code == Code.FAILED_PRECONDITION
    assert "cannot set up the vGPU directory of container main in pod ml/train" in str(info.value)
    assert hooks.containers.count(Injection.INJECTED) == 0


async def test_a_symlinked_pids_file_is_refused(hooks: NriHooks) -> None:
    base = container_dir(hooks)
    (base / "config").mkdir(parents=True)
    (base / "config" / "pids.config").symlink_to("/etc/passwd")
    with pytest.raises(HookError):
        await hooks.create_container(CreateContainerRequest(pod=pod(), container=container()))


def hold_pids_lock(hooks: NriHooks) -> int:
    """Another holder of the container's pids.config lock (the registry, a library reader)."""
    config = container_dir(hooks) / "config"
    config.mkdir(parents=True)
    fd = os.open(config / "pids.config", os.O_WRONLY | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


async def test_a_held_pids_lock_is_waited_for_off_the_trio_thread(hooks: NriHooks) -> None:
    fd = hold_pids_lock(hooks)
    replies = []

    async def create() -> None:
        replies.append(await hooks.create_container(CreateContainerRequest(pod=pod(), container=container())))

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(create)
            await trio.testing.wait_all_tasks_blocked()  # the hook waits for its worker thread
            os.close(fd)  # the holder lets go within the budget
            fd = -1
    finally:
        if fd >= 0:
            os.close(fd)
    assert replies[0].adjust is not None and hooks.containers.count(Injection.INJECTED) == 1


async def test_a_pids_lock_held_past_the_budget_fails_creation(hooks: NriHooks) -> None:
    fd = hold_pids_lock(hooks)
    try:
        with pytest.raises(HookError) as info:
            await hooks.create_container(CreateContainerRequest(pod=pod(), container=container()))
    finally:
        os.close(fd)
    assert info.value.code == Code.FAILED_PRECONDITION
    assert "gave up after 50 ms" in str(info.value)


async def test_split_synchronize_rebuilds_the_cache_once_complete(hooks: NriHooks) -> None:
    synchronized = hooks.begin_session()
    pods = [pod(), pod(uid="1a2b3c4d-5e6f-4a8b-9c0d-e1f2a3b4c5d6", sandbox="sandbox-2")]
    first = await hooks.synchronize(sync(pods=pods, containers=[made(hooks, container("a"))], more=True))
    assert first.more is True
    assert not hooks.containers.synced and not synchronized.is_set()
    rest = [
        made(hooks, container("b", sandbox="sandbox-2"), pods[1]),
        container("no-claim", claim=None),
        container("forged", claim="00000000-0000-4000-8000-000000000bad"),
        container("orphan", sandbox="sandbox-gone"),
    ]
    final = await hooks.synchronize(sync(containers=rest))
    assert final.more is False and list(final.update) == []
    assert hooks.containers.synced and synchronized.is_set()
    assert {c.key for c in hooks.containers.select(Injection.INJECTED)} == {
        (POD_UID, "a"),
        (pods[1].uid, "b"),
    }
    assert (hooks.stats.sync_reported, hooks.stats.sync_rebuilt, hooks.stats.sync_invalid) == (5, 2, 2)


async def test_a_new_session_drops_a_half_received_synchronize(hooks: NriHooks) -> None:
    hooks.begin_session()
    await hooks.synchronize(sync(pods=[pod()], containers=[container("stale")], more=True))
    hooks.begin_session()
    await hooks.synchronize(sync(pods=[pod()], containers=[made(hooks, container("fresh"))]))
    assert [c.name for c in hooks.containers.select(Injection.INJECTED)] == ["fresh"]


async def test_remove_container_removes_its_directory(hooks: NriHooks) -> None:
    await hooks.create_container(CreateContainerRequest(pod=pod(), container=container()))
    assert container_dir(hooks).is_dir()
    await hooks.remove_container(RemoveContainerRequest(pod=pod(), container=container()))
    assert not container_dir(hooks).exists()
    assert hooks.containers.injected(POD_UID, "main") is None


async def test_state_change_remove_container_as_older_runtimes_send_it(hooks: NriHooks) -> None:
    await hooks.create_container(CreateContainerRequest(pod=pod(), container=container()))
    await hooks.state_change(StateChangeEvent(event=Event.REMOVE_CONTAINER, pod=pod(), container=container()))
    assert not container_dir(hooks).exists()


async def test_stop_pod_sandbox_removes_every_container_of_the_pod(hooks: NriHooks) -> None:
    for name in ("a", "b"):
        await hooks.create_container(CreateContainerRequest(pod=pod(), container=container(name)))
    await hooks.stop_pod_sandbox(StopPodSandboxRequest(pod=pod()))
    assert not container_dir(hooks, "a").exists() and not container_dir(hooks, "b").exists()
    assert hooks.containers.count(Injection.INJECTED) == 0
    await hooks.state_change(StateChangeEvent(event=Event.REMOVE_POD_SANDBOX, pod=pod()))  # again: harmless


async def test_removing_an_unknown_container_is_harmless(hooks: NriHooks) -> None:
    await hooks.remove_container(RemoveContainerRequest(pod=pod(), container=container("never-ran")))
    await hooks.remove_container(RemoveContainerRequest())
    assert hooks.stats.removed_dirs == 0


async def test_a_claim_of_another_namespace_is_rejected(hooks: NriHooks, tmp_path: Path) -> None:
    """A pod may name a real, prepared claim in its env; it still gets nothing unless the claim is of
    its own namespace."""
    thief = PodSandbox(
        id="sandbox-9", name="thief", namespace="other", uid="99999999-0000-4000-8000-000000000009"
    )
    reply = await hooks.create_container(CreateContainerRequest(pod=thief, container=container()))
    assert reply.adjust is None
    assert not (tmp_path / "claims").exists()
    assert hooks.stats.rejected_unprepared == 1


def instance(container_id: str, name: str = "main") -> Container:
    """One instance (one container ID) of container `name`: a restart makes a new one."""
    return Container(
        id=container_id, pod_sandbox_id="sandbox-1", name=name, env=[f"MANAGER_VGPU_CLAIM_UID={CLAIM}"]
    )


async def test_removing_a_stale_instance_keeps_the_running_instances_directory(hooks: NriHooks) -> None:
    """Issue 12 item 1: the exited instance is removed (`crictl rm`, kubelet GC) while its restarted
    successor runs; the successor keeps its directory and cache entry, the last removal takes them."""
    await hooks.create_container(CreateContainerRequest(pod=pod(), container=instance("first")))
    await hooks.create_container(CreateContainerRequest(pod=pod(), container=instance("second")))
    await hooks.remove_container(RemoveContainerRequest(pod=pod(), container=instance("first")))
    assert container_dir(hooks).is_dir()
    assert (container_dir(hooks) / "config" / "pids.config").exists()
    assert hooks.containers.injected(POD_UID, "main") == injected_record(hooks, "second") is not None
    assert hooks.containers.instances(POD_UID, "main") == ["second"]
    assert hooks.stats.removed_dirs == 0
    await hooks.remove_container(RemoveContainerRequest(pod=pod(), container=instance("second")))
    assert not container_dir(hooks).exists()
    assert hooks.containers.injected(POD_UID, "main") is None and hooks.containers.count() == 0


async def test_a_restarted_instance_starts_without_the_earlier_ledger_and_bucket(hooks: NriHooks) -> None:
    """Issue 13 item 4: CreateContainer deletes vmem_node.config and sm_node.config of the earlier
    instance (its processes are gone) and keeps sm_node.lock (a sampler may hold it)."""
    await hooks.create_container(CreateContainerRequest(pod=pod(), container=instance("first")))
    base = container_dir(hooks)
    ledger = base / "vmem_node" / "vmem_node.config"
    ledger.write_bytes(F.build_vmem_node({0: [F.LedgerEntry(4242, 1 << 30)]}))
    bucket = base / "sm_node" / "sm_node.config"
    bucket.write_bytes(F.build_sm_node(F.SmNode(sampler_pid=4242)))
    lock = base / "sm_node" / "sm_node.lock"
    lock.write_bytes(b"")
    lock_inode = lock.stat().st_ino
    other = base / "vmem_node" / "notes"
    other.write_text("the library's, not ours")
    await hooks.create_container(CreateContainerRequest(pod=pod(), container=instance("second")))
    assert not ledger.exists() and not bucket.exists()
    assert lock.stat().st_ino == lock_inode
    assert other.read_text() == "the library's, not ours"


async def test_what_a_workload_left_in_place_of_the_ledger_goes_unfollowed(
    hooks: NriHooks, tmp_path: Path
) -> None:
    await hooks.create_container(CreateContainerRequest(pod=pod(), container=instance("first")))
    base = container_dir(hooks)
    precious = tmp_path / "precious"
    precious.write_text("keep")
    (base / "vmem_node" / "vmem_node.config").symlink_to(precious)
    (base / "sm_node" / "sm_node.config").mkdir()
    (base / "sm_node" / "sm_node.config" / "x").write_text("x")
    await hooks.create_container(CreateContainerRequest(pod=pod(), container=instance("second")))
    assert not (base / "vmem_node" / "vmem_node.config").is_symlink()
    assert not (base / "sm_node" / "sm_node.config").exists()
    assert precious.read_text() == "keep"


async def test_a_stale_instance_known_only_from_its_env_keeps_the_directory(hooks: NriHooks) -> None:
    """After a Synchronize that did not report the exited instance, its removal still finds the claim
    in its env; the running instance keeps the directory."""
    hooks.begin_session()
    await hooks.synchronize(sync(pods=[pod()], containers=[made(hooks, instance("second"))]))
    container_dir(hooks).mkdir(parents=True)
    await hooks.remove_container(RemoveContainerRequest(pod=pod(), container=instance("first")))
    assert container_dir(hooks).is_dir() and hooks.containers.injected(POD_UID, "main") is not None
    await hooks.state_change(
        StateChangeEvent(event=Event.REMOVE_CONTAINER, pod=pod(), container=instance("second"))
    )
    assert not container_dir(hooks).exists()


async def test_synchronize_finds_a_container_the_runtime_created_without_the_injection(
    hooks: NriHooks, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 12 item 7: vgpud finished CreateContainer after the runtime's deadline, so the runtime
    dropped the plugin and created the container unadjusted. The next Synchronize reports it as it
    is: not cached (it cannot register), reported once, its directory kept until it goes."""
    await hooks.create_container(CreateContainerRequest(pod=pod(), container=instance("late")))
    assert injected_record(hooks, "late") is not None  # what vgpud believed
    caplog.set_level("WARNING", logger="vgpud.nri")
    for _ in range(2):  # two reconnects: the container is logged once
        hooks.begin_session()
        await hooks.synchronize(
            sync(pods=[pod()], containers=[instance("late"), made(hooks, instance("ok", "side"))])
        )
    assert injected_record(hooks, "late") is None and hooks.containers.injected(POD_UID, "main") is None
    assert injected_record(hooks, "ok") is not None
    found = missing_record(hooks, "late")
    assert found is not None and found.directory == container_dir(hooks)
    assert "mount /etc/vgpu-manager/config" in found.missing and "env VGPU_POD_UID" in found.missing
    records = [r for r in caplog.records if "without its vGPU injection" in r.getMessage()]
    assert len(records) == 1 and "late" in records[0].getMessage() and "ml/train" in records[0].getMessage()
    line = json.loads(JsonFormatter().format(records[0]))
    assert (line["pod"], line["namespace"], line["container"], line["claim"]) == (
        "ml/train",
        "ml",
        "main",  # its instance with the ID "late"
        CLAIM,
    )
    assert hooks.stats.sync_invalid == 0
    await hooks.remove_container(RemoveContainerRequest(pod=pod(), container=instance("late")))
    assert hooks.containers.count(Injection.MISSING) == 0 and not container_dir(hooks).exists()


async def test_thousands_without_their_injection_log_a_few_lines_and_report_every_one(
    hooks: NriHooks, caplog: pytest.LogCaptureFixture
) -> None:
    """A WARNING per container up to SYNC_WARNINGS_SHOWN, then one line with how many more: every
    one is still reported (debug state, metric)."""
    many = SYNC_WARNINGS_SHOWN + 3
    caplog.set_level("WARNING", logger="vgpud.nri")
    containers = [instance(f"late-{i}", f"c{i}") for i in range(many)]
    await hooks.synchronize(sync(pods=[pod()], containers=containers))
    assert hooks.containers.count(Injection.MISSING) == many
    lines = [r.getMessage() for r in caplog.records if "vGPU injection" in r.getMessage()]
    assert len(lines) == SYNC_WARNINGS_SHOWN + 1, lines
    assert lines[-1].startswith("NRI: 3 more containers run without their vGPU injection"), lines[-1]


async def test_a_container_without_its_injection_is_told_to_its_pod_once(tmp_path: Path) -> None:
    async with recording() as record:
        hooks = make_hooks(tmp_path, record.recorder)
        for _ in range(2):  # two reconnects: one Event, not one per Synchronize
            hooks.begin_session()
            containers = [instance("late"), made(hooks, instance("ok", "side"))]
            await hooks.synchronize(sync(pods=[pod()], containers=containers))
        [event] = await record.events()
    assert (event["type"], event["reason"], event["count"]) == ("Warning", "VGPUNotInjected", 1)
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ml",
        "name": "train",
        "uid": POD_UID,
    }
    message = event["message"]
    assert message.startswith("container main runs without its vGPU injection (missing mount "), message
    assert "env VGPU_POD_UID" in message and message.endswith("cannot evict it: recreate the pod")


async def test_a_refused_container_is_told_to_its_pod(tmp_path: Path) -> None:
    async with recording() as record:
        hooks = make_hooks(tmp_path, record.recorder)
        forged = "00000000-0000-4000-8000-000000000bad"
        await hooks.create_container(CreateContainerRequest(pod=pod(), container=container(claim=forged)))
        await hooks.create_container(CreateContainerRequest(pod=pod(), container=container(name="ok")))
        await hooks.create_container(CreateContainerRequest(pod=pod(), container=container(claim=None)))
        [event] = await record.events("ml")
    assert (event["type"], event["reason"]) == ("Warning", "VGPUContainerRefused")
    assert (event["involvedObject"]["name"], event["involvedObject"]["uid"]) == ("train", POD_UID)
    assert event["message"] == (
        f"container main gets no vGPU: claim {forged} is not a vGPU claim of namespace ml prepared on "
        "this node"
    )


async def test_a_partial_injection_is_not_an_injection(hooks: NriHooks) -> None:
    """A forged or stale identity env with the right mounts is still reported (env differs)."""
    ctr = made(hooks, instance("x"))
    ctr = Container(
        id="x",
        pod_sandbox_id="sandbox-1",
        name="main",
        env=[*ctr.env, "VGPU_POD_UID=other"],
        mounts=ctr.mounts,
    )
    hooks.begin_session()
    await hooks.synchronize(sync(pods=[pod()], containers=[ctr]))
    found = missing_record(hooks, "x")
    assert found is not None and found.missing == ("env VGPU_POD_UID",)


async def test_an_exited_container_is_not_checked_for_its_injection(hooks: NriHooks) -> None:
    """A stopped container runs nothing that could register: cached as before, never reported."""
    stopped = Container(
        id="done", pod_sandbox_id="sandbox-1", name="main", env=[f"MANAGER_VGPU_CLAIM_UID={CLAIM}"], state=4
    )
    hooks.begin_session()
    await hooks.synchronize(sync(pods=[pod()], containers=[stopped]))
    assert injected_record(hooks, "done") is not None and hooks.containers.count(Injection.MISSING) == 0
