"""Claims and pods as the partition code sees them, parsed from API dicts.

Input is what the API server returns (camelCase JSON, resource.k8s.io/v1 and core/v1). Only what
partitioning needs is kept: the vGPU devices of a claim allocated to our driver (firstAvailable
subrequests folded into their main request), the pods it is reserved for, and which containers of a
pod reference which of its requests. A malformed object is a `ModelError` that names the object and
the field; it never yields a half-parsed view.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from vgpud.partition.layout import LayoutError, check_dns_label, check_token


class ModelError(ValueError):
    """An API object that does not have the shape Kubernetes guarantees."""


class ContainerKind(StrEnum):
    """The reference's two kinds; a sidecar is an init container with restartPolicy: Always."""

    INIT = "init"
    APP = "app"


@dataclass(frozen=True)
class ContainerRef:
    """One container of one pod: the graph's container node and a registry candidate."""

    pod_uid: str
    kind: ContainerKind
    name: str
    sidecar: bool = False

    @property
    def node(self) -> str:
        """`<podUID>/<init|app>/<name>`: the reference's node name, which partition keys hash."""
        return f"{self.pod_uid}/{self.kind}/{self.name}"


@dataclass(frozen=True)
class ClaimReference:
    """A `resources.claims` entry: a pod claim name and optionally one request of it."""

    name: str
    request: str | None


@dataclass(frozen=True)
class PodContainer:
    ref: ContainerRef
    claims: tuple[ClaimReference, ...]


@dataclass(frozen=True)
class AllocatedDevice:
    """One allocation result of our driver."""

    request: str
    subrequest: str | None
    pool: str
    device: str
    share_id: str | None = None
    consumed_capacity: Mapping[str, str] = field(default_factory=dict, hash=False)
    admin_access: bool = False

    @property
    def result_request(self) -> str:
        """The result's own request field: `main` or `main/sub`."""
        return self.request if self.subrequest is None else f"{self.request}/{self.subrequest}"


@dataclass(frozen=True)
class ReservedPod:
    name: str
    uid: str


@dataclass(frozen=True)
class ClaimView:
    uid: str
    name: str
    namespace: str
    annotations: Mapping[str, str] = field(default_factory=dict, hash=False)
    allocated: bool = False
    #: results of our driver, in result order (other drivers' results are dropped)
    devices: tuple[AllocatedDevice, ...] = ()
    reserved_for: tuple[ReservedPod, ...] = ()

    @property
    def requests(self) -> tuple[str, ...]:
        """The main requests allocated to our driver, sorted."""
        return tuple(sorted({device.request for device in self.devices}))

    def reserves(self, pod: PodView) -> bool:
        return pod.namespace == self.namespace and any(
            ref.uid == pod.uid and ref.name == pod.name for ref in self.reserved_for
        )

    @classmethod
    def from_dict(cls, obj: Any, driver: str) -> ClaimView:
        return parse_claim(obj, driver)


@dataclass(frozen=True)
class PodView:
    uid: str
    name: str
    namespace: str
    #: pod claim name -> ResourceClaim name; None while a template's claim is not generated yet
    claim_names: Mapping[str, str | None] = field(default_factory=dict, hash=False)
    #: init containers first, then app containers, each in spec order
    containers: tuple[PodContainer, ...] = ()

    def container(self, name: str) -> PodContainer | None:
        return next((c for c in self.containers if c.ref.name == name), None)

    @classmethod
    def from_dict(cls, obj: Any) -> PodView:
        return parse_pod(obj)


# --------------------------------------------------------------------------------------------------
# Parsing


class _Reader:
    """Typed field access whose errors say which object and which field."""

    def __init__(self, what: str) -> None:
        self.what = what

    def error(self, path: str, message: str) -> ModelError:
        return ModelError(f"{self.what}: {path}: {message}")

    def get(self, obj: Mapping[str, Any], key: str, path: str, kind: type, required: bool = False) -> Any:
        value = obj.get(key)
        where = f"{path}.{key}" if path else key
        if value is None:
            if required:
                raise self.error(where, "missing")
            return None
        if not isinstance(value, kind):
            raise self.error(where, f"expected {_KIND_NAMES[kind]}, got {type(value).__name__}")
        return value

    def text(self, obj: Mapping[str, Any], key: str, path: str) -> str | None:
        """An optional string; empty counts as absent (as omitempty fields do)."""
        return self.get(obj, key, path, str) or None

    def need(self, obj: Mapping[str, Any], key: str, path: str) -> str:
        """A required, non-empty string."""
        value = self.get(obj, key, path, str, required=True)
        if not value:
            raise self.error(f"{path}.{key}" if path else key, "empty")
        return value

    def items(self, obj: Mapping[str, Any], key: str, path: str) -> Iterable[tuple[str, Mapping[str, Any]]]:
        """The entries of an optional list of objects, each with its path."""
        for index, item in enumerate(self.get(obj, key, path, list) or ()):
            where = f"{path}.{key}[{index}]" if path else f"{key}[{index}]"
            if not isinstance(item, Mapping):
                raise self.error(where, f"expected an object, got {type(item).__name__}")
            yield where, item

    def checked(self, check: Any, value: str, what: str, path: str) -> str:
        try:
            return check(value, what)
        except LayoutError as err:
            raise self.error(path, str(err)) from None


_KIND_NAMES = {Mapping: "an object", list: "a list", str: "a string", bool: "a boolean"}


def _metadata(reader: _Reader, obj: Any) -> tuple[Mapping[str, Any], str, str, str]:
    if not isinstance(obj, Mapping):
        raise reader.error("(object)", f"expected an object, got {type(obj).__name__}")
    meta = reader.get(obj, "metadata", "", Mapping, required=True)
    name = reader.need(meta, "name", "metadata")
    namespace = reader.need(meta, "namespace", "metadata")
    reader.what = f"{reader.what} {namespace}/{name}"
    uid = reader.checked(check_token, reader.need(meta, "uid", "metadata"), "UID", "metadata.uid")
    return meta, uid, name, namespace


def _spec_requests(reader: _Reader, spec: Mapping[str, Any]) -> dict[str, frozenset[str] | None]:
    """Request name -> its subrequest names (firstAvailable) or None (exactly)."""
    devices = reader.get(spec, "devices", "spec", Mapping) or {}
    index: dict[str, frozenset[str] | None] = {}
    for path, request in reader.items(devices, "requests", "spec.devices"):
        name = reader.checked(
            check_dns_label, reader.need(request, "name", path), "request name", f"{path}.name"
        )
        subs = [
            reader.need(sub, "name", where) for where, sub in reader.items(request, "firstAvailable", path)
        ]
        index[name] = frozenset(subs) if subs else None
    return index


def _device(
    reader: _Reader, path: str, result: Mapping[str, Any], spec: Mapping[str, frozenset[str] | None]
) -> AllocatedDevice:
    request = reader.need(result, "request", path)
    main, slash, sub = request.partition("/")
    if main not in spec:
        raise reader.error(f"{path}.request", f"{request!r} names no request of spec.devices.requests")
    subs = spec[main]
    if subs is None and slash:
        raise reader.error(f"{path}.request", f"{request!r}: request {main!r} has no firstAvailable")
    if subs is not None and sub not in subs:
        raise reader.error(f"{path}.request", f"{request!r} names no firstAvailable subrequest of {main!r}")
    capacity = reader.get(result, "consumedCapacity", path, Mapping) or {}
    for key, value in capacity.items():
        if not isinstance(value, str | int) or isinstance(value, bool):
            raise reader.error(f"{path}.consumedCapacity.{key}", "expected a quantity string")
    return AllocatedDevice(
        request=main,
        subrequest=sub if slash else None,
        pool=reader.need(result, "pool", path),
        device=reader.need(result, "device", path),
        share_id=reader.text(result, "shareID", path),
        consumed_capacity={str(k): str(v) for k, v in capacity.items()},
        admin_access=bool(reader.get(result, "adminAccess", path, bool)),
    )


def parse_claim(obj: Any, driver: str) -> ClaimView:
    """A resource.k8s.io/v1 ResourceClaim dict -> ClaimView (results of other drivers dropped)."""
    reader = _Reader("ResourceClaim")
    meta, uid, name, namespace = _metadata(reader, obj)
    annotations = reader.get(meta, "annotations", "metadata", Mapping) or {}
    if not all(isinstance(v, str) for v in annotations.values()):
        raise reader.error("metadata.annotations", "values must be strings")
    spec = reader.get(obj, "spec", "", Mapping) or {}
    status = reader.get(obj, "status", "", Mapping) or {}
    allocation = reader.get(status, "allocation", "status", Mapping)
    devices: list[AllocatedDevice] = []
    if allocation is not None:
        spec_requests = _spec_requests(reader, spec)
        results = reader.get(allocation, "devices", "status.allocation", Mapping) or {}
        for path, result in reader.items(results, "results", "status.allocation.devices"):
            if reader.need(result, "driver", path) == driver:
                devices.append(_device(reader, path, result, spec_requests))
    reserved = []
    for path, ref in reader.items(status, "reservedFor", "status"):
        resource = reader.need(ref, "resource", path)
        if resource == "pods" and not reader.text(ref, "apiGroup", path):
            reserved.append(
                ReservedPod(
                    name=reader.need(ref, "name", path),
                    uid=reader.need(ref, "uid", path),
                )
            )
    return ClaimView(
        uid=uid,
        name=name,
        namespace=namespace,
        annotations=dict(annotations),
        allocated=allocation is not None,
        devices=tuple(devices),
        reserved_for=tuple(reserved),
    )


def _pod_claim_names(
    reader: _Reader, spec: Mapping[str, Any], status: Mapping[str, Any]
) -> dict[str, str | None]:
    generated = {
        reader.need(entry, "name", path): reader.text(entry, "resourceClaimName", path)
        for path, entry in reader.items(status, "resourceClaimStatuses", "status")
    }
    names: dict[str, str | None] = {}
    for path, entry in reader.items(spec, "resourceClaims", "spec"):
        pod_claim = reader.need(entry, "name", path)
        direct = reader.text(entry, "resourceClaimName", path)
        template = reader.text(entry, "resourceClaimTemplateName", path)
        if (direct is None) == (template is None):
            raise reader.error(
                path, "exactly one of resourceClaimName and resourceClaimTemplateName must be set"
            )
        names[pod_claim] = direct if direct is not None else generated.get(pod_claim)
    return names


def _containers(
    reader: _Reader, uid: str, spec: Mapping[str, Any], claim_names: Mapping[str, str | None]
) -> tuple[PodContainer, ...]:
    containers: list[PodContainer] = []
    seen: set[str] = set()
    for key, kind in (("initContainers", ContainerKind.INIT), ("containers", ContainerKind.APP)):
        for path, container in reader.items(spec, key, "spec"):
            name = reader.checked(
                check_dns_label,
                reader.need(container, "name", path),
                "container name",
                f"{path}.name",
            )
            if name in seen:
                raise reader.error(f"{path}.name", f"container name {name!r} is used twice")
            seen.add(name)
            sidecar = kind is ContainerKind.INIT and reader.text(container, "restartPolicy", path) == "Always"
            resources = reader.get(container, "resources", path, Mapping) or {}
            refs = []
            for where, ref in reader.items(resources, "claims", f"{path}.resources"):
                claim = reader.need(ref, "name", where)
                if claim not in claim_names:
                    raise reader.error(f"{where}.name", f"{claim!r} is not in spec.resourceClaims")
                refs.append(ClaimReference(claim, reader.text(ref, "request", where)))
            containers.append(PodContainer(ContainerRef(uid, kind, name, sidecar), tuple(refs)))
    return tuple(containers)


def parse_pod(obj: Any) -> PodView:
    """A core/v1 Pod dict -> PodView: its claim references per container."""
    reader = _Reader("Pod")
    _, uid, name, namespace = _metadata(reader, obj)
    spec = reader.get(obj, "spec", "", Mapping, required=True)
    status = reader.get(obj, "status", "", Mapping) or {}
    claim_names = _pod_claim_names(reader, spec, status)
    return PodView(
        uid=uid,
        name=name,
        namespace=namespace,
        claim_names=claim_names,
        containers=_containers(reader, uid, spec, claim_names),
    )


# --------------------------------------------------------------------------------------------------
# Who references what


def container_requests(claim: ClaimView, pod: PodView) -> dict[ContainerRef, tuple[str, ...]]:
    """For each container of `pod`: the vGPU requests of `claim` it references (sorted, non-empty).

    A reference without `request` means every vGPU request of the claim; one to a request that is
    not ours (another driver's, or not allocated) adds nothing.
    """
    if pod.namespace != claim.namespace:
        return {}
    allocated = set(claim.requests)
    found: dict[ContainerRef, tuple[str, ...]] = {}
    for container in pod.containers:
        requests: set[str] = set()
        for ref in container.claims:
            if pod.claim_names.get(ref.name) != claim.name:
                continue
            if ref.request is None:
                requests |= allocated
            elif (main := ref.request.partition("/")[0]) in allocated:
                requests.add(main)
        if requests:
            found[container.ref] = tuple(sorted(requests))
    return found


def claim_consumers(claim: ClaimView, pods: Iterable[PodView]) -> dict[ContainerRef, tuple[str, ...]]:
    """`container_requests` over the pods the claim is reserved for; other pods are ignored."""
    found: dict[ContainerRef, tuple[str, ...]] = {}
    for pod in pods:
        if claim.reserves(pod):
            found.update(container_requests(claim, pod))
    return dict(sorted(found.items(), key=lambda item: item[0].node))
