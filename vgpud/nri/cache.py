"""The NRI cache: which claim and directory each injected container instance has (seed §12.8, §12.9).

Keyed by container ID: a restarted container is a new instance (a new ID) of the same (pod UID,
container name), and the runtime may remove an exited instance while a newer one runs (`crictl rm`,
kubelet garbage collection). The registry only learns (pod UID, container name) from a register call,
so an index maps that pair to its live instances; all instances of one pair share one directory
(`claims/<claim>/<pod>_<ctr>`), which goes only with the last of them.

The container env is the durable fact (`MANAGER_VGPU_CLAIM_UID` survives in the persisted OCI spec), so
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
from typing import Generic, Protocol, TypeVar

#: (pod UID, container name): what a register call identifies
ContainerKey = tuple[str, str]


class Instance(Protocol):
    @property
    def pod_uid(self) -> str: ...
    @property
    def container(self) -> str: ...


@dataclass(frozen=True)
class CacheEntry:
    pod_uid: str
    container: str
    claim_uid: str
    #: the container's directory (`claims/<claim>/<pod>_<ctr>`), shared by its instances
    directory: PurePosixPath

    @property
    def key(self) -> ContainerKey:
        return self.pod_uid, self.container


@dataclass(frozen=True)
class RuntimeContainer:
    """A container with a claim UID in its env, as the runtime reported it."""

    pod_uid: str
    container: str
    claim_uid: str
    pod_namespace: str = ""
    pod_name: str = ""

    @property
    def key(self) -> ContainerKey:
        return self.pod_uid, self.container


T = TypeVar("T", bound=Instance)


class ContainerMap(Generic[T]):
    """Values keyed by container ID, indexed by (pod UID, container name); removable per instance
    or per pod."""

    def __init__(self) -> None:
        self._entries: dict[str, T] = {}
        #: (pod UID, container) -> its instances' IDs, oldest first (a dict keeps insertion order)
        self._index: dict[ContainerKey, dict[str, None]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, container_id: object) -> bool:
        return container_id in self._entries

    def get(self, pod_uid: str, container: str) -> T | None:
        """The newest live instance of (pod UID, container name), None when none is."""
        ids = self._index.get((pod_uid, container))
        return self._entries[next(reversed(ids))] if ids else None

    def instance(self, container_id: str) -> T | None:
        return self._entries.get(container_id)

    def instances(self, pod_uid: str, container: str) -> list[str]:
        """The IDs of the live instances of (pod UID, container name), oldest first."""
        return list(self._index.get((pod_uid, container), ()))

    def set(self, container_id: str, entry: T) -> None:
        self.pop(container_id)
        self._entries[container_id] = entry
        self._index.setdefault((entry.pod_uid, entry.container), {})[container_id] = None

    def pop(self, container_id: str) -> T | None:
        entry = self._entries.pop(container_id, None)
        if entry is not None:
            key = (entry.pod_uid, entry.container)
            ids = self._index[key]
            del ids[container_id]
            if not ids:
                del self._index[key]
        return entry

    def pop_pod(self, pod_uid: str) -> list[tuple[str, T]]:
        """Remove every instance of every container of a pod; (container ID, entry) pairs."""
        ids = [cid for key, ids in self._index.items() if key[0] == pod_uid for cid in ids]
        return [(cid, entry) for cid in ids if (entry := self.pop(cid)) is not None]

    def replace(self, entries: Iterable[tuple[str, T]]) -> None:
        """Everything replaced by `entries` (a later one of the same ID wins, as with `set`); built
        in one pass: a Synchronize replaces thousands."""
        self._entries, self._index = {}, {}
        known, index = self._entries, self._index
        for container_id, entry in entries:
            if container_id in known:
                self.pop(container_id)
            known[container_id] = entry
            key = (entry.pod_uid, entry.container)
            ids = index.get(key)
            if ids is None:
                index[key] = {container_id: None}
            else:
                ids[container_id] = None

    def items(self) -> list[tuple[str, T]]:
        """(container ID, entry), sorted by (pod UID, container name, ID)."""
        return sorted(self._entries.items(), key=lambda item: (item[1].pod_uid, item[1].container, item[0]))


class NriCache(ContainerMap[CacheEntry]):
    def __init__(self) -> None:
        super().__init__()
        self.synced = False

    def replace(self, entries: Iterable[tuple[str, CacheEntry]]) -> None:
        """A Synchronize's view replaces everything; the cache is synced from now on."""
        super().replace(entries)
        self.synced = True

    def uses(self, directory: PurePosixPath) -> list[str]:
        """The IDs of the cached instances whose directory is `directory`."""
        return [cid for cid, entry in self._entries.items() if entry.directory == directory]


class RuntimeContainers(ContainerMap[RuntimeContainer]):
    """The last Synchronize's vGPU containers, then those created and removed since."""


@dataclass(frozen=True)
class NotInjected:
    """A running vGPU container the runtime reports without (all of) vgpud's injection: created while
    vgpud was down, or after the runtime dropped it for missing a deadline. It cannot register; the
    runtimes' NRI adaptation ignores eviction requests, so vgpud reports it and leaves it alone."""

    pod_uid: str
    container: str
    claim_uid: str
    pod_namespace: str
    pod_name: str
    #: the directory it would have had (kept while the instance lives, removed with it)
    directory: PurePosixPath
    #: what of the intended injection the runtime's container lacks ("mount <dest>", "env <KEY>")
    missing: tuple[str, ...]

    @property
    def key(self) -> ContainerKey:
        return self.pod_uid, self.container


class NotInjectedContainers(ContainerMap[NotInjected]):
    """Found at the last Synchronize, dropped when the runtime removes them."""
