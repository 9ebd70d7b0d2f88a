"""`make fuzz`: every fuzz target at full volume, a table of what each saw, exit 1 on any crash.

Environment: FUZZ_TARGET (one name, or several joined by commas; default all), FUZZ_N (inputs per
in-process target, default 10^6; the HTTPS target gets a tenth), FUZZ_SEED (default 1), FUZZ_INPUT
(hex of one input from a crash report: replay it alone; FUZZ_RAW=1 sends it to webhook_https as raw
request bytes instead of a body).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from tests.fuzz import target_nri, target_protobuf, target_registry, target_webhook, target_webhook_https
from tests.fuzz.driver import Tally, Target, replay, run

DEFAULT_N = 1_000_000
HTTPS_SHARE = 10
TOP_KINDS = 8

IN_PROCESS: dict[str, Callable[[int], Target]] = {
    "nri": target_nri.target,
    "protobuf": target_protobuf.target,
    "registry": target_registry.target,
    "webhook": target_webhook.target,
}
NAMES = (*IN_PROCESS, target_webhook_https.NAME)


def fuzz(name: str, n: int, seed: int, given: bytes | None) -> Tally:
    if name == target_webhook_https.NAME:
        raw = os.environ.get("FUZZ_RAW") == "1"
        return target_webhook_https.run(
            max(1, n // HTTPS_SHARE), seed, given=None if given is None else (raw, given)
        )
    target = IN_PROCESS[name](seed)
    return run(target, n, seed) if given is None else replay(target, given)


def _count(name: str, default: int) -> int:
    """A non-negative integer setting; unset or empty (as make passes it) is the default."""
    value = os.environ.get(name) or str(default)
    if not value.isdigit():
        raise SystemExit(f"fuzz: {name}={value!r} is not a non-negative integer")
    return int(value)


def main() -> int:
    names = [t for t in (os.environ.get("FUZZ_TARGET") or ",".join(NAMES)).split(",") if t]
    unknown = [t for t in names if t not in NAMES]
    if unknown:
        print(f"fuzz: unknown target {', '.join(unknown)}; the targets: {', '.join(NAMES)}", file=sys.stderr)
        return 2
    n, seed = _count("FUZZ_N", DEFAULT_N), _count("FUZZ_SEED", 1)
    try:
        given = bytes.fromhex(os.environ["FUZZ_INPUT"]) if os.environ.get("FUZZ_INPUT") else None
    except ValueError:
        raise SystemExit("fuzz: FUZZ_INPUT is not hex (copy it from the crash report)") from None
    crashed = False
    for name in names:
        print(f"== fuzz {name} (seed {seed})", flush=True)
        tally = fuzz(name, n, seed, given)
        print(tally.summary())
        for kind, count in tally.kinds.most_common(TOP_KINDS):
            print(f"   {count:>9}  {kind}")
        for crash in tally.crashes:
            print(crash.describe(name, seed))
        crashed |= tally.crash_count > 0
        sys.stdout.flush()
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
