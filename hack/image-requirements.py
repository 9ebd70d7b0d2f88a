"""Print vgpud's runtime dependency closure as `name==version` lines, versions as installed here.

    .venv/bin/python hack/image-requirements.py [--drop NAME]...

The image installs exactly these pins (hack/build-image.sh), so it runs the versions the tests ran and
the same venv always gives the same image. Walks `vgpud`'s requirements without extras (the dev extras
stay out), following each requirement's own extras and evaluating markers for this interpreter. A
--drop NAME is not followed: NAME, and what only NAME needs, stay out (a part the image removes).
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, distribution

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def closure(root: str, drop: frozenset[str] = frozenset()) -> dict[str, str]:
    """Canonical name -> installed version of every distribution `root` needs at run time."""
    pins: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    while todo:
        name, extras = todo.pop()
        if name in drop or (name, extras) in seen:
            continue
        seen.add((name, extras))
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            raise SystemExit(f"image-requirements: {name} is not installed (run `make setup`)") from None
        pins[name] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            envs = [{"extra": extra} for extra in extras] or [{"extra": ""}]
            if req.marker is not None and not any(req.marker.evaluate(env) for env in envs):
                continue
            todo.append((canonicalize_name(req.name), frozenset(req.extras)))
    pins.pop(root)
    return pins


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--drop", action="append", default=[], help="a distribution to leave out (repeat)")
    args = parser.parse_args()
    drop = frozenset(canonicalize_name(name) for name in args.drop)
    unknown = sorted(drop - set(closure("vgpud")))
    if unknown:
        parser.error(f"--drop {', '.join(unknown)}: not among vgpud's runtime dependencies")
    pins = closure("vgpud", drop)
    for name, version in sorted(pins.items()):
        print(f"{name}=={version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
