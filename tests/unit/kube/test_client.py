"""KubeClient without an API server: configuration errors, an unreachable server, and the wire
(paths, content types, error mapping, watch ERROR events) against a scripted HTTP stub."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import trio
import yaml

from tests.kubeapi import free_port
from vgpud.kube.api import Conflict, Gone, KubeError, NotFound, WatchEventType
from vgpud.kube.client import LIST_PAGE_SIZE, KubeClient
from vgpud.kube.rest import THROTTLE_RETRIES, retry_delay

SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def test_from_config_names_what_it_tried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    missing = tmp_path / "absent.yaml"
    monkeypatch.setenv("KUBECONFIG", str(missing))
    with pytest.raises(KubeError) as e:
        KubeClient.from_config(None)
    assert "in-cluster" in str(e.value) and str(missing) in str(e.value)
    with pytest.raises(KubeError) as e:
        KubeClient.from_config(tmp_path / "explicit.yaml")
    assert "explicit.yaml" in str(e.value) and "in-cluster" not in str(e.value)


async def test_unreachable_server(tmp_path: Path) -> None:
    client = KubeClient.from_config(kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{free_port()}"))
    with pytest.raises(KubeError) as e:
        await client.get_node("n")
    assert e.value.status == 0 and "unreachable" in str(e.value)
    with pytest.raises(KubeError):
        async with client.watch_resource_slices(driver="d", node_name="n"):
            pass


@dataclass
class Stub:
    """Answers by (method, path, is-watch); records every request."""

    #: an answer is (status, body chunks) or (status, body chunks, extra headers)
    routes: dict[tuple[str, str, bool], Callable[[], tuple[Any, ...]]]
    requests: list[dict[str, Any]] = field(default_factory=list)


def status(code: int, message: str) -> tuple[int, list[bytes]]:
    return code, [
        json.dumps({"kind": "Status", "status": "Failure", "message": message, "code": code}).encode()
    ]


def event(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


@pytest.fixture
def stub(tmp_path: Path) -> Iterator[tuple[Stub, KubeClient]]:
    stub = Stub(routes={})

    class Handler(BaseHTTPRequestHandler):
        def handle_one(self) -> None:
            url = urlsplit(self.path)
            query = parse_qs(url.query)
            length = int(self.headers.get("Content-Length") or 0)
            stub.requests.append(
                {
                    "method": self.command,
                    "path": url.path,
                    "query": query,
                    "content_type": self.headers.get("Content-Type"),
                    "body": json.loads(self.rfile.read(length)) if length else None,
                }
            )
            route = stub.routes.get((self.command, url.path, query.get("watch") == ["true"]))
            answer = route() if route else status(404, f"no route for {self.command} {url.path}")
            code, chunks, *headers = answer
            self.send_response(code)
            for name, value in (headers[0] if headers else {}).items():
                self.send_header(name, value)
            self.send_header("Content-Type", "application/json")
            self.send_header("Connection", "close")
            self.end_headers()
            for chunk in chunks:
                self.wfile.write(chunk)
                self.wfile.flush()

        do_GET = do_PATCH = do_DELETE = handle_one

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    client = KubeClient.from_config(kubeconfig(tmp_path / "kc", f"http://127.0.0.1:{server.server_port}"))
    try:
        yield stub, client
    finally:
        client.close()
        server.shutdown()
        server.server_close()


async def test_errors_are_mapped(stub: tuple[Stub, KubeClient]) -> None:
    routes, client = stub[0].routes, stub[1]
    claim = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c"
    routes["PATCH", claim, False] = lambda: status(409, "Precondition failed: UID in precondition")
    routes["GET", "/api/v1/nodes/boom", False] = lambda: (500, [b"not json"])
    with pytest.raises(NotFound) as e:
        await client.get_node("missing")
    assert "no route for GET /api/v1/nodes/missing" in str(e.value)
    with pytest.raises(Conflict) as c:
        await client.patch_resource_claim_metadata("ns", "c", uid="u1", annotations={"a": "1", "b": None})
    assert "Precondition failed" in str(c.value)
    with pytest.raises(KubeError) as k:
        await client.get_node("boom")
    assert k.value.status == 500 and not isinstance(k.value, NotFound | Conflict)
    patch = stub[0].requests[1]
    assert patch["content_type"] == "application/merge-patch+json"
    assert patch["body"] == {"metadata": {"uid": "u1", "annotations": {"a": "1", "b": None}}}


async def test_apply_is_a_server_side_apply(stub: tuple[Stub, KubeClient]) -> None:
    routes, client = stub[0].routes, stub[1]
    body = {"metadata": {"name": "s"}, "spec": {"driver": "d"}}
    routes["PATCH", f"{SLICES}/s", False] = lambda: (200, [json.dumps({"metadata": {"name": "s"}}).encode()])
    assert (await client.apply_resource_slice(body, field_manager="vgpud"))["metadata"]["name"] == "s"
    [request] = stub[0].requests
    assert request["content_type"] == "application/apply-patch+yaml"
    assert request["query"]["fieldManager"] == ["vgpud"] and request["query"]["force"] == ["true"]
    assert request["body"] == {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", **body}


async def test_watch_error_event_raises(stub: tuple[Stub, KubeClient]) -> None:
    routes, client = stub[0].routes, stub[1]
    obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"}}
    gone = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old resource version"}
    routes["GET", SLICES, False] = lambda: (
        200,
        [json.dumps({"metadata": {"resourceVersion": "7"}}).encode()],
    )
    routes["GET", SLICES, True] = lambda: (
        200,
        [event("ADDED", obj), event("BOOKMARK", obj), event("ERROR", gone)],
    )
    with trio.fail_after(10), pytest.raises(KubeError) as e:
        async with client.watch_resource_slices(driver="d", node_name="n") as events:
            first = await anext(events)
            assert (first.type, first.object) == (WatchEventType.ADDED, obj)
            await anext(events)  # the BOOKMARK is skipped, the ERROR raises and leaves the block
    assert isinstance(e.value, Gone) and "too old resource version" in str(e.value)
    watch = stub[0].requests[-1]["query"]
    assert watch["resourceVersion"] == ["7"]
    assert watch["fieldSelector"] == ["spec.driver=d,spec.nodeName=n"]


async def test_watch_that_ends_ends_the_iterator(stub: tuple[Stub, KubeClient]) -> None:
    routes, client = stub[0].routes, stub[1]
    routes["GET", SLICES, False] = lambda: (
        200,
        [json.dumps({"metadata": {"resourceVersion": "7"}}).encode()],
    )
    routes["GET", SLICES, True] = lambda: (200, [])
    with trio.fail_after(10):
        async with client.watch_resource_slices(driver="d", node_name="n") as events:
            assert [e async for e in events] == []


async def test_watch_refused_raises_on_entry(stub: tuple[Stub, KubeClient]) -> None:
    routes, client = stub[0].routes, stub[1]
    routes["GET", SLICES, False] = lambda: (
        200,
        [json.dumps({"metadata": {"resourceVersion": "7"}}).encode()],
    )
    routes["GET", SLICES, True] = lambda: status(403, "resourceslices is forbidden")
    with trio.fail_after(10), pytest.raises(KubeError, match="forbidden") as e:
        async with client.watch_resource_slices(driver="d", node_name="n"):
            pytest.fail("entered a watch the server refused")
    assert e.value.status == 403


async def test_leaving_a_watch_ends_its_stream_at_once(stub: tuple[Stub, KubeClient]) -> None:
    routes, client = stub[0].routes, stub[1]
    obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"}}
    release = threading.Event()

    def open_stream() -> Iterator[bytes]:
        yield event("ADDED", obj)
        release.wait(60)  # the server keeps the watch open: only the client's stop ends the read

    routes["GET", SLICES, False] = lambda: (
        200,
        [json.dumps({"metadata": {"resourceVersion": "7"}}).encode()],
    )
    routes["GET", SLICES, True] = lambda: (200, open_stream())
    try:
        with trio.fail_after(10):
            async with client.watch_resource_slices(driver="d", node_name="n") as events:
                assert (await anext(events)).object == obj
    finally:
        release.set()


async def test_a_watch_line_past_the_limit_is_a_broken_stream(
    stub: tuple[Stub, KubeClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream that never ends its line does not grow without bound: the watch fails, naming why."""
    monkeypatch.setattr("vgpud.kube.rest.MAX_EVENT_BYTES", 1000)
    routes, client = stub[0].routes, stub[1]
    routes["GET", SLICES, False] = lambda: (
        200,
        [json.dumps({"metadata": {"resourceVersion": "7"}}).encode()],
    )
    routes["GET", SLICES, True] = lambda: (200, [b'{"type": "ADDED", "object": {"x": "' + b"y" * 5000])
    with trio.fail_after(10), pytest.raises(KubeError, match="longer than 1000 bytes"):
        async with client.watch_resource_slices(driver="d", node_name="n") as events:
            await anext(events)


@pytest.mark.parametrize(
    ("method", "code", "retry_after", "delay"),
    [
        ("GET", 429, "3", 3.0),
        ("GET", 503, "1", 1.0),
        ("GET", 429, "0", 0.0),
        ("GET", 429, "-5", 0.0),
        ("GET", 429, "3600", 30.0),  # capped
        ("GET", 429, None, None),  # no Retry-After: not throttling, an error
        ("GET", 429, "Wed, 21 Oct 2026 07:28:00 GMT", None),  # the date form: client-go does not retry
        ("GET", 404, "1", None),
        ("PATCH", 429, "1", None),  # a write is never sent again
        ("DELETE", 503, "1", None),
    ],
)
def test_the_throttling_rule(method: str, code: int, retry_after: str | None, delay: float | None) -> None:
    assert retry_delay(method, code, retry_after) == delay


def throttled(times: int, then: tuple[Any, ...]) -> Callable[[], tuple[Any, ...]]:
    """A route that answers 429 with `Retry-After: 0` `times` times, then `then`."""
    left = [times]

    def answer() -> tuple[Any, ...]:
        if left[0] > 0:
            left[0] -= 1
            return (*status(429, "too many requests"), {"Retry-After": "0"})
        return then

    return answer


async def test_a_throttled_read_is_sent_again_as_asked(stub: tuple[Stub, KubeClient]) -> None:
    routes, client = stub[0].routes, stub[1]
    routes["GET", "/api/v1/nodes/n", False] = throttled(
        2, (200, [json.dumps({"metadata": {"name": "n"}}).encode()])
    )
    assert (await client.get_node("n"))["metadata"]["name"] == "n"
    assert len(stub[0].requests) == 3


async def test_a_read_throttled_past_the_retries_fails_with_the_429(stub: tuple[Stub, KubeClient]) -> None:
    routes, client = stub[0].routes, stub[1]
    routes["GET", "/api/v1/nodes/n", False] = throttled(1000, status(200, "never"))
    with pytest.raises(KubeError) as e:
        await client.get_node("n")
    assert e.value.status == 429 and len(stub[0].requests) == THROTTLE_RETRIES + 1


async def test_a_throttled_write_is_not_sent_again(stub: tuple[Stub, KubeClient]) -> None:
    routes, client = stub[0].routes, stub[1]
    routes["PATCH", f"{SLICES}/s", False] = throttled(1, (200, [b"{}"]))
    with pytest.raises(KubeError) as e:
        await client.apply_resource_slice({"metadata": {"name": "s"}}, field_manager="vgpud")
    assert e.value.status == 429 and len(stub[0].requests) == 1


def pages(*answers: tuple[Any, ...]) -> Callable[[], tuple[Any, ...]]:
    """A route that gives `answers` one after another."""
    queue = list(answers)
    return lambda: queue.pop(0)


def page(names: list[str], version: str, token: str = "") -> tuple[int, list[bytes]]:
    metadata = {"resourceVersion": version, **({"continue": token} if token else {})}
    items = [{"metadata": {"name": name}} for name in names]
    return 200, [json.dumps({"metadata": metadata, "items": items}).encode()]


async def test_a_list_comes_in_pages(stub: tuple[Stub, KubeClient]) -> None:
    routes, client = stub[0].routes, stub[1]
    claims = "/apis/resource.k8s.io/v1/resourceclaims"
    routes["GET", claims, False] = pages(page(["a", "b"], "9", "t1"), page(["c"], "9"))
    listing = await client.list_resource_claims()
    assert [c["metadata"]["name"] for c in listing.items] == ["a", "b", "c"]
    assert listing.resource_version == "9" and listing.items[0]["kind"] == "ResourceClaim"
    first, second = (request["query"] for request in stub[0].requests)
    assert first == {"limit": [str(LIST_PAGE_SIZE)]}
    assert second == {"limit": [str(LIST_PAGE_SIZE)], "continue": ["t1"]}


async def test_an_expired_continue_token_lists_everything_at_once(stub: tuple[Stub, KubeClient]) -> None:
    routes, client = stub[0].routes, stub[1]
    claims = "/apis/resource.k8s.io/v1/resourceclaims"
    expired = status(410, "The provided continue parameter is too old")
    routes["GET", claims, False] = pages(page(["a"], "9", "t1"), expired, page(["a", "b", "c"], "12"))
    listing = await client.list_resource_claims()
    assert [c["metadata"]["name"] for c in listing.items] == ["a", "b", "c"]
    assert listing.resource_version == "12"
    assert stub[0].requests[-1]["query"] == {}  # the whole list, unpaginated


async def test_a_first_page_gone_is_the_callers_410(stub: tuple[Stub, KubeClient]) -> None:
    routes, client = stub[0].routes, stub[1]
    routes["GET", "/apis/resource.k8s.io/v1/resourceclaims", False] = lambda: status(410, "gone")
    with pytest.raises(Gone):
        await client.list_resource_claims()


async def test_the_informers_watches_ask_for_bookmarks_and_the_slice_watch_does_not(
    stub: tuple[Stub, KubeClient],
) -> None:
    routes, client = stub[0].routes, stub[1]
    bookmark = {"kind": "ResourceClaim", "metadata": {"resourceVersion": "15"}}
    routes["GET", "/apis/resource.k8s.io/v1/resourceclaims", True] = lambda: (
        200,
        [event("BOOKMARK", bookmark)],
    )
    async with client.watch_resource_claims(resource_version="7") as events:
        got = await anext(events)
    assert (got.type, got.object) == (WatchEventType.BOOKMARK, bookmark)
    assert stub[0].requests[-1]["query"]["allowWatchBookmarks"] == ["true"]
