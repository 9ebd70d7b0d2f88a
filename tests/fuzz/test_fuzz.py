"""The short run of every fuzz target (`make fuzz` runs them at volume), and the driver's own checks:
a crash, a hang and a broken contract are each caught and reported with the input that replays them."""

from __future__ import annotations

import json
import random

import pytest

from tests.fuzz import target_webhook_https
from tests.fuzz.__main__ import IN_PROCESS
from tests.fuzz.driver import ContractBroken, Target, replay, run
from tests.fuzz.target_webhook import seed_reviews

SEED = 20261201
SHORT_N = 2000
HTTPS_N = 1000
#: distinct outcomes a short run must reach: the generators get past the first check of each surface
MIN_KINDS = {"nri": 30, "protobuf": 20, "registry": 20, "webhook": 80}
#: an outcome of each kind must be among them: valid inputs accepted, malformed ones refused
MUST_SEE = {
    "nri": ("server request", "client payload", "mux ok", "fastcodec ok", "MalformedMessage", "MuxError"),
    "protobuf": ("ok Request", "ok CreateContainerRequest", "ok ContainerDeviceRequest", "MalformedMessage"),
    "registry": ("query", "container", "GRPCError: INVALID_ARGUMENT", "BadRequest", "CgroupParseError"),
    "webhook": ("pods CREATE: 200", "pods CREATE: 403", "resourceclaims/status UPDATE: 200", "BadReview"),
}


@pytest.mark.parametrize("name", sorted(IN_PROCESS))
def test_short_run_finds_no_crash(name: str) -> None:
    tally = run(IN_PROCESS[name](SEED), SHORT_N, SEED)
    assert tally.crash_count == 0, "\n".join(c.describe(name, SEED) for c in tally.crashes)
    assert len(tally.kinds) >= MIN_KINDS[name], tally.kinds
    for prefix in MUST_SEE[name]:
        assert any(prefix in kind for kind in tally.kinds), (prefix, sorted(tally.kinds))
    assert 0 < tally.error_kinds() < len(tally.kinds)


def test_short_run_over_https_finds_no_crash() -> None:
    tally = target_webhook_https.run(HTTPS_N, SEED)
    assert tally.crash_count == 0, "\n".join(c.describe(tally.target, SEED) for c in tally.crashes)
    assert sum(tally.kinds.values()) == HTTPS_N + 1
    assert any("raw " in kind for kind in tally.kinds), sorted(tally.kinds)
    assert any("BadReview" in kind for kind in tally.kinds)
    assert tally.kinds["pods CREATE: 403"] > 0


def test_the_same_seed_gives_the_same_inputs() -> None:
    target = IN_PROCESS["protobuf"](SEED)
    first, second = random.Random(5), random.Random(5)
    assert [target.generate(first) for _ in range(50)] == [target.generate(second) for _ in range(50)]


def _planted(fault: BaseException | None, *, on: bytes = b"\x07") -> Target:
    """A target over single random bytes whose check fails on one of them."""

    def check(data: bytes) -> str:
        if data == on:
            if fault is None:
                while True:  # a decoder that never ends
                    pass
            raise fault
        return "ok"

    # a short bound only where the hang is planted: elsewhere a stalled machine must not look like one
    bound = 0.2 if fault is None else 5.0
    return Target("planted", lambda rng: bytes([rng.randrange(16)]), check, per_input_s=bound)


@pytest.mark.parametrize(
    ("fault", "reported"),
    [
        (IndexError("index out of range"), "IndexError: index out of range at "),
        (ContractBroken("does not round-trip"), "ContractBroken: does not round-trip"),
        (None, "Hang: one input ran longer than 0.2 s"),
    ],
)
def test_a_crash_is_reported_with_its_input_and_replays(fault: BaseException | None, reported: str) -> None:
    target = _planted(fault)
    tally = run(target, 40, seed=3)
    generator = random.Random(3)
    planted = sum(target.generate(generator) == b"\x07" for _ in range(40))
    assert tally.crash_count == planted > 0
    assert all(c.data == b"\x07" for c in tally.crashes)
    crash = tally.crashes[0]
    text = crash.describe("planted", 3)
    assert reported in text
    assert "seed 3" in text and "hex): 07" in text and "FUZZ_SEED=3" in text
    assert sum(tally.kinds.values()) + tally.crash_count == 40
    again = replay(target, crash.data)
    assert again.crash_count == 1 and again.crashes[0].error.startswith(reported.split(" at ", maxsplit=1)[0])


def test_https_answers_are_checked_against_parse_review() -> None:
    bad = b"{}"
    assert target_webhook_https.expect(
        bad, 400, b"bad AdmissionReview: AdmissionReview.apiVersion is missing\n"
    )
    with pytest.raises(ContractBroken, match="expected 400"):
        target_webhook_https.expect(bad, 200, b"{}")
    with pytest.raises(ContractBroken, match="expected 200"):
        target_webhook_https.expect(json.dumps(seed_reviews()[0]).encode(), 400, b"no")
