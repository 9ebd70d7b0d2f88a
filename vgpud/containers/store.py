"""Every container instance the runtime reported through NRI, vGPU or not, in one store.

Keyed by container ID and indexed by (pod UID, container name): the runtime may remove an exited
instance while a newer one runs (`crictl rm`, kubelet garbage collection), and a register call only
names the pair. All instances of one pair share one directory, which goes only with the last of them
(`users`). A Synchronize replaces everything; the NRI hooks keep it current in between.

`synced` turns true with the first complete Synchronize and stays true across disconnects: the
records of running containers remain valid while the plugin is away (the container env is the
durable fact, so nothing here is stored on disk).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import PurePosixPath

from vgpud.containers.record import CLAIMED, Injection, NodeContainer
from vgpud.containers.values import ContainerKey


class ContainerStore:
    def __init__(self) -> None:
        self._records: dict[str, NodeContainer] = {}
        #: (pod UID, container) -> its instances' IDs, oldest first (a dict keeps insertion order)
        self._index: dict[ContainerKey, dict[str, None]] = {}
        #: the IDs of the records that carry a vGPU claim UID (a few among thousands)
        self._claimed: dict[str, None] = {}
        #: true once the first complete Synchronize arrived, and from then on
        self.synced = False

    def __len__(self) -> int:
        return len(self._records)

    # --- reads ---------------------------------------------------------------------------------

    def by_id(self, container_id: str) -> NodeContainer | None:
        return self._records.get(container_id)

    def newest(self, pod_uid: str, name: str) -> NodeContainer | None:
        """The newest instance of (pod UID, container name), None when the runtime reported none."""
        ids = self._index.get((pod_uid, name))
        return self._records[next(reversed(ids))] if ids else None

    def injected(self, pod_uid: str, name: str) -> NodeContainer | None:
        """The newest instance of (pod UID, container name) vgpud injected, None when none is."""
        for container_id in reversed(self._index.get((pod_uid, name), {})):
            record = self._records[container_id]
            if record.injection is Injection.INJECTED:
                return record
        return None

    def instances(self, pod_uid: str, name: str, injection: Injection = Injection.INJECTED) -> list[str]:
        """The IDs of the instances of (pod UID, container name) in that state, oldest first."""
        ids = self._index.get((pod_uid, name), ())
        return [cid for cid in ids if self._records[cid].injection is injection]

    def select(self, *states: Injection) -> list[NodeContainer]:
        """The vGPU containers in these states (default: every one with a claim UID), sorted by (pod
        UID, container name, ID)."""
        wanted = frozenset(states) if states else CLAIMED
        found = [r for cid in self._claimed if (r := self._records[cid]).injection in wanted]
        return sorted(found, key=lambda r: (r.pod_uid, r.name, r.container_id))

    def count(self, *states: Injection) -> int:
        """How many vGPU containers are in these states (default: every one with a claim UID)."""
        wanted = frozenset(states) if states else CLAIMED
        return sum(1 for cid in self._claimed if self._records[cid].injection in wanted)

    def users(self, directory: PurePosixPath) -> list[str]:
        """The IDs of the injected instances whose directory is `directory`."""
        return [
            cid
            for cid in self._claimed
            if (r := self._records[cid]).directory == directory and r.injection is Injection.INJECTED
        ]

    def running_ids(self) -> list[str]:
        """The IDs of the instances with a live process, in no particular order."""
        return [cid for cid, record in self._records.items() if record.running]

    # --- writes (the NRI hooks) ----------------------------------------------------------------

    def set(self, record: NodeContainer) -> None:
        """Add an instance, or change one in place (it keeps its age among its container's instances)."""
        cid = record.container_id
        before = self._records.get(cid)
        if before is not None and before.key != record.key:
            self.pop(cid)
        self._records[cid] = record
        self._index.setdefault(record.key, {})[cid] = None
        if record.injection is Injection.NO_CLAIM:
            self._claimed.pop(cid, None)
        else:
            self._claimed[cid] = None

    def refresh(self, record: NodeContainer) -> None:
        """The runtime's new facts of an instance (a lifecycle event): what vgpud knows of its vGPU
        claim stays."""
        before = self._records.get(record.container_id)
        if before is not None and before.injection is not Injection.NO_CLAIM:
            record = record._replace(
                claim_uid=before.claim_uid,
                injection=before.injection,
                directory=before.directory,
                missing=before.missing,
            )
        self.set(record)

    def pop(self, container_id: str) -> NodeContainer | None:
        record = self._records.pop(container_id, None)
        if record is not None:
            ids = self._index[record.key]
            del ids[container_id]
            if not ids:
                del self._index[record.key]
            self._claimed.pop(container_id, None)
        return record

    def pop_pod(self, pod_uid: str) -> list[NodeContainer]:
        """Remove every instance of every container of a pod."""
        ids = [cid for key, ids in self._index.items() if key[0] == pod_uid for cid in ids]
        return [record for cid in ids if (record := self.pop(cid)) is not None]

    def replace(self, records: Iterable[NodeContainer]) -> None:
        """A Synchronize's view replaces everything (a later record of the same ID wins); built in one
        pass: a Synchronize replaces thousands. The store is synced from now on."""
        self._records, self._index, self._claimed = {}, {}, {}
        known, index, claimed, no_claim = self._records, self._index, self._claimed, Injection.NO_CLAIM
        for record in records:
            cid = record.container_id
            if cid in known:
                self.pop(cid)
            known[cid] = record
            key = (record.pod_uid, record.name)
            ids = index.get(key)
            if ids is None:
                index[key] = {cid: None}
            else:
                ids[cid] = None
            if record.injection is not no_claim:
                claimed[cid] = None
        self.synced = True
