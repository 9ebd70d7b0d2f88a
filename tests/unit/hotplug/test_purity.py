"""The device rule modules do no I/O: imported and run in a process where the filesystem and the
network raise (devrules and devfilter are pure; bpfsys and cgroup2dev do the I/O)."""

from __future__ import annotations

from tests.purity import run_without_io

BODY = """
    from vgpud.hotplug.devfilter import compile_filter, verdict
    from vgpud.containers.values import DeviceRule
    from vgpud.hotplug.devrules import container_rules, gpu_rules

    rules = container_rules([DeviceRule(False, "a", None, None, "rwm")], gpu_rules([0], PROC_DEVICES))
    assert len(compile_filter(rules)) % 8 == 0
    assert verdict(rules, "c", 195, 0, "rw") and verdict(rules, "c", 509, 1, "rw")
    assert not verdict(rules, "c", 195, 1, "rw")
    assert "vgpud.hotplug.bpfsys" not in sys.modules
    print("pure")
"""


def test_devrules_and_devfilter_do_no_io() -> None:
    done = run_without_io(BODY, PROC_DEVICES="Character devices:\n195 nvidia\n509 nvidia-uvm\n")
    assert (done.returncode, done.stdout.strip()) == (0, "pure"), done.stderr
