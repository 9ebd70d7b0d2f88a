"""Kubernetes quantity strings ("40", "1Gi", "1536Mi", "2e9"), as `consumedCapacity` carries them.

Exact (Fractions, no floats) because memory limits are compared in whole MiB.
"""

from __future__ import annotations

import re
from fractions import Fraction

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}
_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exponent>[+-]?[0-9]+)|(?P<decimal>[numkMGTPE]?))$"
)


def parse_quantity(text: str) -> Fraction:
    """The exact value of a quantity; ValueError names the string when it is not one."""
    match = _QUANTITY.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity")
    number = Fraction(match["number"])
    if match["binary"]:
        return number * _BINARY[match["binary"]]
    if match["exponent"] is not None:
        return number * Fraction(10) ** int(match["exponent"])
    return number * _DECIMAL[match["decimal"] or ""]


def quantity_as_int(text: str) -> int | None:
    """The value as an integer, or None when it has a fraction (Go's `Quantity.AsInt64` ok=false)."""
    value = parse_quantity(text)
    return value.numerator if value.denominator == 1 else None
