"""tests/e2e/previous_vgpud.py plays a vgpud release that did not publish `nriMode` by replacing
`vgpud.dra.slicebuild.device_attributes`: that function must still exist and `build_slice` must still
look it up at each call, or the cluster's upgrade scenario would test today's vgpud twice."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e import previous_vgpud
from vgpud.dra import slicebuild
from vgpud.gpu.mock import load_profile, shipped_profiles
from vgpud.relaxations import NRI_MODE_ATTRIBUTE


@pytest.fixture
def patched() -> Iterator[None]:
    current = slicebuild.device_attributes
    slicebuild.device_attributes = previous_vgpud.device_attributes_without_nri_mode
    try:
        yield
    finally:
        slicebuild.device_attributes = current


def devices() -> list[dict[str, Any]]:
    gpus = load_profile(shipped_profiles()["a100-40gb-x2"])
    built = slicebuild.build_slice(
        driver="d.example.com", node_name="n", node_uid="u", gpus=gpus, nri_mode=True
    )
    return built["spec"]["devices"]


def test_todays_slice_says_nri_mode() -> None:
    assert all(d["attributes"][NRI_MODE_ATTRIBUTE] == {"bool": True} for d in devices())


def test_the_previous_release_leaves_it_out_and_nothing_else(patched: None) -> None:
    attributes = [d["attributes"] for d in devices()]
    assert attributes and all(NRI_MODE_ATTRIBUTE not in a for a in attributes)
    assert all(a["type"] == {"string": "vgpu"} for a in attributes)
