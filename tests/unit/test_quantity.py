"""vgpud.quantity: the Kubernetes quantity grammar, exact values, and clear refusals."""

from __future__ import annotations

from decimal import Decimal

import pytest

from vgpud.quantity import MAX_EXPONENT, parse_quantity


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", "0"),
        ("1", "1"),
        ("+7", "7"),
        ("-3", "-3"),
        ("1.5", "1.5"),
        ("5.", "5"),
        (".5", "0.5"),
        ("100m", "0.1"),
        ("250u", "0.00025"),
        ("3n", "0.000000003"),
        ("1k", "1000"),
        ("2M", "2000000"),
        ("1G", "1000000000"),
        ("1T", "1" + "0" * 12),
        ("1P", "1" + "0" * 15),
        ("1E", "1" + "0" * 18),
        ("1Ki", "1024"),
        ("200Mi", str(200 * 1024**2)),
        ("1.5Gi", str(3 * 1024**3 // 2)),
        ("1Ti", str(1024**4)),
        ("1Pi", str(1024**5)),
        ("2Ei", str(2 * 1024**6)),
        ("4e3", "4000"),
        ("4E3", "4000"),
        ("12e-2", "0.12"),
        ("1e+2", "100"),
        ("-1.25Ki", "-1280"),
    ],
)
def test_parses_exactly(text: str, expected: str) -> None:
    assert parse_quantity(text) == Decimal(expected)


def test_numbers_pass_as_themselves() -> None:
    assert parse_quantity(40960) == 40960
    assert parse_quantity(Decimal("2.5")) == Decimal("2.5")
    assert parse_quantity(0.1) == Decimal("0.1")  # the float's shortest repr, not its binary expansion


@pytest.mark.parametrize(
    "bad",
    [
        "",
        " 1",
        "1 ",
        "1_000",
        "NaN",
        "Infinity",
        "inf",
        "1.2.3",
        ".",
        "+",
        "1ki",  # binary suffixes are upper case (but k)
        "1mi",
        "1KiB",
        "1Gb",
        "1K",  # decimal kilo is k
        "1e",
        "1e1.5",
        "1Mi2",
        "Mi",
        "0x10",
        f"1e{MAX_EXPONENT + 1}",
    ],
)
def test_refuses_what_is_not_a_quantity(bad: str) -> None:
    with pytest.raises(ValueError, match=r"quantity|exponent"):
        parse_quantity(bad)


@pytest.mark.parametrize("bad", [True, None, [1], float("nan"), float("inf"), Decimal("NaN")])
def test_refuses_other_types_and_non_finite_numbers(bad: object) -> None:
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity(bad)  # type: ignore[arg-type]
