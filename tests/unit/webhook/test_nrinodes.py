"""Which requests and claim specs select NRI nodes: the selector forms that count (plain, and CEL's
optional one for a roll from a vgpud without nriMode), those that do not, the NRI DeviceClasses, and
each request shape (exactly, firstAvailable, v1beta1)."""

from __future__ import annotations

from typing import Any

import pytest

from tests import objects as o
from vgpud.relaxations import nri_selector, nri_selector_optional
from vgpud.webhook.nrinodes import is_nri_selector, request_selects_nri_nodes, spec_selects_nri_nodes

DRIVER = o.DRIVER
NRI_CLASSES = frozenset({"vgpu-manager-nri"})


@pytest.mark.parametrize(
    "expression",
    [
        nri_selector(DRIVER),
        "device.attributes['manager.nvidia.com'].nriMode == true",
        'device.attributes["manager.nvidia.com"].nriMode == true',
        "device.attributes['manager.nvidia.com'].nriMode==true",
        "device.attributes['manager.nvidia.com'].nriMode",
        'device.attributes["manager.nvidia.com"].nriMode',
        "  device . attributes [ 'manager.nvidia.com' ] . nriMode  ==  true  ",
        "device.attributes['manager.nvidia.com'].nriMode\n\t== true\n",
        # CEL's optional syntax: false on a device without the attribute
        nri_selector_optional(DRIVER),
        "device.attributes['manager.nvidia.com'].?nriMode.orValue(false)",
        'device.attributes["manager.nvidia.com"].?nriMode.orValue(false)',
        "device.attributes['manager.nvidia.com'].?nriMode.orValue(false) == true",
        'device.attributes["manager.nvidia.com"].?nriMode.orValue(false)==true',
        "  device . attributes [ 'manager.nvidia.com' ] .? nriMode . orValue ( false )  ==  true  ",
        "device.attributes['manager.nvidia.com']\n\t.?nriMode\n\t.orValue(\tfalse\n)\n",
        "device.attributes['manager.nvidia.com']. ? nriMode.orValue(false)",  # `.` and `?`: two tokens
    ],
)
def test_the_attribute_test_counts(expression: str) -> None:
    assert is_nri_selector(expression, DRIVER)


@pytest.mark.parametrize(
    "expression",
    [
        "device.attributes['other.example.com'].nriMode == true",  # another driver's attribute
        "device.attributes['manager.nvidia.com '].nriMode == true",  # space inside the key
        "device.attributes['manager.nvidia.com\"].nriMode == true",  # mismatched quotes
        "device.attributes['manager.nvidia.com'].nriMode != false",
        "device.attributes['manager.nvidia.com'].nriMode == false",
        "!device.attributes['manager.nvidia.com'].nriMode",
        "device.attributes['manager.nvidia.com'].nriMode == true || true",
        "device.attributes['manager.nvidia.com'].nriMode || device.attributes['manager.nvidia.com'].x",
        "device.attributes['manager.nvidia.com'].nriMode == true && device.driver == 'manager.nvidia.com'",
        "(device.attributes['manager.nvidia.com'].nriMode == true)",
        "true == device.attributes['manager.nvidia.com'].nriMode",
        "device.attributes['manager.nvidia.com'].nriMode == True",
        "device.attributes['manager.nvidia.com'].nrimode == true",
        "device.attributes['manager.nvidia.com'].nriModeX",
        "device.capacity['manager.nvidia.com'].nriMode == true",
        "device.attributes['manager.nvidia.com'].nriMode == true // comment",
        # the optional form: only `orValue(false)` (true would select nodes without the attribute)
        "device.attributes['manager.nvidia.com'].?nriMode.orValue(true)",
        "device.attributes['manager.nvidia.com'].?nriMode.orValue(true) == true",
        "device.attributes['other.example.com'].?nriMode.orValue(false)",
        "device.attributes['manager.nvidia.com'].?nriMode",
        "device.attributes['manager.nvidia.com'].?nriMode == true",
        "device.attributes['manager.nvidia.com'].?nriMode.hasValue()",
        "device.attributes['manager.nvidia.com'].?nriMode.orValue(false) || x",
        "device.attributes['manager.nvidia.com'].?nriMode.orValue(false) || true",
        "device.attributes['manager.nvidia.com'].?nriMode.orValue(false) == false",
        "device.attributes['manager.nvidia.com'].?nriMode.orValue(false) != false",
        "!device.attributes['manager.nvidia.com'].?nriMode.orValue(false)",
        "!!device.attributes['manager.nvidia.com'].?nriMode.orValue(false)",
        "!device.attributes['manager.nvidia.com'].?nriMode.orValue(true)",
        "device.attributes['manager.nvidia.com'].?nriMode.orValue(False)",
        "device.attributes['manager.nvidia.com'].?nriMode.orValue()",
        "device.attributes['manager.nvidia.com'].?nriMode.orValue(0)",
        "device.attributes['manager.nvidia.com'].?nriMode.value()",
        "device.attributes['manager.nvidia.com'].?nriMode.orValue(false).orValue(false)",
        "device.attributes['manager.nvidia.com'].nriMode.orValue(false)",  # no `?`
        "device.attributes['manager.nvidia.com']?.nriMode.orValue(false)",  # `?.` is not CEL's
        "device.attributes[?'manager.nvidia.com'].?nriMode.orValue(false)",
        "",
        None,
        42,
    ],
)
def test_anything_else_does_not(expression: Any) -> None:
    assert not is_nri_selector(expression, DRIVER)


def test_the_driver_is_matched_literally() -> None:
    """A driver name's dots are dots, not any character."""
    assert not is_nri_selector("device.attributes['managerXnvidiaXcom'].nriMode", DRIVER)
    assert is_nri_selector(nri_selector("vgpu.example.com"), "vgpu.example.com")
    assert not is_nri_selector("device.attributes['managerXnvidiaXcom'].?nriMode.orValue(false)", DRIVER)
    assert is_nri_selector(nri_selector_optional("vgpu.example.com"), "vgpu.example.com")


SELECTOR = [{"cel": {"expression": nri_selector(DRIVER)}}]
OPTIONAL = [{"cel": {"expression": nri_selector_optional(DRIVER)}}]
OTHER = [{"cel": {"expression": "device.attributes['manager.nvidia.com'].model == 'A100'"}}]


def exactly(device_class: str = "vgpu-manager", selectors: list[Any] | None = None) -> dict[str, Any]:
    request: dict[str, Any] = {"name": "r", "exactly": {"deviceClassName": device_class}}
    if selectors is not None:
        request["exactly"]["selectors"] = selectors
    return request


def first_available(*alternatives: tuple[str, list[Any] | None]) -> dict[str, Any]:
    subs = []
    for n, (device_class, selectors) in enumerate(alternatives):
        sub: dict[str, Any] = {"name": f"s{n}", "deviceClassName": device_class}
        if selectors is not None:
            sub["selectors"] = selectors
        subs.append(sub)
    return {"name": "r", "firstAvailable": subs}


@pytest.mark.parametrize(
    ("request_", "selects"),
    [
        (exactly(), False),
        (exactly(selectors=OTHER), False),
        (exactly(selectors=SELECTOR), True),
        (exactly(selectors=OTHER + SELECTOR), True),  # selectors are ANDed: one is enough
        (exactly(selectors=OPTIONAL), True),
        (exactly(selectors=OTHER + OPTIONAL), True),
        (exactly("vgpu-manager-nri"), True),
        (exactly("vgpu-manager-nri", OTHER), True),
        (exactly(selectors=[{"cel": None}, {"x": 1}, "junk"]), False),
        (exactly(selectors=[{"cel": {"expression": ["device..."]}}]), False),
        (first_available(("vgpu-manager", SELECTOR), ("vgpu-manager-nri", None)), True),
        (first_available(("vgpu-manager", SELECTOR), ("vgpu-manager", None)), False),
        (first_available(("vgpu-manager", SELECTOR), ("vgpu-manager", OPTIONAL)), True),
        (first_available(("vgpu-manager", None), ("vgpu-manager-nri", OTHER)), False),
        ({"name": "r", "deviceClassName": "vgpu-manager", "selectors": SELECTOR}, True),  # v1beta1
        ({"name": "r", "deviceClassName": "vgpu-manager-nri"}, True),  # v1beta1
        ({"name": "r", "deviceClassName": "vgpu-manager"}, False),  # v1beta1
        ({"name": "r", "exactly": {"deviceClassName": ["vgpu-manager-nri"]}}, False),
        ({"name": "r"}, False),
    ],
    ids=[
        "exactly, no selector",
        "exactly, another selector",
        "exactly, the selector",
        "exactly, another selector and the selector",
        "exactly, the optional selector",
        "exactly, another selector and the optional selector",
        "exactly, the NRI class",
        "exactly, the NRI class and another selector",
        "exactly, selectors without CEL",
        "exactly, an expression that is not a string",
        "firstAvailable, every alternative",
        "firstAvailable, one alternative not",
        "firstAvailable, the selector and the optional selector",
        "firstAvailable, the NRI class alternative's own selector does not matter, the other's does",
        "v1beta1, the selector",
        "v1beta1, the NRI class",
        "v1beta1, neither",
        "exactly, a class that is not a string",
        "no device class",
    ],
)
def test_request_selects_nri_nodes(request_: dict[str, Any], selects: bool) -> None:
    assert request_selects_nri_nodes(request_, DRIVER, NRI_CLASSES) is selects


def test_without_nri_classes_only_the_selector_counts() -> None:
    assert not request_selects_nri_nodes(exactly("vgpu-manager-nri"), DRIVER, frozenset())
    assert request_selects_nri_nodes(exactly(selectors=SELECTOR), DRIVER, frozenset())


def spec(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {"requests": list(requests)}}


def named(name: str, request: dict[str, Any]) -> dict[str, Any]:
    return {**request, "name": name}


@pytest.mark.parametrize(
    ("claim_spec", "requests", "selects"),
    [
        (
            spec(named("a", exactly(selectors=SELECTOR)), named("b", exactly("vgpu-manager-nri"))),
            {"a", "b"},
            True,
        ),
        (spec(named("a", exactly(selectors=SELECTOR)), named("b", exactly())), {"a", "b"}, False),
        # only the vGPU requests are asked: a NIC request needs no selector
        (spec(named("a", exactly(selectors=SELECTOR)), named("nic", exactly("dranet"))), {"a"}, True),
        (spec(named("a", exactly(selectors=SELECTOR))), {"a", "gone"}, False),  # a name the spec lacks
        (spec(), set(), True),
        (None, {"a"}, False),
        ({"devices": {"requests": "x"}}, {"a"}, False),
    ],
    ids=[
        "every vGPU request",
        "one vGPU request not",
        "a non-vGPU request is not asked",
        "an allocated request the spec does not name",
        "no vGPU request",
        "no spec",
        "requests not a list",
    ],
)
def test_spec_selects_nri_nodes(claim_spec: Any, requests: set[str], selects: bool) -> None:
    assert spec_selects_nri_nodes(claim_spec, requests, DRIVER, NRI_CLASSES) is selects
