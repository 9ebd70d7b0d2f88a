"""The device-health rules, pure: which XIDs make a GPU unhealthy, and when a sick GPU is healthy again.

XIDs are the NVIDIA driver's error reports. Some are caused by the application on the GPU (a bad
memory access, a kernel that hangs) and say nothing about the GPU itself: those are ignored, as NVIDIA's
device plugin does (13, 31, 43, 45, 68, 109; `--health-ignored-xids` replaces the list). Every other
XID is fatal: the GPU turns unhealthy. So does a GPU that stops answering NVML ("GPU lost").

Recovery: an unhealthy GPU is healthy again once NVML answers for it and nothing bad (a fatal XID, a
failed check) has been seen for `recovery_seconds`. Times here are on the watcher's monotonic clock
(Trio's); the board's `since` is wall-clock time, given separately.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

#: application-caused XIDs, ignored by default (NVIDIA k8s-device-plugin, internal/rm/health.go)
APPLICATION_XIDS: tuple[int, ...] = (13, 31, 43, 45, 68, 109)
DEFAULT_IGNORED_XIDS = ",".join(map(str, APPLICATION_XIDS))
#: `--health-ignored-xids none`: every XID is fatal
NO_XIDS = "none"
MAX_XID = 65535

#: what the common XIDs mean (NVIDIA's XID catalogue), for the log line and the reason
XID_NAMES: dict[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    32: "invalid or corrupted push buffer stream",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "video processor exception",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    109: "context switch timeout error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}


def describe_xid(xid: int) -> str:
    """`XID 79 (GPU has fallen off the bus)`, or `XID 7` for one the table does not name."""
    name = XID_NAMES.get(xid)
    return f"XID {xid} ({name})" if name else f"XID {xid}"


def parse_xid_list(raw: str) -> frozenset[int]:
    """`13,31,43`: the XIDs to ignore; `none`: none (ValueError for anything else)."""
    text = raw.strip()
    if text.lower() == NO_XIDS:
        return frozenset()
    xids: set[int] = set()
    for part in text.split(","):
        item = part.strip()
        if not (item.isascii() and item.isdigit()) or not 1 <= int(item) <= MAX_XID:
            raise ValueError(
                f"{item!r} is not an XID (1..{MAX_XID}): give comma-separated XIDs, or {NO_XIDS!r} to "
                "ignore none"
            )
        xids.add(int(item))
    return frozenset(xids)


def is_fatal(xid: int, ignored: frozenset[int]) -> bool:
    return xid not in ignored


@dataclass(frozen=True)
class DeviceTrack:
    """What the watcher knows of one GPU (immutable; the functions below make the next one)."""

    healthy: bool = True
    #: why it is unhealthy (the first cause since it was last healthy); "" when healthy
    reason: str = ""
    #: the XID that made it unhealthy, if one did
    xid: int | None = None
    #: monotonic time of the last bad observation (fatal XID or failed check); None while healthy
    bad_at: float | None = None
    #: the last check found it answering NVML
    answering: bool = True


def on_fatal_xid(track: DeviceTrack, xid: int, now: float) -> DeviceTrack:
    """A fatal XID: unhealthy (the reason names the first cause), and the recovery wait restarts."""
    if track.healthy:
        return replace(track, healthy=False, reason=describe_xid(xid), xid=xid, bad_at=now)
    return replace(track, bad_at=now)


def on_check(track: DeviceTrack, problem: str | None, now: float) -> DeviceTrack:
    """A per-device NVML check: `problem` is None when the GPU answered, else why it did not."""
    if problem is None:
        return replace(track, answering=True)
    if track.healthy:
        return DeviceTrack(healthy=False, reason=f"GPU lost: {problem}", bad_at=now, answering=False)
    return replace(track, bad_at=now, answering=False)


def recovery_due(track: DeviceTrack, recovery_seconds: float) -> float | None:
    """When the GPU may be healthy again (if it keeps answering and nothing bad comes); None when it
    is healthy, or not answering (then the next good check starts nothing: the wait runs from the
    last bad observation)."""
    if track.healthy or not track.answering or track.bad_at is None:
        return None
    return track.bad_at + recovery_seconds


def settle(track: DeviceTrack, now: float, recovery_seconds: float) -> DeviceTrack:
    """Healthy again when the recovery wait is over; otherwise unchanged."""
    due = recovery_due(track, recovery_seconds)
    if due is not None and now >= due:
        return DeviceTrack()
    return track
