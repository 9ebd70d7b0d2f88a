"""The attachment file: round trip, other boot, corruption moved aside, no symlinks, atomic 0600."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.hotplug.world import CLAIMS, KEY, OTHER_SLAVE, TARGET
from vgpud.hotplug.rules import AttachKey, Attachment, AttachState
from vgpud.hotplug.store import HOTPLUG_FILE, AttachmentStore, StoreError, decode, encode

BOOT = "5b1e7d7c-0c1a-4d7e-9d0e-3f2b2f1c9a01"
FIRST = Attachment(KEY, "c" * 64, "team", "trainer", CLAIMS, 1700000000.25)
SECOND = replace(
    FIRST, key=AttachKey(TARGET, "app", OTHER_SLAVE), claims=(), attached_at=5.0, state=AttachState.DETACHING
)
TABLE = {FIRST.key: FIRST, SECOND.key: SECOND}


@pytest.fixture
def store(tmp_path: Path) -> AttachmentStore:
    return AttachmentStore(tmp_path / "plugin" / HOTPLUG_FILE, BOOT)


def test_round_trip_keeps_everything_but_the_live_reservations(store: AttachmentStore) -> None:
    store.save(TABLE)
    loaded = store.load()
    assert loaded.keys() == TABLE.keys()
    # reservedFor is the claim watch's live view, not part of the record
    assert loaded[KEY] == replace(FIRST, claims=tuple(replace(c, reserved_for=frozenset()) for c in CLAIMS))
    assert loaded[SECOND.key] == SECOND
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert encode(BOOT, TABLE) == encode(BOOT, dict(reversed(TABLE.items())))  # key order, not insertion


def test_missing_file_is_an_empty_table(store: AttachmentStore) -> None:
    assert store.load() == {}


def test_a_file_from_another_boot_is_discarded(store: AttachmentStore) -> None:
    store.save(TABLE)
    assert AttachmentStore(store.path, "another-boot").load() == {}
    assert store.path.exists()  # not quarantined: it was valid


def _record() -> dict:
    return json.loads(encode(BOOT, {KEY: FIRST}))


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda o: o.update(version=2), "version 2"),
        (lambda o: o.pop("nodeBootID"), "nodeBootID must be a string"),
        (lambda o: o["attachments"][0].update(targetPodUID="../etc"), "not a pod UID"),
        (lambda o: o["attachments"][0].update(containerName="A/B"), "not a DNS label"),
        (lambda o: o["attachments"][0].update(attachedAt="now"), "attachedAt must be a number"),
        (
            lambda o: o["attachments"][0].update(state="half"),
            "state 'half' is not one of attaching, attached",
        ),
        (lambda o: o["attachments"][0].pop("state"), "state must be a string"),
        (lambda o: o["attachments"][0]["claims"][0].update(devices=[1]), "devices must be a list of strings"),
        (lambda o: o["attachments"].append(dict(o["attachments"][0])), "listed twice"),
        (lambda o: o.update(attachments={}), "attachments must be a list"),
    ],
)
def test_a_malformed_record_is_moved_aside(
    store: AttachmentStore, caplog: pytest.LogCaptureFixture, mutate, reason: str
) -> None:
    obj = _record()
    mutate(obj)
    store.path.parent.mkdir()
    store.path.write_text(json.dumps(obj))
    with pytest.raises(ValueError, match=reason):
        decode(store.path.read_bytes())
    with caplog.at_level(logging.ERROR, "vgpud.hotplug"):
        assert store.load() == {}
    assert reason in caplog.text
    assert not store.path.exists()
    (aside,) = store.path.parent.glob(f"{HOTPLUG_FILE}.corrupt-*")
    assert json.loads(aside.read_text()) == obj  # kept for the operator
    store.save({KEY: FIRST})  # and the next save starts a new file
    assert store.load().keys() == {KEY}


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=512))
def test_arbitrary_bytes_decode_or_raise_value_error(data: bytes) -> None:
    with contextlib.suppress(ValueError):
        decode(data)


def test_a_symlink_is_never_followed(store: AttachmentStore, tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.write_text("keep me")
    store.path.parent.mkdir()
    store.path.symlink_to(precious)
    with pytest.raises(StoreError, match="symlink"):
        store.load()
    with pytest.raises(StoreError, match="symbolic link"):
        store.save(TABLE)
    assert precious.read_text() == "keep me" and store.path.is_symlink()


def test_a_fifo_is_refused_without_blocking(store: AttachmentStore) -> None:
    store.path.parent.mkdir()
    os.mkfifo(store.path)
    with pytest.raises(StoreError, match="not a regular file"):
        store.load()


def test_a_failed_write_leaves_the_old_file(store: AttachmentStore) -> None:
    store.save({KEY: FIRST})
    before = store.path.read_bytes()
    with pytest.raises(StoreError, match="cannot encode"):
        store.save({KEY: replace(FIRST, attached_at=float("nan"))})
    assert store.path.read_bytes() == before
    assert [p.name for p in store.path.parent.iterdir()] == [HOTPLUG_FILE]  # no temp file left


def test_something_else_at_the_path_is_refused_and_kept(store: AttachmentStore) -> None:
    store.path.mkdir(parents=True)
    with pytest.raises(StoreError, match="not a regular file"):
        store.save(TABLE)
    with pytest.raises(StoreError, match="not a regular file"):
        store.load()
    assert store.path.is_dir()
