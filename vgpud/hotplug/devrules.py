"""Device cgroup rules: which character devices a hot-plugged vGPU needs (pure, no I/O).

A rule has the OCI `LinuxDeviceCgroup` shape (NRI sends the same): allow or deny, a type (`c`, `b`
or `a` for all), a major and a minor (None: any), and an access string of `r`, `w`, `m`. The NVIDIA
driver's GPU nodes are `/dev/nvidia<minor>` with the fixed major 195, the control node
`/dev/nvidiactl` is 195:255, and the unified-memory nodes `/dev/nvidia-uvm` and
`/dev/nvidia-uvm-tools` (minors 0 and 1) have a major the kernel assigns at load time, listed in
`/proc/devices` as `nvidia-uvm`.
"""

from __future__ import annotations

from collections.abc import Iterable

from vgpud.containers.values import DeviceRule

#: the NVIDIA driver's fixed character major (`/dev/nvidia<minor>`, `/dev/nvidiactl`)
NVIDIA_MAJOR = 195
#: `/dev/nvidiactl`'s minor
NVIDIACTL_MINOR = 255
#: the name of the unified-memory driver's major in /proc/devices
UVM_DEVICE_NAME = "nvidia-uvm"
#: `/dev/nvidia-uvm` and `/dev/nvidia-uvm-tools`
UVM_MINORS = (0, 1)
#: what a vGPU device node needs (read and write; `m`, mknod, stays with whoever creates the node)
GPU_ACCESS = "rw"


def char_rule(major: int, minor: int, access: str = GPU_ACCESS) -> DeviceRule:
    return DeviceRule(True, "c", major, minor, access)


def uvm_major(proc_devices: str) -> int | None:
    """The `nvidia-uvm` major from the text of /proc/devices; None when the driver is not loaded."""
    section = ""
    for raw in proc_devices.splitlines():
        line = raw.strip()
        if line.endswith(":"):
            section = line
            continue
        fields = line.split()
        if section.startswith("Character") and len(fields) == 2 and fields[1] == UVM_DEVICE_NAME:
            return int(fields[0]) if fields[0].isdigit() else None
    return None


def gpu_rules(minors: Iterable[int], proc_devices: str) -> tuple[DeviceRule, ...]:
    """The rules a container needs to use these GPUs: each GPU node, the control node, and the
    unified-memory nodes when that driver is loaded. Sorted, without repeats."""
    rules = {char_rule(NVIDIA_MAJOR, minor) for minor in minors}
    rules.add(char_rule(NVIDIA_MAJOR, NVIDIACTL_MINOR))
    uvm = uvm_major(proc_devices)
    if uvm is not None:
        rules.update(char_rule(uvm, minor) for minor in UVM_MINORS)
    return tuple(sorted(rules, key=lambda r: (r.major or -1, r.minor or -1)))


#: the rules runc appends to every container's list after the spec's own (runc libcontainer/specconv
#: `AllowedDevices`, runc 1.1 and later; 1.2.0's release candidates lacked /dev/net/tun): mknod of
#: any node, /dev/null, random, full, tty, zero, urandom, the pty slaves, /dev/ptmx and
#: /dev/net/tun. containerd's spec for a plain container holds only `deny a *:* rwm` (and what
#: device plugins, CDI or NRI add), so NRI's linux.resources.devices lacks these, and a program of
#: NRI's list alone would take /dev/null from the container.
RUNC_DEFAULT_RULES = (
    DeviceRule(True, "c", None, None, "m"),
    DeviceRule(True, "b", None, None, "m"),
    char_rule(1, 3, "rwm"),
    char_rule(1, 8, "rwm"),
    char_rule(1, 7, "rwm"),
    char_rule(5, 0, "rwm"),
    char_rule(1, 5, "rwm"),
    char_rule(1, 9, "rwm"),
    DeviceRule(True, "c", 136, None, "rwm"),
    char_rule(5, 2, "rwm"),
    char_rule(10, 200, "rwm"),
)


def container_rules(spec_rules: Iterable[DeviceRule], added: Iterable[DeviceRule]) -> tuple[DeviceRule, ...]:
    """The whole list a runc container's device program must hold: the spec's rules (NRI's
    linux.resources.devices, in order), runc's defaults as runc appends them, then `added` last,
    so an added allow is not undone by an earlier deny. (runc leaves out a default whose path the
    spec also lists as a device node; the spec's own rule for that node then still applies.)"""
    return (*spec_rules, *RUNC_DEFAULT_RULES, *added)
