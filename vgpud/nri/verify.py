"""Did the runtime give a container what vgpud intended? (pure)

A runtime that drops the plugin (a missed deadline) or runs without it (vgpud down) creates the
container without the adjustment, and CreateContainer's reply is no proof of the opposite: only the
container the runtime reports back (Synchronize: its mounts and env) is.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence

from vgpud.partition.layout import Mount


def missing_injection(
    mounts: Sequence[Mount],
    env: Mapping[str, str],
    have_mounts: Iterable[tuple[str, str]],
    have_env: Sequence[str],
) -> tuple[str, ...]:
    """What of the intended `mounts` and `env` the container lacks: `mount <destination>` for a bind
    mount that is absent or has another source, `env <KEY>` for an identity variable with another
    value; () when complete. `have_mounts`: the container's (destination, source) pairs; `have_env`
    its `KEY=VALUE` list (the last of a key wins)."""
    have = set(have_mounts)
    gaps = [_gap("mount", m.container_path) for m in mounts if (m.container_path, m.host_path) not in have]
    values = _env_dict(have_env)
    gaps += [_gap("env", key) for key, value in env.items() if values.get(key, "") != value]
    return tuple(gaps)


@functools.cache
def _gap(kind: str, name: str) -> str:
    """`<kind> <name>`, one string per name: a Synchronize may find thousands of containers lacking
    the same few mounts and env (a node whose containers were created while vgpud was away)."""
    return f"{kind} {name}"


def _env_dict(env: Sequence[str]) -> dict[str, str]:
    """`KEY=VALUE` items as a dict, the last of a key winning (`env_value` for every key at once)."""
    values = {}
    for item in env:
        key, sep, value = item.partition("=")
        if sep:
            values[key] = value
    return values
