"""The betterproto2 code in vgpud/_pb speaks the same bytes and method paths as protoc's own output.

The reference side is independent of betterproto2: tests.stdproto has grpc_tools.protoc compile the
same protos/ into a descriptor set loaded into a private DescriptorPool, giving standard protobuf
classes (a private pool, rather than importing `--python_out` modules, keeps the generated `google.rpc`
and `grpc.health` names away from the real `google`/`grpc` packages and the default pool).

Every message of every proto file is filled from its descriptor (every field, nested messages, repeated,
maps, enums, proto3 `optional`, bytes, integer extremes), built independently on both sides, and sent
across in both directions. Enumerating from descriptors means a message or field added to protos/ is
covered without touching this file.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from typing import Any

import betterproto2
import pytest
from betterproto2.grpclib import ServiceBase
from google.protobuf import descriptor_pool, message_factory, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor, FileDescriptor
from google.protobuf.message import Message as StdMessage

import vgpud._pb
from tests import stdproto
from vgpud._pb.google.protobuf import Any as BpAny
from vgpud._pb.google.rpc import Status
from vgpud._pb.grpc.health.v1 import HealthCheckResponse, HealthCheckResponseServingStatus
from vgpud._pb.k8s.io.kubelet.pkg.apis.dra.v1 import Device
from vgpud._pb.message_pool import default_message_pool

PROTO_FILES = sorted(p.relative_to(stdproto.PROTOS).as_posix() for p in stdproto.PROTOS.rglob("*.proto"))

# low: signed minimum / unsigned 1 / first enum value; high: maximum / last enum value;
# zero: every presence-tracked field present with its zero value (proto3 optional "", empty
# submessages, zero list elements and map entries); empty: nothing set.
VARIANTS = ("low", "high", "zero", "empty")
MAX_DEPTH = 8

_INT_RANGES: dict[int, tuple[int, int]] = {
    **dict.fromkeys(
        (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32),
        (-(2**31), 2**31 - 1),
    ),
    **dict.fromkeys(
        (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64),
        (-(2**63), 2**63 - 1),
    ),
    **dict.fromkeys((FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32), (1, 2**32 - 1)),
    **dict.fromkeys((FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64), (1, 2**64 - 1)),
}
_FLOATS = {FieldDescriptor.TYPE_FLOAT: (-3.25, 0.5), FieldDescriptor.TYPE_DOUBLE: (-2.5e300, 0.1)}

Tree = dict[str, Any]
"""A message's intended content: field name -> scalar, Tree, list, or dict (maps)."""


@pytest.fixture(scope="session")
def std_pool() -> descriptor_pool.DescriptorPool:
    """protoc's compilation of protos/, shared with the other tiers through tests.stdproto."""
    return stdproto.pool()


def _std_class(desc: Descriptor) -> type[StdMessage]:
    return message_factory.GetMessageClass(desc)


GENERATED = [importlib.import_module(m.name) for m in pkgutil.walk_packages(vgpud._pb.__path__, "vgpud._pb.")]
"""Every generated module; importing one registers its messages in the betterproto2 pool."""


def _bp_class(desc: Descriptor) -> type[betterproto2.Message]:
    return default_message_pool.url_to_type[f"type.googleapis.com/{desc.full_name}"]


def _messages(file: FileDescriptor) -> Iterator[Descriptor]:
    """Every message of a file, nested ones included, map entries excluded (they are dicts)."""
    stack = list(file.message_types_by_name.values())
    while stack:
        desc = stack.pop()
        if not desc.GetOptions().map_entry:
            yield desc
            stack.extend(desc.nested_types)


# ---- content derived from descriptors ------------------------------------------------------------


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


_ZEROS: dict[int, Any] = {
    FieldDescriptor.TYPE_BOOL: False,
    FieldDescriptor.TYPE_STRING: "",
    FieldDescriptor.TYPE_BYTES: b"",
    FieldDescriptor.TYPE_FLOAT: 0.0,
    FieldDescriptor.TYPE_DOUBLE: 0.0,
}


def _scalar(field: FieldDescriptor, variant: str, salt: int) -> Any:
    """A value for a non-message field; distinct per salt so list and map entries differ."""
    kind = field.type
    if variant == "zero":
        return _ZEROS.get(kind, 0)
    high = variant == "high"
    if kind in _INT_RANGES:
        return _INT_RANGES[kind][high]
    if kind in _FLOATS:
        return _FLOATS[kind][high]
    if kind == FieldDescriptor.TYPE_BOOL:
        return salt % 2 == 1 or high
    if kind == FieldDescriptor.TYPE_STRING:
        return f"{field.name}-ä✓-{variant}-{salt}"
    if kind == FieldDescriptor.TYPE_BYTES:
        return bytes([0, 255, salt]) + field.name.encode()
    if kind == FieldDescriptor.TYPE_ENUM:
        numbers = sorted(v.number for v in field.enum_type.values if v.number != 0) or [0]
        return numbers[-1] if high else numbers[0]
    raise AssertionError(f"unhandled field type {kind} of {field.full_name}")


def _value(field: FieldDescriptor, variant: str, depth: int, salt: int) -> Any:
    if field.message_type is not None:
        return {} if variant == "zero" else populate(field.message_type, variant, depth + 1)
    return _scalar(field, variant, salt)


def _map_value(field: FieldDescriptor, variant: str, depth: int) -> dict[Any, Any]:
    key_field = field.message_type.fields_by_name["key"]
    value_field = field.message_type.fields_by_name["value"]
    if variant == "zero":
        return {_scalar(key_field, "zero", 0): _value(value_field, "zero", depth, 0)}
    if key_field.type == FieldDescriptor.TYPE_BOOL:
        keys = [False, True]
    else:
        keys = [_scalar(key_field, "low", 1), _scalar(key_field, "high", 2)]
    return {key: _value(value_field, variant, depth, salt) for salt, key in enumerate(keys, 1)}


def _chosen_in_oneof(field: FieldDescriptor, variant: str) -> bool:
    """Real oneofs get exactly one member: the last for `high`, the first otherwise."""
    oneof = field.containing_oneof
    if oneof is None or (len(oneof.fields) == 1 and field.has_presence and oneof.name.startswith("_")):
        return True
    members = list(oneof.fields)
    return field is (members[-1] if variant == "high" else members[0])


def populate(desc: Descriptor, variant: str, depth: int = 0) -> Tree:
    """Content for `desc` that sets every field the variant asks for."""
    if variant == "empty" or depth > MAX_DEPTH:
        return {}
    tree: Tree = {}
    for field in desc.fields:
        if not _chosen_in_oneof(field, variant):
            continue
        if _is_map(field):
            tree[field.name] = _map_value(field, variant, depth)
        elif field.is_repeated:
            if field.message_type is not None:
                # One filled element and one empty one: empty elements must survive too.
                tree[field.name] = [_value(field, variant, depth, 1), {}]
            elif variant == "zero":
                tree[field.name] = [_scalar(field, "zero", 0)]
            else:
                tree[field.name] = [_scalar(field, "low", 1), _scalar(field, "high", 2)]
        elif variant != "zero" or field.has_presence:
            tree[field.name] = _value(field, variant, depth, 1)
    return tree


# ---- the two independent builders -----------------------------------------------------------------


def build_std(desc: Descriptor, tree: Tree) -> StdMessage:
    msg = _std_class(desc)()
    for name, value in tree.items():
        field = desc.fields_by_name[name]
        target = getattr(msg, name)
        if _is_map(field):
            value_type = field.message_type.fields_by_name["value"].message_type
            for key, item in value.items():
                if value_type is None:
                    target[key] = item
                else:
                    target[key].CopyFrom(build_std(value_type, item))
        elif field.is_repeated:
            if field.message_type is None:
                target.extend(value)
            else:
                for item in value:
                    target.add().CopyFrom(build_std(field.message_type, item))
        elif field.message_type is not None:
            target.SetInParent()
            target.MergeFrom(build_std(field.message_type, value))
        else:
            setattr(msg, name, value)
    return msg


def build_bp(desc: Descriptor, tree: Tree) -> betterproto2.Message:
    cls = _bp_class(desc)
    meta = cls._betterproto
    kwargs: dict[str, Any] = {}
    for name, value in tree.items():
        field = desc.fields_by_name[name]
        attr = meta.field_name_by_number[field.number]
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            value_cls = meta.cls_by_field[f"{attr}.value"]
            kwargs[attr] = {key: _bp_value(value_field, value_cls, item) for key, item in value.items()}
        elif field.is_repeated:
            kwargs[attr] = [_bp_value(field, meta.cls_by_field[attr], item) for item in value]
        else:
            kwargs[attr] = _bp_value(field, meta.cls_by_field[attr], value)
    return cls(**kwargs)


def _bp_value(field: FieldDescriptor, cls: type, value: Any) -> Any:
    if field.message_type is not None:
        return build_bp(field.message_type, value)
    if field.enum_type is not None:
        return cls(value)
    return value


def _assert_fully_populated(msg: StdMessage, depth: int = 0) -> None:
    """Guards the test itself: a `high` tree must set every field, or the round trip proves less."""
    if depth > MAX_DEPTH:
        return
    for field in msg.DESCRIPTOR.fields:
        if not _chosen_in_oneof(field, "high"):
            continue
        value = getattr(msg, field.name)
        where = f"{msg.DESCRIPTOR.full_name}.{field.name}"
        if field.is_repeated:
            assert len(value) > 0, f"{where} left empty"
            if field.message_type is not None and not _is_map(field):
                _assert_fully_populated(value[0], depth + 1)
        elif field.message_type is not None:
            assert msg.HasField(field.name), f"{where} left unset"
            _assert_fully_populated(value, depth + 1)
        else:
            assert value != _scalar(field, "zero", 0), f"{where} left at its default"


# ---- the round trips ----------------------------------------------------------------------------


def _mismatch(label: str, got: object, want: object) -> str:
    def show(m: object) -> str:
        text = text_format.MessageToString(m) if isinstance(m, StdMessage) else repr(m)
        return text[:1500]

    return f"{label}\n  got:  {show(got)}\n  want: {show(want)}"


def _round_trips(desc: Descriptor, variant: str) -> list[str]:
    tree = populate(desc, variant)
    want_std = build_std(desc, tree)
    want_bp = build_bp(desc, tree)
    label = f"{desc.full_name} [{variant}]"
    failures = []
    got_std = _std_class(desc).FromString(bytes(want_bp))
    if got_std != want_std:
        failures.append(_mismatch(f"{label} betterproto2 -> protobuf", got_std, want_std))
    got_bp = type(want_bp).parse(want_std.SerializeToString())
    if got_bp != want_bp or got_bp._unknown_fields:
        failures.append(_mismatch(f"{label} protobuf -> betterproto2", got_bp, want_bp))
    return failures


@pytest.mark.parametrize("proto_file", PROTO_FILES)
def test_every_message_round_trips_both_ways(
    std_pool: descriptor_pool.DescriptorPool, proto_file: str
) -> None:
    """Each direction compares against a message built independently from the same content."""
    messages = list(_messages(std_pool.FindFileByName(proto_file)))
    assert messages, f"{proto_file} defines no messages"
    for desc in messages:
        _assert_fully_populated(build_std(desc, populate(desc, "high")))
    failures = [f for desc in messages for variant in VARIANTS for f in _round_trips(desc, variant)]
    assert not failures, "\n".join(failures)


def test_every_message_and_rpc_type_is_generated(std_pool: descriptor_pool.DescriptorPool) -> None:
    """Nothing in protos/ is missing from vgpud/_pb, including every RPC's request and response."""
    wanted: set[str] = set()
    for name in PROTO_FILES:
        file = std_pool.FindFileByName(name)
        wanted.update(d.full_name for d in _messages(file))
        for service in file.services_by_name.values():
            for method in service.methods:
                wanted.update((method.input_type.full_name, method.output_type.full_name))
    generated = {url.removeprefix("type.googleapis.com/") for url in default_message_pool.url_to_type}
    assert wanted - generated == set()


# ---- method paths -------------------------------------------------------------------------------


def _service_bases() -> Iterator[type[ServiceBase]]:
    for module in GENERATED:
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, ServiceBase) and obj is not ServiceBase and obj.__module__ == module.__name__:
                yield obj


@functools.cache
def _served_handlers() -> dict[str, Any]:
    return {path: h for base in _service_bases() for path, h in base().__mapping__().items()}


def test_server_bases_serve_exactly_the_descriptor_methods(std_pool: descriptor_pool.DescriptorPool) -> None:
    """Paths, streaming shape and message types of every handler match protoc's descriptors."""
    handlers = _served_handlers()
    methods = {
        f"/{service.full_name}/{method.name}": method
        for name in PROTO_FILES
        for service in std_pool.FindFileByName(name).services_by_name.values()
        for method in service.methods
    }
    assert set(handlers) == set(methods)
    for path, method in methods.items():
        handler = handlers[path]
        assert handler.cardinality.value.client_streaming == method.client_streaming, path
        assert handler.cardinality.value.server_streaming == method.server_streaming, path
        assert _bp_class(method.input_type) is handler.request_type, path
        assert _bp_class(method.output_type) is handler.reply_type, path


@pytest.mark.parametrize(
    "path",
    [
        "/pluginregistration.Registration/GetInfo",
        "/pluginregistration.Registration/NotifyRegistrationStatus",
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
        "/v1alpha1.DRAResourceHealth/NodeWatchResources",
        "/registry.VDeviceRegistry/RegisterContainerDevice",
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
        "/nri.pkg.api.v1alpha1.Runtime/RegisterPlugin",
        "/nri.pkg.api.v1alpha1.Plugin/Configure",
        "/nri.pkg.api.v1alpha1.Plugin/CreateContainer",
        "/nri.pkg.api.v1alpha1.Plugin/RemoveContainer",
        "/nri.pkg.api.v1alpha1.Plugin/StateChange",
    ],
)
def test_upstream_method_path_is_served(path: str) -> None:
    """Written out by hand from the upstream contracts: catches a wrong package in protos/ itself."""
    assert path in _served_handlers()


# ---- presence and well-known types --------------------------------------------------------------


@pytest.mark.parametrize(("share_id", "wire"), [(None, b""), ("", b"\x2a\x00"), ("s1", b"\x2a\x02s1")])
def test_share_id_presence(share_id: str | None, wire: bytes) -> None:
    """DRA v1 Device.share_id is proto3 optional: unset, empty and set are three different things."""
    device = Device(share_id=share_id)
    assert bytes(device) == wire
    std = stdproto.message_class("k8s.io.kubelet.pkg.apis.dra.v1.Device")
    parsed = std.FromString(wire)
    assert parsed.HasField("share_id") is (share_id is not None)
    assert Device.parse(parsed.SerializeToString()).share_id == share_id


def test_any_in_status_details_interoperates() -> None:
    """google.rpc.Status.details carries google.protobuf.Any; pack/unpack must agree with protobuf."""
    inner = HealthCheckResponse(status=HealthCheckResponseServingStatus.NOT_SERVING)
    status = Status(code=5, message="liveness: not found", details=[BpAny.pack(inner)])
    parsed = stdproto.message_class("google.rpc.Status").FromString(bytes(status))
    assert parsed.details[0].type_url == "type.googleapis.com/grpc.health.v1.HealthCheckResponse"
    std_inner = stdproto.message_class("grpc.health.v1.HealthCheckResponse")()
    assert parsed.details[0].Unpack(std_inner)
    assert std_inner.status == int(HealthCheckResponseServingStatus.NOT_SERVING)

    back = Status.parse(parsed.SerializeToString())
    assert back == status
    assert back.details[0].unpack() == inner
