"""The container env as NRI reports it: a list of `KEY=VALUE` strings (pure)."""

from __future__ import annotations

from collections.abc import Iterable


def env_value(env: Iterable[str], name: str) -> str:
    """The value of `name` in a `KEY=VALUE` list: the last one wins, "" when absent."""
    value = ""
    prefix = f"{name}="
    for item in env:
        if item.startswith(prefix):
            value = item[len(prefix) :]
    return value
