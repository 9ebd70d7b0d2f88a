"""Kubernetes resource quantities ("200Mi", "1.5", "4e3", "100m") as exact Decimals.

The grammar of apimachinery's resource.Quantity: a signed decimal number, then one suffix: a binary
SI one (Ki Mi Gi Ti Pi Ei), a decimal SI one (n u m k M G T P E) or a decimal exponent (e/E and a
signed integer). Here rather than the client library's parser, whose import loads the whole client
(+20 MiB resident, docs/decisions.md), and which lets through what the API server refuses ("NaN",
" 1", "1_000"). Pure: no I/O.
"""

from __future__ import annotations

import re
from decimal import Decimal

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<binary>[KMGTPE]i)|[eE](?P<exponent>[+-]?[0-9]+)|(?P<decimal>[numkMGTPE]?))"
)
#: the largest decimal exponent accepted: far beyond any real quantity, small enough to stay exact
MAX_EXPONENT = 1000


def parse_quantity(value: str | int | float | Decimal) -> Decimal:
    """`value` as an exact number; ValueError naming it when it is not a quantity (a bool is not)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, int | Decimal):
        number = Decimal(value)
    elif isinstance(value, float):
        number = Decimal(repr(value))
    elif isinstance(value, str):
        return _parse_text(value)
    else:
        raise ValueError(f"{value!r} is not a quantity (a {type(value).__name__})")
    if not number.is_finite():
        raise ValueError(f"{value!r} is not a finite quantity")
    return number


def _parse_text(text: str) -> Decimal:
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a quantity (a number with an optional suffix: Ki..Ei, n..E, e<N>)")
    number = Decimal(match["number"])
    if match["binary"] is not None:
        return number * 1024 ** _BINARY[match["binary"]]
    exponent = int(match["exponent"]) if match["exponent"] is not None else _DECIMAL[match["decimal"]]
    if abs(exponent) > MAX_EXPONENT:
        raise ValueError(f"{text!r}: exponent {exponent} is out of range (at most {MAX_EXPONENT} either way)")
    return number.scaleb(exponent)
