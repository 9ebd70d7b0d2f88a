"""The garbage collector for a long-running daemon: freeze what start-up made, once.

A full collection traverses every tracked object, and after start that is almost only start-up's:
the imported modules, generated messages, the first lists of claims and pods (60,000 objects after
`import vgpud.daemon` alone; a full collection of them takes 11 ms on a quiet core, three times that
on a loaded one, inside whichever registration or CreateContainer it falls in). They live as long as
the process. `gc.freeze()` moves them to a permanent generation that no collection traverses (the same
full collection then takes well under 1 ms); objects made later are collected as before, so nothing
is kept alive that would have been freed. The thresholds stay Python's: a larger first generation
did not make bench/registry.py's tail any shorter (with 256 Python grpcio clients on 2 cores that
tail is the OS preempting the server: the slowest registrations use about 1 ms of CPU in 30-90 ms of
wall time).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Sequence

from vgpud.kube.informer import Informer

log = logging.getLogger("vgpud.heap")


def freeze_start_up() -> int:
    """Collect what start-up left behind, then freeze every object alive now; how many were frozen."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.debug("start-up heap frozen: %d objects out of the collector's reach", frozen)
    return frozen


def freeze_when_listed(caches: Sequence[Informer]) -> None:
    """Freeze once every cache in `caches` has listed for the first time (at once when there are none):
    their objects are start-up's too. Later lists do nothing here."""
    pending = [cache for cache in caches if not cache.synced]
    if not pending:
        freeze_start_up()
        return
    done = False

    def listed() -> None:
        nonlocal done
        if not done and all(cache.synced for cache in pending):
            done = True
            freeze_start_up()

    for cache in pending:
        cache.list_handlers.append(listed)
