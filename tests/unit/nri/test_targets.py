"""Every container in the node's container store (`NriHooks.containers`: the hot-plug's targets, issue
18): from Synchronize and the lifecycle hooks, with the pid, cgroups path and device rules the runtime
reported, and the `on_container_gone` listeners told once per instance."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import betterproto2
import pytest

from tests.unit.nri.test_hooks import CLAIM, POD_UID, container, hooks, pod  # noqa: F401 (fixture)
from vgpud._pb import nri_api_pb2
from vgpud._pb.nri.pkg.api.v1alpha1 import (
    Container,
    ContainerState,
    CreateContainerRequest,
    Event,
    LinuxContainer,
    LinuxDeviceCgroup,
    LinuxResources,
    OptionalInt64,
    PodSandbox,
    PostStartContainerRequest,
    RemoveContainerRequest,
    RemovePodSandboxRequest,
    StateChangeEvent,
    StopContainerRequest,
    StopPodSandboxRequest,
    SynchronizeRequest,
)
from vgpud.containers.linux import ContainerLinux, device_rules
from vgpud.containers.record import Injection, NodeContainer
from vgpud.containers.store import ContainerStore
from vgpud.containers.values import DeviceRule
from vgpud.hotplug.service import TargetLookup
from vgpud.nri.hooks import NriHooks
from vgpud.nri.methods import plugin_methods

CGROUP = "kubepods-besteffort-pod8f0c.slice:cri-containerd:ctr-main"
#: containerd's defaults: deny everything, then a few; one rule with any minor
RUNTIME_RULES = (
    DeviceRule(False, "a", None, None, "rwm"),
    DeviceRule(True, "c", 1, 3, "rwm"),
    DeviceRule(True, "c", 136, None, "rwm"),
)


def linux(cgroup: str = CGROUP) -> LinuxContainer:
    devices = [
        LinuxDeviceCgroup(
            allow=r.allow,
            type=r.type,
            major=None if r.major is None else OptionalInt64(value=r.major),
            minor=None if r.minor is None else OptionalInt64(value=r.minor),
            access=r.access,
        )
        for r in RUNTIME_RULES
    ]
    return LinuxContainer(cgroups_path=cgroup, resources=LinuxResources(devices=devices))


def ctr(name: str = "main", claim: str | None = None, **fields: Any) -> Container:
    made = container(name, claim=claim)
    made.linux = linux()
    for key, value in fields.items():
        setattr(made, key, value)
    return made


async def call(hooks: NriHooks, method: str, message: betterproto2.Message) -> Any:  # noqa: F811
    """As the session does: the request's wire bytes through the method's decoder, then its handler."""
    decode, handler, _ = plugin_methods(hooks)[method]
    return await handler(decode(bytes(message)))


def listen(hooks: NriHooks) -> list[str]:  # noqa: F811
    heard: list[str] = []

    async def listener(container_id: str) -> None:
        heard.append(container_id)

    hooks.on_container_gone.append(listener)
    return heard


def test_the_container_store_is_a_target_lookup() -> None:
    targets = ContainerStore()
    lookup: TargetLookup = targets
    assert not lookup.synced and lookup.newest(POD_UID, "main") is None
    old = NodeContainer("old", POD_UID, "main", "ml", "train", False, 0, ContainerLinux.of())
    new = old._replace(container_id="new", running=True, pid=42)
    targets.replace([old, new])
    assert targets.synced
    assert targets.newest(POD_UID, "main") == new
    assert targets.by_id("old") == old and targets.by_id("nope") is None
    assert targets.running_ids() == ["new"]


async def test_synchronize_keeps_every_container_with_its_runtime_facts(hooks: NriHooks) -> None:  # noqa: F811
    other = PodSandbox(
        id="sandbox-2", name="web", namespace="default", uid="0a1b2c3d-0000-4000-8000-000000000002"
    )
    containers = [
        ctr("main", claim=CLAIM, state=ContainerState.CONTAINER_RUNNING, pid=4242),
        ctr("plain", state=ContainerState.CONTAINER_PAUSED, pid=77),
        ctr("exited", state=ContainerState.CONTAINER_STOPPED),
        Container(id="bare", pod_sandbox_id="sandbox-2", name="bare", state=ContainerState.CONTAINER_CREATED),
        Container(id="orphan", pod_sandbox_id="sandbox-gone", name="orphan"),  # no pod: no UID to index
    ]
    decode, handler, _ = plugin_methods(hooks)["Synchronize"]
    await handler(decode(bytes(SynchronizeRequest(pods=[pod(), other], containers=containers))))
    targets = hooks.containers
    assert targets.synced and len(targets) == 4
    main = targets.by_id("ctr-main")
    assert main is not None and main.injection is Injection.MISSING  # the harness injects nothing
    assert (
        main[:8]
        == NodeContainer(
            "ctr-main", POD_UID, "main", "ml", "train", True, 4242, ContainerLinux.of(CGROUP, RUNTIME_RULES)
        )[:8]
    )
    main = targets.by_id("ctr-main")
    assert main.cgroups_path == CGROUP and main.device_rules == RUNTIME_RULES
    assert targets.by_id("ctr-plain").running and targets.by_id("ctr-plain").pid == 77  # paused: alive
    assert not targets.by_id("ctr-exited").running
    assert targets.by_id("bare") == NodeContainer(
        "bare", other.uid, "bare", "default", "web", False, 0, ContainerLinux.of()
    )
    assert targets.newest(other.uid, "bare") == targets.by_id("bare")


async def test_split_synchronize_collects_every_chunk(hooks: NriHooks) -> None:  # noqa: F811
    decode, handler, _ = plugin_methods(hooks)["Synchronize"]
    first = SynchronizeRequest(pods=[pod()], containers=[ctr("a")], more=True)
    await handler(decode(bytes(first)))
    assert not hooks.containers.synced
    await handler(decode(bytes(SynchronizeRequest(containers=[ctr("b")]))))
    assert hooks.containers.synced and hooks.containers.by_id("ctr-a") and hooks.containers.by_id("ctr-b")


async def test_the_lifecycle_of_one_container(hooks: NriHooks) -> None:  # noqa: F811
    heard = listen(hooks)
    plain = ctr("plain")
    await call(hooks, "CreateContainer", CreateContainerRequest(pod=pod(), container=plain))
    created = hooks.containers.by_id("ctr-plain")
    assert created == NodeContainer(
        "ctr-plain", POD_UID, "plain", "ml", "train", False, 0, ContainerLinux.of(CGROUP, RUNTIME_RULES)
    )
    assert hooks.containers.newest(POD_UID, "plain") == created

    started = ctr("plain", pid=31337, state=ContainerState.CONTAINER_RUNNING)
    await call(hooks, "PostStartContainer", PostStartContainerRequest(pod=pod(), container=started))
    assert hooks.containers.by_id("ctr-plain") == created._replace(running=True, pid=31337)
    assert heard == []

    stopped = ctr("plain", pid=31337, state=ContainerState.CONTAINER_STOPPED)
    await call(hooks, "StopContainer", StopContainerRequest(pod=pod(), container=stopped))
    assert hooks.containers.by_id("ctr-plain") == created  # kept until removed, without a process
    assert heard == ["ctr-plain"]

    await call(hooks, "RemoveContainer", RemoveContainerRequest(pod=pod(), container=stopped))
    assert hooks.containers.by_id("ctr-plain") is None
    assert heard == ["ctr-plain"]  # once per instance: it was told at the stop


async def test_a_removal_without_a_stop_tells_the_listeners(hooks: NriHooks) -> None:  # noqa: F811
    heard = listen(hooks)
    running = ctr("x", pid=5, state=ContainerState.CONTAINER_RUNNING)
    await call(hooks, "PostStartContainer", PostStartContainerRequest(pod=pod(), container=running))
    await call(hooks, "RemoveContainer", RemoveContainerRequest(pod=pod(), container=running))
    assert heard == ["ctr-x"] and len(hooks.containers) == 0


async def test_state_change_events_of_older_runtimes(hooks: NriHooks) -> None:  # noqa: F811
    """NRI v0.6.1 delivers PostStartContainer and RemoveContainer as StateChange events."""
    heard = listen(hooks)
    started = ctr("old", pid=99, state=ContainerState.CONTAINER_RUNNING)
    await call(
        hooks, "StateChange", StateChangeEvent(event=Event.POST_START_CONTAINER, pod=pod(), container=started)
    )
    assert hooks.containers.by_id("ctr-old").pid == 99 and hooks.containers.by_id("ctr-old").running
    await call(
        hooks, "StateChange", StateChangeEvent(event=Event.REMOVE_CONTAINER, pod=pod(), container=started)
    )
    assert hooks.containers.by_id("ctr-old") is None and heard == ["ctr-old"]


@pytest.mark.parametrize(
    ("method", "request_type"),
    [("StopPodSandbox", StopPodSandboxRequest), ("RemovePodSandbox", RemovePodSandboxRequest)],
)
async def test_pod_sandbox_events_drop_every_container_of_the_pod(
    hooks: NriHooks,  # noqa: F811
    method: str,
    request_type: type[betterproto2.Message],
) -> None:
    heard = listen(hooks)
    other = PodSandbox(id="sandbox-2", name="web", namespace="ml", uid="0a1b2c3d-0000-4000-8000-000000000002")
    for name, in_pod in (("a", pod()), ("b", pod()), ("c", other)):
        started = ctr(name, pid=1, state=ContainerState.CONTAINER_RUNNING)
        started.pod_sandbox_id = in_pod.id
        await call(hooks, "PostStartContainer", PostStartContainerRequest(pod=in_pod, container=started))
    await call(hooks, "CreateContainer", CreateContainerRequest(pod=pod(), container=ctr("never-started")))
    await call(hooks, method, request_type(pod=pod()))
    assert sorted(heard) == ["ctr-a", "ctr-b"]  # not the one that never ran
    assert len(hooks.containers) == 1 and hooks.containers.by_id("ctr-c") is not None


async def test_a_failing_listener_fails_neither_the_hook_nor_the_others(
    hooks: NriHooks,  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(container_id: str) -> None:
        raise RuntimeError("revoke failed")

    hooks.on_container_gone.append(broken)
    heard = listen(hooks)
    running = ctr("x", pid=5, state=ContainerState.CONTAINER_RUNNING)
    await call(hooks, "PostStartContainer", PostStartContainerRequest(pod=pod(), container=running))
    await call(hooks, "StopContainer", StopContainerRequest(pod=pod(), container=running))
    assert heard == ["ctr-x"]
    assert (
        "a listener for the end of container ctr-x failed" in caplog.text and "revoke failed" in caplog.text
    )


async def test_a_create_that_fails_leaves_no_target(hooks: NriHooks) -> None:  # noqa: F811
    root = Path(hooks.assigner.layout.root)
    (root / "claims").mkdir(parents=True)
    (root / "claims" / CLAIM).write_text("not a directory")  # its directory cannot be made
    with pytest.raises(Exception, match="cannot set up"):
        await call(hooks, "CreateContainer", CreateContainerRequest(pod=pod(), container=ctr(claim=CLAIM)))
    assert hooks.containers.by_id("ctr-main") is None


async def test_a_resync_tells_of_the_containers_that_ended_while_away(hooks: NriHooks) -> None:  # noqa: F811
    heard = listen(hooks)
    decode, handler, _ = plugin_methods(hooks)["Synchronize"]
    running = [ctr(n, pid=10, state=ContainerState.CONTAINER_RUNNING) for n in ("stays", "stops", "goes")]
    await handler(decode(bytes(SynchronizeRequest(pods=[pod()], containers=running))))
    assert heard == []  # the first Synchronize: nothing known before it
    hooks.begin_session()
    later = [running[0], ctr("stops", state=ContainerState.CONTAINER_STOPPED)]
    await handler(decode(bytes(SynchronizeRequest(pods=[pod()], containers=later))))
    assert sorted(heard) == ["ctr-goes", "ctr-stops"]
    assert hooks.containers.by_id("ctr-goes") is None and not hooks.containers.by_id("ctr-stops").running


def test_an_unset_device_type_is_every_device() -> None:
    """containerd's `deny all` rule leaves the type unset (the OCI spec's default: `a`); upb and
    betterproto2 messages give the same rules."""
    rule = LinuxDeviceCgroup(allow=False, access="rwm")
    assert device_rules([rule]) == (DeviceRule(False, "a", None, None, "rwm"),)
    upb = nri_api_pb2.LinuxDeviceCgroup.FromString(bytes(rule))  # type: ignore[attr-defined]
    assert device_rules([upb]) == (DeviceRule(False, "a", None, None, "rwm"),)
