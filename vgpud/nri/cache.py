"""The NRI cache: which claim and directory each injected container has (seed §12.8, §12.9).

Keyed by (pod UID, container name), the only identity the registry learns from a register call. The
container env is the durable fact (`MANAGER_VGPU_CLAIM_UID` survives in the persisted OCI spec), so
the cache is rebuilt from a Synchronize after every reconnect and needs no storage of its own.
`synced` turns true with the first complete Synchronize and stays true across disconnects (DESIGN
§5): entries of running containers remain valid while the plugin is away.

`RuntimeContainers`, keyed the same way, is what the runtime told the plugin it runs (every container
with a claim UID in its env, valid or not): the drift self-check compares the two; nothing decides on it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class CacheEntry:
    claim_uid: str
    #: the container's directory (`claims/<claim>/<pod>_<ctr>`), removed with the container
    directory: PurePosixPath


@dataclass(frozen=True)
class RuntimeContainer:
    """A container with a claim UID in its env, as the runtime reported it."""

    claim_uid: str
    pod_namespace: str = ""
    pod_name: str = ""


class ContainerMap(Generic[T]):
    """Values keyed by (pod UID, container name), removable per container or per pod."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], T] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, pod_uid: str, container: str) -> T | None:
        return self._entries.get((pod_uid, container))

    def set(self, pod_uid: str, container: str, entry: T) -> None:
        self._entries[(pod_uid, container)] = entry

    def pop(self, pod_uid: str, container: str) -> T | None:
        return self._entries.pop((pod_uid, container), None)

    def pop_pod(self, pod_uid: str) -> list[tuple[str, T]]:
        """Remove every container of a pod; (container, entry) pairs of what was there."""
        keys = [key for key in self._entries if key[0] == pod_uid]
        return [(key[1], self._entries.pop(key)) for key in keys]

    def replace(self, entries: Iterable[tuple[str, str, T]]) -> None:
        self._entries = {(pod_uid, container): entry for pod_uid, container, entry in entries}

    def items(self) -> list[tuple[tuple[str, str], T]]:
        return sorted(self._entries.items(), key=lambda item: item[0])


class NriCache(ContainerMap[CacheEntry]):
    def __init__(self) -> None:
        super().__init__()
        self.synced = False

    def replace(self, entries: Iterable[tuple[str, str, CacheEntry]]) -> None:
        """A Synchronize's view replaces everything; the cache is synced from now on."""
        super().replace(entries)
        self.synced = True


class RuntimeContainers(ContainerMap[RuntimeContainer]):
    """The last Synchronize's vGPU containers, then those created and removed since."""
