"""betterproto2's internal that vgpud.compat.betterproto2 reads (`Message._betterproto`): each test fails
if it moves or changes shape (tests/unit/test_wire.py checks vgpud.wire against protobuf through it)."""

from __future__ import annotations

import dataclasses
from typing import Any

import betterproto2

from vgpud._pb.k8s.io.kubelet.pkg.apis.dra import v1
from vgpud._pb.nri.pkg.api import v1alpha1 as nri
from vgpud.compat.betterproto2 import DeclaredField, declared_fields


def test_a_message_class_keeps_its_metadata_in_betterproto() -> None:
    """`_betterproto` is a class property, built once per class, with the two tables read."""
    meta = v1.Claim._betterproto
    assert isinstance(meta, betterproto2.ProtoClassMetadata)
    assert v1.Claim._betterproto is meta
    assert isinstance(meta.meta_by_field_name, dict)
    assert isinstance(meta.cls_by_field, dict)
    field = meta.meta_by_field_name["uid"]
    assert isinstance(field, betterproto2.FieldMetadata)
    assert {"number", "proto_type", "repeated", "unwrap"} <= {f.name for f in dataclasses.fields(field)}


def test_scalars_and_repeated_messages() -> None:
    assert declared_fields(v1.Claim) == (
        DeclaredField("namespace", 1, betterproto2.TYPE_STRING, False, None),
        DeclaredField("uid", 2, betterproto2.TYPE_STRING, False, None),
        DeclaredField("name", 3, betterproto2.TYPE_STRING, False, None),
    )
    assert declared_fields(v1.NodePrepareResourcesRequest) == (
        DeclaredField("claims", 1, betterproto2.TYPE_MESSAGE, True, v1.Claim),
    )


def test_a_map_field_carries_its_generated_entry_with_key_1_and_value_2() -> None:
    (claims,) = declared_fields(v1.NodePrepareResourcesResponse)
    assert (claims.name, claims.number, claims.proto_type) == ("claims", 1, betterproto2.TYPE_MAP)
    assert claims.message is not None and issubclass(claims.message, betterproto2.Message)
    assert declared_fields(claims.message) == (
        DeclaredField("key", 1, betterproto2.TYPE_STRING, False, None),
        DeclaredField("value", 2, betterproto2.TYPE_MESSAGE, False, v1.NodePrepareResourceResponse),
    )
    simple, _ = declared_fields(nri.FieldOwners)
    assert simple.message is not None
    assert [(f.number, f.proto_type) for f in declared_fields(simple.message)] == [
        (1, betterproto2.TYPE_INT32),
        (2, betterproto2.TYPE_STRING),
    ]


def test_a_wrapper_typed_field_carries_the_wrapper_message() -> None:
    """A field of a wrapper type (BoolValue, read as a Python `bool | None`) names the message on the
    wire in `unwrap` (any message class stands in for BoolValue here: vgpud's protos use none)."""
    wrapped: type[Any] = dataclasses.make_dataclass(
        "Wrapped",
        [
            (
                "flag",
                Any,
                betterproto2.field(1, betterproto2.TYPE_MESSAGE, unwrap=lambda: v1.Claim, optional=True),
            )
        ],
        bases=(betterproto2.Message,),
        eq=False,
        repr=False,
    )
    assert declared_fields(wrapped) == (DeclaredField("flag", 1, betterproto2.TYPE_MESSAGE, False, v1.Claim),)
