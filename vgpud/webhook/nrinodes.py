"""Whether a claim keeps its vGPU devices on NRI nodes: what the webhook's relaxations ask (pure).

A relaxed shape is safe only where NRI gives each container its own directory (vgpud.relaxations).
The scheduler keeps a request on such nodes when every device it may get has the node's
`NRI_MODE_ATTRIBUTE` set, which a request says in one of two ways:

- its device class is one of the NRI DeviceClasses (`Policy.nri_classes`: NRI by name, whatever their
  own selectors say; the chart's `nriOnly` classes select the attribute, in the optional form below);
- one of its own CEL selectors is exactly the attribute test, in one of these forms (`<driver>` the
  driver's name, quoted with ' or "), each optionally followed by `== true`:

  - `device.attributes['<driver>'].nriMode` (`nri_selector(driver)`);
  - `device.attributes['<driver>'].?nriMode.orValue(false)` (`nri_selector_optional(driver)`): CEL's
    optional syntax, false on a device without the attribute, for a rolling upgrade from a vgpud that
    did not publish it (there the plain form is a CEL runtime error, "no such key", which aborts the
    allocation). Only `orValue(false)`: `orValue(true)` would also select the nodes without it.

  CEL's whitespace may separate any two tokens (`.` and `?` are two). Selectors are ANDed, so one such
  selector is enough; any other expression (another driver, `!= false`, `||`, `!`, the test inside a
  larger expression) does not count: deciding what a CEL expression implies is not this webhook's
  job, and a false "no" only costs a denial that says how to write the selector.

A `firstAvailable` request selects NRI nodes when every alternative does (the scheduler may pick any).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

from vgpud.relaxations import NRI_MODE_ATTRIBUTE

#: CEL's whitespace (its lexer's WHITESPACE token)
_WS = "[ \t\n\r\f]*"


@cache
def _attribute_test(driver: str) -> re.Pattern[str]:
    """`device.attributes['<driver>'].nriMode` or `device.attributes['<driver>'].?nriMode.orValue(false)`,
    optionally `== true`, tokens apart as CEL allows (its grammar has no `.?` token: `.` then `?`)."""
    dot = rf"{_WS}\.{_WS}"
    plain = rf"{dot}{NRI_MODE_ATTRIBUTE}"
    optional = rf"{dot}\?{_WS}{NRI_MODE_ATTRIBUTE}{dot}orValue{_WS}\({_WS}false{_WS}\)"
    return re.compile(
        rf"{_WS}device{dot}attributes{_WS}\[{_WS}(['\"]){re.escape(driver)}\1{_WS}\]"
        rf"(?:{plain}|{optional}){_WS}(?:=={_WS}true{_WS})?"
    )


def is_nri_selector(expression: Any, driver: str) -> bool:
    """Whether a CEL expression is exactly the test for `driver`'s NRI-mode attribute: the plain
    `nri_selector` or the optional `nri_selector_optional`, each optionally `== true`. The optional
    form counts only with `orValue(false)`; `orValue(true)` selects devices without the attribute too
    (the nodes of a vgpud that does not publish it, eager or not), so it does not."""
    return isinstance(expression, str) and _attribute_test(driver).fullmatch(expression) is not None


def _entries(value: Any) -> list[Mapping[str, Any]]:
    return [item for item in value if isinstance(item, Mapping)] if isinstance(value, list) else []


def _selects(device_request: Mapping[str, Any], driver: str, nri_classes: frozenset[str]) -> bool:
    """One device request (`exactly`, a `firstAvailable` alternative, a v1beta1 request)."""
    device_class = device_request.get("deviceClassName")
    if isinstance(device_class, str) and device_class in nri_classes:
        return True
    selectors = _entries(device_request.get("selectors"))
    return any(is_nri_selector(_cel(selector), driver) for selector in selectors)


def _cel(selector: Mapping[str, Any]) -> Any:
    cel = selector.get("cel")
    return cel.get("expression") if isinstance(cel, Mapping) else None


def request_selects_nri_nodes(request: Mapping[str, Any], driver: str, nri_classes: frozenset[str]) -> bool:
    """Whether a request of a claim spec (resource.k8s.io v1, v1beta2 or v1beta1) selects NRI nodes."""
    alternatives = _entries(request.get("firstAvailable"))
    if alternatives:
        return all(_selects(alternative, driver, nri_classes) for alternative in alternatives)
    exactly = request.get("exactly")
    return _selects(exactly if isinstance(exactly, Mapping) else request, driver, nri_classes)


def spec_selects_nri_nodes(
    spec: Any, requests: Iterable[str], driver: str, nri_classes: frozenset[str]
) -> bool:
    """Whether each of `requests` (a claim's vGPU requests, by name) selects NRI nodes in the claim
    spec `spec`; a name the spec does not have does not."""
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    by_name = {
        r.get("name"): r for r in _entries(devices.get("requests") if isinstance(devices, Mapping) else None)
    }
    return all(
        name in by_name and request_selects_nri_nodes(by_name[name], driver, nri_classes) for name in requests
    )
