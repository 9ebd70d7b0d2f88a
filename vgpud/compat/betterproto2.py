"""betterproto2's field metadata (its internal, named only here; tests/unit/compat/test_betterproto2.py
pins it).

A generated message class keeps what `parse` reads in `Message._betterproto`, a class property that
builds (once per class) a `ProtoClassMetadata`:

- `meta_by_field_name`: each field's `FieldMetadata`, whose `number`, `proto_type`, `repeated` and
  `unwrap` (a wrapper type's message class, e.g. BoolValue's) are what the wire carries;
- `cls_by_field`: the class of each field's value: a message field's message, a map field's
  generated `Entry` (key = field 1, value = field 2).

betterproto2 offers no public listing of a class's fields with their numbers and types, and
`vgpud.wire` must walk the bytes against exactly the fields `parse` will read, so it reads them here.
"""

from __future__ import annotations

from dataclasses import dataclass

import betterproto2


@dataclass(frozen=True, slots=True)
class DeclaredField:
    """One field of a message class, as betterproto2 reads it from the wire."""

    name: str  # the Python attribute
    number: int
    proto_type: str  # one of betterproto2's TYPE_* names
    repeated: bool
    #: the message class the wire carries for a message field (a wrapper type's own message) or a map
    #: field (its `Entry`); None for scalars
    message: type[betterproto2.Message] | None


def declared_fields(message_type: type[betterproto2.Message]) -> tuple[DeclaredField, ...]:
    """The fields `message_type.parse` reads, from betterproto2's `message_type._betterproto` (the
    only place betterproto2 keeps field numbers and wire types)."""
    meta = message_type._betterproto
    fields = []
    for name, field in meta.meta_by_field_name.items():
        message = None
        if field.proto_type == betterproto2.TYPE_MAP:
            message = meta.cls_by_field[name]
        elif field.proto_type == betterproto2.TYPE_MESSAGE:
            message = field.unwrap() if field.unwrap else meta.cls_by_field[name]
        fields.append(DeclaredField(name, field.number, field.proto_type, bool(field.repeated), message))
    return tuple(fields)
