"""Valid random protobuf messages of any betterproto2 class, built from the class's own metadata.

The fuzz targets mutate these: a mutation that starts from a valid encoding reaches the deep paths of a
decoder (nested messages, maps, packed runs), which random bytes seldom do.
"""

from __future__ import annotations

import random
import struct
from typing import Any

import betterproto2

from tests.fuzz.driver import text

_INT_RANGES = {
    betterproto2.TYPE_INT32: (-(2**31), 2**31 - 1),
    betterproto2.TYPE_SINT32: (-(2**31), 2**31 - 1),
    betterproto2.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    betterproto2.TYPE_UINT32: (0, 2**32 - 1),
    betterproto2.TYPE_FIXED32: (0, 2**32 - 1),
    betterproto2.TYPE_INT64: (-(2**63), 2**63 - 1),
    betterproto2.TYPE_SINT64: (-(2**63), 2**63 - 1),
    betterproto2.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    betterproto2.TYPE_UINT64: (0, 2**64 - 1),
    betterproto2.TYPE_FIXED64: (0, 2**64 - 1),
}


def _scalar(rng: random.Random, proto_type: str, cls: Any) -> Any:
    if proto_type == betterproto2.TYPE_STRING:
        return text(rng)
    if proto_type == betterproto2.TYPE_BYTES:
        return rng.randbytes(rng.randint(0, 12))
    if proto_type == betterproto2.TYPE_BOOL:
        return rng.random() < 0.5
    if proto_type == betterproto2.TYPE_ENUM:
        return rng.choice(list(cls))
    if proto_type == betterproto2.TYPE_FLOAT:
        return struct.unpack("<f", struct.pack("<f", rng.uniform(-1e6, 1e6)))[0]
    if proto_type == betterproto2.TYPE_DOUBLE:
        return rng.uniform(-1e12, 1e12)
    low, high = _INT_RANGES[proto_type]
    return rng.choice((0, 1, low, high, rng.randint(low, high)))


def random_message(
    rng: random.Random, cls: type[betterproto2.Message], depth: int = 0
) -> betterproto2.Message:
    """An instance of `cls` with a random subset of its fields set (nested down to depth 3)."""
    meta = cls._betterproto
    values: dict[str, Any] = {}
    groups: set[str] = set()
    for name, field in meta.meta_by_field_name.items():
        if field.unwrap is not None or rng.random() < 0.4:
            continue
        if field.group is not None:
            if field.group in groups:
                continue  # one member of a oneof
            groups.add(field.group)
        sub = meta.cls_by_field.get(name)
        count = rng.randint(0, 3)
        if field.proto_type == betterproto2.TYPE_MAP:
            if depth >= 3:
                continue
            key_meta, value_meta = field.map_meta
            entry = sub._betterproto
            key_cls, value_cls = entry.cls_by_field["key"], entry.cls_by_field["value"]
            values[name] = {
                _scalar(rng, key_meta.proto_type, key_cls): (
                    random_message(rng, value_cls, depth + 1)
                    if value_meta.proto_type == betterproto2.TYPE_MESSAGE
                    else _scalar(rng, value_meta.proto_type, value_cls)
                )
                for _ in range(count)
            }
        elif field.proto_type == betterproto2.TYPE_MESSAGE:
            if depth >= 3:
                continue
            if field.repeated:
                values[name] = [random_message(rng, sub, depth + 1) for _ in range(count)]
            else:
                values[name] = random_message(rng, sub, depth + 1)
        elif field.repeated:
            values[name] = [_scalar(rng, field.proto_type, sub) for _ in range(count)]
        else:
            values[name] = _scalar(rng, field.proto_type, sub)
    return cls(**values)


def encodings(rng: random.Random, cls: type[betterproto2.Message], count: int) -> tuple[bytes, ...]:
    """`count` valid encodings of random `cls` instances (the seed pool the mutators start from)."""
    return tuple(bytes(random_message(rng, cls)) for _ in range(count))
