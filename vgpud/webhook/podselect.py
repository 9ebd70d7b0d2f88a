"""Which pods a review needs, and what of a pod the webhook keeps: pure functions over API dicts (no
I/O), for the pod cache (vgpud.webhook.podcache) and the tests' fake API alike.

A review of a pod needs the other pods of its namespace that name one of its vGPU claims (only they can
hold one of their requests), and those the claims are reserved for; a review of a claim's reservations
needs the pods it is reserved for. A pod names a ResourceClaim in spec.resourceClaims[] and, for a
template's claim once generated, in status.resourceClaimStatuses[]: the index is built from both.

What is kept of a pod (`trim_pod`) is every field `parse_pod` and `namespace_pod` read, as it came, of
the right type or not, so that the rules reject a malformed pod from the cache as they would from a
list (ApiObjectError); the rest (labels, annotations, managed fields, images, env...) is most of a pod.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from vgpud.kube.api import JsonObject

#: the fields kept of each part of a pod (the rules read no other), and those of them whose strings
#: repeat across pods (a namespace, a node, a container's or a pod claim's name...), kept as one copy
_METADATA = ("name", "namespace", "uid", "resourceVersion"), frozenset({"namespace"})
_SPEC = ("nodeName",), frozenset({"nodeName"})
_POD_CLAIM = (
    ("name", "resourceClaimName", "resourceClaimTemplateName"),
    frozenset({"name", "resourceClaimTemplateName"}),
)
_CONTAINER = ("name", "restartPolicy"), frozenset({"name", "restartPolicy"})
_CLAIM_REF = ("name", "request"), frozenset({"name", "request"})
_STATUS = ("phase",), frozenset({"phase"})
_CLAIM_STATUS = ("name", "resourceClaimName"), frozenset({"name"})
#: at most this many distinct strings shared: such names repeat within a cluster; beyond, they do not
SHARED_STRINGS = 50_000

Fields = tuple[tuple[str, ...], frozenset[str]]
#: one copy of each shared string (a cache keeps one table for all its pods)
Strings = dict[str, str]


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _pick(obj: Mapping[str, Any], fields: Fields, strings: Strings) -> dict[str, Any]:
    """The fields of `obj` that it has, values as they are, the strings of shared fields from
    `strings`; the keys are this module's, one copy for every pod."""
    keys, shared = fields
    out = {}
    for key in keys:
        if key in obj:
            value = obj[key]
            if key in shared and isinstance(value, str):
                value = (
                    strings.setdefault(value, value)
                    if len(strings) < SHARED_STRINGS
                    else strings.get(value, value)
                )
            out[key] = value
    return out


def _entries(value: Any, fields: Fields, strings: Strings) -> Any:
    """A list of objects with only `fields` kept; a value that is not a list, or an item that is not
    an object, as it came."""
    if not isinstance(value, list):
        return value
    return [_pick(item, fields, strings) if isinstance(item, Mapping) else item for item in value]


def _trim_container(container: Mapping[str, Any], strings: Strings) -> dict[str, Any]:
    out = _pick(container, _CONTAINER, strings)
    resources = container.get("resources")
    if isinstance(resources, Mapping):
        if "claims" in resources:  # an empty `resources` reads as a missing one: left out
            out["resources"] = {"claims": _entries(resources["claims"], _CLAIM_REF, strings)}
    elif "resources" in container:
        out["resources"] = resources
    return out


def _trim_spec(spec: Mapping[str, Any], strings: Strings) -> dict[str, Any]:
    out = _pick(spec, _SPEC, strings)
    if "resourceClaims" in spec:
        out["resourceClaims"] = _entries(spec["resourceClaims"], _POD_CLAIM, strings)
    for key in ("initContainers", "containers"):
        if key in spec:
            value = spec[key]
            if isinstance(value, list):
                value = [_trim_container(c, strings) if isinstance(c, Mapping) else c for c in value]
            out[key] = value
    return out


def _trim_status(status: Mapping[str, Any], strings: Strings) -> dict[str, Any]:
    out = _pick(status, _STATUS, strings)
    if "resourceClaimStatuses" in status:
        out["resourceClaimStatuses"] = _entries(status["resourceClaimStatuses"], _CLAIM_STATUS, strings)
    return out


_TRIMS: tuple[tuple[str, Callable[[Mapping[str, Any], Strings], dict[str, Any]]], ...] = (
    ("metadata", lambda meta, strings: _pick(meta, _METADATA, strings)),
    ("spec", _trim_spec),
    ("status", _trim_status),
)


def trim_pod(pod: Mapping[str, Any], strings: Strings | None = None) -> JsonObject:
    """What the rules and the cache read of a pod: metadata name, namespace, uid, resourceVersion;
    spec.nodeName and spec.resourceClaims (name, resourceClaimName, resourceClaimTemplateName); each
    container's name, restartPolicy and resources.claims (name, request); status.phase and
    status.resourceClaimStatuses (name, resourceClaimName). A field that is present stays present with
    its value as it came, whatever its type (the rules judge it); a part that is not an object is kept
    whole. `strings`: the table of shared strings (one per cache; none: a table of its own)."""
    strings = {} if strings is None else strings
    out: JsonObject = {}
    for key, trim in _TRIMS:
        if key in pod:
            value = pod[key]
            out[key] = trim(value, strings) if isinstance(value, Mapping) else value
    return out


def pod_claim_names(pod: Any) -> frozenset[str]:
    """The ResourceClaims a pod names: spec.resourceClaims[].resourceClaimName and, for a template's
    claim once generated, status.resourceClaimStatuses[].resourceClaimName (a superset of the names
    `parse_pod` resolves; a value that is not a string names nothing)."""
    names: set[str] = set()
    for path in (("spec", "resourceClaims"), ("status", "resourceClaimStatuses")):
        entries = _get(pod, *path)
        if isinstance(entries, list):
            for entry in entries:
                name = _get(entry, "resourceClaimName")
                if isinstance(name, str) and name:
                    names.add(name)
    return frozenset(names)


def reservations(claim: Any) -> dict[str, str]:
    """uid -> name of the pods a claim's status.reservedFor names (an entry without a string uid
    names none; the rules reject such a claim on their own)."""
    out: dict[str, str] = {}
    entries = _get(claim, "status", "reservedFor")
    for entry in entries if isinstance(entries, list) else ():
        uid, name = _get(entry, "uid"), _get(entry, "name")
        if isinstance(uid, str) and uid:
            out[uid] = name if isinstance(name, str) else ""
    return out


def selects(pod: Any, namespace: str, claim_names: Collection[str], reserved_uids: Collection[str]) -> bool:
    """Whether a review of `namespace` needs `pod`: one of its pods that names one of `claim_names`
    or that a claim is reserved for (`reserved_uids`)."""
    if _get(pod, "metadata", "namespace") != namespace:
        return False
    uid = _get(pod, "metadata", "uid")
    return (isinstance(uid, str) and uid in reserved_uids) or not pod_claim_names(pod).isdisjoint(claim_names)


def select_pods(
    pods: Iterable[Any], namespace: str, claim_names: Collection[str], reserved_uids: Collection[str]
) -> list[JsonObject]:
    """The pods a review needs (`selects`), in the order given: what `PodCache.pods_for` returns
    through its index, here over any list (the tests' fake API uses it)."""
    return [pod for pod in pods if selects(pod, namespace, claim_names, reserved_uids)]


def storable(pod: Any) -> bool:
    """Whether a cache can key the object: a pod with its metadata an object (every pod the API
    server sends)."""
    return isinstance(pod, Mapping) and isinstance(pod.get("metadata"), Mapping)
