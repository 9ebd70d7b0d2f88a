"""Which NRI events vgpud subscribes to, limited to what the runtime's NRI version knows.

Pure: unknown bits in the Configure mask make a runtime drop the plugin (nri-protocol.md §0).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from vgpud._pb.nri.pkg.api.v1alpha1 import Event

#: the events vgpud needs: creation to inject, start and stop for the hot-plug's targets (pid,
#: running), and every way a container's directory becomes garbage; all within events 1..11
WANTED_EVENTS = (
    Event.CREATE_CONTAINER,
    Event.POST_START_CONTAINER,
    Event.STOP_CONTAINER,
    Event.REMOVE_CONTAINER,
    Event.STOP_POD_SANDBOX,
    Event.REMOVE_POD_SANDBOX,
)
#: NRI <= v0.9 (containerd 1.7, 2.0, 2.1) knows events 1..11; v0.10+ adds 12..14 (nri-protocol.md §0)
MASK_BEFORE_V0_10 = 0x7FF
MASK_FROM_V0_10 = 0x3FFF


def event_mask(events: Iterable[Event]) -> int:
    return sum(1 << (int(event) - 1) for event in set(events))


def known_events_mask(nri_version: str) -> int:
    """The events a runtime of this NRI version accepts; unknown bits make it drop the plugin."""
    match = re.match(r"^v?(\d+)\.(\d+)", nri_version or "")
    if match and (int(match[1]), int(match[2])) >= (0, 10):
        return MASK_FROM_V0_10
    return MASK_BEFORE_V0_10
