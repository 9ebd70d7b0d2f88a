"""Walking exception groups: what a Trio nursery raised, as the plain exceptions inside it."""

from __future__ import annotations

from collections.abc import Iterator


def leaves(exc: BaseException) -> Iterator[BaseException]:
    """Every exception in `exc` that is not a group, depth first in raise order; `exc` itself when it
    is not a group."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from leaves(inner)
    else:
        yield exc
