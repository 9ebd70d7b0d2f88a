"""The device program compiler: the reference decision on known cases, the compiled program run by
a small interpreter (tests/unit/hotplug/bpfvm.py) against it on many rule lists and accesses, and
bad rules refused with the rule named."""

from __future__ import annotations

import itertools
import random

import pytest

from tests.unit.hotplug import bpfvm
from vgpud.containers.values import DeviceRule
from vgpud.hotplug.devfilter import compile_filter, verdict

U32_MAX = 0xFFFF_FFFF
ACCESSES = ("r", "w", "m", "rw", "rm", "wm", "rwm")


def allow(kind: str, major: int | None, minor: int | None, access: str = "rwm") -> DeviceRule:
    return DeviceRule(True, kind, major, minor, access)


def deny(kind: str, major: int | None, minor: int | None, access: str = "rwm") -> DeviceRule:
    return DeviceRule(False, kind, major, minor, access)


#: what containerd and runc give a plain container: deny all, then mknod anything, then the usual nodes
CONTAINER = [
    deny("a", None, None),
    allow("c", None, None, "m"),
    allow("b", None, None, "m"),
    allow("c", 1, 3),
    allow("c", 1, 5),
    allow("c", 136, None),
    allow("c", 5, 2),
]


Case = tuple[list[DeviceRule], str, int, int, str, bool]


@pytest.mark.parametrize(
    "case",
    [
        (CONTAINER, "c", 1, 3, "rw", True),
        (CONTAINER, "c", 1, 4, "r", False),
        (CONTAINER, "c", 1, 4, "m", True),
        (CONTAINER, "b", 8, 0, "m", True),
        (CONTAINER, "b", 8, 0, "r", False),
        (CONTAINER, "c", 136, 7, "rwm", True),
        (CONTAINER, "b", 136, 7, "r", False),
        ([*CONTAINER, allow("c", 195, 0, "rw")], "c", 195, 0, "rw", True),
        ([*CONTAINER, allow("c", 195, 0, "rw")], "c", 195, 1, "rw", False),
        ([], "c", 1, 3, "r", False),
        ([allow("a", None, None)], "b", 7, 9, "rwm", True),
        # the last rule that matches decides, bit by bit
        ([allow("c", 195, None, "rw"), deny("c", 195, 1, "w")], "c", 195, 1, "r", True),
        ([allow("c", 195, None, "rw"), deny("c", 195, 1, "w")], "c", 195, 1, "rw", False),
        ([allow("c", 195, None, "rw"), deny("c", 195, 1, "w")], "c", 195, 2, "rw", True),
        ([deny("c", 1, 3), allow("c", 1, 3, "r")], "c", 1, 3, "r", True),
        ([allow("c", 1, 3, "r"), deny("c", 1, 3)], "c", 1, 3, "r", False),
        ([allow("c", 1, 5, "r"), allow("c", 1, 5, "w")], "c", 1, 5, "rw", True),
        ([allow("a", None, None, "r")], "c", 1, 5, "rw", False),
        # numbers above 2**31 compare as unsigned 32-bit values
        ([allow("c", U32_MAX, U32_MAX)], "c", U32_MAX, U32_MAX, "rw", True),
        ([allow("c", 2**31, 0)], "c", 2**31, 0, "r", True),
        ([allow("c", 2**31, 0)], "c", 0, 0, "r", False),
    ],
)
def test_verdict_and_program_on_known_cases(case: Case) -> None:
    rules, dev_type, major, minor, access, expected = case
    assert verdict(rules, dev_type, major, minor, access) is expected
    ran = bpfvm.run(compile_filter(rules), bpfvm.access_type(dev_type, access), major, minor)
    assert ran == int(expected)


NUMBERS = (None, 0, 1, 3, 195, 2**31, U32_MAX)


def random_rules(rng: random.Random) -> list[DeviceRule]:
    return [
        DeviceRule(
            rng.random() < 0.7,
            rng.choice("abcc"),
            rng.choice(NUMBERS),
            rng.choice(NUMBERS),
            "".join(sorted(rng.sample("rwm", rng.randint(1, 3)))),
        )
        for _ in range(rng.randint(0, 8))
    ]


def test_program_decides_as_the_reference_on_random_rule_lists() -> None:
    """300 random lists x 336 devices and accesses: about 100k runs, at least 5k of each answer."""
    rng = random.Random(18)
    probes = list(
        itertools.product("bc", [n for n in NUMBERS if n is not None], (0, 3, 2**31, U32_MAX), ACCESSES)
    )
    seen = {True: 0, False: 0}
    for _ in range(300):
        rules = random_rules(rng)
        program = compile_filter(rules)
        for dev_type, major, minor, access in probes:
            expected = verdict(rules, dev_type, major, minor, access)
            got = bpfvm.run(program, bpfvm.access_type(dev_type, access), major, minor)
            assert got == int(expected), (rules, dev_type, major, minor, access)
            seen[expected] += 1
    assert min(seen.values()) > 5_000, seen


def test_program_grows_linearly_with_the_rules() -> None:
    """6 loads, 3 bit tests of 3 instructions; per bit named, a jump per field and one to go on;
    a default deny of 2 per bit, and the final allow of 2."""
    rule = allow("c", 195, 0, "rw")
    one = len(compile_filter([rule])) // 8
    hundred = len(compile_filter([rule] * 100)) // 8
    assert (one, hundred) == (6 + 9 + 2 * 4 + 3 * 2 + 2, 6 + 9 + 2 * 400 + 3 * 2 + 2)


@pytest.mark.parametrize(
    ("rule", "what"),
    [
        (DeviceRule(True, "x", 1, 3, "rw"), "type"),
        (DeviceRule(True, "c", 1, 3, ""), "access"),
        (DeviceRule(True, "c", 1, 3, "rx"), "access"),
        (DeviceRule(True, "c", -1, 3, "rw"), "major"),
        (DeviceRule(True, "c", 1, U32_MAX + 1, "rw"), "minor"),
        (DeviceRule(True, "c", True, 3, "rw"), "major"),
    ],
)
def test_bad_rules_are_refused_naming_the_rule(rule: DeviceRule, what: str) -> None:
    for call in (lambda: compile_filter([allow("c", 1, 3), rule]), lambda: verdict([rule], "c", 1, 3, "r")):
        with pytest.raises(ValueError, match=what) as info:
            call()
        assert repr(rule) in str(info.value)
