"""Pure parsing of /proc/<pid>/cgroup and of the pod status fields registration reads."""

from __future__ import annotations

import contextlib
from pathlib import PurePosixPath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.registry.world import cgroup_path, container_id, pod_uid
from vgpud.registry.cgroup import (
    CgroupParseError,
    Membership,
    container_id_of_status,
    parse_proc_cgroup,
    pod_cgroup_dirs,
    pod_terminated,
)

UID = "8f0c6a5e-1b2d-4e3f-a4b5-c6d7e8f90a1b"
CID = "ab" * 32
CGROUPFS = Membership(UID, False, CID, CID)
SYSTEMD = Membership(UID, True, f"cri-containerd-{CID}.scope", CID)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # cgroup v2, cgroupfs driver, each QoS class
        (f"0::/kubepods/besteffort/pod{UID}/{CID}\n", CGROUPFS),
        (f"0::/kubepods/burstable/pod{UID}/{CID}\n", CGROUPFS),
        (f"0::/kubepods/pod{UID}/{CID}\n", CGROUPFS),
        # cgroup v2, systemd driver
        (
            f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}"
            f".slice/cri-containerd-{CID}.scope\n",
            SYSTEMD,
        ),
        (f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope", SYSTEMD),
        # cgroup v1: one line per hierarchy, some left at the root
        (
            f"12:pids:/kubepods/burstable/pod{UID}/{CID}\n11:cpuset:/\n"
            f"10:memory:/kubepods/burstable/pod{UID}/{CID}\n"
            f"1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n0::/\n",
            CGROUPFS,
        ),
        # a private cgroup namespace shows the path relative to the reader's root
        (f"0::/../../besteffort/pod{UID}/{CID}\n", CGROUPFS),
        # a sub-cgroup the container made for itself still belongs to the container
        (f"0::/kubepods/besteffort/pod{UID}/{CID}/worker/inner\n", CGROUPFS),
        # below a kubelet --cgroup-root (the tests' parent)
        (f"8:pids:/vgpud-test-x/kubepods/besteffort/pod{UID}/{CID}\n", CGROUPFS),
        # CRI-O, cgroupfs
        (f"0::/kubepods/besteffort/pod{UID}/crio-{CID}\n", Membership(UID, False, f"crio-{CID}", CID)),
        # static pods have a 32-hex UID
        (f"0::/kubepods/pod{'c' * 32}/{CID}\n", Membership("c" * 32, False, CID, CID)),
    ],
)
def test_pod_and_container(text: str, expected: Membership) -> None:
    assert parse_proc_cgroup(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "0::/user.slice/user-0.slice/session-1.scope\n",
        "0::/\n",
        "",
        "12:pids:/\n11:memory:/system.slice/containerd.service\n",
        "0::/kubepods/besteffort/podnot-a-uid/" + CID,
        "garbage without colons\n",
    ],
)
def test_outside_any_pod(text: str) -> None:
    assert parse_proc_cgroup(text) is None


def test_pod_without_container() -> None:
    assert parse_proc_cgroup(f"0::/kubepods/besteffort/pod{UID}\n") == Membership(UID, False)
    # conmon's scope is not the container
    conmon = f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-conmon-{CID}.scope"
    assert parse_proc_cgroup(conmon) == Membership(UID, True)


def test_hierarchies_that_disagree_are_an_error() -> None:
    other = "cd" * 32
    text = f"12:pids:/kubepods/pod{UID}/{CID}\n10:memory:/kubepods/pod{UID}/{other}\n"
    with pytest.raises(CgroupParseError, match="disagree"):
        parse_proc_cgroup(text)


@given(
    n=st.integers(0, 2**32 - 1),
    m=st.integers(0, 2**64),
    systemd=st.booleans(),
    qos=st.sampled_from(["guaranteed", "burstable", "besteffort"]),
)
def test_every_kubelet_path_round_trips(n: int, m: int, systemd: bool, qos: str) -> None:
    uid, cid = pod_uid(n), container_id(m)
    membership = parse_proc_cgroup(f"0::{cgroup_path(uid, cid, qos=qos, systemd=systemd)}\n")
    assert membership is not None and (membership.pod_uid, membership.container_id) == (uid, cid)
    # and the pod directory is one of the three the lookup probes
    pod_dir = PurePosixPath(cgroup_path(uid, cid, qos=qos, systemd=systemd).lstrip("/")).parent
    assert pod_dir in pod_cgroup_dirs(uid, systemd)


@given(st.text())
def test_arbitrary_text_never_crashes(text: str) -> None:
    with contextlib.suppress(CgroupParseError):
        parse_proc_cgroup(text)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (f"containerd://{CID}", CID),
        (f"cri-o://{CID}", CID),
        (f"docker://{CID}", CID),
        (CID, None),
        ("containerd://short", None),
        ("", None),
    ],
)
def test_status_container_id(value: str, expected: str | None) -> None:
    assert container_id_of_status(value) == expected


def _pod(phase: str, *, deleting: bool = False, running: bool = True) -> dict:
    state = {"running": {}} if running else {"terminated": {"exitCode": 0}}
    meta = {"name": "p", "namespace": "default", "uid": UID}
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "status": {"phase": phase, "containerStatuses": [{"name": "c", "state": state}]},
    }


@pytest.mark.parametrize(
    ("pod", "terminated"),
    [
        (_pod("Running"), False),
        (_pod("Pending", running=False), False),
        (_pod("Succeeded", running=False), True),
        (_pod("Failed", running=False), True),
        (_pod("Running", deleting=True), False),  # still running while it shuts down
        (_pod("Running", deleting=True, running=False), True),
    ],
)
def test_pod_terminated(pod: dict, terminated: bool) -> None:
    assert pod_terminated(pod) is terminated
