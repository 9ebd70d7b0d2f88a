"""The added devices' entries in the target's vgpu.config: pure round trips and refusals, the slave's
limits from its CDI spec, and the locked in-place rewrite on real files (OFD lock contention,
symlink, FIFO, invalid file, no file)."""

from __future__ import annotations

import fcntl
import functools
import json
import os
import stat
import struct
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from vgpud.dra.cdi import ContainerEdits, claim_spec, spec_path
from vgpud.hotplug import configfile as C
from vgpud.hotplug import vgpuconfig as V
from vgpud.hotplug.configfile import ConfigState
from vgpud.hotplug.vgpuconfig import AddedDevice, ConfigError
from vgpud.partition import libfiles as F
from vgpud.partition.edits import ComputePolicy, device_env

GIB = 1 << 30
OWN = "GPU-2db41dd2-f9b4-4c97-9654-9baa4a150479"
ADDED = "GPU-bdad1e16-755f-41d4-985c-16737eb6e907"
THIRD = "GPU-0c9f7a55-1e21-4c57-8d3e-62c0e7a0b1f3"
CLAIM = "7d2c9b0e-51f4-4b8e-9a43-0f1d2e3c4b5a"
DRIVER = "manager.nvidia.com"


def limits(uuid: str, memory: int = 4 * GIB, core: int = 30) -> F.DeviceLimits:
    return F.DeviceLimits(
        uuid=uuid,
        total_memory=memory,
        real_memory=memory,
        hard_core=core,
        core_limit=core > 0,
        hard_limit=core > 0,
        memory_limit=memory > 0,
        activate=True,
    )


def marked(entry: F.DeviceLimits) -> F.DeviceLimits:
    """An entry as `extend_config` writes it."""
    return replace(entry, hotplug=True)


def target_file(own_index: int = 1) -> bytes:
    """A target's vgpu.config as its library writes it: its own device at `own_index`."""
    devices = [F.DeviceLimits()] * F.MAX_DEVICES
    devices[own_index] = limits(OWN, 2 * GIB, 50)
    config = F.VgpuConfig(devices=tuple(devices), pod_uid="u", pod_name="target", container_name="main")
    return F.build_vgpu_config(config)


BASE = target_file()
ADD = (AddedDevice(0, limits(ADDED)),)


# --------------------------------------------------------------------------------------------------
# Pure


def test_extend_then_shrink_gives_back_the_same_bytes() -> None:
    extended = V.extend_config(BASE, ADD)
    active = F.parse_vgpu_config(extended).active()
    assert active == {0: marked(limits(ADDED)), 1: limits(OWN, 2 * GIB, 50)}
    assert extended[F.CONFIG_DEVICES_OFFSET + F.CONFIG_DEVICE_SIZE :] == BASE[F.CONFIG_DEVICES_OFFSET + 128 :]
    assert V.shrink_config(extended, [ADDED]) == BASE


@given(st.sets(st.sampled_from([i for i in range(F.MAX_DEVICES) if i != 1]), min_size=1, max_size=15))
def test_any_free_slots_round_trip(indexes: set[int]) -> None:
    uuids = {i: f"GPU-{i:08x}-0000-4000-8000-000000000000" for i in indexes}
    added = [AddedDevice(i, limits(u, (i + 1) * GIB, i + 1)) for i, u in uuids.items()]
    extended = V.extend_config(BASE, added)
    assert set(F.parse_vgpu_config(extended).active()) == indexes | {1}
    assert V.extend_config(extended, added) == extended  # idempotent
    assert V.shrink_config(extended, uuids.values()) == BASE


def test_extend_is_idempotent_and_shrink_of_what_is_gone_changes_nothing() -> None:
    once = V.extend_config(BASE, ADD)
    assert V.extend_config(once, ADD) == once
    assert V.shrink_config(BASE, [ADDED]) == BASE
    assert V.shrink_config(once, [THIRD]) == once


@pytest.mark.parametrize(
    ("added", "message"),
    [
        ((AddedDevice(1, limits(ADDED)),), f"the slot holds {OWN}, a device of the target's own env"),
        ((AddedDevice(0, limits(OWN)),), "at host index 1 already"),
        ((AddedDevice(1, limits(OWN, 2 * GIB, 50)),), "a second share of the same GPU"),
        ((AddedDevice(16, limits(ADDED)),), "host indexes 0..15"),
        ((AddedDevice(-1, limits(ADDED)),), "host indexes 0..15"),
        ((AddedDevice(0, F.DeviceLimits(uuid=ADDED)),), "activate set"),
        ((AddedDevice(0, limits("MIG-x")),), "needs a GPU UUID"),
        ((AddedDevice(0, limits(ADDED)), AddedDevice(0, limits(THIRD))), "claim the same host index"),
    ],
)
def test_refused_changes_name_the_device(added: tuple[AddedDevice, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        V.extend_config(BASE, added)


def test_an_added_device_with_other_limits_or_another_in_its_slot_is_refused() -> None:
    once = V.extend_config(BASE, ADD)
    with pytest.raises(ConfigError, match="with other limits"):
        V.extend_config(once, [AddedDevice(0, limits(ADDED, 8 * GIB))])
    with pytest.raises(ConfigError, match=f"holds {ADDED}, hot-plugged by another attachment"):
        V.extend_config(once, [AddedDevice(0, limits(THIRD))])


def test_shrink_never_removes_the_target_s_own_entry() -> None:
    """The same GPU as the target's own (one entry per GPU) is refused, and detaching its UUID leaves
    the target's entry alone."""
    assert V.shrink_config(BASE, [OWN]) == BASE


def test_every_slot_taken_refuses_the_next_device() -> None:
    full = BASE
    for i in (i for i in range(F.MAX_DEVICES) if i != 1):
        full = V.extend_config(full, [AddedDevice(i, limits(f"GPU-{i:08x}-0000-4000-8000-000000000000"))])
    for i in range(F.MAX_DEVICES):
        with pytest.raises(ConfigError, match="the slot holds"):
            V.extend_config(full, [AddedDevice(i, limits(THIRD))])


def test_an_inactive_slot_with_content_is_not_overwritten() -> None:
    dirty = bytearray(BASE)
    dirty[F.config_device_offset(0) + 60] = 1  # total_memory of an inactive entry
    with pytest.raises(ConfigError, match="inactive but not empty"):
        V.extend_config(bytes(dirty), ADD)


@pytest.mark.parametrize("bad", [b"", BASE[:2559], b"\1" + BASE[1:], bytes(F.CONFIG_FILE_SIZE)])
def test_a_file_that_is_not_a_vgpu_config_is_refused(bad: bytes) -> None:
    with pytest.raises(ConfigError, match=r"not a valid vgpu\.config"):
        V.extend_config(bad, ADD)
    with pytest.raises(ConfigError, match=r"not a valid vgpu\.config"):
        V.shrink_config(bad, [ADDED])


# --------------------------------------------------------------------------------------------------
# The slave's limits, from the env vgpud's own Prepare builds


#: the claim-common env Prepare writes (vgpud.dra.claimedits.claim_common_env): the unsuffixed
#: limit names blanked, the unsuffixed ratio set
COMMON = {"CUDA_MEM_LIMIT": "", "CUDA_CORE_LIMIT": "", "CUDA_CORE_SOFT_LIMIT": "", "CUDA_MEM_RATIO": "1.00"}


def slave_spec(index: int = 3, capacity: dict[str, str] | None = None, ratio: int = 100) -> dict:
    """The CDI spec of a one-device slave claim, from the same builders Prepare uses."""
    env = device_env(
        index,
        ADDED,
        total_memory=40 * GIB,
        consumed_capacity=capacity if capacity is not None else {"memory": "4Gi", "cores": "30"},
        memory_ratio=ratio,
    )
    name = f"{CLAIM}-gpu-vgpu-{index}-0"
    return claim_spec(DRIVER, CLAIM, [(name, ContainerEdits.of(env))], ContainerEdits.of(COMMON))


def test_slave_limits_follow_the_env_prepare_writes() -> None:
    assert V.slave_limits([slave_spec()]) == [AddedDevice(3, limits(ADDED))]


def test_balance_policy_gives_a_soft_limit_and_no_capacity_gives_none() -> None:
    env = device_env(
        5, ADDED, total_memory=40 * GIB, consumed_capacity={"cores": "30"}, policy=ComputePolicy.BALANCE
    )
    entry = V.device_limits(env, 5)
    assert entry is not None
    assert (entry.hard_core, entry.soft_core, entry.core_limit, entry.hard_limit) == (30, 0, True, True)
    # soft 100 is "off" for the library (>= 100), so the limit stays hard, as core_env.c decides
    assert (entry.memory_limit, entry.total_memory) == (False, 0)
    assert V.device_limits(env, 4) is None


def test_an_oversold_device_has_its_real_memory_scaled() -> None:
    (device,) = V.slave_limits([slave_spec(capacity={"memory": "8Gi"}, ratio=200)])
    assert (device.limits.total_memory, device.limits.real_memory) == (8 * GIB, 4 * GIB)
    assert device.limits.memory_oversold and not device.limits.core_limit


def test_unsuffixed_names_count_where_no_suffixed_one_is_set() -> None:
    spec = slave_spec(capacity={})
    spec["containerEdits"] = {"env": ["CUDA_MEM_LIMIT=1g", "CUDA_CORE_LIMIT=20"]}
    (device,) = V.slave_limits([spec])
    assert (device.limits.total_memory, device.limits.hard_core) == (GIB, 20)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CUDA_MEM_LIMIT_3", "4x"),
        ("CUDA_MEM_LIMIT_3", "m"),
        ("CUDA_MEM_LIMIT_3", "99999999999999999999t"),
        ("CUDA_MEM_RATIO_3", "0.5"),
        ("CUDA_MEM_RATIO_3", "inf"),
        ("CUDA_CORE_LIMIT_3", "3o"),
        ("CUDA_CORE_SOFT_LIMIT_3", "1_0"),
    ],
)
def test_a_value_the_library_refuses_is_refused(name: str, value: str) -> None:
    env = {"MANAGER_VISIBLE_DEVICE_3": ADDED, name: value}
    with pytest.raises(ConfigError, match=name):
        V.device_limits(env, 3)


@pytest.mark.parametrize(
    ("value", "size"), [("1024", 1024), ("4k", 4096), ("2Gi", 2 * GIB), ("1tb", 1 << 40)]
)
def test_sizes_as_the_library_reads_them(value: str, size: int) -> None:
    entry = V.device_limits({"MANAGER_VISIBLE_DEVICE_0": ADDED, "CUDA_MEM_LIMIT_0": value}, 0)
    assert entry is not None and entry.total_memory == size


def test_two_claims_on_one_host_index_are_refused() -> None:
    other = slave_spec()
    other["devices"][0]["containerEdits"]["env"] = [
        e.replace(ADDED, THIRD) for e in other["devices"][0]["containerEdits"]["env"]
    ]
    with pytest.raises(ConfigError, match="host index 3: two claims"):
        V.slave_limits([slave_spec(), other])


def test_the_spec_is_read_from_vgpud_s_own_file(tmp_path: Path) -> None:
    path = spec_path(tmp_path, DRIVER, CLAIM)
    with pytest.raises(ConfigError, match="No such file"):
        C.read_claim_spec(tmp_path, DRIVER, CLAIM)
    path.write_text(json.dumps(slave_spec()))
    assert V.slave_limits([C.read_claim_spec(tmp_path, DRIVER, CLAIM)]) == [AddedDevice(3, limits(ADDED))]
    path.write_text("[]")
    with pytest.raises(ConfigError, match="not a JSON object"):
        C.read_claim_spec(tmp_path, DRIVER, CLAIM)
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(ConfigError, match="is a symbolic link"):
        C.read_claim_spec(tmp_path, DRIVER, CLAIM)


# --------------------------------------------------------------------------------------------------
# I/O on real files


def write_config(directory: Path, data: bytes = BASE) -> Path:
    path = directory / F.VGPU_CONFIG_FILE
    path.write_bytes(data + bytes(F.CONFIG_FILE_SIZE - len(data)))
    return path


def hold_lock(path: Path) -> int:
    """Another open file description holding the byte-0 OFD write lock, as the library does."""
    fd = os.open(path, os.O_RDWR)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0))
    return fd


EXTEND = functools.partial(V.extend_config, added=ADD)
SHRINK = functools.partial(V.shrink_config, uuids=[ADDED])


async def test_attach_then_detach_on_a_real_file(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    inode = path.stat().st_ino
    first = await C.change_target_config(path, EXTEND)
    assert (first.state, first.written) == (ConfigState.CHANGED, (0,))
    assert F.parse_vgpu_config(path.read_bytes()).active()[0] == marked(limits(ADDED))
    assert len(path.read_bytes()) == F.CONFIG_FILE_SIZE and path.stat().st_ino == inode
    again = await C.change_target_config(path, EXTEND)
    assert again.state is ConfigState.UNCHANGED
    gone = await C.change_target_config(path, SHRINK)
    assert (gone.state, gone.written) == (ConfigState.CHANGED, (0,))
    assert path.read_bytes() == BASE + bytes(F.CONFIG_FILE_SIZE - len(BASE))


async def test_no_config_is_an_outcome_not_an_error(tmp_path: Path) -> None:
    for path in (tmp_path / F.VGPU_CONFIG_FILE, tmp_path / "absent" / F.VGPU_CONFIG_FILE):
        outcome = await C.change_target_config(path, EXTEND)
        assert outcome.state is ConfigState.NO_CONFIG
        assert "enforces no limit" in outcome.detail
        assert not path.exists()


async def test_a_held_lock_fails_clearly_after_the_wait(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    fd = hold_lock(path)
    try:
        start = time.monotonic()
        with pytest.raises(ConfigError, match=r"stayed taken for 0\.2 s; nothing changed"):
            await C.change_target_config(path, EXTEND, lock_wait=0.2)
        assert 0.2 <= time.monotonic() - start < 2
    finally:
        os.close(fd)
    assert path.read_bytes()[: len(BASE)] == BASE


async def test_the_change_waits_for_the_holder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_config(tmp_path)
    refused = threading.Event()
    real = C._ofd_lock

    def spy(fd: int, kind: int) -> bool:
        taken = real(fd, kind)
        if not taken:
            refused.set()
        return taken

    monkeypatch.setattr(C, "_ofd_lock", spy)
    fd = hold_lock(path)
    result: list[C.ConfigOutcome] = []
    async with trio.open_nursery() as nursery:

        async def change() -> None:
            result.append(await C.change_target_config(path, EXTEND, lock_wait=30))

        nursery.start_soon(change)
        await trio.to_thread.run_sync(refused.wait)  # it tried once and found the lock taken
        assert path.read_bytes()[: len(BASE)] == BASE
        os.close(fd)
    assert result[0].state is ConfigState.CHANGED


async def test_a_symlink_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    real = write_config(tmp_path / "elsewhere")
    link = tmp_path / F.VGPU_CONFIG_FILE
    link.symlink_to(real)
    with pytest.raises(ConfigError, match=r"symbolic link \(not followed\); nothing changed"):
        await C.change_target_config(link, EXTEND)
    assert real.read_bytes()[: len(BASE)] == BASE


async def test_a_fifo_or_a_second_link_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / F.VGPU_CONFIG_FILE
    os.mkfifo(fifo)
    with trio.fail_after(5), pytest.raises(ConfigError, match="not a regular file"):
        await C.change_target_config(fifo, EXTEND)
    other = tmp_path / "d"
    other.mkdir()
    path = write_config(other)
    os.link(path, tmp_path / "hard")
    with pytest.raises(ConfigError, match="one link"):
        await C.change_target_config(path, EXTEND)


async def test_an_invalid_file_or_a_refused_change_changes_nothing(tmp_path: Path) -> None:
    path = write_config(tmp_path, b"garbage")
    with pytest.raises(ConfigError, match=r"not a valid vgpu\.config.*nothing changed"):
        await C.change_target_config(path, EXTEND)
    assert path.read_bytes().startswith(b"garbage")
    path = write_config(tmp_path, BASE)
    clash = functools.partial(V.extend_config, added=[AddedDevice(1, limits(ADDED))])
    with pytest.raises(ConfigError, match="the slot holds"):
        await C.change_target_config(path, clash)
    assert path.read_bytes()[: len(BASE)] == BASE


# --------------------------------------------------------------------------------------------------
# create: a target whose library never wrote the file


def header_only(*entries: tuple[int, F.DeviceLimits]) -> bytes:
    """The file `create` makes (a valid header, nothing else) with these entries."""
    devices = [F.DeviceLimits()] * F.MAX_DEVICES
    for index, entry in entries:
        devices[index] = entry
    return F.build_vgpu_config(F.VgpuConfig(devices=tuple(devices)))


async def test_create_makes_a_header_only_file_with_the_entries(tmp_path: Path) -> None:
    path = tmp_path / F.VGPU_CONFIG_FILE
    umask = os.umask(0o077)  # vgpud's umask does not narrow the file: every container user reads it
    try:
        outcome = await C.change_target_config(path, EXTEND, create=True)
    finally:
        os.umask(umask)
    assert (outcome.state, outcome.written, outcome.created) == (ConfigState.CHANGED, (0,), True)
    assert "(created)" in outcome.detail
    assert path.read_bytes() == header_only((0, marked(limits(ADDED))))
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    again = await C.change_target_config(path, EXTEND, create=True)
    assert (again.state, again.created) == (ConfigState.UNCHANGED, False)
    gone = await C.change_target_config(path, SHRINK, create=True)
    assert gone.state is ConfigState.CHANGED
    assert path.read_bytes() == header_only()  # it stays: a header-only file holds nothing


async def test_create_on_an_existing_file_changes_it_as_before(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    outcome = await C.change_target_config(path, EXTEND, create=True)
    assert (outcome.state, outcome.written, outcome.created) == (ConfigState.CHANGED, (0,), False)
    assert F.parse_vgpu_config(path.read_bytes()).active()[0] == marked(limits(ADDED))


async def test_create_fills_an_empty_file_a_library_left(tmp_path: Path) -> None:
    """A library process whose env it could not build leaves the file it opened empty."""
    path = tmp_path / F.VGPU_CONFIG_FILE
    path.write_bytes(b"")
    with pytest.raises(ConfigError, match=r"not a valid vgpu\.config"):
        await C.change_target_config(path, EXTEND)
    assert path.read_bytes() == b""
    outcome = await C.change_target_config(path, EXTEND, create=True)
    assert outcome.created
    assert path.read_bytes() == header_only((0, marked(limits(ADDED))))


async def test_create_loses_the_race_to_the_library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The library creates (and writes) the file between vgpud's open and its O_EXCL create: vgpud
    changes the library's file, as when it was there first."""
    path = tmp_path / F.VGPU_CONFIG_FILE
    real = C._create

    def library_first(dir_fd: int, at: Path) -> int | None:
        write_config(tmp_path)
        made = real(dir_fd, at)
        assert made is None  # EEXIST
        return made

    monkeypatch.setattr(C, "_create", library_first)
    outcome = await C.change_target_config(path, EXTEND, create=True)
    assert (outcome.state, outcome.created) == (ConfigState.CHANGED, False)
    assert path.read_bytes() == V.extend_config(BASE, ADD) + bytes(F.CONFIG_FILE_SIZE - len(BASE))


async def test_create_needs_the_directory_and_a_change(tmp_path: Path) -> None:
    missing = tmp_path / "absent" / F.VGPU_CONFIG_FILE
    outcome = await C.change_target_config(missing, EXTEND, create=True)
    assert outcome.state is ConfigState.NO_CONFIG
    assert "its directory does not exist" in outcome.detail
    assert not missing.parent.exists()
    path = tmp_path / F.VGPU_CONFIG_FILE
    nothing = await C.change_target_config(path, SHRINK, create=True)  # a file would hold nothing
    assert (nothing.state, nothing.missing) == (ConfigState.NO_CONFIG, "it does not exist")
    bad = functools.partial(V.extend_config, added=[AddedDevice(16, limits(ADDED))])
    with pytest.raises(ConfigError, match=r"host indexes 0\.\.15"):
        await C.change_target_config(path, bad, create=True)
    assert list(tmp_path.iterdir()) == []


async def test_create_never_goes_through_a_symlink(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    linked_dir = tmp_path / "config"
    linked_dir.symlink_to(elsewhere)
    with pytest.raises(ConfigError, match=r"is not a directory \(a symbolic link is not followed\)"):
        await C.change_target_config(linked_dir / F.VGPU_CONFIG_FILE, EXTEND, create=True)
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    (real_dir / F.VGPU_CONFIG_FILE).symlink_to(elsewhere / F.VGPU_CONFIG_FILE)  # dangling
    with pytest.raises(ConfigError, match=r"symbolic link \(not followed\); nothing changed"):
        await C.change_target_config(real_dir / F.VGPU_CONFIG_FILE, EXTEND, create=True)
    assert list(elsewhere.iterdir()) == []
