"""The list a runc container's device program holds: containerd's spec rules, runc's defaults, the
added GPU rules; decided by the reference verdict of vgpud.hotplug.devfilter."""

from __future__ import annotations

import pytest

from vgpud.containers.values import DeviceRule
from vgpud.hotplug.devfilter import verdict
from vgpud.hotplug.devrules import container_rules, gpu_rules

#: containerd's spec rules for a plain container
CONTAINERD_SPEC = (DeviceRule(False, "a", None, None, "rwm"),)
PROC_DEVICES = "Character devices:\n  1 mem\n195 nvidia-frontend\n509 nvidia-uvm\n\nBlock devices:\n  8 sd\n"


@pytest.mark.parametrize(
    ("device", "access", "expected"),
    [
        (("c", 1, 3), "rw", (True, True)),  # /dev/null
        (("c", 1, 9), "r", (True, True)),  # /dev/urandom
        (("c", 136, 4), "rw", (True, True)),  # a pty slave
        (("c", 10, 200), "rw", (True, True)),  # /dev/net/tun
        (("c", 195, 0), "m", (True, True)),  # mknod of any char node
        (("b", 8, 0), "m", (True, True)),
        (("b", 8, 0), "r", (False, False)),
        (("c", 195, 0), "rw", (False, True)),
        (("c", 195, 255), "rw", (False, True)),  # /dev/nvidiactl
        (("c", 509, 1), "rw", (False, True)),  # /dev/nvidia-uvm-tools
        (("c", 195, 1), "rw", (False, False)),  # another GPU
        (("c", 1, 1), "r", (False, False)),  # /dev/mem
    ],
)
def test_a_plain_container_keeps_runcs_defaults_and_gains_the_gpu(
    device: tuple[str, int, int], access: str, expected: tuple[bool, bool]
) -> None:
    """expected: (without the GPU rules, with them)."""
    before = container_rules(CONTAINERD_SPEC, ())
    after = container_rules(CONTAINERD_SPEC, gpu_rules([0], PROC_DEVICES))
    assert (verdict(before, *device, access), verdict(after, *device, access)) == expected


def test_added_rules_come_after_a_spec_deny() -> None:
    spec = (*CONTAINERD_SPEC, DeviceRule(False, "c", 195, None, "rwm"))
    assert verdict(container_rules(spec, gpu_rules([0], "")), "c", 195, 0, "rw")
