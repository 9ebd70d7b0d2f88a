"""A real runc container on cgroup v2 gets a device by replace_device_filter, then loses it again.

This host's containers run on cgroup v1; here runc (the node's, hack/install-node.sh) runs in a
private mount namespace where /sys/fs/cgroup is the cgroup2 hierarchy, so it creates the container's
cgroup there and attaches its own device program, as on a v2 node. The test makes /dev/fuse's node
in the container's /dev from the host (as device-mounter does for a GPU), and `runc exec` opens it:
EPERM under runc's program; allowed after vgpud's replacement with the container's rules (the spec's,
runc's defaults, and the added one), with /dev/null and the other defaults still open; EPERM again
after a replacement without it. No containerd or kubelet, so no node lock."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.node import INSTALL_HINT, node_env
from tests.support import require
from tests.unit.libvgpu import cgroup2
from vgpud.containers.values import DeviceRule
from vgpud.hotplug.cgroup2dev import attached_filters, replace_device_filter
from vgpud.hotplug.devrules import container_rules

#: the added device: present on most hosts, opened with no capability (unlike /dev/kmsg or /dev/mem)
DEVICE = Path("/dev/fuse")
DENIED = "Operation not permitted"
#: runs in the container: opens each PATH:MODE and prints "PATH:MODE ok" or the shell's error
PROBE = """
for spec in "$@"; do
  path=${spec%:*}
  if [ "${spec##*:}" = rw ]; then err=$( (exec 3<>"$path") 2>&1 ); else err=$( (exec 3<"$path") 2>&1 ); fi
  echo "$spec ${err:-ok}"
done
"""


@dataclass
class Container:
    runc: list[str]
    cgroup: Path
    spec_rules: list[DeviceRule]
    pid: int

    def opens(self, *specs: str) -> dict[str, str]:
        """`ok` or the open's error, per PATH:MODE, from a process `runc exec` starts in the container."""
        done = subprocess.run(
            [*self.runc, "exec", "ctr", "sh", "/probe.sh", *specs],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return dict(line.split(" ", 1) for line in done.stdout.splitlines())


def _device_rules(config: dict[str, Any]) -> list[DeviceRule]:
    """The spec's linux.resources.devices as DeviceRules (what NRI would send)."""
    return [
        DeviceRule(d["allow"], d.get("type", "a"), d.get("major"), d.get("minor"), d["access"])
        for d in config["linux"]["resources"]["devices"]
    ]


@pytest.fixture
def container(tmp_path: Path) -> Iterator[Container]:
    env = node_env()
    runc_bin, busybox = env.get("RUNC_BIN", ""), Path(env.get("NODE_ROOT", "/nonexistent"), "usr/bin/busybox")
    require(bool(runc_bin) and Path(runc_bin).exists() and busybox.exists(), "runc and busybox", INSTALL_HINT)
    require(cgroup2.available(), "a cgroup v2 mount and unshare", cgroup2.INSTALL_HINT)
    require(
        DEVICE.exists() and stat.S_ISCHR(DEVICE.stat().st_mode),
        f"the {DEVICE} device",
        "load the fuse module",
    )
    rootfs = tmp_path / "bundle" / "rootfs"
    (rootfs / "bin").mkdir(parents=True)
    (rootfs / "bin" / "busybox").write_bytes(busybox.read_bytes())
    (rootfs / "bin" / "busybox").chmod(0o755)
    for name in ("sh", "sleep"):
        (rootfs / "bin" / name).symlink_to("busybox")
    (rootfs / "probe.sh").write_text(PROBE)
    runc = [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        'mount -t cgroup2 none /sys/fs/cgroup && exec "$@"',
        "runc-v2",
        runc_bin,
        "--root",
        str(tmp_path / "state"),
    ]
    bundle = rootfs.parent
    subprocess.run([runc_bin, "spec"], cwd=bundle, check=True)
    with cgroup2.hierarchy() as tree:
        cgroup = tree.make("runc")
        config = json.loads((bundle / "config.json").read_text())
        config["process"].update(terminal=False, args=["sleep", "600"])
        config["linux"]["cgroupsPath"] = f"/{cgroup.name}"
        (bundle / "config.json").write_text(json.dumps(config))
        pid_file, log = tmp_path / "pid", tmp_path / "runc.log"
        try:
            with log.open("w") as out:  # the container keeps runc's stdio: a file, not a pipe to wait on
                run = subprocess.run(
                    [*runc, "run", "-d", "--pid-file", str(pid_file), "ctr"],
                    cwd=bundle,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    timeout=60,
                    check=False,
                )
            assert run.returncode == 0, log.read_text()
            yield Container(runc, cgroup, _device_rules(config), int(pid_file.read_text()))
        finally:
            subprocess.run([*runc, "delete", "-f", "ctr"], capture_output=True, timeout=60, check=False)


def test_runc_container_gains_and_loses_a_device(container: Container) -> None:
    node = Path(f"/proc/{container.pid}/root/dev") / DEVICE.name
    os.mknod(node, 0o666 | stat.S_IFCHR, DEVICE.stat().st_rdev)
    os.chmod(node, 0o666)
    [runc_program] = attached_filters(container.cgroup)
    probes = (f"{DEVICE}:rw", "/dev/null:rw", "/dev/zero:r", "/dev/urandom:r")
    before = container.opens(*probes)
    assert DENIED in before.pop(probes[0]), before
    assert before == dict.fromkeys(probes[1:], "ok")

    added = DeviceRule(True, "c", os.major(DEVICE.stat().st_rdev), os.minor(DEVICE.stat().st_rdev), "rw")
    replace_device_filter(container.cgroup, container_rules(container.spec_rules, [added]))
    [ours] = attached_filters(container.cgroup)
    assert ours != runc_program
    assert container.opens(*probes) == dict.fromkeys(probes, "ok")

    replace_device_filter(container.cgroup, container_rules(container.spec_rules, []))
    after = container.opens(*probes)
    assert DENIED in after.pop(probes[0]), after
    assert after == dict.fromkeys(probes[1:], "ok")
    assert len(attached_filters(container.cgroup)) == 1
