"""admission.k8s.io/v1 AdmissionReview: the request read and checked, the response built (pure).

A body that is not a well-formed review is a `BadReview` whose reason says what is wrong; the server
answers it with HTTP 400 and that reason. A review that reads fine always gets HTTP 200 with an
AdmissionReview response: allowed, or denied with `status.code` 403 and the rule's message (500 when
the webhook could not find out, 400 when the object itself cannot be read).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ADMISSION_API = "admission.k8s.io/v1"
OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})
#: longest message and warning sent back: the API server shows them to the user, whole
MAX_MESSAGE = 8192
MAX_WARNING = 512
MAX_WARNINGS = 10
_REASONS = {400: "BadRequest", 403: "Forbidden", 500: "InternalError"}


class BadReview(ValueError):
    """The body is not an AdmissionReview this webhook can answer; `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class GroupVersion:
    """`request.kind` (name = kind) or `request.resource` (name = resource)."""

    group: str
    version: str
    name: str


@dataclass(frozen=True)
class AdmissionRequest:
    uid: str
    kind: GroupVersion
    resource: GroupVersion
    sub_resource: str
    operation: str
    namespace: str
    name: str
    object: Mapping[str, Any] | None
    old_object: Mapping[str, Any] | None
    dry_run: bool = False

    @property
    def resource_path(self) -> str:
        """`pods`, `resourceclaims`, `resourceclaims/status`: the resource as webhook rules name it."""
        return f"{self.resource.name}/{self.sub_resource}" if self.sub_resource else self.resource.name

    def object_with_identity(self) -> dict[str, Any]:
        """`object` with metadata namespace, name and uid filled from the request where missing (an
        object under creation may not carry them all; the review's uid stands in for the object's)."""
        obj = dict(self.object or {})
        meta = dict(obj["metadata"]) if isinstance(obj.get("metadata"), Mapping) else {}
        for key, value in (("namespace", self.namespace), ("name", self.name), ("uid", self.uid)):
            if not meta.get(key) and value:
                meta[key] = value
        obj["metadata"] = meta
        return obj


def _decode(body: bytes) -> Any:
    try:
        return json.loads(body)
    except RecursionError:
        raise BadReview("the body is not JSON: nested too deeply") from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, an integer too long to convert
        raise BadReview(f"the body is not JSON: {err}") from None


def _string(obj: Mapping[str, Any], key: str, where: str, *, required: bool = False) -> str:
    value = obj.get(key)
    if value is None or value == "":
        if required:
            raise BadReview(f"{where}.{key} is missing")
        return ""
    if not isinstance(value, str):
        raise BadReview(f"{where}.{key} must be a string, not {type(value).__name__}")
    return value


def _object(
    obj: Mapping[str, Any], key: str, where: str, *, required: bool = False
) -> Mapping[str, Any] | None:
    value = obj.get(key)
    if value is None:
        if required:
            raise BadReview(f"{where}.{key} is missing")
        return None
    if not isinstance(value, Mapping):
        raise BadReview(f"{where}.{key} must be an object, not {type(value).__name__}")
    return value


def _group_version(request: Mapping[str, Any], key: str, name_key: str) -> GroupVersion:
    where = f"request.{key}"
    value = _object(request, key, "request", required=True)
    assert value is not None
    return GroupVersion(
        _string(value, "group", where),  # "" is the core group
        _string(value, "version", where, required=True),
        _string(value, name_key, where, required=True),
    )


def parse_review(body: bytes) -> AdmissionRequest:
    """The request of an admission.k8s.io/v1 AdmissionReview; BadReview when the body is not one."""
    review = _decode(body)
    if not isinstance(review, Mapping):
        raise BadReview(f"the body must be a JSON object (an AdmissionReview), not {type(review).__name__}")
    api_version = _string(review, "apiVersion", "AdmissionReview", required=True)
    if api_version != ADMISSION_API:
        raise BadReview(
            f"apiVersion {api_version!r} is not {ADMISSION_API} (set admissionReviewVersions: [v1])"
        )
    kind = _string(review, "kind", "AdmissionReview", required=True)
    if kind != "AdmissionReview":
        raise BadReview(f"kind {kind!r} is not AdmissionReview")
    request = _object(review, "request", "AdmissionReview", required=True)
    assert request is not None
    operation = _string(request, "operation", "request", required=True)
    if operation not in OPERATIONS:
        raise BadReview(f"request.operation {operation!r} is not one of {', '.join(sorted(OPERATIONS))}")
    obj = _object(request, "object", "request", required=operation in ("CREATE", "UPDATE"))
    dry_run = request.get("dryRun", False)
    if not isinstance(dry_run, bool):
        raise BadReview(f"request.dryRun must be a boolean, not {type(dry_run).__name__}")
    return AdmissionRequest(
        uid=_string(request, "uid", "request", required=True),
        kind=_group_version(request, "kind", "kind"),
        resource=_group_version(request, "resource", "resource"),
        sub_resource=_string(request, "subResource", "request"),
        operation=operation,
        namespace=_string(request, "namespace", "request"),
        name=_string(request, "name", "request"),
        object=obj,
        old_object=_object(request, "oldObject", "request"),
        dry_run=dry_run,
    )


@dataclass(frozen=True)
class Decision:
    """The answer to one review. `code` is the HTTP-like status the API server shows on denial."""

    allowed: bool
    message: str = ""
    code: int = 200
    warnings: tuple[str, ...] = ()

    @classmethod
    def allow(cls, message: str = "", warnings: tuple[str, ...] = ()) -> Decision:
        return cls(True, message, 200, warnings)

    @classmethod
    def deny(cls, message: str, code: int = 403, warnings: tuple[str, ...] = ()) -> Decision:
        return cls(False, message, code, warnings)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def review_response(uid: str, decision: Decision) -> dict[str, Any]:
    """The AdmissionReview the API server expects back: `response.uid` echoes the request's."""
    response: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {
            "code": decision.code,
            "reason": _REASONS.get(decision.code, "Forbidden"),
            "message": _clip(decision.message, MAX_MESSAGE),
        }
    if decision.warnings:
        response["warnings"] = [_clip(w, MAX_WARNING) for w in decision.warnings[:MAX_WARNINGS]]
    return {"apiVersion": ADMISSION_API, "kind": "AdmissionReview", "response": response}


def encode(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()
