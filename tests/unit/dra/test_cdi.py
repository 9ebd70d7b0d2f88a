"""CDI specs: names, minimum cdiVersion, schema validity of everything we generate, atomic files."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vgpud.dra import checkpoint as cpmod
from vgpud.dra.cdi import (
    CDI_CLASS,
    ContainerEdits,
    cdi_kind,
    claim_spec,
    device_name,
    minimum_cdi_version,
    qualified_device_id,
    remove_spec,
    sanitize,
    spec_path,
    write_spec,
)
from vgpud.partition.layout import Layout, LayoutError, Mount, common_mounts, partition_mounts

PROPERTY = settings(max_examples=150, deadline=None)
DRIVER = "manager.nvidia.com"
UID = "0f8e6a4c-1b2d-4c3e-8f9a-0b1c2d3e4f5a"  # starts with a digit, as half of all UUIDs do
LETTER_UID = "af8e6a4c-1b2d-4c3e-8f9a-0b1c2d3e4f5a"
SCHEMA = json.loads((Path(__file__).parent / "cdi_schema.json").read_text())
VALIDATOR = jsonschema.Draft7Validator(SCHEMA)


def valid(spec: dict[str, Any]) -> dict[str, Any]:
    VALIDATOR.validate(spec)
    return spec


def test_the_schema_is_a_valid_draft7_schema() -> None:
    jsonschema.Draft7Validator.check_schema(SCHEMA)


# --------------------------------------------------------------------------------------------------
# Names


def test_kind_and_qualified_id() -> None:
    assert CDI_CLASS == "claim"
    assert cdi_kind(DRIVER) == "k8s.manager.nvidia.com/claim"
    assert qualified_device_id(DRIVER, "n-0") == "k8s.manager.nvidia.com/claim=n-0"


@pytest.mark.parametrize("driver", ["", "a/b", "dr iver", "driver."])
def test_a_driver_that_makes_no_cdi_vendor_is_refused(driver: str) -> None:
    with pytest.raises(ValueError, match="CDI vendor"):
        cdi_kind(driver)


def test_device_name_with_a_share_id() -> None:
    assert device_name(UID, "gpu", 3, "7c2a-11", 0) == f"{UID}-gpu-vgpu-3-share-7c2a-11"


@pytest.mark.parametrize("share_id", [None, ""])
def test_device_name_without_a_share_id_uses_the_ordinal(share_id: str | None) -> None:
    assert device_name(UID, "gpu", 3, share_id, 2) == f"{UID}-gpu-vgpu-3-2"


def test_device_name_sanitizes_every_token() -> None:
    assert device_name(UID, "main/sub", 0, None, 1) == f"{UID}-main-sub-vgpu-0-1"
    assert device_name("uid:1 x", "r@q", 1, "s/h", 0) == "uid-1-x-r-q-vgpu-1-share-s-h"
    assert sanitize("a.b_c-D9/é") == "a.b_c-D9--"


@pytest.mark.parametrize(
    "args",
    [
        ("", "gpu", 0, None, 0),
        (UID, "", 0, None, 0),
        (UID, "gpu", -1, None, 0),
        (UID, "gpu", 0, None, -1),
        (UID, "gpu", 0, "share/", 0),  # would end in '-': CDI refuses the name
        ("-uid", "gpu", 0, None, 0),  # would start with '-'
    ],
)
def test_device_names_cdi_would_refuse_are_refused(args: tuple[Any, ...]) -> None:
    with pytest.raises(ValueError):
        device_name(*args)


# --------------------------------------------------------------------------------------------------
# Specs

MOUNT = Mount.bind(
    PurePosixPath("/etc/vgpu-manager/registry"), PurePosixPath("/etc/vgpu-manager/registry"), read_only=True
)


def test_container_edits_to_cdi() -> None:
    assert ContainerEdits().to_cdi() == {}
    edits = ContainerEdits(env=("A=1", "B="), mounts=(MOUNT,))
    assert edits.to_cdi() == {
        "env": ["A=1", "B="],
        "mounts": [
            {
                "hostPath": "/etc/vgpu-manager/registry",
                "containerPath": "/etc/vgpu-manager/registry",
                "options": ["ro", "nosuid", "nodev", "bind"],
                "type": "bind",
            }
        ],
    }
    assert ContainerEdits.of({"B": "2", "A": "1"}, [MOUNT]) == ContainerEdits(("B=2", "A=1"), (MOUNT,))


@pytest.mark.parametrize("entry", ["NOEQUALS", "=value", ""])
def test_env_entries_must_be_name_equals_value(entry: str) -> None:
    with pytest.raises(ValueError, match="NAME=VALUE"):
        ContainerEdits(env=(entry,))


def test_claim_spec_layout() -> None:
    name = device_name(LETTER_UID, "gpu", 0, None, 0)
    spec = valid(
        claim_spec(
            DRIVER, LETTER_UID, [(name, ContainerEdits(env=("X=1",)))], ContainerEdits(mounts=(MOUNT,))
        )
    )
    assert list(spec) == ["cdiVersion", "kind", "devices", "containerEdits"]
    assert spec["kind"] == "k8s.manager.nvidia.com/claim"
    assert spec["devices"] == [{"name": name, "containerEdits": {"env": ["X=1"]}}]
    assert spec["containerEdits"]["mounts"][0]["type"] == "bind"
    assert spec["cdiVersion"] == "0.4.0"  # mount type


def test_claim_spec_omits_empty_common_edits() -> None:
    name = device_name(LETTER_UID, "gpu", 0, None, 0)
    for common in (None, ContainerEdits()):
        spec = valid(claim_spec(DRIVER, LETTER_UID, [(name, ContainerEdits())], common))
        assert "containerEdits" not in spec
        assert spec["devices"] == [{"name": name, "containerEdits": {}}]
        assert spec["cdiVersion"] == "0.3.0"


def test_a_claim_uid_starting_with_a_digit_needs_0_5_0() -> None:
    spec = valid(
        claim_spec(DRIVER, UID, [(device_name(UID, "gpu", 0, None, 0), ContainerEdits(mounts=(MOUNT,)))])
    )
    assert spec["cdiVersion"] == "0.5.0"


@pytest.mark.parametrize(
    ("devices", "match"),
    [
        ([], "at least one device"),
        ([(f"{LETTER_UID}-a", ContainerEdits()), (f"{LETTER_UID}-a", ContainerEdits())], "appears twice"),
        ([(f"{UID}-gpu-vgpu-0-0", ContainerEdits())], "claim-unique"),  # another claim's name
        ([(f"{LETTER_UID}-gpu-", ContainerEdits())], "claim-unique"),
    ],
)
def test_claim_spec_refuses_names_that_could_collide_or_fail(devices: list[Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        claim_spec(DRIVER, LETTER_UID, devices)


def test_a_full_vgpu_claim_spec_is_valid() -> None:
    layout = Layout(PurePosixPath("/etc/vgpu-manager"))
    common = ContainerEdits.of(
        {"LD_PRELOAD": "/etc/vgpu-manager/driver/libvgpu-control.so", "MANAGER_VGPU_CLAIM_UID": ""},
        common_mounts(layout, library_version="1.0.0", client_mode=False),
    )
    devices = [
        (
            device_name(UID, "gpu", minor, f"share-{minor}", minor),
            ContainerEdits.of(
                {f"MANAGER_VISIBLE_DEVICE_{minor}": f"GPU-{minor}", f"CUDA_MEM_LIMIT_{minor}": "1024m"},
                partition_mounts(layout, layout.partition(UID, f"pod-1-app/{minor}")),
            ),
        )
        for minor in range(2)
    ]
    spec = valid(claim_spec(DRIVER, UID, devices, common))
    assert spec["cdiVersion"] == "0.5.0"
    assert len(spec["devices"]) == 2 and len(spec["containerEdits"]["mounts"]) == 4


tokens = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=12)
paths = st.lists(st.from_regex(r"[a-z0-9._-]{1,8}", fullmatch=True), min_size=1, max_size=4).map(
    lambda parts: PurePosixPath("/", *parts)
)
mounts = st.builds(Mount.bind, paths, paths, read_only=st.booleans())
env_maps = st.dictionaries(
    st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True), st.text(max_size=10), max_size=4
)
edits = st.builds(ContainerEdits.of, env_maps, st.lists(mounts, max_size=3))


@PROPERTY
@given(
    uid=st.uuids().map(str),
    requests=st.lists(
        st.tuples(tokens, st.integers(0, 63), st.none() | st.uuids().map(str), edits), min_size=1, max_size=4
    ),
    common=st.none() | edits,
)
def test_every_generated_spec_validates_and_declares_its_minimum_version(
    uid: str, requests: list[tuple[str, int, str | None, ContainerEdits]], common: ContainerEdits | None
) -> None:
    named: dict[str, ContainerEdits] = {}
    for ordinal, (request, minor, share_id, device_edits) in enumerate(requests):
        try:
            name = device_name(uid, request, minor, share_id, ordinal)
        except ValueError:
            continue  # a request name sanitized into an invalid name is refused, never emitted
        named[name] = device_edits
    if not named:
        return
    spec = valid(claim_spec(DRIVER, uid, list(named.items()), common))
    has_mounts = any(e.mounts for e in named.values()) or bool(common and common.mounts)
    assert spec["cdiVersion"] == ("0.5.0" if uid[0].isdigit() else "0.4.0" if has_mounts else "0.3.0")
    for device in spec["devices"]:
        assert device["name"].startswith(f"{uid}-")


BASE: dict[str, Any] = {
    "cdiVersion": "1.1.0",
    "kind": "k8s.x/claim",
    "devices": [{"name": "a", "containerEdits": {}}],
}


def spec_with(**changes: Any) -> dict[str, Any]:
    spec = json.loads(json.dumps(BASE))
    device_edits = changes.pop("device_edits", None)
    if device_edits is not None:
        spec["devices"][0]["containerEdits"] = device_edits
    device_annotations = changes.pop("device_annotations", None)
    if device_annotations is not None:
        spec["devices"][0]["annotations"] = device_annotations
    name = changes.pop("name", None)
    if name is not None:
        spec["devices"][0]["name"] = name
    spec.update(changes)
    return spec


VERSION_RULES = {
    "nothing newer than 0.3.0": (spec_with(), "0.3.0"),
    "mount without a type": (
        spec_with(containerEdits={"mounts": [{"hostPath": "/a", "containerPath": "/b"}]}),
        "0.3.0",
    ),
    "mount type": (
        spec_with(device_edits={"mounts": [{"hostPath": "/a", "containerPath": "/b", "type": "bind"}]}),
        "0.4.0",
    ),
    "name starting with a digit": (spec_with(name="0abc"), "0.5.0"),
    "device node hostPath": (
        spec_with(containerEdits={"deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/y"}]}),
        "0.5.0",
    ),
    "device node without hostPath": (
        spec_with(containerEdits={"deviceNodes": [{"path": "/dev/x"}]}),
        "0.3.0",
    ),
    "spec annotations": (spec_with(annotations={"a": "b"}), "0.6.0"),
    "device annotations": (spec_with(device_annotations={"a": "b"}), "0.6.0"),
    "empty annotations": (spec_with(annotations={}), "0.3.0"),
    "dot in class": (spec_with(kind="k8s.x/cl.aim"), "0.6.0"),
    "dot only in vendor": (spec_with(kind="k8s.x.y/claim"), "0.3.0"),
    "intelRdt": (spec_with(device_edits={"intelRdt": {"closID": "c"}}), "0.7.0"),
    "empty intelRdt": (spec_with(containerEdits={"intelRdt": {}}), "0.7.0"),
    "additionalGids": (spec_with(containerEdits={"additionalGids": [5]}), "0.7.0"),
    "intelRdt enableMonitoring false": (
        spec_with(containerEdits={"intelRdt": {"enableMonitoring": False}}),
        "0.7.0",
    ),
    "intelRdt enableMonitoring": (
        spec_with(containerEdits={"intelRdt": {"enableMonitoring": True}}),
        "1.1.0",
    ),
    "intelRdt schemata": (spec_with(device_edits={"intelRdt": {"schemata": []}}), "1.1.0"),
    "netDevices": (
        spec_with(device_edits={"netDevices": [{"hostInterfaceName": "eth1", "name": "net1"}]}),
        "1.1.0",
    ),
    "the newest feature wins": (
        spec_with(
            name="9",
            annotations={"a": "b"},
            containerEdits={"netDevices": [{"hostInterfaceName": "e", "name": "n"}]},
        ),
        "1.1.0",
    ),
}


@pytest.mark.parametrize(("spec", "version"), VERSION_RULES.values(), ids=VERSION_RULES.keys())
def test_minimum_cdi_version_rules(spec: dict[str, Any], version: str) -> None:
    valid(spec)
    assert minimum_cdi_version(spec) == version


SCHEMA_REJECTS = {
    "no devices": {**BASE, "devices": []},
    "name starting with a dash": spec_with(name="-a"),
    "name ending with a dot": spec_with(name="a."),
    "env without =": spec_with(containerEdits={"env": ["A"]}),
    "relative container path": spec_with(
        containerEdits={"mounts": [{"hostPath": "/a", "containerPath": "b"}]}
    ),
    "unknown field": spec_with(extra=1),
    "unknown version": spec_with(cdiVersion="0.9.0"),
    "kind without a class": spec_with(kind="k8s.x"),
    "device without containerEdits": {**BASE, "devices": [{"name": "a"}]},
}


@pytest.mark.parametrize("spec", SCHEMA_REJECTS.values(), ids=SCHEMA_REJECTS.keys())
def test_the_schema_is_not_vacuous(spec: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        VALIDATOR.validate(spec)


# --------------------------------------------------------------------------------------------------
# Files


def sample_spec(uid: str = UID) -> dict[str, Any]:
    return claim_spec(DRIVER, uid, [(device_name(uid, "gpu", 0, None, 0), ContainerEdits(env=("A=1",)))])


def test_spec_path() -> None:
    assert spec_path(Path("/var/run/cdi"), DRIVER, UID) == Path(
        f"/var/run/cdi/k8s.manager.nvidia.com-claim_{UID}.json"
    )
    with pytest.raises(LayoutError):
        spec_path(Path("/var/run/cdi"), DRIVER, "../etc")


def test_write_then_remove(tmp_path: Path) -> None:
    root = tmp_path / "run" / "cdi"  # created on demand
    spec = sample_spec()
    path = write_spec(root, DRIVER, UID, spec)
    assert path == spec_path(root, DRIVER, UID)
    assert json.loads(path.read_text()) == spec
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert sorted(p.name for p in root.iterdir()) == [path.name]  # no temp file left behind
    assert remove_spec(root, DRIVER, UID) is True
    assert not path.exists()
    assert remove_spec(root, DRIVER, UID) is False  # missing is fine


def test_mode_is_0644_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        path = write_spec(tmp_path, DRIVER, UID, sample_spec())
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_rewrite_replaces_atomically(tmp_path: Path) -> None:
    first = write_spec(tmp_path, DRIVER, UID, sample_spec())
    old = first.read_bytes()
    updated = claim_spec(DRIVER, UID, [(device_name(UID, "gpu", 1, None, 0), ContainerEdits())])
    with first.open("rb") as reader:
        write_spec(tmp_path, DRIVER, UID, updated)
        assert reader.read() == old  # the runtime reading the old file sees it whole
    assert json.loads(first.read_text()) == updated


def test_a_crash_before_rename_keeps_the_old_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_spec(tmp_path, DRIVER, UID, sample_spec())
    old = path.read_bytes()

    def crash(src: object, dst: object) -> None:
        raise OSError(5, "simulated crash")

    monkeypatch.setattr(cpmod.os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        write_spec(tmp_path, DRIVER, UID, claim_spec(DRIVER, UID, [(f"{UID}-other", ContainerEdits())]))
    assert path.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_a_symlink_at_the_target_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    root = tmp_path / "cdi"
    root.mkdir()
    spec_path(root, DRIVER, UID).symlink_to(victim)
    with pytest.raises(OSError, match="symbolic link"):
        write_spec(root, DRIVER, UID, sample_spec())
    assert victim.read_text() == "precious" and spec_path(root, DRIVER, UID).is_symlink()
    assert [p.name for p in root.iterdir()] == [spec_path(root, DRIVER, UID).name]
    assert remove_spec(root, DRIVER, UID) is True  # removing unlinks the link itself, never the target
    assert victim.read_text() == "precious"


def test_a_directory_at_the_target_is_refused(tmp_path: Path) -> None:
    spec_path(tmp_path, DRIVER, UID).mkdir()
    with pytest.raises(OSError, match="not a regular file"):
        write_spec(tmp_path, DRIVER, UID, sample_spec())
    with pytest.raises(OSError, match="directory"):
        remove_spec(tmp_path, DRIVER, UID)
