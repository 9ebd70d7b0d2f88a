"""KubeClient without an API server: configuration errors, an unreachable server, and the wire
(paths, content types, error mapping, watch ERROR events) against a scripted HTTP stub."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator
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
from vgpud.kube.client import KubeClient

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

    routes: dict[tuple[str, str, bool], Callable[[], tuple[int, Iterable[bytes]]]]
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
            code, chunks = route() if route else status(404, f"no route for {self.command} {url.path}")
            self.send_response(code)
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
        await client.patch_resource_claim_annotations("ns", "c", {"a": "1", "b": None}, uid="u1")
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
