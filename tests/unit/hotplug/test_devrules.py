"""Which rules a hot-plugged GPU needs, how OCI rule lists decide, where a container's cgroup is."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

from vgpud.hotplug.cgpath import CgroupPathError, cgroup_dir
from vgpud.hotplug.devrules import gpu_rules, uvm_major

PROC_DEVICES = """Character devices:
  1 mem
195 nvidia-frontend
195 nvidia
234 nvidia-uvm
509 nvidia-caps

Block devices:
  8 sd
234 nvidia-uvm
"""


def test_gpu_rules_with_and_without_the_unified_memory_driver() -> None:
    assert uvm_major(PROC_DEVICES) == 234
    assert [str(r) for r in gpu_rules([1, 0, 1], PROC_DEVICES)] == [
        "c 195:0 rw",
        "c 195:1 rw",
        "c 195:255 rw",
        "c 234:0 rw",
        "c 234:1 rw",
    ]
    assert [str(r) for r in gpu_rules([3], "Character devices:\n  1 mem\n")] == ["c 195:3 rw", "c 195:255 rw"]
    assert uvm_major("Block devices:\n234 nvidia-uvm\n") is None  # only a character major counts


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/kubepods/besteffort/pod1234/abcd", "kubepods/besteffort/pod1234/abcd"),
        (
            "kubepods-besteffort-pod12_34.slice:cri-containerd:abcd",
            "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod12_34.slice/cri-containerd-abcd.scope",
        ),
        (
            "kubepods-pod1.slice:cri-containerd:ef01",
            "kubepods.slice/kubepods-pod1.slice/cri-containerd-ef01.scope",
        ),
        ("-.slice:docker:abc", "docker-abc.scope"),
    ],
)
def test_cgroup_dir(path: str, expected: str) -> None:
    assert cgroup_dir(path) == PurePosixPath(expected)


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("", "no cgroups path"),
        ("/", "a hierarchy's root"),
        ("/kubepods/../../etc", "component '..'"),
        ("kubepods.slice:cri-containerd", "neither absolute nor slice:prefix:name"),
        ("kubepods--x.slice:p:n", "not a systemd slice name"),
        ("notaslice:p:n", "not a systemd slice name"),
        ("/kubepods/a b", "component 'a b'"),
    ],
)
def test_cgroup_dir_refuses(path: str, why: str) -> None:
    with pytest.raises(CgroupPathError, match=why):
        cgroup_dir(path)
