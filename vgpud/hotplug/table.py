"""The attachment table: in memory for lookups, on disk (`vgpud.hotplug.store`) for restarts.

A change is written to the file first and takes effect in memory only once the write succeeded, so
memory never holds what a restart would lose. Changes are serialized by the caller (the service's
lock): deciding from `attachments` and changing the table must be one step.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import trio

from vgpud.hotplug.rules import AttachKey, Attachment
from vgpud.hotplug.store import AttachmentStore


class AttachmentTable:
    def __init__(self, store: AttachmentStore) -> None:
        self.store = store
        self._entries: dict[AttachKey, Attachment] = {}

    async def load(self) -> None:
        """Replace the table with what the file holds (StoreError when it cannot be read safely)."""
        self._entries = await trio.to_thread.run_sync(self.store.load)

    @property
    def attachments(self) -> Mapping[AttachKey, Attachment]:
        """A read-only view of the table now."""
        return MappingProxyType(self._entries)

    def sorted(self) -> list[Attachment]:
        return [self._entries[k] for k in sorted(self._entries)]

    async def put(self, attachment: Attachment) -> None:
        """Add or replace the attachment of its key; StoreError (and no change) when the write fails."""
        await self._commit({**self._entries, attachment.key: attachment})

    async def remove(self, key: AttachKey) -> None:
        """Remove the attachment of `key`; StoreError (and no change) when the write fails."""
        await self._commit({k: v for k, v in self._entries.items() if k != key})

    async def _commit(self, entries: dict[AttachKey, Attachment]) -> None:
        await trio.to_thread.run_sync(self.store.save, entries)
        self._entries = entries
