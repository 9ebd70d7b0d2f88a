"""Shared values for the hot-plug tests: pod UIDs, a running target container, slave claims."""

from __future__ import annotations

from vgpud.hotplug.rules import AttachKey, KnownContainer, SlaveClaim

TARGET = "11111111-2222-3333-4444-555555555555"
SLAVE = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
OTHER_SLAVE = "aaaaaaaa-bbbb-cccc-dddd-ffffffffffff"
CLAIM = "cccccccc-0000-0000-0000-000000000001"
KEY = AttachKey(TARGET, "app", SLAVE)
RUNNING = KnownContainer("c" * 64, TARGET, "app", "team", "trainer", running=True)
CLAIMS = (SlaveClaim("team", "slave-gpu", CLAIM, ("gpu-0-vgpu",), frozenset({SLAVE})),)
