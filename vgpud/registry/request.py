"""The register call's request side: what a call may carry, how many may be in flight, and the errors
it can end with, each one gRPC status.

A request names its target by a register UUID (eager mode), or by a pod UID and a container name;
`parse_query` checks the fields and turns them into a `RegisterQuery` for resolution
(`vgpud.registry.resolve`). `Admission` bounds the calls in flight on the node and per caller. The
errors, each with the status the caller gets (`vgpud.registry.server` answers with it):

- `BadRequest`: INVALID_ARGUMENT, a field that is not what it claims to be, or a missing one;
- `Overloaded`: RESOURCE_EXHAUSTED, over the in-flight limits;
- `CallerRefused`: PERMISSION_DENIED, the caller is not (and cannot become) the target;
- `TargetGone`: NOT_FOUND, a target that cannot exist;
- `ResolveTimeout`: DEADLINE_EXCEEDED (PERMISSION_DENIED when the caller was another container of the
  target's pod), still unresolved when resolution's time ran out;
- `WriteBusy`: UNAVAILABLE, pids.config's lock held past its budget;
- `WriteFailed`, and `RegisterError` itself: INTERNAL.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from grpclib.const import Status

from vgpud.containers.values import is_pod_uid
from vgpud.partition.assigner import RegisterQuery, is_register_uuid
from vgpud.partition.layout import LayoutError, check_dns_label

MAX_IN_FLIGHT = 256
MAX_PER_CALLER = 8


# --------------------------------------------------------------------------------------------------
# Errors: each is one gRPC status


class RegisterError(Exception):
    """A register call that fails; `status` is what the caller gets."""

    status = Status.INTERNAL


class BadRequest(RegisterError):
    status = Status.INVALID_ARGUMENT


class CallerRefused(RegisterError):
    """The caller is not (and cannot become) the target: wrong pod, no pod, unknown PID."""

    status = Status.PERMISSION_DENIED


class TargetGone(RegisterError):
    status = Status.NOT_FOUND


class Overloaded(RegisterError):
    status = Status.RESOURCE_EXHAUSTED


class ResolveTimeout(RegisterError):
    """Resolution ran out of time; the last attempt's reason is in the message.

    The reference answers UNKNOWN ("context deadline exceeded: last attempt: ..."); DEADLINE_EXCEEDED
    says the same more precisely, and the library only checks for success. When the last attempt
    found the caller to be another container of the right pod, it is PERMISSION_DENIED instead.
    """

    status = Status.DEADLINE_EXCEEDED

    def __init__(self, message: str, *, mismatch: bool) -> None:
        super().__init__(message)
        if mismatch:
            self.status = Status.PERMISSION_DENIED


class WriteFailed(RegisterError):
    status = Status.INTERNAL


class WriteBusy(RegisterError):
    """Another writer held pids.config's lock past the budget: worth a retry."""

    status = Status.UNAVAILABLE


# --------------------------------------------------------------------------------------------------
# Limits


class Admission:
    """In-flight limits: `total` calls at once, `per_caller` from one caller; refuse, never queue,
    so a flood costs the flooder a fast error and everyone else nothing."""

    def __init__(self, total: int = MAX_IN_FLIGHT, per_caller: int = MAX_PER_CALLER) -> None:
        self.total, self.per_caller = total, per_caller
        self._counts: dict[str, int] = {}
        self.in_flight = 0

    @contextmanager
    def slot(self, key: str) -> Iterator[None]:
        if self.in_flight >= self.total:
            raise Overloaded(f"{self.in_flight} register calls in flight (the node's limit); retry later")
        if self._counts.get(key, 0) >= self.per_caller:
            raise Overloaded(f"{self.per_caller} register calls of {key} in flight (the limit per caller)")
        self.in_flight += 1
        self._counts[key] = self._counts.get(key, 0) + 1
        try:
            yield
        finally:
            self.in_flight -= 1
            if self._counts[key] <= 1:
                del self._counts[key]
            else:
                self._counts[key] -= 1


# --------------------------------------------------------------------------------------------------
# Requests


def parse_query(pod_uid: str, container: str, register_uuid: str) -> RegisterQuery:
    """Validate the request's fields (INVALID_ARGUMENT): a UUID, or a pod UID and a container name."""
    try:
        if register_uuid and not is_register_uuid(register_uuid):
            raise BadRequest(f"register_uuid {register_uuid[:64]!r} is not a lower-case UUID")
        if bool(pod_uid) != bool(container):
            raise BadRequest("pod_uid and container_name come together")
        if not register_uuid and not pod_uid:
            raise BadRequest("a register request needs register_uuid, or pod_uid and container_name")
        if pod_uid:
            if not is_pod_uid(pod_uid):
                raise BadRequest(f"pod_uid {pod_uid[:64]!r} is not a pod UID")
            check_dns_label(container, "container_name")
    except LayoutError as err:
        raise BadRequest(str(err)[:300]) from None
    return RegisterQuery(register_uuid=register_uuid, pod_uid=pod_uid, container=container)
