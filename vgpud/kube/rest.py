"""Blocking HTTP to the API server over urllib3: JSON calls, and watch streams read line by line.

Errors come out as the KubeError family, as client-go maps them: 404 NotFound, 410 Gone (a watch's
ERROR event with code 410 too), 409 or a 422 on metadata.uid Conflict, any other status KubeError
with it, and no answer at all KubeError with status 0 ("unreachable"). Every call runs in a worker
thread (vgpud.kube.client); the pool keeps up to `maxsize` connections for reuse.

A read the server throttles (429, or a 5xx, with `Retry-After` in seconds: API Priority and Fairness,
an overloaded server) is tried again after the time it asks, up to THROTTLE_RETRIES times, as client-go
does (`retry_delay`). A write is not: the thread cannot learn that its caller gave up meanwhile, and
a write sent after that would surprise it; the caller sees the 429 as a KubeError.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from urllib.parse import urlencode

import urllib3

from vgpud import __version__
from vgpud.kube.api import Conflict, Gone, JsonObject, KubeError, NotFound
from vgpud.kube.config import ApiConfig

#: seconds to wait for a TCP connection to the API server before failing a call
CONNECT_TIMEOUT_S = 10.0
#: seconds an ordinary call may wait for the server's answer
CALL_TIMEOUT_S = 30.0
#: connection errors retried before a call fails (a pooled connection the server closed meanwhile);
#: an answer is never retried here, and a PATCH never after its request was sent. urllib3's own
#: `Retry-After` handling is off: with `status=0` it turns a throttled answer into a connection error
#: (status 0, "unreachable"); `retry_delay` decides instead
RETRIES = urllib3.Retry(total=3, redirect=False, status=0, respect_retry_after_header=False)

#: the most bytes one read of a watch stream takes
READ_SIZE = 65536
#: the longest watch event line accepted: the API server stores objects up to about 1.5 MiB (etcd's
#: request limit), so a line past this is a broken stream, not a big object
MAX_EVENT_BYTES = 16 * 1024 * 1024

#: how often a throttled read is tried again (client-go's default for a request: 10)
THROTTLE_RETRIES = 10
#: the longest `Retry-After` waited for; a longer one is waited this long
MAX_RETRY_AFTER_S = 30.0

Query = Mapping[str, str | int | bool]

log = logging.getLogger("vgpud.kube")


def retry_delay(method: str, status: int, retry_after: str | None) -> float | None:
    """Seconds to wait before trying a request again that the server did not serve, or None: do not
    (client-go's rule: a 429 or a 5xx that carries `Retry-After` in whole seconds; here reads only)."""
    if retry_after is None or method != "GET":
        return None
    if status != 429 and not 500 <= status < 600:
        return None
    try:
        seconds = int(retry_after.strip())
    except ValueError:
        return None  # the HTTP-date form: client-go does not retry on it either
    return min(max(seconds, 0), MAX_RETRY_AFTER_S)


class Rest:
    """One API server, one connection pool."""

    def __init__(self, config: ApiConfig, *, maxsize: int) -> None:
        self._config = config
        #: answers that asked to come back later (429, or 5xx with Retry-After) and were tried again
        self.throttled = 0
        self._pool = urllib3.PoolManager(
            num_pools=1,
            maxsize=maxsize,
            ssl_context=config.ssl_context(),
            cert_reqs="CERT_NONE" if config.insecure_skip_tls_verify else "CERT_REQUIRED",
            retries=RETRIES,
        )

    def close(self) -> None:
        self._pool.clear()

    def call(
        self, method: str, path: str, query: Query | None = None, body: JsonObject | None = None,
        content_type: str = "application/json",
    ) -> JsonObject:  # fmt: skip
        """One request; the decoded JSON answer."""
        what = f"{method} {path}"
        with translated_errors(what):
            response = self._request(method, path, query, body, content_type, read_timeout=CALL_TIMEOUT_S)
            try:
                data = response.data
            finally:
                response.release_conn()
            _raise_for_status(what, response.status, data)
        try:
            answer = json.loads(data)
        except ValueError as e:
            raise KubeError(f"{what}: the API server's answer is not JSON: {e}", response.status) from e
        if not isinstance(answer, dict):
            raise KubeError(f"{what}: the API server's answer is not a JSON object", response.status)
        return answer

    def open_watch(self, path: str, query: Query, *, read_timeout: float) -> urllib3.BaseHTTPResponse:
        """A watch's response, headers read (the server accepted it), body not yet; raises like `call`."""
        what = f"watch {path}"
        with translated_errors(what):
            response = self._request(
                "GET", path, {**query, "watch": "true"}, None, "", read_timeout=read_timeout
            )
            if response.status >= 300:
                try:
                    data = response.data
                finally:
                    response.release_conn()
                _raise_for_status(what, response.status, data)
        return response

    def _request(
        self, method: str, path: str, query: Query | None, body: JsonObject | None, content_type: str,
        *, read_timeout: float,
    ) -> urllib3.BaseHTTPResponse:  # fmt: skip
        headers = {
            "Accept": "application/json",
            "User-Agent": f"vgpud/{__version__}",
            **self._config.headers(),
        }
        encoded = None
        if body is not None:
            encoded = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = content_type
        fields = {name: _query_value(value) for name, value in (query or {}).items()}
        url = self._config.server + path
        if fields:
            url += "?" + urlencode(fields)
        timeout = urllib3.Timeout(connect=CONNECT_TIMEOUT_S, read=read_timeout)
        retries = 0
        while True:
            response = self._pool.request(
                method, url, body=encoded, headers=headers, preload_content=False, timeout=timeout
            )
            delay = retry_delay(method, response.status, response.headers.get("Retry-After"))
            if delay is None or retries == THROTTLE_RETRIES:
                return response
            retries += 1
            self.throttled += 1
            response.drain_conn()
            response.release_conn()
            log.info(
                "%s %s: the API server answered %d; again in %.0f s", method, path, response.status, delay
            )
            time.sleep(delay)  # a worker thread's: the event loop runs on


def watch_events(response: urllib3.BaseHTTPResponse, what: str) -> Iterator[JsonObject]:
    """The events of a watch, one JSON object per line, until the server ends the stream; an ERROR
    event raises (its Status's code: 410 Gone when the version is too old)."""
    with translated_errors(what):
        pending = b""
        # read1: whatever has arrived, chunked or not (a plain read would wait for the stream's end)
        while chunk := response.read1(READ_SIZE, decode_content=False):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip():
                    yield _event(line, what)
            if len(pending) > MAX_EVENT_BYTES:
                raise KubeError(
                    f"{what}: a watch event longer than {MAX_EVENT_BYTES} bytes: the stream is broken"
                )
        if pending.strip():
            yield _event(pending, what)


def _event(line: bytes, what: str) -> JsonObject:
    try:
        event = json.loads(line)
    except ValueError as e:
        raise KubeError(f"{what}: a watch event is not JSON: {e}") from e
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
        raise KubeError(f"{what}: a watch event without an object: {line[:200]!r}")
    if event.get("type") == "ERROR":
        status = event["object"]
        raise _error(what, int(status.get("code") or 0), status)
    return event


def shutdown(response: urllib3.BaseHTTPResponse) -> None:
    """Unblock a thread reading `response` (its socket shut down); nothing when already closed."""
    with suppress(ValueError, RuntimeError, OSError):
        response.shutdown()  # type: ignore[attr-defined]


@contextmanager
def translated_errors(what: str) -> Iterator[None]:
    """Transport errors as KubeError with status 0 (no answer)."""
    try:
        yield
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise KubeError(f"{what}: API server unreachable: {e}", 0) from e


def _raise_for_status(what: str, status: int, data: bytes) -> None:
    if status < 300:
        return
    try:
        answer = json.loads(data)
    except ValueError:
        answer = {}
    raise _error(what, status, answer if isinstance(answer, dict) else {})


def _error(what: str, status: int, answer: JsonObject) -> KubeError:
    """The KubeError for an API Status `answer` with HTTP `status`, the server's message in it."""
    message = f"{what}: {answer.get('message') or answer.get('reason') or 'HTTP error'} ({status})"
    if status == 404:
        return NotFound(message, status)
    if status == 410:
        return Gone(message, status)
    if status == 409 or _uid_mismatch(status, answer):
        return Conflict(message, status)
    return KubeError(message, status)


def _uid_mismatch(status: int, answer: JsonObject) -> bool:
    """A write carrying metadata.uid for an object that has another uid (deleted and re-created
    since it was read): the API server rejects it as 422 Invalid on metadata.uid, not as 409."""
    causes = (answer.get("details") or {}).get("causes") or []
    return status == 422 and any(cause.get("field") == "metadata.uid" for cause in causes)


def _query_value(value: str | int | bool) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)
