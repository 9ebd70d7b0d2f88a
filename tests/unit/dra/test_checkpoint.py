"""The checkpoint: codec round trip, every corruption refused, quarantine, boot id, atomic 0600 writes."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vgpud.dra import checkpoint as cpmod
from vgpud.dra.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    ClaimEntry,
    PreparedDevice,
    PrepareState,
    checksum,
    decode,
    encode,
    read_boot_id,
)
from vgpud.partition.assigner import PartitionRecord

PROPERTY = settings(max_examples=150, deadline=None)
BOOT = "5b1e7d7c-0c1a-4d7e-9d0e-3f2b2f1c9a01"
UID = "0f8e6a4c-1b2d-4c3e-8f9a-0b1c2d3e4f5a"


def entry(**overrides: object) -> ClaimEntry:
    values: dict[str, object] = {
        "state": PrepareState.COMPLETED,
        "name": "claim-a",
        "namespace": "team",
        "prepared_devices": (
            PreparedDevice(
                ("gpu",), "node-1", "vgpu-0", (f"k8s.manager.nvidia.com/claim={UID}-gpu-vgpu-0-0",)
            ),
            PreparedDevice(("gpu",), "node-1", "vgpu-1", ("k8s.manager.nvidia.com/claim=x",), share_id="s-1"),
        ),
        "partition": PartitionRecord({"gpu": "pod-1-app/0"}, {"8a9b": "pod-1-app/0"}).to_dict(),
    }
    values.update(overrides)
    return ClaimEntry(**values)  # type: ignore[arg-type]


def sample() -> Checkpoint:
    return Checkpoint(BOOT).with_claim(UID, entry()).with_claim("other", entry(state=PrepareState.STARTED))


def resign(obj: dict) -> bytes:
    """A file whose checksum matches its (possibly malformed) v2: only the shape checks can catch it."""
    obj["checksum"] = checksum(obj["v2"])
    return json.dumps(obj).encode()


# --------------------------------------------------------------------------------------------------
# Codec

names = st.text(min_size=0, max_size=12)
devices = st.builds(
    PreparedDevice,
    request_names=st.lists(names, max_size=3).map(tuple),
    pool=names,
    device=names,
    cdi_device_ids=st.lists(names, max_size=3).map(tuple),
    share_id=st.none() | names,
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | names,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(names, inner, max_size=3),
    max_leaves=10,
)
entries = st.builds(
    ClaimEntry,
    state=st.sampled_from(PrepareState),
    name=names,
    namespace=names,
    prepared_devices=st.lists(devices, max_size=4).map(tuple),
    partition=st.builds(
        PartitionRecord,
        st.dictionaries(names, names, max_size=3),
        st.dictionaries(names, names, max_size=3),
    ).map(PartitionRecord.to_dict),
    vgpu=st.booleans(),
    status=st.dictionaries(names, json_values, max_size=3),
)
checkpoints = st.builds(Checkpoint, boot_id=names, claims=st.dictionaries(names, entries, max_size=4))


@PROPERTY
@given(checkpoints)
def test_round_trip(cp: Checkpoint) -> None:
    data = encode(cp)
    assert decode(data) == cp
    assert encode(decode(data)) == data  # deterministic: the same content gives the same bytes


@PROPERTY
@given(devices)
def test_prepared_device_round_trip(device: PreparedDevice) -> None:
    assert PreparedDevice.from_dict(device.to_dict()) == device


def test_the_reference_layout() -> None:
    obj = json.loads(encode(sample()))
    assert set(obj) == {"checksum", "v2"}
    assert obj["v2"]["nodeBootID"] == BOOT
    claim = obj["v2"]["preparedClaims"][UID]
    assert claim["checkpointState"] == "PrepareCompleted"
    assert (claim["name"], claim["namespace"], claim["status"], claim["vgpu"]) == (
        "claim-a",
        "team",
        {},
        True,
    )
    assert claim["partition"] == {
        "requestPartitions": {"gpu": "pod-1-app/0"},
        "registerUUIDs": {"8a9b": "pod-1-app/0"},
    }
    assert PartitionRecord.from_dict(claim["partition"]) == PartitionRecord(
        {"gpu": "pod-1-app/0"}, {"8a9b": "pod-1-app/0"}
    )
    first, second = claim["preparedDevices"]
    assert first == {
        "requestNames": ["gpu"],
        "poolName": "node-1",
        "deviceName": "vgpu-0",
        "cdiDeviceIDs": [f"k8s.manager.nvidia.com/claim={UID}-gpu-vgpu-0-0"],
    }
    assert second["shareID"] == "s-1"


def test_checksum_covers_content_not_formatting() -> None:
    obj = json.loads(encode(sample()))
    assert decode(json.dumps(obj, indent=4).encode()) == sample()  # re-indented by hand: still valid


def test_immutable_updates() -> None:
    base = Checkpoint(BOOT)
    one = base.with_claim(UID, entry())
    assert base.claims == {} and set(one.claims) == {UID}
    assert one.without_claim(UID) == base and one.without_claim("absent") == one
    assert set(one.claims) == {UID}


CORRUPT = {
    "empty": b"",
    "truncated": encode(sample())[:-20],
    "not JSON": b"checkpoint, v2",
    "not UTF-8": b'{"checksum": 1, "v2": "\xff"}',
    "deeply nested": b"[" * 100_000 + b"]" * 100_000,
    "a list": b"[]",
    "no checksum": json.dumps({"v2": json.loads(encode(sample()))["v2"]}).encode(),
    "checksum a string": json.dumps({"checksum": str(checksum({})), "v2": {}}).encode(),
    "checksum a bool": json.dumps({"checksum": True, "v2": {}}).encode(),
    "v2 a list": json.dumps({"checksum": checksum([]), "v2": []}).encode(),
    "wrong checksum": encode(sample()).replace(b"claim-a", b"claim-b"),
    "v2 missing": resign({"v2": None}),
}


def _tamper(path: tuple[str, ...], value: object) -> bytes:
    obj = json.loads(encode(sample()))
    target = obj["v2"]
    for key in path[:-1]:
        target = target[key] if not isinstance(target, list) else target[int(key)]
    if isinstance(target, list):
        target[int(path[-1])] = value
    else:
        target[path[-1]] = value
    return resign(obj)


SHAPES = {
    "boot id a number": (("nodeBootID",), 5),
    "claims a list": (("preparedClaims",), []),
    "claim a string": (("preparedClaims", UID), "x"),
    "unknown state": (("preparedClaims", UID, "checkpointState"), "PrepareHalfway"),
    "state missing": (("preparedClaims", UID, "checkpointState"), None),
    "name a number": (("preparedClaims", UID, "name"), 3),
    "status a list": (("preparedClaims", UID, "status"), []),
    "partition a string": (("preparedClaims", UID, "partition"), "p"),
    "vgpu a string": (("preparedClaims", UID, "vgpu"), "yes"),
    "vgpu a number": (("preparedClaims", UID, "vgpu"), 1),
    "devices an object": (("preparedClaims", UID, "preparedDevices"), {}),
    "device a string": (("preparedClaims", UID, "preparedDevices", "0"), "vgpu-0"),
    "pool missing": (("preparedClaims", UID, "preparedDevices", "0", "poolName"), None),
    "device name a list": (("preparedClaims", UID, "preparedDevices", "0", "deviceName"), ["vgpu-0"]),
    "request names of numbers": (("preparedClaims", UID, "preparedDevices", "0", "requestNames"), [1]),
    "cdi ids a string": (("preparedClaims", UID, "preparedDevices", "0", "cdiDeviceIDs"), "k8s.x/claim=y"),
    "share id a number": (("preparedClaims", UID, "preparedDevices", "1", "shareID"), 7),
}


@pytest.mark.parametrize("data", CORRUPT.values(), ids=CORRUPT.keys())
def test_corruption_is_refused(data: bytes) -> None:
    with pytest.raises(CheckpointError):
        decode(data)


@pytest.mark.parametrize("case", SHAPES.values(), ids=SHAPES.keys())
def test_a_wrong_shape_with_a_valid_checksum_is_refused(case: tuple[tuple[str, ...], object]) -> None:
    with pytest.raises(CheckpointError):
        decode(_tamper(*case))


def test_errors_say_what_is_wrong() -> None:
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        decode(CORRUPT["wrong checksum"])
    for bad in ("checksum a bool", "checksum a string", "no checksum"):
        with pytest.raises(CheckpointError, match="checksum is missing or not an integer"):
            decode(CORRUPT[bad])
    with pytest.raises(CheckpointError, match="unknown checkpointState 'PrepareHalfway'"):
        decode(_tamper(*SHAPES["unknown state"]))
    with pytest.raises(CheckpointError, match=f"claim {UID}: vgpu must be a boolean"):
        decode(_tamper(*SHAPES["vgpu a number"]))


@PROPERTY
@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_escape_as_anything_but_checkpoint_error(data: bytes) -> None:
    with contextlib.suppress(CheckpointError):
        decode(data)


def test_absent_optional_fields_take_their_defaults() -> None:
    v2 = {"preparedClaims": {UID: {"checkpointState": "PrepareStarted"}}, "nodeBootID": BOOT}
    cp = decode(resign({"v2": v2}))
    assert cp.claims[UID] == ClaimEntry(PrepareState.STARTED, "", "")
    assert cp.claims[UID].state is PrepareState.STARTED and cp.claims[UID].vgpu is True


# --------------------------------------------------------------------------------------------------
# Store


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "checkpoint.json", BOOT)


def test_missing_file_loads_empty(store: CheckpointStore) -> None:
    assert store.load() == Checkpoint(BOOT)


def test_save_then_load(store: CheckpointStore) -> None:
    store.save(sample())
    assert store.load() == sample()
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600


def test_mode_is_0600_whatever_the_umask(store: CheckpointStore) -> None:
    old = os.umask(0o000)
    try:
        store.save(sample())
    finally:
        os.umask(old)
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600


def test_save_creates_the_plugin_dir(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "plugins" / "manager.nvidia.com" / "checkpoint.json", BOOT)
    store.save(sample())
    assert store.load() == sample()


def test_another_boot_is_discarded(store: CheckpointStore, caplog: pytest.LogCaptureFixture) -> None:
    store.save(sample())
    rebooted = CheckpointStore(store.path, "another-boot")
    with caplog.at_level(logging.INFO, logger="vgpud.dra.checkpoint"):
        assert rebooted.load() == Checkpoint("another-boot")
    assert "node rebooted: discarding 2 claims" in caplog.text


@pytest.mark.parametrize(
    "data", [CORRUPT["truncated"], CORRUPT["wrong checksum"], _tamper(*SHAPES["unknown state"])]
)
def test_corrupt_file_is_quarantined_and_load_starts_empty(
    store: CheckpointStore, data: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    store.path.write_bytes(data)
    with caplog.at_level(logging.ERROR, logger="vgpud.dra.checkpoint"):
        assert store.load() == Checkpoint(BOOT)
    assert not store.path.exists()
    (aside,) = store.path.parent.glob("checkpoint.json.corrupt-*")
    assert aside.read_bytes() == data  # kept for a post-mortem
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    assert "is corrupt" in caplog.text and aside.name in caplog.text
    store.save(sample())  # and the node carries on
    assert store.load() == sample()


def test_two_quarantines_in_one_second_keep_both(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cpmod.time, "time", lambda: 1_700_000_000.5)
    for data in (b"one", b"two"):
        store.path.write_bytes(data)
        assert store.load() == Checkpoint(BOOT)
    kept = sorted(p.read_bytes() for p in store.path.parent.glob("checkpoint.json.corrupt-1700000000*"))
    assert kept == [b"one", b"two"]


def test_oversize_file_is_quarantined(store: CheckpointStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpmod, "MAX_CHECKPOINT_BYTES", 64)
    store.path.write_bytes(encode(sample()))
    assert store.load() == Checkpoint(BOOT)
    assert list(store.path.parent.glob("checkpoint.json.corrupt-*"))


def test_save_is_atomic_a_crash_before_rename_keeps_the_old_file(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.save(sample())
    before = store.path.read_bytes()

    def crash(src: object, dst: object) -> None:
        raise OSError(5, "simulated crash between write and rename")

    monkeypatch.setattr(cpmod.os, "replace", crash)
    with pytest.raises(CheckpointError, match="simulated crash"):
        store.save(Checkpoint(BOOT))
    assert store.path.read_bytes() == before
    assert sorted(p.name for p in store.path.parent.iterdir()) == ["checkpoint.json"]  # no temp left


def test_save_is_atomic_a_failed_write_leaves_no_temp(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.save(sample())
    before = store.path.read_bytes()

    def full(fd: int, data: object) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cpmod.os, "write", full)
    with pytest.raises(CheckpointError, match="No space left"):
        store.save(Checkpoint(BOOT))
    assert store.path.read_bytes() == before
    assert sorted(p.name for p in store.path.parent.iterdir()) == ["checkpoint.json"]


def test_save_replaces_by_rename(store: CheckpointStore) -> None:
    store.save(sample())
    with store.path.open("rb") as reader:
        store.save(Checkpoint(BOOT))
        assert decode(reader.read()) == sample()  # a reader of the old file still sees the old content
    assert store.load() == Checkpoint(BOOT)


def test_a_symlink_is_refused_and_its_target_untouched(store: CheckpointStore, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(encode(sample()))
    store.path.symlink_to(target)
    with pytest.raises(CheckpointError, match="symbolic link"):
        store.load()
    with pytest.raises(CheckpointError, match="symbolic link"):
        store.save(Checkpoint(BOOT))
    assert target.read_bytes() == encode(sample())
    assert store.path.is_symlink()


def test_a_dangling_symlink_is_refused_and_nothing_created(store: CheckpointStore, tmp_path: Path) -> None:
    store.path.symlink_to(tmp_path / "would-be-created")
    with pytest.raises(CheckpointError, match="symbolic link"):
        store.load()
    with pytest.raises(CheckpointError, match="symbolic link"):
        store.save(sample())
    assert not (tmp_path / "would-be-created").exists()


def test_a_directory_or_fifo_is_refused(store: CheckpointStore) -> None:
    store.path.mkdir()
    with pytest.raises(CheckpointError, match="not a regular file"):
        store.load()
    with pytest.raises(CheckpointError, match="not a regular file"):
        store.save(sample())
    store.path.rmdir()
    os.mkfifo(store.path)
    with pytest.raises(CheckpointError, match="not a regular file"):
        store.load()  # and it did not block waiting for a writer


def test_unencodable_content_is_a_checkpoint_error(store: CheckpointStore) -> None:
    for status in ({"x": float("nan")}, {"x": {1, 2}}, {1: "a", "b": "c"}):
        with pytest.raises(CheckpointError, match="cannot encode"):
            store.save(Checkpoint(BOOT).with_claim(UID, entry(status=status)))
    assert not store.path.exists()


def test_read_boot_id(tmp_path: Path) -> None:
    path = tmp_path / "boot_id"
    path.write_text(BOOT + "\n")
    assert read_boot_id(path) == BOOT
    path.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        read_boot_id(path)


def test_read_boot_id_of_this_machine() -> None:
    assert len(read_boot_id()) == 36
