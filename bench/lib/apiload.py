"""Filling a real API server fast, and churning it at a fixed rate, as the admin.

`Admin` makes requests over keep-alive HTTPS connections, one per thread; `fill` runs a function over a
range of indices on a pool of threads, printing progress lines; `Churn` patches objects in a thread at a
fixed rate until stopped. The objects: ResourceClaims allocated to other nodes (`other_claim`,
`claim_allocation`) spread over namespaces, and pods of one namespace naming claims (`pod`).
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from tests import objects as o

RESOURCE = "/apis/resource.k8s.io/v1"
THREADS = 16
PROGRESS_EVERY_S = 3.0
#: the class vGPU claims name (the webhook's default --vgpu-device-classes)
VGPU_CLASS = "vgpu-manager"


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: bytes) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {body[:300].decode(errors='replace')}")
        self.status = status


class Admin:
    """The admin's requests, each thread on its own keep-alive connection."""

    def __init__(self, url: str, token: str, context: ssl.SSLContext) -> None:
        parts = urlsplit(url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 443
        self._headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        self._context = context
        self._local = threading.local()

    def _connection(self) -> http.client.HTTPSConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection(self._host, self._port, context=self._context, timeout=60)
            self._local.conn = conn
        return conn

    def raw(
        self, method: str, path: str, body: object = None, content_type: str = "application/json"
    ) -> tuple[int, bytes]:
        """(status, body); a broken keep-alive connection is opened again once."""
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = dict(self._headers)
        if data is not None:
            headers["Content-Type"] = content_type
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                return response.status, response.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def call(
        self,
        method: str,
        path: str,
        body: object = None,
        content_type: str = "application/json",
        *,
        ok: tuple[int, ...] = (),
    ) -> dict[str, Any]:
        """The decoded answer; ApiError for a status >= 300 not in `ok`."""
        status, data = self.raw(method, path, body, content_type)
        if status >= 300 and status not in ok:
            raise ApiError(method, path, status, data)
        return json.loads(data or b"{}")

    def count(self, path: str) -> int:
        """How many objects a list path holds: a one-item page and its remainingItemCount (or every page
        when the server gives no count)."""
        page = self.call("GET", f"{path}?limit=1")
        meta = page.get("metadata") or {}
        if "remainingItemCount" in meta or not meta.get("continue"):
            return len(page.get("items") or []) + int(meta.get("remainingItemCount") or 0)
        total, token = 0, ""
        while True:
            query = "limit=5000" + (f"&continue={token}" if token else "")
            page = self.call("GET", f"{path}?{query}")
            total += len(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return total

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()


def fill(what: str, start: int, end: int, make: Callable[[int], None], threads: int = THREADS) -> float:
    """`make(k)` for k in [start, end) on `threads` threads, with progress lines; the objects per second."""
    if end <= start:
        return 0.0
    done = 0
    lock = threading.Lock()
    errors: list[BaseException] = []

    def one(k: int) -> None:
        nonlocal done
        if errors:
            return
        try:
            make(k)
        except BaseException as err:
            errors.append(err)
            raise
        with lock:
            done += 1

    began = last = time.monotonic()
    pool = ThreadPoolExecutor(threads, thread_name_prefix=f"fill-{what}")
    try:
        for k in range(start, end):
            pool.submit(one, k)
        while done < end - start and not errors:
            time.sleep(0.2)
            now = time.monotonic()
            if now - last >= PROGRESS_EVERY_S:
                last = now
                print(f"  {what}: {start + done:,}/{end:,} ({done / (now - began):,.0f}/s)", flush=True)
    except BaseException:
        # interrupted: the requests in flight end when the caller stops the API server, not before
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True, cancel_futures=True)
    if errors:
        raise errors[0]
    seconds = time.monotonic() - began
    rate = (end - start) / seconds
    print(f"  {what}: {end:,}/{end:,} in {seconds:.1f} s ({rate:,.0f}/s)", flush=True)
    return rate


def other_claim(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A vGPU claim as a user creates it: one request of the vGPU class (and `labels`)."""
    request = {"name": "gpu", "exactly": {"deviceClassName": VGPU_CLASS, "capacity": {"requests": {}}}}
    request["exactly"]["capacity"]["requests"] = {"memory": "4Gi", "cores": "25"}
    meta: dict[str, Any] = {"name": name, **({"labels": labels} if labels else {})}
    return {"metadata": meta, "spec": {"devices": {"requests": [request]}}}


def claim_allocation(node: str, *, pod: str, pod_uid: str, requests: tuple[str, ...] = ("gpu",)) -> dict:
    """The status the scheduler gives a vGPU claim it allocated on `node` and reserved for one pod."""
    results = [
        {
            "request": request,
            "driver": o.DRIVER,
            "pool": node,
            "device": "gpu-0",
            "shareID": str(uuid.uuid4()),
            "consumedCapacity": {"memory": "4Gi", "cores": "25"},
        }
        for request in requests
    ]
    selector = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {
        "allocation": {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [selector]}},
        "reservedFor": [{"resource": "pods", "name": pod, "uid": pod_uid}] if pod else [],
    }


def pod(name: str, node: str, claims: dict[str, tuple[str, list[str]]]) -> dict[str, Any]:
    """A pod bound to `node`; `claims`: container -> (ResourceClaim name, its requests it uses)."""
    containers = []
    resource_claims: dict[str, str] = {}
    for container, (claim, requests) in claims.items():
        pod_claim = f"c-{claim}"
        resource_claims[pod_claim] = claim
        refs = [o.ref(pod_claim, r) for r in requests] or [o.ref(pod_claim)]
        containers.append({**o.container(container, *refs), "imagePullPolicy": "IfNotPresent"})
    return {
        "metadata": {"name": name, "labels": {"app": "bench"}},
        "spec": {
            "nodeName": node,
            "containers": containers,
            "resourceClaims": [{"name": k, "resourceClaimName": v} for k, v in resource_claims.items()],
        },
    }


class Churn:
    """`update(i)` for i = 0, 1, ... at `rate` per second in a thread, until `stop`; counts what it did."""

    def __init__(self, update: Callable[[int], None], rate: float) -> None:
        self._update, self.rate = update, rate
        self._stop = threading.Event()
        self.done = 0
        self.errors: list[str] = []
        self.began = self.ended = 0.0
        self._thread = threading.Thread(target=self._run, name="churn", daemon=True)

    def start(self) -> Churn:
        self.began = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.ended = time.monotonic()

    @property
    def achieved(self) -> float:
        return self.done / max(1e-9, (self.ended or time.monotonic()) - self.began)

    def _run(self) -> None:
        step = 1.0 / self.rate
        due = time.monotonic()
        while not self._stop.is_set():
            try:
                self._update(self.done)
            except Exception as err:  # recorded: a failed update is the bench's own failure
                self.errors.append(f"{type(err).__name__}: {err}")
                if len(self.errors) > 10:
                    return
            self.done += 1
            due += step
            delay = due - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            elif delay < -1.0:
                due = time.monotonic()  # behind by more than a second: do not try to catch up in a burst
