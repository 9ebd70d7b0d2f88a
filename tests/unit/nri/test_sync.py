"""Synchronize's decoding (claimed containers kept, the rest counted), its GC pause, and the
bulk cache replace it feeds."""

from __future__ import annotations

import gc

import pytest

from vgpud._pb.nri.pkg.api.v1alpha1 import (
    Container,
    ContainerState,
    LinuxContainer,
    LinuxDeviceCgroup,
    LinuxResources,
    Mount,
    OptionalInt64,
    PodSandbox,
    SynchronizeRequest,
)
from vgpud.containers.linux import ContainerLinux
from vgpud.containers.record import NodeContainer
from vgpud.containers.values import DeviceRule
from vgpud.nri.rebuild import RUNTIME_FIELDS, ClaimFacts
from vgpud.nri.sync import SyncContainer, SyncPod, SyncTarget, decode_sync, gc_paused, target_of
from vgpud.wire import MalformedMessage

CLAIM = "5b0e7c1a-3f2d-4c8e-9a71-0d6f1e2b3c4d"


def test_only_containers_with_a_claim_uid_are_kept_and_every_one_is_counted() -> None:
    containers = [
        Container(id="a", pod_sandbox_id="s", name="a", env=["PATH=/bin", f"MANAGER_VGPU_CLAIM_UID={CLAIM}"]),
        Container(id="b", pod_sandbox_id="s", name="b", env=["PATH=/bin"]),
        Container(id="c", pod_sandbox_id="s", name="c", env=["MANAGER_VGPU_CLAIM_UID="]),  # empty: none
        Container(
            id="d",
            pod_sandbox_id="s",
            name="d",
            env=["MANAGER_VGPU_CLAIM_UID=first", "MANAGER_VGPU_CLAIM_UID=last", "X=1"],  # the last wins
            mounts=[Mount(destination="/dst", source="/src", type="bind")],
            state=ContainerState.CONTAINER_STOPPED,
        ),
    ]
    pods = [PodSandbox(id="s", uid="u", name="p", namespace="ns")]
    batch = decode_sync(bytes(SynchronizeRequest(pods=pods, containers=containers, more=True)))
    assert batch.pods == (SyncPod("s", "u", "p", "ns"),)
    assert batch.reported == 4 and batch.more is True
    assert batch.claimed == (
        SyncContainer("a", "s", "a", CLAIM, ("PATH=/bin", f"MANAGER_VGPU_CLAIM_UID={CLAIM}"), (), 0),
        SyncContainer(
            "d",
            "s",
            "d",
            "last",
            ("MANAGER_VGPU_CLAIM_UID=first", "MANAGER_VGPU_CLAIM_UID=last", "X=1"),
            (("/dst", "/src"),),
            int(ContainerState.CONTAINER_STOPPED),
        ),
    )
    assert batch.claimed[1].stopped and not batch.claimed[0].stopped


def test_malformed_bytes_are_refused_and_the_collector_is_back_on() -> None:
    assert gc.isenabled()
    with pytest.raises(MalformedMessage):
        decode_sync(b"\x0a\x05ab")  # a length running past the end
    assert gc.isenabled()


def test_the_gc_pause_restores_the_collector_as_it_found_it() -> None:
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("the block failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # someone else turned it off: left off
    finally:
        gc.enable()


def test_overlapping_pauses_keep_the_collector_off_until_the_last_ends() -> None:
    first, second = gc_paused(), gc_paused()  # two Trio tasks: not properly nested
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not gc.isenabled()
    second.__exit__(None, None, None)
    assert gc.isenabled()


def test_every_container_is_kept_as_a_target_with_its_runtime_facts() -> None:
    rules = [
        LinuxDeviceCgroup(allow=False, type="a", access="rwm"),  # major and minor unset: any
        LinuxDeviceCgroup(
            allow=True, type="c", major=OptionalInt64(value=195), minor=OptionalInt64(value=0), access="rw"
        ),
        LinuxDeviceCgroup(allow=True, type="c", major=OptionalInt64(value=0), access="r"),  # 0 is a number
    ]
    containers = [
        Container(
            id="a",
            pod_sandbox_id="s",
            name="a",
            state=ContainerState.CONTAINER_RUNNING,
            pid=4242,
            linux=LinuxContainer(cgroups_path="/kubepods/pod-u/a", resources=LinuxResources(devices=rules)),
        ),
        Container(id="b", pod_sandbox_id="s", name="b"),  # no linux at all
        Container(id="c", pod_sandbox_id="elsewhere", name="c", state=ContainerState.CONTAINER_PAUSED, pid=7),
    ]
    pods = [PodSandbox(id="s", uid="u", name="p", namespace="ns")]
    batch = decode_sync(bytes(SynchronizeRequest(pods=pods, containers=containers)))
    assert batch.claimed == ()
    want_rules = (
        DeviceRule(False, "a", None, None, "rwm"),
        DeviceRule(True, "c", 195, 0, "rw"),
        DeviceRule(True, "c", 0, None, "r"),
    )
    assert batch.targets == (
        NodeContainer(
            "a", "u", "a", "ns", "p", True, 4242, ContainerLinux.of("/kubepods/pod-u/a", want_rules)
        ),
        NodeContainer("b", "u", "b", "ns", "p", False, 0, ContainerLinux.of()),
    )
    # a split request: this container's pod came in another chunk, found when the last has arrived
    (unresolved,) = batch.unresolved
    assert unresolved == SyncTarget(
        "c", "elsewhere", "c", int(ContainerState.CONTAINER_PAUSED), 7, ContainerLinux.of()
    )
    pod = SyncPod("elsewhere", "u2", "q", "ns2")
    assert target_of(unresolved, pod) == NodeContainer(
        "c", "u2", "c", "ns2", "q", True, 7, ContainerLinux.of()
    )


def test_claim_facts_are_the_records_last_fields_in_its_order() -> None:
    """The Synchronize joins a record's runtime fields with its ClaimFacts as tuples."""
    assert NodeContainer._fields[RUNTIME_FIELDS:] == ClaimFacts._fields
    assert NodeContainer._fields[RUNTIME_FIELDS - 1] == "linux"
