"""The NRI cache: which claim and directory each injected container has (seed §12.8, §12.9).

Keyed by (pod UID, container name), the only identity the registry learns from a register call. The
container env is the durable fact (`MANAGER_VGPU_CLAIM_UID` survives in the persisted OCI spec), so
the cache is rebuilt from a Synchronize after every reconnect and needs no storage of its own.
`synced` turns true with the first complete Synchronize and stays true across disconnects (DESIGN
§5): entries of running containers remain valid while the plugin is away.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath


@dataclass(frozen=True)
class CacheEntry:
    claim_uid: str
    #: the container's directory (`claims/<claim>/<pod>_<ctr>`), removed with the container
    directory: PurePosixPath


class NriCache:
    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], CacheEntry] = {}
        self.synced = False

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, pod_uid: str, container: str) -> CacheEntry | None:
        return self._entries.get((pod_uid, container))

    def set(self, pod_uid: str, container: str, entry: CacheEntry) -> None:
        self._entries[(pod_uid, container)] = entry

    def pop(self, pod_uid: str, container: str) -> CacheEntry | None:
        return self._entries.pop((pod_uid, container), None)

    def pop_pod(self, pod_uid: str) -> list[tuple[str, CacheEntry]]:
        """Remove every container of a pod; (container, entry) pairs of what was there."""
        keys = [key for key in self._entries if key[0] == pod_uid]
        return [(key[1], self._entries.pop(key)) for key in keys]

    def replace(self, entries: Iterable[tuple[str, str, CacheEntry]]) -> None:
        """A Synchronize's view replaces everything; the cache is synced from now on."""
        self._entries = {(pod_uid, container): entry for pod_uid, container, entry in entries}
        self.synced = True

    def items(self) -> list[tuple[tuple[str, str], CacheEntry]]:
        return sorted(self._entries.items())
