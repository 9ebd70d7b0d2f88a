"""The fuzz driver every target shares: seeded inputs in, the contract checked per input, a tally out.

A target is a generator of inputs (structured mutations of valid messages, and plain random bytes)
and a `check` that feeds one input to the real code. `check` returns the input's outcome: what was
accepted ("ok Request", "query"), or the documented error it met, named by `kind_of` ("error
MalformedMessage: length N runs past the end ..."); it raises
`ContractBroken` when the code answered outside its contract (a wrong round-trip, an answer of the
wrong shape). Any other exception out of `check` is a crash, and so is an input that takes longer
than `per_input_s` (a SIGALRM ends it: a hang is a crash too, not a stuck run).

Inputs are drawn from one `random.Random(seed)` per target, in order, so the same seed gives the same
inputs; a crash prints the seed, the input's index and its bytes in hex, which `replay` runs alone.
"""

from __future__ import annotations

import random
import re
import signal
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType

import trio

#: bytes that make decoders take unusual paths: varint continuation, sign bits, zero, ASCII edges
INTERESTING = (0x00, 0x01, 0x02, 0x07, 0x08, 0x0A, 0x10, 0x12, 0x7F, 0x80, 0x81, 0xC0, 0xFE, 0xFF)
_NUMBER = re.compile(r"\d+")
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
#: how every documented-error outcome starts (the others are accepted inputs)
ERROR = "error "
#: crashes kept in full per target (the count covers every one)
KEPT_CRASHES = 5


class ContractBroken(AssertionError):
    """The code answered, but not as its contract says (a failed round-trip, a malformed reply)."""


class Hang(Exception):
    """One input ran past the time bound."""


@dataclass(frozen=True)
class Crash:
    index: int
    data: bytes
    error: str  # the exception's type and message, with the innermost traceback line
    env: str = ""  # more settings the replay of this one input needs (FUZZ_RAW=1)

    def describe(self, target: str, seed: int) -> str:
        alone = f"FUZZ_INPUT={self.data.hex()[:64]}{'...' if len(self.data) > 32 else ''} {self.env}".strip()
        return (
            f"CRASH in {target} (seed {seed}, input #{self.index}): {self.error}\n"
            f"  input ({len(self.data)} bytes, hex): {self.data.hex()}\n"
            f"  replay: make fuzz FUZZ_TARGET={target} FUZZ_SEED={seed}"
            + (f"  (or this input alone: {alone})" if self.data else "")
        )


@dataclass
class Tally:
    """What one run of one target saw."""

    target: str
    seed: int
    inputs: int = 0
    seconds: float = 0.0
    kinds: Counter[str] = field(default_factory=Counter)
    crash_count: int = 0
    crashes: list[Crash] = field(default_factory=list)

    def crashed(self, index: int, data: bytes, err: BaseException, env: str = "") -> None:
        self.crash_count += 1
        if len(self.crashes) < KEPT_CRASHES:
            where = traceback.extract_tb(err.__traceback__)[-1:] if err.__traceback__ else []
            at = f" at {where[0].filename}:{where[0].lineno}" if where else ""
            self.crashes.append(Crash(index, data, f"{type(err).__name__}: {err}{at}", env))

    def error_kinds(self) -> int:
        return sum(kind.startswith(ERROR) for kind in self.kinds)

    def summary(self) -> str:
        rate = self.inputs / self.seconds if self.seconds else 0.0
        return (
            f"{self.target}: {self.inputs} inputs in {self.seconds:.1f} s ({rate:,.0f}/s), "
            f"{len(self.kinds)} distinct outcomes ({self.error_kinds()} error kinds), "
            f"{self.crash_count} crashes"
        )


@dataclass(frozen=True)
class Target:
    """One surface: `generate(rng)` makes an input, `check(data)` runs it (see the module doc).

    `acheck` instead of `check`: an async check, run under Trio; its time bound is a Trio deadline
    (a hang in a wait), and an input that returns later than the bound counts as a hang as well."""

    name: str
    generate: Callable[[random.Random], bytes]
    check: Callable[[bytes], str] | None = None
    acheck: Callable[[bytes], Awaitable[str]] | None = None
    per_input_s: float = 2.0


@contextmanager
def time_bound(seconds: float) -> Iterator[None]:
    """Raise `Hang` in the main thread when the body runs longer than `seconds` (SIGALRM)."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise Hang(f"one input ran longer than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_one(target: Target, data: bytes, tally: Tally, index: int) -> None:
    """Check one input under the time bound; its outcome or its crash goes into `tally`."""
    assert target.check is not None
    signal.setitimer(signal.ITIMER_REAL, target.per_input_s)
    try:
        kind = target.check(data)
    except Exception as err:  # anything but a documented error: the crash the fuzzer is looking for
        signal.setitimer(signal.ITIMER_REAL, 0)
        tally.crashed(index, data, err)
        return
    signal.setitimer(signal.ITIMER_REAL, 0)
    tally.kinds[kind] += 1


async def arun_one(target: Target, data: bytes, tally: Tally, index: int) -> None:
    """`run_one` for an async check."""
    assert target.acheck is not None
    started = time.perf_counter()
    try:
        with trio.fail_after(target.per_input_s):
            kind = await target.acheck(data)
        if time.perf_counter() - started > target.per_input_s:
            raise Hang(
                f"one input took {time.perf_counter() - started:.1f} s (bound {target.per_input_s:g} s)"
            )
    except Exception as err:
        tally.crashed(index, data, err)
        return
    tally.kinds[kind] += 1


def run(target: Target, n: int, seed: int) -> Tally:
    """`n` inputs from `seed` through `target`."""
    rng = random.Random(seed)
    tally = Tally(target.name, seed)
    started = time.perf_counter()
    if target.acheck is not None:

        async def main() -> None:
            for index in range(n):
                await arun_one(target, target.generate(rng), tally, index)

        trio.run(main)
    else:
        with time_bound(target.per_input_s):
            for index in range(n):
                run_one(target, target.generate(rng), tally, index)
    tally.inputs = n
    tally.seconds = time.perf_counter() - started
    return tally


def replay(target: Target, data: bytes) -> Tally:
    """One given input (from a crash report) through `target`."""
    tally = Tally(target.name, seed=-1)
    if target.acheck is not None:
        trio.run(arun_one, target, data, tally, 0)
    else:
        with time_bound(target.per_input_s):
            run_one(target, data, tally, 0)
    tally.inputs = 1
    return tally


def kind_of(err: BaseException, detail: str = "") -> str:
    """An error outcome's name: `ERROR` + the error type and its detail with numbers and quoted values
    blanked out, so error paths are told apart without every offset or value becoming a kind."""
    detail = _QUOTED.sub("'…'", _NUMBER.sub("N", detail))[:100]
    return f"{ERROR}{type(err).__name__}: {detail}" if detail else f"{ERROR}{type(err).__name__}"


# --------------------------------------------------------------------------------------------------
# Mutation


def mutate(rng: random.Random, data: bytes, *, pool: tuple[bytes, ...] = ()) -> bytes:
    """1-4 structure-blind edits of `data`: bit flips, interesting bytes, inserts, deletes, truncation,
    duplicated or spliced runs (from `pool`, other valid inputs)."""
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(9)
        size = len(buf)
        if op == 0 and size:
            buf[rng.randrange(size)] ^= 1 << rng.randrange(8)
        elif op == 1 and size:
            buf[rng.randrange(size)] = rng.choice(INTERESTING)
        elif op == 2:
            at = rng.randint(0, size)
            buf[at:at] = bytes(rng.choice(INTERESTING) for _ in range(rng.randint(1, 4)))
        elif op == 3 and size:
            at = rng.randrange(size)
            del buf[at : at + rng.randint(1, 8)]
        elif op == 4 and size:
            del buf[rng.randrange(size) :]
        elif op == 5 and size:
            at = rng.randrange(size)
            run = buf[at : at + rng.randint(1, 16)]
            to = rng.randint(0, size)
            buf[to:to] = run
        elif op == 6 and pool:
            other = rng.choice(pool)
            at, cut = rng.randint(0, size), rng.randint(0, len(other))
            buf[at:] = other[cut:]
        elif op == 7 and size:
            buf[rng.randrange(size)] = rng.randrange(256)
        else:
            at = rng.randint(0, size)
            buf[at:at] = rng.randbytes(rng.randint(1, 8))
    return bytes(buf)


def random_bytes(rng: random.Random, most: int = 64) -> bytes:
    return rng.randbytes(rng.randint(0, most))


def surface_inputs(pools: tuple[tuple[bytes, ...], ...], most: int = 64) -> Callable[[random.Random], bytes]:
    """A generator for a target with several surfaces: one head byte (the surface in its low bits, a
    free parameter such as a read size above them), then a pool entry as it is (10%), mutated (80%), or
    random bytes of at most `most` (10%)."""
    bits = (len(pools) - 1).bit_length()

    def generate(rng: random.Random) -> bytes:
        surface = rng.randrange(len(pools))
        head = bytes([surface | rng.randrange(256 >> bits) << bits])
        roll = rng.random()
        if roll < 0.1:
            return head + rng.choice(pools[surface])
        if roll < 0.9:
            return head + mutate(rng, rng.choice(pools[surface]), pool=pools[surface])
        return head + random_bytes(rng, most)

    return generate


def text(rng: random.Random, most: int = 12) -> str:
    """A short string, now and then with characters that need several UTF-8 bytes."""
    alphabet = "abcxyz019-_./=:" if rng.random() < 0.8 else "aé€😀\x00\u2028"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, most)))
