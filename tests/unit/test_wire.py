"""vgpud.wire: strict checking of protobuf bytes, against real generated messages and standard protobuf.

Standard protobuf (upb, built from the same protos by `tests.stdproto`) is the oracle: `check_message`
must reject exactly what protobuf's `FromString` rejects, except for the stricter rules `vgpud.wire`
documents, which protobuf lets through (`STRICTER` pins each one down):

* field number 0, which upb refuses except in a message that declares no fields at all;
* well-formed groups (wire types 3/4) in an unknown field;
* a known field in a wire type that does not fit its declared type (protobuf keeps it as unknown);
* a singular message field sent twice (protobuf merges the two, betterproto2 keeps the last);
* a map entry with a field besides key and value (upb files the entry under unknown fields);
* a map entry without its message value (protobuf reads an empty message, betterproto2 None).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import betterproto2
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.stdproto import message_class
from vgpud._pb import ttrpc
from vgpud._pb.k8s.io.kubelet.pkg.apis.dra import v1
from vgpud._pb.nri.pkg.api import v1alpha1 as nri
from vgpud.compat.betterproto2 import declared_fields
from vgpud.wire import MAX_DEPTH, MalformedMessage, check_message, parse_strict

_SINGULAR = ("double", "float", "int32", "int64", "uint32", "uint64", "sint32", "sint64")
_SINGULAR += ("fixed32", "fixed64", "sfixed32", "sfixed64", "bool", "string", "bytes")
_REPEATED = ("double", "fixed32", "sint64", "bool", "string")

Scalars: type[betterproto2.Message] = dataclasses.make_dataclass(
    "Scalars",
    [(f"f_{t}", Any, betterproto2.field(n, t)) for n, t in enumerate(_SINGULAR, 1)]
    + [(f"r_{t}", Any, betterproto2.field(n, t, repeated=True)) for n, t in enumerate(_REPEATED, 21)]
    + [("child", "Scalars | None", betterproto2.field(30, betterproto2.TYPE_MESSAGE, optional=True))],
    bases=(betterproto2.Message,),
    namespace={"__module__": __name__},  # where betterproto2 resolves "Scalars | None"
    eq=False,
    repr=False,
)
"""Every scalar type as f_<type> (1..15), repeated ones as r_<type> (21..25, packed), a recursive
child (30): what the real protos lack. Built with make_dataclass, as betterproto2 builds map entries."""


@functools.cache
def _scalars_protobuf() -> type[Message]:
    """The protobuf twin of `Scalars`, described from its betterproto2 metadata."""
    fd = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="wiretest.proto", package="wiretest", syntax="proto3")
    described = file.message_type.add(name="Scalars")
    for declared in declared_fields(Scalars):
        field = described.field.add(name=declared.name, number=declared.number)
        field.type = getattr(fd, f"TYPE_{declared.proto_type.upper()}")
        field.label = fd.LABEL_REPEATED if declared.repeated else fd.LABEL_OPTIONAL
        if declared.proto_type == betterproto2.TYPE_MESSAGE:
            field.type_name = ".wiretest.Scalars"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("wiretest.Scalars"))


_FULL_NAMES = {
    v1.NodePrepareResourcesRequest: "k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourcesRequest",
    v1.NodePrepareResourcesResponse: "k8s.io.kubelet.pkg.apis.dra.v1.NodePrepareResourcesResponse",
    v1.Claim: "k8s.io.kubelet.pkg.apis.dra.v1.Claim",
    nri.User: "nri.pkg.api.v1alpha1.User",
    nri.CreateContainerRequest: "nri.pkg.api.v1alpha1.CreateContainerRequest",
    nri.Empty: "nri.pkg.api.v1alpha1.Empty",
    ttrpc.Request: "ttrpc.Request",
}


def _protobuf_accepts(message_type: type[betterproto2.Message], data: bytes) -> bool:
    cls = _scalars_protobuf() if message_type is Scalars else message_class(_FULL_NAMES[message_type])
    try:
        cls.FromString(data)
    except DecodeError:
        return False
    return True


def _stricter_than_protobuf(reason: str) -> bool:
    """The documented rules protobuf does not enforce (see the module docstring)."""
    return (
        reason.startswith(("field number 0 ", "group wire type", "message field sent twice"))
        or " needs wire type " in reason
        or " in a map entry, " in reason
        or reason.startswith("map entry without its message value")
    )


# --- building wire bytes by hand


def _v(value: int) -> bytes:
    """A varint."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes([*out, value])


def _t(number: int, wire_type: int) -> bytes:
    """A tag."""
    return _v(number << 3 | wire_type)


def _ld(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return _t(number, 2) + _v(len(payload)) + payload


def _nested(levels: int) -> bytes:
    """`Scalars` with a chain of `levels` children below it."""
    data = b""
    for _ in range(levels):
        data = _ld(30, data)
    return data


# --- valid samples, populated the way peers populate them

SAMPLES: list[betterproto2.Message] = [
    v1.NodePrepareResourcesRequest(
        claims=[v1.Claim(namespace="default", uid="0d5e-ü", name="gpu"), v1.Claim(uid="x")]
    ),
    v1.NodePrepareResourcesResponse(
        claims={
            "uid-1": v1.NodePrepareResourceResponse(
                devices=[
                    v1.Device(request_names=["r1"], pool_name="node-a", device_name="vgpu-0", share_id="s"),
                    v1.Device(cdi_device_ids=["k8s.example.com/claim=1"], share_id=""),
                ]
            ),
            "uid-2": v1.NodePrepareResourceResponse(error="claim default/missing not found"),
        }
    ),
    nri.CreateContainerRequest(
        pod=nri.PodSandbox(id="pod", labels={"app": "x"}, annotations={"a": "b"}, ips=["10.0.0.1"], pid=7),
        container=nri.Container(
            id="ctr",
            state=nri.ContainerState(2),
            env=["A=1", "B=ß"],
            args=["sleep", "1"],
            mounts=[nri.Mount(destination="/d", type="bind", source="/s", options=["rbind", "ro"])],
            user=nri.User(uid=1000, gid=1000, additional_gids=[4, 300, 70000]),
            linux=nri.LinuxContainer(cgroups_path="/kubepods", oom_score_adj=nri.OptionalInt(value=-999)),
            created_at=-1,
            exit_code=-2,
        ),
    ),
    nri.Empty(),
    ttrpc.Request(
        service="nri.pkg.api.v1alpha1.Plugin",
        method="CreateContainer",
        payload=b"\xff\x00not utf-8 \xc3",
        timeout_nano=-5,
        metadata=[ttrpc.KeyValue(key="k", value="v")],
    ),
    Scalars(
        f_double=-1.5,
        f_float=2.5,
        f_int32=-3,
        f_int64=-(1 << 62),
        f_uint32=(1 << 32) - 1,
        f_uint64=(1 << 64) - 1,
        f_sint32=-7,
        f_sint64=-(1 << 63),
        f_fixed32=9,
        f_fixed64=10,
        f_sfixed32=-11,
        f_sfixed64=-12,
        f_bool=True,
        f_string="ok",
        f_bytes=b"\xff",
        r_double=[1.0, -0.0],
        r_fixed32=[1, 2],
        r_sint64=[-1, 1 << 40],
        r_bool=[True, False],
        r_string=["a", ""],
        child=Scalars(f_string="child", child=Scalars(r_bool=[True])),
    ),
]


# --- malformed input: the error names the field path, the rule and the offset

MALFORMED = [
    pytest.param(
        v1.NodePrepareResourcesRequest,
        b"\x0a\x05ab",
        "NodePrepareResourcesRequest.claims[0]",
        "length 5 runs past the end: 2 bytes left",
        2,
        id="truncated-length",
    ),
    pytest.param(
        v1.NodePrepareResourcesRequest,
        b"\xff\xff\xff\xff",
        "NodePrepareResourcesRequest",
        "tag varint runs past the end",
        0,
        id="unterminated-tag",
    ),
    pytest.param(
        v1.NodePrepareResourcesRequest,
        _ld(1, b"\x12\x05a"),
        "NodePrepareResourcesRequest.claims[0].uid",
        "length 5 runs past the end: 1 bytes left",
        4,
        id="truncated-string-in-claim",
    ),
    pytest.param(
        v1.NodePrepareResourcesRequest,
        _ld(1, _ld(1, b"ns")) + _ld(1, _ld(2, b"u") + b"\x1a\x09ab"),
        "NodePrepareResourcesRequest.claims[1].name",
        "length 9 runs past the end: 2 bytes left",
        13,
        id="truncation-in-second-repeated-message",
    ),
    pytest.param(
        ttrpc.Request,
        _t(4, 0) + b"\xff" * 10 + b"\x01",
        "Request.timeout_nano",
        "value varint longer than 10 bytes",
        1,
        id="varint-over-10-bytes",
    ),
    pytest.param(
        ttrpc.Request,
        _t(4, 0) + b"\x80",
        "Request.timeout_nano",
        "value varint runs past the end",
        1,
        id="cut-varint",
    ),
    pytest.param(
        nri.Empty,
        b"\x88\x80\x80\x80\x80\x00\x00",
        "Empty",
        "tag varint longer than 5 bytes",
        0,
        id="tag-over-5-bytes",
    ),
    pytest.param(
        ttrpc.Request,
        _t(3, 2) + b"\x80" * 5 + b"\x00",
        "Request.payload",
        "length varint longer than 5 bytes",
        1,
        id="length-over-5-bytes",
    ),
    pytest.param(
        v1.NodePrepareResourcesRequest,
        b"\x02\x00",
        "NodePrepareResourcesRequest",
        "field number 0 out of range",
        0,
        id="field-number-0",
    ),
    pytest.param(
        v1.NodePrepareResourcesRequest,
        _t(9, 3) + _t(9, 4),
        "NodePrepareResourcesRequest.#9",
        "group wire type 3 is not supported",
        1,
        id="group-in-unknown-field",
    ),
    pytest.param(nri.Empty, _t(9, 6), "Empty.#9", "invalid wire type 6", 1, id="wire-type-6"),
    pytest.param(
        v1.NodePrepareResourcesRequest,
        _ld(1, _t(2, 0) + b"\x01"),
        "NodePrepareResourcesRequest.claims[0].uid",
        "wire type 0, but string needs wire type 2",
        3,
        id="string-field-as-varint",
    ),
    pytest.param(
        v1.NodePrepareResourcesRequest,
        _t(1, 5) + b"abcd",
        "NodePrepareResourcesRequest.claims[0]",
        "wire type 5, but message needs wire type 2",
        1,
        id="message-field-as-fixed32",
    ),
    pytest.param(
        ttrpc.Request,
        _ld(4, b"\x01"),
        "Request.timeout_nano",
        "wire type 2, but int64 needs wire type 0",
        1,
        id="singular-scalar-as-packed",
    ),
    pytest.param(
        v1.NodePrepareResourcesRequest,
        _ld(1, _ld(2, b"a\xff")),
        "NodePrepareResourcesRequest.claims[0].uid",
        "invalid UTF-8 in string: invalid start byte",
        5,
        id="invalid-utf8",
    ),
    pytest.param(
        v1.NodePrepareResourcesResponse,
        _ld(1, _ld(1, b"\xc3")),
        "NodePrepareResourcesResponse.claims[0].key",
        "invalid UTF-8 in string",
        4,
        id="invalid-utf8-map-key",
    ),
    pytest.param(
        v1.NodePrepareResourcesResponse,
        _ld(1, _ld(1, b"k") + b"\x12\x09" + _ld(2, b"err")),
        "NodePrepareResourcesResponse.claims[0].value",
        "length 9 runs past the end: 5 bytes left",
        7,
        id="map-entry-truncated",
    ),
    pytest.param(
        v1.NodePrepareResourcesResponse,
        _ld(1, _ld(1, b"k") + _ld(2, _ld(1, _ld(2, b"pool")) + _ld(1, b"\x2a\x03ab"))),
        "NodePrepareResourcesResponse.claims[0].value.devices[1].share_id",
        "length 3 runs past the end: 2 bytes left",
        19,
        id="map-value-optional-string-truncated",
    ),
    pytest.param(
        v1.NodePrepareResourcesResponse,
        _ld(1, _ld(1, b"k") + _ld(2, b"")) + _ld(1, _ld(1, b"k")),
        "NodePrepareResourcesResponse.claims[1]",
        "map entry without its message value",
        9,
        id="map-entry-without-message-value",
    ),
    pytest.param(
        nri.CreateContainerRequest,
        _ld(1, _ld(1, b"sandbox")) + _ld(2, _ld(1, b"a")) + _ld(2, _ld(2, b"b")),
        "CreateContainerRequest.container",
        "message field sent twice",
        16,
        id="singular-message-twice",
    ),
    pytest.param(
        nri.CreateContainerRequest,
        _ld(2, _ld(5, _ld(1, b"k") + _ld(2, b"v")) + _ld(5, _ld(1, b"k") + _t(15, 0) + b"\x2d")),
        "CreateContainerRequest.container.labels[1]",
        "field 15 in a map entry, which holds key (1) and value (2) only",
        15,
        id="map-entry-extra-field",
    ),
    pytest.param(
        nri.CreateContainerRequest,
        _ld(2, _ld(8, b"A=1") + _ld(8, b"\xff")),
        "CreateContainerRequest.container.env[1]",
        "invalid UTF-8",
        9,
        id="nri-env",
    ),
    pytest.param(
        nri.CreateContainerRequest,
        _ld(2, _ld(9, _ld(1, b"/d")) + _ld(9, _ld(4, b"ro") + b"\x22\x05r")),
        "CreateContainerRequest.container.mounts[1].options[1]",
        "length 5 runs past the end: 1 bytes left",
        16,
        id="nri-mount-options",
    ),
    pytest.param(
        nri.CreateContainerRequest,
        _ld(2, _ld(21, _ld(3, b"\x01\x81"))),
        "CreateContainerRequest.container.user.additional_gids[0]",
        "packed varint runs past the end",
        8,
        id="packed-varint-cut",
    ),
    pytest.param(
        ttrpc.Request,
        _ld(5, _ld(1, b"k") + _t(2, 0) + b"\x01"),
        "Request.metadata[0].value",
        "wire type 0, but string needs wire type 2",
        6,
        id="ttrpc-metadata",
    ),
    pytest.param(
        Scalars,
        _ld(21, bytes(12)),
        "Scalars.r_double[0]",
        "packed fixed64 run of 12 bytes is not whole elements",
        3,
        id="packed-fixed-partial",
    ),
    pytest.param(
        Scalars,
        _ld(23, b"\xff" * 10 + b"\x01"),
        "Scalars.r_sint64[0]",
        "packed varint longer than 10 bytes",
        3,
        id="packed-varint-over-10-bytes",
    ),
    pytest.param(
        Scalars, _t(1, 1) + bytes(3), "Scalars.f_double", "fixed64 needs 8 bytes, 3 left", 1, id="cut-fixed64"
    ),
    pytest.param(
        Scalars, _t(99, 5) + bytes(1), "Scalars.#99", "fixed32 needs 4 bytes, 1 left", 2, id="cut-fixed32"
    ),
    pytest.param(
        Scalars,
        _nested(MAX_DEPTH + 1),
        "Scalars" + ".child" * (MAX_DEPTH + 1),
        f"messages nested deeper than {MAX_DEPTH}",
        len(_nested(MAX_DEPTH + 1)),  # where the innermost (empty) child starts
        id="depth-limit",
    ),
]


@pytest.mark.parametrize(("message_type", "data", "path", "reason", "offset"), MALFORMED)
def test_malformed_is_refused_with_path_reason_and_offset(
    message_type: type[betterproto2.Message], data: bytes, path: str, reason: str, offset: int
) -> None:
    with pytest.raises(MalformedMessage) as info:
        check_message(data, message_type)
    assert (info.value.path, info.value.offset) == (path, offset), str(info.value)
    assert info.value.reason.startswith(reason), str(info.value)
    assert str(info.value) == f"{path}: {info.value.reason} (offset {offset} of {len(data)})"
    with pytest.raises(MalformedMessage):
        parse_strict(data, message_type)
    if not _stricter_than_protobuf(info.value.reason):
        assert not _protobuf_accepts(message_type, data)


ODD_BUT_VALID = [
    pytest.param(v1.NodePrepareResourcesRequest, b"", id="empty"),
    pytest.param(
        v1.Claim,
        _t(9, 0) + b"\x01" + _t(10, 1) + bytes(8) + _ld(11, b"\xff") + _t(12, 5) + bytes(4),
        id="unknown-fields-of-every-wire-type",
    ),
    pytest.param(nri.User, _ld(3, b"\x01\xac\x02"), id="packed-repeated"),
    pytest.param(nri.User, _t(3, 0) + b"\x01" + _t(3, 0) + b"\xac\x02", id="unpacked-repeated"),
    pytest.param(Scalars, _t(22, 5) + bytes(4) + _ld(22, bytes(8)), id="unpacked-then-packed-fixed"),
    pytest.param(Scalars, _ld(21, b""), id="empty-packed-run"),
    pytest.param(ttrpc.Request, _t(4, 0) + b"\xff" * 9 + b"\x7f", id="10-byte-varint-over-64-bits"),
    pytest.param(nri.Empty, _v((1 << 29) - 1 << 3) + b"\x00", id="largest-field-number"),
    pytest.param(nri.Empty, _t(1, 2) + b"\x80\x80\x80\x80\x00", id="5-byte-length"),
    pytest.param(nri.CreateContainerRequest, _ld(2, _ld(5, b"")), id="map-entry-without-key-or-value"),
    pytest.param(Scalars, _nested(MAX_DEPTH), id="depth-at-the-limit"),
]


@pytest.mark.parametrize(("message_type", "data"), ODD_BUT_VALID)
def test_odd_but_valid_passes_as_in_protobuf(message_type: type[betterproto2.Message], data: bytes) -> None:
    check_message(data, message_type)
    assert _protobuf_accepts(message_type, data)


STRICTER = [
    pytest.param(nri.Empty, b"\x02\x00", id="field-number-0-in-a-message-without-fields"),
    pytest.param(
        v1.NodePrepareResourcesRequest, _t(9, 3) + _ld(1, b"x") + _t(9, 4), id="group-in-unknown-field"
    ),
    pytest.param(v1.NodePrepareResourcesRequest, _ld(1, _t(2, 0) + b"\x01"), id="string-field-as-varint"),
    pytest.param(ttrpc.Request, _ld(4, b"\x01"), id="singular-int64-as-packed"),
    pytest.param(nri.CreateContainerRequest, _ld(2, _ld(1, b"a")) + _ld(2, b""), id="singular-message-twice"),
    pytest.param(v1.NodePrepareResourcesResponse, _ld(1, b""), id="map-entry-without-message-value"),
    pytest.param(
        v1.NodePrepareResourcesResponse, _ld(1, _ld(1, b"k") + _t(3, 0) + b"\x01"), id="map-entry-extra-field"
    ),
]


@pytest.mark.parametrize(("message_type", "data"), STRICTER)
def test_stricter_than_protobuf_exactly_where_documented(
    message_type: type[betterproto2.Message], data: bytes
) -> None:
    assert _protobuf_accepts(message_type, data)
    with pytest.raises(MalformedMessage) as info:
        check_message(data, message_type)
    assert _stricter_than_protobuf(info.value.reason), str(info.value)


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda m: type(m).__name__)
def test_samples_pass_and_round_trip(sample: betterproto2.Message) -> None:
    data = bytes(sample)
    assert parse_strict(data, type(sample)) == sample
    assert _protobuf_accepts(type(sample), data)


def _protobuf_reads(message_type: type[betterproto2.Message], data: bytes) -> dict[str, Any]:
    """What standard protobuf reads from `data`, unknown fields dropped, as betterproto2's dict form."""
    message = message_class(_FULL_NAMES[message_type]).FromString(data)
    message.DiscardUnknownFields()
    return message_type.parse(message.SerializeToString()).to_dict()


@pytest.mark.parametrize(
    ("data", "upb", "betterproto2"),
    [
        pytest.param(  # found by tests/fuzz: make fuzz FUZZ_TARGET=nri FUZZ_SEED=1
            _ld(2, _ld(1, b"ctr")) + _ld(2, _ld(2, b"sandbox")),
            {"container": {"id": "ctr", "podSandboxId": "sandbox"}},
            {"container": {"podSandboxId": "sandbox"}},
            id="singular-message-twice",
        ),
        pytest.param(  # found by tests/fuzz: make fuzz FUZZ_TARGET=nri FUZZ_SEED=1
            _ld(2, _ld(5, _ld(1, b"k") + _ld(2, b"v")) + _ld(5, _ld(1, b"x") + _t(4, 5) + bytes(4))),
            {"container": {"labels": {"k": "v"}}},
            {"container": {"labels": {"k": "v", "x": ""}}},
            id="map-entry-extra-field",
        ),
    ],
)
def test_bytes_the_two_nri_decoders_read_differently_are_refused(
    data: bytes, upb: dict[str, Any], betterproto2: dict[str, Any]
) -> None:
    """vgpud reads CreateContainer with upb (vgpud.nri.fastcodec) and the other calls with betterproto2:
    bytes they read as two different messages must not reach either."""
    assert _protobuf_reads(nri.CreateContainerRequest, data) == upb
    assert nri.CreateContainerRequest.parse(data).to_dict() == betterproto2
    with pytest.raises(MalformedMessage):
        check_message(data, nri.CreateContainerRequest)


def test_a_map_entry_without_its_message_value_is_refused() -> None:
    """Found by tests/fuzz (make fuzz FUZZ_TARGET=protobuf FUZZ_SEED=1): betterproto2 reads the missing
    value of `net_devices` (map<string, LinuxNetDevice>) as None, and the message it returns cannot be
    encoded again; protobuf reads an empty LinuxNetDevice."""
    data = _ld(10, _ld(1, b"eth0"))  # LinuxContainer.net_devices = {"eth0": <no value>}
    upb = message_class("nri.pkg.api.v1alpha1.LinuxContainer").FromString(data)
    assert list(upb.net_devices) == ["eth0"] and upb.net_devices["eth0"].ByteSize() == 0
    lenient = nri.LinuxContainer.parse(data)
    assert lenient.net_devices == {"eth0": None}
    with pytest.raises(TypeError):
        bytes(lenient)
    with pytest.raises(
        MalformedMessage, match=r"LinuxContainer\.net_devices\[0\]: map entry without its message"
    ):
        check_message(data, nri.LinuxContainer)


def test_the_lenient_cases_from_the_brief_are_refused() -> None:
    for data in (b"\xff\xff\xff\xff", b"\x0a\x05ab"):
        with pytest.raises(MalformedMessage, match="NodePrepareResourcesRequest"):
            parse_strict(data, v1.NodePrepareResourcesRequest)


# --- properties

_text = st.text(max_size=12)
_u32 = st.integers(0, (1 << 32) - 1)
_i64 = st.integers(-(1 << 63), (1 << 63) - 1)

_populated = st.one_of(
    st.builds(
        v1.NodePrepareResourcesRequest,
        claims=st.lists(st.builds(v1.Claim, namespace=_text, uid=_text, name=_text), max_size=3),
    ),
    st.builds(
        v1.NodePrepareResourcesResponse,
        claims=st.dictionaries(
            _text,
            st.builds(
                v1.NodePrepareResourceResponse,
                devices=st.lists(
                    st.builds(
                        v1.Device, request_names=st.lists(_text, max_size=2), share_id=st.none() | _text
                    ),
                    max_size=2,
                ),
                error=_text,
            ),
            max_size=3,
        ),
    ),
    st.builds(
        nri.CreateContainerRequest,
        pod=st.builds(nri.PodSandbox, id=_text, labels=st.dictionaries(_text, _text, max_size=3)),
        container=st.builds(
            nri.Container,
            env=st.lists(_text, max_size=3),
            mounts=st.lists(st.builds(nri.Mount, options=st.lists(_text, max_size=2)), max_size=2),
            user=st.builds(nri.User, uid=_u32, additional_gids=st.lists(_u32, max_size=4)),
            created_at=_i64,
        ),
    ),
    st.builds(
        ttrpc.Request,
        method=_text,
        payload=st.binary(max_size=16),
        timeout_nano=_i64,
        metadata=st.lists(st.builds(ttrpc.KeyValue, key=_text, value=_text), max_size=2),
    ),
    st.builds(
        Scalars,
        f_double=st.floats(),
        f_float=st.floats(width=32),
        f_int64=_i64,
        f_sint64=_i64,
        f_fixed32=_u32,
        f_string=_text,
        r_double=st.lists(st.floats(), max_size=3),
        r_sint64=st.lists(_i64, max_size=3),
        r_string=st.lists(_text, max_size=3),
        child=st.none() | st.builds(Scalars, f_string=_text, r_bool=st.lists(st.booleans(), max_size=3)),
    ),
)


@settings(max_examples=150, deadline=None)
@given(_populated)
def test_every_betterproto2_encoding_passes(message: betterproto2.Message) -> None:
    data = bytes(message)
    assert bytes(parse_strict(data, type(message))) == data  # bytes: NaN != NaN in a list


@st.composite
def _mangled(draw: st.DrawFn) -> tuple[type[betterproto2.Message], bytes]:
    """A valid sample cut, overwritten, bit-flipped or spliced, one to three times."""
    sample = draw(st.sampled_from(SAMPLES))
    data = bytearray(bytes(sample))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["truncate", "set", "flip", "insert"]))
        at = draw(st.integers(0, len(data)))
        if op == "truncate":
            del data[at:]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif at < len(data):
            data[at] = draw(st.integers(0, 255)) if op == "set" else data[at] ^ 1 << draw(st.integers(0, 7))
    return type(sample), bytes(data)


_random = st.tuples(st.sampled_from([type(s) for s in SAMPLES]), st.binary(max_size=24))


@settings(max_examples=700, deadline=None)
@given(st.one_of(_mangled(), _random))
def test_agrees_with_protobuf(case: tuple[type[betterproto2.Message], bytes]) -> None:
    message_type, data = case
    try:
        check_message(data, message_type)
    except MalformedMessage as e:
        assert not _protobuf_accepts(message_type, data) or _stricter_than_protobuf(e.reason), str(e)
    else:
        assert _protobuf_accepts(message_type, data)
        message_type.parse(data)  # and betterproto2 parses whatever passed
