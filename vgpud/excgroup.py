"""Walking exception groups: what a Trio nursery raised, as the plain exceptions inside it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import trio


def leaves(exc: BaseException) -> Iterator[BaseException]:
    """Every exception in `exc` that is not a group, depth first in raise order; `exc` itself when it
    is not a group."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from leaves(inner)
    else:
        yield exc


@contextmanager
def single_error_unwrapped() -> Iterator[None]:
    """Around a nursery: when what it raised holds one error besides cancellations, that error as it
    was, not wrapped (callers and tests catch KubeError around a component as around a call)."""
    try:
        yield
    except BaseExceptionGroup as group:
        errors = [e for e in leaves(group) if not isinstance(e, trio.Cancelled)]
        if len(errors) == 1:
            raise errors[0] from errors[0].__cause__
        raise
