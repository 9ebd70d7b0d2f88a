"""KubeClient: KubeApi over the official `kubernetes` client (DESIGN §2).

The client is blocking, so every call runs in a worker thread under this client's own
CapacityLimiter (it never competes with other to_thread users). Calls pass `_preload_content=False`
and json-decode the raw body: no model conversion, camelCase kept, and a client upgrade (37.x moved
models to pydantic) cannot change what vgpud sees. A watch holds one thread for its lifetime; leaving
its context manager stops it with `Watch.stop()` and a socket shutdown, so the thread ends at once.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, closing, contextmanager, suppress
from pathlib import Path
from typing import Any

import trio
import urllib3
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from vgpud.kube._channel import ChannelEvents, WatchItem
from vgpud.kube.api import (
    RESOURCE_API,
    Conflict,
    Gone,
    JsonObject,
    KubeError,
    Listing,
    NotFound,
    WatchEvent,
    WatchEventType,
)

#: seconds to wait for a TCP connection to the API server before failing a call
CONNECT_TIMEOUT_S = 10.0
#: seconds an ordinary call may wait for the server's answer
CALL_TIMEOUT_S = 30.0
#: a watch ends after this long (server-side timeoutSeconds) and the caller lists and re-watches,
#: as client-go's reflector does; it also bounds how stale a watch's view can get
WATCH_TIMEOUT_S = 300

_MERGE_PATCH = "application/merge-patch+json"
_APPLY_PATCH = "application/apply-patch+yaml"  # a JSON body is valid YAML; the client sends it as JSON


class KubeClient:
    """KubeApi against a real API server."""

    def __init__(self, api_client: client.ApiClient, *, max_threads: int = 8) -> None:
        self._api_client = api_client
        self._core = client.CoreV1Api(api_client)
        self._resource = client.ResourceV1Api(api_client)
        self._limiter = trio.CapacityLimiter(max_threads)

    @classmethod
    def from_config(cls, kubeconfig: Path | None = None) -> KubeClient:
        """In-cluster config when running in a pod, else `kubeconfig` (or $KUBECONFIG, ~/.kube/config)."""
        configuration = client.Configuration()
        tried: list[str] = []
        if kubeconfig is None:
            try:
                config.load_incluster_config(client_configuration=configuration)
                return cls(client.ApiClient(configuration))
            except ConfigException as e:
                tried.append(f"in-cluster config ({e})")
        path = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        try:
            config.load_kube_config(
                config_file=str(kubeconfig) if kubeconfig else None,
                client_configuration=configuration,
                persist_config=False,
            )
        except (ConfigException, OSError, ValueError, TypeError) as e:
            tried.append(f"kubeconfig {path} ({e})")
            raise KubeError("no Kubernetes API configuration: tried " + "; ".join(tried)) from e
        return cls(client.ApiClient(configuration))

    def close(self) -> None:
        self._api_client.close()

    async def get_resource_claim(self, namespace: str, name: str) -> JsonObject:
        return await self._call(self._resource.read_namespaced_resource_claim, name, namespace)

    async def patch_resource_claim_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str | None], *, uid: str
    ) -> JsonObject:
        # metadata.uid in a merge patch is a precondition, checked atomically with the write: a claim
        # deleted and re-created under the same name fails it (422 on metadata.uid -> Conflict).
        body = {"metadata": {"uid": uid, "annotations": dict(annotations)}}
        return await self._call(
            self._resource.patch_namespaced_resource_claim, name, namespace, body, _content_type=_MERGE_PATCH
        )

    async def get_pod(self, namespace: str, name: str) -> JsonObject:
        return await self._call(self._core.read_namespaced_pod, name, namespace)

    async def list_node_pods(self, *, node_name: str) -> Listing:
        listed = await self._call(
            self._core.list_pod_for_all_namespaces, field_selector=_pod_selector(node_name)
        )
        return _listing(listed, "v1", "Pod")

    def watch_node_pods(
        self, *, node_name: str, resource_version: str
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        return self._watch(self._core.list_pod_for_all_namespaces, _pod_selector(node_name), resource_version)

    async def get_node(self, name: str) -> JsonObject:
        return await self._call(self._core.read_node, name)

    async def list_resource_slices(self, *, driver: str, node_name: str) -> list[JsonObject]:
        listed = await self._call(
            self._resource.list_resource_slice, field_selector=_slice_selector(driver, node_name)
        )
        return [_with_kind(item) for item in listed.get("items") or []]

    async def apply_resource_slice(self, body: JsonObject, *, field_manager: str) -> JsonObject:
        """Server-side apply (force); the server creates the slice when it does not exist."""
        body = {"apiVersion": RESOURCE_API, "kind": "ResourceSlice", **body}
        return await self._call(
            self._resource.patch_resource_slice,
            body["metadata"]["name"],
            body,
            field_manager=field_manager,
            force=True,
            _content_type=_APPLY_PATCH,
        )

    async def delete_resource_slice(self, name: str) -> None:
        with suppress(NotFound):
            await self._call(self._resource.delete_resource_slice, name)

    def watch_resource_slices(
        self, *, driver: str, node_name: str
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        """Events after the moment of entry: it lists to learn the current resourceVersion and watches
        from there (a watch without one would first replay every slice as ADDED), and returns only once
        the server has accepted the watch, so a change made after entry is always seen."""
        return self._watch(self._resource.list_resource_slice, _slice_selector(driver, node_name))

    async def list_resource_claims(self) -> Listing:
        listed = await self._call(self._resource.list_resource_claim_for_all_namespaces)
        return _listing(listed, RESOURCE_API, "ResourceClaim")

    def watch_resource_claims(
        self, *, resource_version: str
    ) -> AbstractAsyncContextManager[AsyncIterator[WatchEvent]]:
        return self._watch(self._resource.list_resource_claim_for_all_namespaces, "", resource_version)

    @asynccontextmanager
    async def _watch(
        self, lister: Callable[..., Any], selector: str, resource_version: str | None = None
    ) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        """A watch from `resource_version`, or (None) from now: then a one-item list learns the
        current version first."""
        if resource_version is None:
            listed = await self._call(lister, field_selector=selector, limit=1)
            resource_version = listed["metadata"]["resourceVersion"]
        stream = _Watch(lister, selector, resource_version)
        send, receive = trio.open_memory_channel[WatchItem](0)
        error: BaseException | None = None
        async with trio.open_nursery() as nursery:
            try:
                await nursery.start(stream.run, send)
                with receive:
                    yield ChannelEvents(receive)
            except BaseException as e:
                # Held until the thread has ended (the nursery waits for it instead of abandoning it),
                # and raised as it was, not wrapped in the nursery's ExceptionGroup: `except KubeError`
                # around a watch works as with FakeKube.
                error = e
            finally:
                stream.stop()
        if error is not None:
            raise error

    async def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> JsonObject:
        """Run one API call in a worker thread; the decoded JSON body, or a KubeError."""
        call = functools.partial(
            method,
            *args,
            _preload_content=False,
            _request_timeout=(CONNECT_TIMEOUT_S, CALL_TIMEOUT_S),
            **kwargs,
        )

        def blocking() -> JsonObject:
            with _translated_errors(method.__name__):
                response = call()
                try:
                    return json.loads(response.data)
                except ValueError as e:
                    raise KubeError(f"{method.__name__}: the API server's answer is not JSON: {e}") from e
                finally:
                    response.release_conn()

        return await trio.to_thread.run_sync(blocking, limiter=self._limiter, abandon_on_cancel=True)


class _Watch:
    """One watch stream in one thread, feeding a Trio channel until stopped, ended or broken."""

    def __init__(self, lister: Callable[..., Any], selector: str, resource_version: str) -> None:
        self._lister = lister
        self._selector = selector
        self._resource_version = resource_version
        self._watch = watch.Watch()
        self._lock = threading.Lock()
        self._response: urllib3.HTTPResponse | None = None
        self._stopped = False

    async def run(self, send: trio.MemorySendChannel[WatchItem], task_status: trio.TaskStatus[None]) -> None:
        """Started once the server accepted the watch (an error before that is raised to the opener);
        a later stream error goes to the reader as KubeError. Leaving, cancelled too, stops the thread."""
        accepted = False

        def started() -> None:
            nonlocal accepted
            task_status.started()
            accepted = True

        try:
            async with send:
                try:
                    await trio.to_thread.run_sync(
                        self._pump,
                        send,
                        lambda: trio.from_thread.run_sync(started),
                        # one thread per watch, for as long as it lasts: its own limiter, not the calls'
                        limiter=trio.CapacityLimiter(1),
                        abandon_on_cancel=True,
                    )
                except KubeError as e:
                    if not accepted:
                        raise
                    if not self._stopped:
                        with suppress(trio.BrokenResourceError):
                            await send.send(e)
        finally:
            self.stop()

    def stop(self) -> None:
        """Callable from Trio: ends the thread's blocking read now (Watch.stop() alone misses a
        response it has not registered yet)."""
        with self._lock:
            self._stopped = True
            response = self._response
        self._watch.stop()
        if response is not None:
            _shutdown(response)

    def _open(self, started: Callable[[], None], **kwargs: Any) -> urllib3.HTTPResponse:
        """The list call Watch.stream makes; with headers back, the server has accepted the watch.
        Watch finds no model type to convert to in this function, so event objects stay dicts."""
        response: urllib3.HTTPResponse = self._lister(**kwargs)
        with self._lock:
            self._response = response
            stopped = self._stopped
        if stopped:  # cancelled while connecting: nobody waits for the start any more
            _shutdown(response)
        else:
            started()
        return response

    def _pump(self, send: trio.MemorySendChannel[WatchItem], started: Callable[[], None]) -> None:
        with _translated_errors(f"watch ({self._lister.__name__})"), closing(self._stream(started)) as stream:
            for raw in stream:
                if raw["type"] not in WatchEventType.__members__:
                    continue  # BOOKMARK (not requested) and whatever a newer server adds
                event = WatchEvent(WatchEventType(raw["type"]), raw["raw_object"])
                try:
                    trio.from_thread.run(send.send, event)
                except (trio.BrokenResourceError, trio.ClosedResourceError, trio.RunFinishedError):
                    return  # the reader left

    def _stream(self, started: Callable[[], None]) -> Iterator[dict[str, Any]]:
        try:
            yield from self._watch.stream(
                functools.partial(self._open, started),
                field_selector=self._selector,
                resource_version=self._resource_version,
                # timeoutSeconds also turns off Watch's own re-watch from a stale resourceVersion
                timeout_seconds=WATCH_TIMEOUT_S,
                # quiet is normal, but not longer than the server's own timeout: then the link is dead
                _request_timeout=(CONNECT_TIMEOUT_S, float(WATCH_TIMEOUT_S) + CALL_TIMEOUT_S),
            )
        except Exception:
            if self._stopped:
                return  # the socket shutdown that stop() did, seen from the reading side
            raise


@contextmanager
def _translated_errors(what: str) -> Iterator[None]:
    """Turn the client's exceptions into NotFound, Conflict or KubeError with the server's message."""
    try:
        yield
    except ApiException as e:
        status = e.status or 0
        answer = _status_body(e)
        message = f"{what}: {answer.get('message') or e.reason} ({status})"
        if status == 404:
            raise NotFound(message, status) from e
        if status == 410:  # also a watch's ERROR event (Expired): Watch.stream raises it as this
            raise Gone(message, status) from e
        if status == 409 or _uid_mismatch(status, answer):
            raise Conflict(message, status) from e
        raise KubeError(message, status) from e
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise KubeError(f"{what}: API server unreachable: {e}", 0) from e


def _status_body(exc: ApiException) -> dict[str, Any]:
    """The Status object the API server sent with an error; {} when the body is not one."""
    try:
        answer = json.loads(exc.body or "")
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


def _uid_mismatch(status: int, answer: dict[str, Any]) -> bool:
    """A write carrying metadata.uid for an object that has another uid (deleted and re-created
    since it was read): the API server rejects it as 422 Invalid on metadata.uid, not as 409."""
    causes = (answer.get("details") or {}).get("causes") or []
    return status == 422 and any(cause.get("field") == "metadata.uid" for cause in causes)


def _shutdown(response: urllib3.HTTPResponse) -> None:
    """Unblock a thread reading `response`; a response already closed has no reader to unblock."""
    with suppress(ValueError, RuntimeError, OSError):
        response.shutdown()


def _slice_selector(driver: str, node_name: str) -> str:
    return f"spec.driver={driver},spec.nodeName={node_name}"


def _pod_selector(node_name: str) -> str:
    return f"spec.nodeName={node_name}"


def _listing(listed: JsonObject, api_version: str, kind: str) -> Listing:
    """List items come without apiVersion/kind: add them, so a listed object looks like a fetched one."""
    items = [{"apiVersion": api_version, "kind": kind, **item} for item in listed.get("items") or []]
    return Listing(items, listed["metadata"]["resourceVersion"])


def _with_kind(item: JsonObject) -> JsonObject:
    """List items come without apiVersion/kind; add them so a listed slice looks like a fetched one."""
    return {"apiVersion": RESOURCE_API, "kind": "ResourceSlice", **item}
