"""The Kubernetes API as vgpud uses it: a small Trio-native interface (DESIGN §2).

Objects travel as plain dicts in the API server's own JSON shape (camelCase), never as client
models, so a client-library upgrade cannot change what the rest of vgpud sees. Two implementations:
`vgpud.kube.client.KubeClient` (vgpud's own REST client over urllib3, blocking calls in threads) and
`vgpud.kube.fake.FakeKube` (in memory, for fast unit tests and benches). Both raise the errors below.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

JsonObject = dict[str, Any]

#: resource.k8s.io version vgpud serves (Kubernetes >= 1.34)
RESOURCE_API = "resource.k8s.io/v1"


class KubeError(Exception):
    """An API call failed; `status` is the HTTP status when the server answered (0 if it did not)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class NotFound(KubeError):
    """404: the object does not exist."""


class Gone(KubeError):
    """410: a watch asked for a resourceVersion the server no longer has (compacted): list again."""


class Conflict(KubeError):
    """409: a create raced another writer, or a resourceVersion precondition failed; also a uid
    precondition that failed (the API server answers that one with 422 on metadata.uid)."""


#: the annotation of the BOOKMARK that ends a watch's initial events (a watch from version "")
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


class WatchEventType(StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"
    #: only the object's resourceVersion: the watch has seen every change up to it (a watch that asked
    #: for bookmarks; the informers do, so a watch reopened after a quiet hour need not list again)
    BOOKMARK = "BOOKMARK"


@dataclass(frozen=True)
class WatchEvent:
    type: WatchEventType
    object: JsonObject


@dataclass(frozen=True)
class Listing:
    """A list's objects and the resourceVersion to watch from: every change after the list."""

    items: list[JsonObject]
    resource_version: str


class KubeApi(Protocol):
    """Every call is a Trio coroutine; none blocks the event loop."""

    async def get_resource_claim(self, namespace: str, name: str) -> JsonObject:
        """The claim (`resource.k8s.io/v1`); NotFound when it does not exist."""
        ...

    async def patch_resource_claim_metadata(
        self,
        namespace: str,
        name: str,
        *,
        uid: str,
        annotations: Mapping[str, str | None] | None = None,
        labels: Mapping[str, str | None] | None = None,
    ) -> JsonObject:
        """Merge-patch annotations and labels (None removes one), only if the claim still has `uid`."""
        ...

    async def get_pod(self, namespace: str, name: str) -> JsonObject:
        """NotFound when the pod does not exist."""
        ...

    async def list_node_pods(self, *, node_name: str) -> Listing:
        """The pods bound to this node (field selector spec.nodeName), every namespace."""
        ...

    def watch_node_pods(
        self, *, node_name: str, resource_version: str
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        """Changes to this node's pods after `resource_version` (a `Listing`'s); Gone when the server
        no longer has that version; ends (or raises KubeError) like the slice watch. From version "":
        the current pods first, each ADDED, then a BOOKMARK annotated INITIAL_EVENTS_END, then the
        changes (the streaming list); a server without it refuses with KubeError (422)."""
        ...

    async def get_node(self, name: str) -> JsonObject:
        """NotFound when the node does not exist (slices are owned by it)."""
        ...

    async def list_resource_slices(self, *, driver: str, node_name: str) -> list[JsonObject]:
        """This driver's slices on this node (field selectors spec.driver and spec.nodeName)."""
        ...

    async def apply_resource_slice(self, body: JsonObject, *, field_manager: str) -> JsonObject:
        """Server-side apply of a whole slice (force), creating it when missing."""
        ...

    async def delete_resource_slice(self, name: str) -> None:
        """Delete one slice; NotFound is not an error (the goal is its absence)."""
        ...

    def watch_resource_slices(
        self, *, driver: str, node_name: str
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        """Changes to this driver's slices on this node from now on; ends (or raises KubeError) when
        the watch breaks, and the caller lists again and re-watches."""
        ...

    async def list_resource_claims(self, *, labels: Mapping[str, str] | None = None) -> Listing:
        """The ResourceClaims of every namespace that carry all of `labels` (None: every claim)."""
        ...

    def watch_resource_claims(
        self, *, resource_version: str, labels: Mapping[str, str] | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        """Changes to the claims `labels` selects after `resource_version` (a claim that gains the
        labels is ADDED, one that loses them DELETED); Gone, ends, raises or streams the current claims
        first (version "") like `watch_node_pods`."""
        ...

    async def create_event(self, namespace: str, body: JsonObject) -> JsonObject:
        """Create a core/v1 Event in `namespace` (vgpud.kube.events); Conflict when its name is taken."""
        ...

    async def patch_event(self, namespace: str, name: str, changes: Mapping[str, Any]) -> JsonObject:
        """Merge-patch an Event's top-level fields (a repeat's count, lastTimestamp, message); NotFound
        when the server no longer has it."""
        ...
