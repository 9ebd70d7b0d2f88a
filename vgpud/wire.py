"""Strict structural check of protobuf wire bytes before betterproto2 parses them.

betterproto2 0.10 parses leniently: a truncated length-delimited field becomes an empty or half-filled
message, a tag that never ends is dropped, a string field sent as a varint becomes an int, a scalar
sent packed becomes a list; other damage surfaces as a stray EOFError or UnicodeDecodeError.
Input from a peer (kubelet, containerd) must instead be refused whole with one clear error, so the
bytes are walked once here, against the message class's own betterproto2 metadata, and only bytes
that pass are handed to `parse`.

Rules: the wire format as protobuf's own (upb) decoder enforces it, plus stricter ones (*):

* a tag is a varint of at most 5 bytes with a field number in 1..2^29-1 (* upb lets 0 through in a
  message that declares no fields); wire types 0, 1, 2 and 5 only (* protobuf skips well-formed
  groups, wire types 3 and 4, in unknown fields; nothing we speak uses them);
* a varint ends within 10 bytes, a length varint within 5; fixed32/fixed64 values have all their
  bytes; a length stays inside the enclosing message;
* (*) a known field arrives in the wire type of its declared type: protobuf files a mismatch under
  unknown fields, betterproto2 stores a value of the wrong Python type; repeated scalars may also
  arrive packed, and a packed run holds whole elements;
* `string` fields, map keys and values included, are valid UTF-8 (proto3);
* (*) a singular message field arrives at most once: protobuf merges a second occurrence into the
  first, betterproto2 keeps only the last, so the two decoders vgpud uses (`vgpud.nri.fastcodec` reads
  CreateContainer with upb) would read different requests from the same bytes; no Go or C++ encoder
  writes one twice;
* (*) a map entry holds its key (1) and value (2) only: upb files an entry with any other field under
  the enclosing message's unknown fields, betterproto2 keeps it as an entry;
* (*) a map entry whose value is a message has that value: protobuf reads a missing one as an empty
  message, betterproto2 as None, which `bytes()` and the code reading the map then trip over (Go and
  C++ always write it);
* message fields and map entries are checked recursively, at most `MAX_DEPTH` levels below the top;
* unknown fields are allowed, checked structurally only (forward compatibility).

Error paths name fields the way they are written in Python: `Request.claims[0].uid`, unknown fields
as `#<number>`, map entries as `<map>[i].key` / `.value`.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TypeVar

import betterproto2

from vgpud.compat.betterproto2 import declared_fields

M = TypeVar("M", bound=betterproto2.Message)

MAX_DEPTH = 100
"""Nested messages allowed below the top-level one (protobuf's default recursion limit)."""

_MAX_FIELD_NUMBER = (1 << 29) - 1
_MAX_SIZE_BYTES = 5  # tags and lengths are 32-bit varints
_MAX_VARINT_BYTES = 10

_VARINT, _FIXED64, _LEN, _FIXED32 = 0, 1, 2, 5
_FIXED_SIZE = {_FIXED64: 8, _FIXED32: 4}
_WIRE_TYPE_OF = {
    **dict.fromkeys(betterproto2.WIRE_VARINT_TYPES, _VARINT),
    **dict.fromkeys(betterproto2.WIRE_FIXED_64_TYPES, _FIXED64),
    **dict.fromkeys(betterproto2.WIRE_FIXED_32_TYPES, _FIXED32),
    **dict.fromkeys(betterproto2.WIRE_LEN_DELIM_TYPES, _LEN),
}
_MAP_VALUE = 2  # a map entry's value field
_LONG_VARINT = re.compile(rb"[\x80-\xff]{%d}" % _MAX_VARINT_BYTES)


class MalformedMessage(ValueError):
    """Bytes that are not a well-formed encoding of the expected message; nothing was parsed."""

    def __init__(self, path: str, reason: str, offset: int, size: int) -> None:
        super().__init__(f"{path}: {reason} (offset {offset} of {size})")
        self.path, self.reason, self.offset = path, reason, offset


class _Fault(Exception):
    """Raised deep in the walk; each enclosing field prepends its path segment on the way out."""

    def __init__(self, reason: str, offset: int) -> None:
        self.reason, self.offset = reason, offset
        self.segments: list[str] = []


@dataclass(frozen=True, slots=True)
class _Field:
    """What the wire may carry for one declared field."""

    name: str
    proto_type: str
    wire_type: int
    repeated: bool  # map entries count as repeated: the path shows their index
    packed: bool  # a repeated scalar: wire type 2 (packed) is accepted too
    once: bool  # a singular message field: a second occurrence is refused
    utf8: bool
    message: type[betterproto2.Message] | None  # nested message or map entry class


def check_message(data: bytes, message_type: type[betterproto2.Message]) -> None:
    """Raise `MalformedMessage` unless `data` is a well-formed encoding of `message_type`."""
    try:
        _check(data, 0, len(data), message_type, 0)
    except _Fault as fault:
        path = message_type.__name__ + "".join(reversed(fault.segments))
        raise MalformedMessage(path, fault.reason, fault.offset, len(data)) from None


def parse_strict(data: bytes, message_type: type[M]) -> M:
    """`message_type.parse(data)`, but malformed bytes raise `MalformedMessage` instead of half-parsing."""
    check_message(data, message_type)
    return message_type.parse(data)


@functools.cache
def _layout(message_type: type[betterproto2.Message]) -> dict[int, _Field]:
    """Field number -> `_Field`, from betterproto2's own metadata (`vgpud.compat.betterproto2`; computed
    once per class)."""
    layout = {}
    for field in declared_fields(message_type):
        is_map = field.proto_type == betterproto2.TYPE_MAP
        layout[field.number] = _Field(
            name=field.name,
            proto_type=field.proto_type,
            wire_type=_WIRE_TYPE_OF[field.proto_type],
            repeated=field.repeated or is_map,
            packed=field.repeated and field.proto_type in betterproto2.PACKED_TYPES,
            once=field.message is not None and not is_map and not field.repeated,
            utf8=field.proto_type == betterproto2.TYPE_STRING,
            message=field.message,
        )
    return layout


def _varint(data: bytes, pos: int, end: int, what: str) -> tuple[int, int]:
    """The varint at `pos` and the position after it; it must end within 10 bytes and before `end`."""
    value = shift = 0
    for i in range(pos, min(pos + _MAX_VARINT_BYTES, end)):
        byte = data[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i + 1
        shift += 7
    if end - pos < _MAX_VARINT_BYTES:
        raise _Fault(f"{what} varint runs past the end", pos)
    raise _Fault(f"{what} varint longer than {_MAX_VARINT_BYTES} bytes", pos)


def _check(
    data: bytes,
    pos: int,
    end: int,
    message_type: type[betterproto2.Message],
    depth: int,
    *,
    entry: bool = False,
) -> None:
    """Walk the fields in data[pos:end] as `message_type` (`entry`: a map entry, key and value only)."""
    layout = _layout(message_type)
    seen: dict[int, int] = {}  # occurrences of each repeated field so far, for error paths
    once: set[int] = set()  # singular message fields met so far
    begin = pos
    while pos < end:
        tag_at = pos
        if data[pos] < 0x80:
            key, pos = data[pos], pos + 1
        else:
            key, pos = _varint(data, pos, end, "tag")
            if pos - tag_at > _MAX_SIZE_BYTES:
                raise _Fault(f"tag varint longer than {_MAX_SIZE_BYTES} bytes", tag_at)
        number, wire_type = key >> 3, key & 7
        if not 1 <= number <= _MAX_FIELD_NUMBER:
            raise _Fault(f"field number {number} out of range 1..{_MAX_FIELD_NUMBER}", tag_at)
        field = layout.get(number)
        if field is None and entry:
            raise _Fault(f"field {number} in a map entry, which holds key (1) and value (2) only", tag_at)
        if field is not None and field.once:
            if number in once:
                fault = _Fault(
                    "message field sent twice (protobuf would merge them; betterproto2 keeps the last)",
                    tag_at,
                )
                fault.segments.append(f".{field.name}")
                raise fault
            once.add(number)
        try:
            pos = _check_value(data, pos, end, wire_type, field, depth=depth)
        except _Fault as fault:
            if field is None:
                fault.segments.append(f".#{number}")
            elif field.repeated:
                fault.segments.append(f".{field.name}[{seen.get(number, 0)}]")
            else:
                fault.segments.append(f".{field.name}")
            raise
        if field is not None and field.repeated:
            seen[number] = seen.get(number, 0) + 1
    value = layout.get(_MAP_VALUE) if entry else None
    if value is not None and value.once and _MAP_VALUE not in once:
        raise _Fault(
            "map entry without its message value (protobuf reads an empty one, betterproto2 None)", begin
        )


def _check_value(data: bytes, pos: int, end: int, wire_type: int, field: _Field | None, *, depth: int) -> int:
    """Check one field value starting at `pos` (its tag already read); return the position after it."""
    if field is not None and wire_type != field.wire_type and not (field.packed and wire_type == _LEN):
        raise _Fault(f"wire type {wire_type}, but {field.proto_type} needs wire type {field.wire_type}", pos)
    if wire_type == _VARINT:
        return pos + 1 if pos < end and data[pos] < 0x80 else _varint(data, pos, end, "value")[1]
    if wire_type != _LEN:
        size = _FIXED_SIZE.get(wire_type)
        if size is None:
            kind = "group wire type" if wire_type in (3, 4) else "invalid wire type"
            raise _Fault(f"{kind} {wire_type} is not supported", pos)
        if pos + size > end:
            raise _Fault(f"fixed{size * 8} needs {size} bytes, {end - pos} left", pos)
        return pos + size
    if pos < end and data[pos] < 0x80:
        length, start = data[pos], pos + 1
    else:
        length, start = _varint(data, pos, end, "length")
        if start - pos > _MAX_SIZE_BYTES:
            raise _Fault(f"length varint longer than {_MAX_SIZE_BYTES} bytes", pos)
    stop = start + length
    if stop > end:
        raise _Fault(f"length {length} runs past the end: {end - start} bytes left", start)
    if field is None:
        pass  # unknown: opaque bytes
    elif field.message is not None:
        if depth >= MAX_DEPTH:
            raise _Fault(f"messages nested deeper than {MAX_DEPTH}", start)
        _check(data, start, stop, field.message, depth + 1, entry=field.proto_type == betterproto2.TYPE_MAP)
    elif field.utf8:
        try:
            data[start:stop].decode("utf-8")
        except UnicodeDecodeError as e:
            raise _Fault(f"invalid UTF-8 in string: {e.reason}", start + e.start) from None
    elif field.packed:
        _check_packed(data, start, stop, field.wire_type)
    return stop


def _check_packed(data: bytes, start: int, stop: int, wire_type: int) -> None:
    """A packed run: whole fixed-size elements, or varints that each end within 10 bytes and the run."""
    size = _FIXED_SIZE.get(wire_type)
    if size is not None:
        if (stop - start) % size:
            raise _Fault(f"packed fixed{size * 8} run of {stop - start} bytes is not whole elements", start)
    elif start < stop:
        if data[stop - 1] >= 0x80:
            raise _Fault("packed varint runs past the end", stop - 1)
        long = _LONG_VARINT.search(data, start, stop)
        if long is not None:
            raise _Fault(f"packed varint longer than {_MAX_VARINT_BYTES} bytes", long.start())
