"""AdmissionReview in and out: what is read, what is refused as not a review (and why), the answer."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from tests import objects as o
from tests.unit.webhook.builders import claim_review, review
from vgpud.webhook.review import (
    MAX_MESSAGE,
    AdmissionRequest,
    BadReview,
    Decision,
    GroupVersion,
    encode,
    parse_review,
    review_response,
)

POD = o.pod("p", o.POD1_UID, containers=[o.container("a", o.ref("gpu"))])


def body(document: Any) -> bytes:
    return json.dumps(document).encode()


def test_a_pod_create_review_is_read() -> None:
    request = parse_review(body(review(POD, uid="r-1")))
    assert request == AdmissionRequest(
        uid="r-1",
        kind=GroupVersion("", "v1", "Pod"),
        resource=GroupVersion("", "v1", "pods"),
        sub_resource="",
        operation="CREATE",
        namespace="default",
        name="p",
        object=POD,
        old_object=None,
    )
    assert request.resource_path == "pods"


def test_a_claim_status_review_is_read() -> None:
    claim = o.claim(requests=[o.exactly("r0")], results=[o.result("r0")])
    request = parse_review(body(claim_review(claim, sub_resource="status", operation="UPDATE", old=claim)))
    assert request.resource == GroupVersion("resource.k8s.io", "v1", "resourceclaims")
    assert request.resource_path == "resourceclaims/status"
    assert request.old_object == claim


def test_object_with_identity_fills_what_the_object_lacks() -> None:
    bare = {"spec": {}}
    request = parse_review(body(review(bare, uid="5d7f2a30-aaaa-4bbb-8ccc-0123456789ab")))
    assert request.object_with_identity()["metadata"] == {
        "namespace": "default",
        "uid": "5d7f2a30-aaaa-4bbb-8ccc-0123456789ab",
    }
    assert parse_review(body(review(POD))).object_with_identity()["metadata"] == POD["metadata"]


def _mutate(path: str, value: Any) -> bytes:
    """A valid review with one field set (value ...) or removed (value is DELETE)."""
    document = copy.deepcopy(review(POD))
    *parents, last = path.split(".")
    target = document
    for key in parents:
        target = target[key]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value
    return body(document)


DELETE = object()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "the body is not JSON"),
        (b"garbage", "the body is not JSON"),
        (b"\xff\xfe\x00garbage", "the body is not JSON"),
        (body(review(POD))[:-40], "the body is not JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "the body is not JSON: nested too deeply"),
        (b"1" * 5000, "the body is not JSON"),  # longer than Python converts to int
        (b"[]", "must be a JSON object (an AdmissionReview), not list"),
        (b"null", "must be a JSON object (an AdmissionReview), not NoneType"),
        (_mutate("apiVersion", "admission.k8s.io/v1beta1"), "apiVersion 'admission.k8s.io/v1beta1' is not"),
        (_mutate("apiVersion", DELETE), "AdmissionReview.apiVersion is missing"),
        (_mutate("kind", "Pod"), "kind 'Pod' is not AdmissionReview"),
        (_mutate("request", DELETE), "AdmissionReview.request is missing"),
        (_mutate("request", "x"), "AdmissionReview.request must be an object, not str"),
        (_mutate("request.uid", DELETE), "request.uid is missing"),
        (_mutate("request.uid", 7), "request.uid must be a string, not int"),
        (_mutate("request.operation", "PATCH"), "request.operation 'PATCH' is not one of"),
        (_mutate("request.kind", DELETE), "request.kind is missing"),
        (_mutate("request.kind.kind", DELETE), "request.kind.kind is missing"),
        (_mutate("request.resource.version", None), "request.resource.version is missing"),
        (_mutate("request.resource.group", 1), "request.resource.group must be a string, not int"),
        (_mutate("request.object", None), "request.object is missing"),
        (_mutate("request.object", [1]), "request.object must be an object, not list"),
        (_mutate("request.oldObject", "x"), "request.oldObject must be an object, not str"),
        (_mutate("request.subResource", 3), "request.subResource must be a string, not int"),
        (_mutate("request.dryRun", "yes"), "request.dryRun must be a boolean, not str"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_what_is_not_a_review_says_why(raw: bytes, reason: str) -> None:
    with pytest.raises(BadReview) as caught:
        parse_review(raw)
    assert reason in caught.value.reason


def test_a_delete_needs_no_object() -> None:
    document = review(None, operation="DELETE", old=POD)
    assert parse_review(body(document)).object is None


def test_an_allowed_response_echoes_the_uid() -> None:
    assert review_response("u-1", Decision.allow()) == {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": {"uid": "u-1", "allowed": True},
    }


def test_a_denial_carries_code_reason_message_and_warnings() -> None:
    response = review_response("u-2", Decision.deny("no", warnings=("w1", "w2")))["response"]
    assert response == {
        "uid": "u-2",
        "allowed": False,
        "status": {"code": 403, "reason": "Forbidden", "message": "no"},
        "warnings": ["w1", "w2"],
    }
    failed = review_response("u-3", Decision.deny("lookup failed", code=500))["response"]
    assert failed["status"]["reason"] == "InternalError"


def test_long_messages_are_clipped() -> None:
    response = review_response("u", Decision.deny("x" * (MAX_MESSAGE * 2)))["response"]
    assert len(response["status"]["message"]) == MAX_MESSAGE
    assert response["status"]["message"].endswith("...")


def test_encode_is_compact_json() -> None:
    assert encode({"a": [1, 2]}) == b'{"a":[1,2]}'
