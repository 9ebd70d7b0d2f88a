"""Fuzz target: the strict protobuf decoder (`vgpud.wire.parse_strict`) on every message type a peer sends.

Contract per input: `MalformedMessage` or a message, nothing else; an accepted message re-encodes to
bytes that parse back to the same message (round-trip); and for NRI types, whatever the strict check
accepts, protobuf's own upb decoder accepts too (the strict rules are upb's plus stricter ones) and
reads as the same message (vgpud reads CreateContainer with upb, the other calls with betterproto2).
The first input byte picks the message type, the rest is its encoding.
"""

from __future__ import annotations

import random

import betterproto2
from google.protobuf.message import DecodeError

from tests.fuzz.driver import ContractBroken, Target, kind_of, mutate, random_bytes
from tests.fuzz.messages import encodings
from vgpud._pb import nri_api_pb2, ttrpc
from vgpud._pb.k8s.io.kubelet.pkg.apis.dra import v1 as dra
from vgpud._pb.nri.pkg.api.v1alpha1 import (
    ConfigureRequest,
    CreateContainerRequest,
    StateChangeEvent,
    SynchronizeRequest,
    UpdateContainerRequest,
)
from vgpud._pb.pluginregistration import RegistrationStatus
from vgpud._pb.registry import ContainerDeviceRequest
from vgpud.wire import MalformedMessage, parse_strict

#: what kubelet, containerd and the library send vgpud
TYPES: tuple[type[betterproto2.Message], ...] = (
    ttrpc.Request,
    ttrpc.Response,
    CreateContainerRequest,
    SynchronizeRequest,
    ConfigureRequest,
    StateChangeEvent,
    UpdateContainerRequest,
    dra.NodePrepareResourcesRequest,
    dra.NodeUnprepareResourcesRequest,
    ContainerDeviceRequest,
    RegistrationStatus,
)
_NRI = {
    CreateContainerRequest,
    SynchronizeRequest,
    ConfigureRequest,
    StateChangeEvent,
    UpdateContainerRequest,
}
POOL_SIZE = 64


def _same_in_upb(cls: type[betterproto2.Message], body: bytes, message: betterproto2.Message) -> None:
    """upb accepts what the strict check accepts, and reads the message betterproto2 read (unknown
    fields aside): vgpud decodes CreateContainer with upb and the other NRI calls with betterproto2."""
    upb = getattr(nri_api_pb2, cls.__name__)
    try:
        direct = upb.FromString(body)
    except DecodeError as err:
        raise ContractBroken(f"{cls.__name__}: the strict check accepts what upb refuses: {err}") from None
    through = upb.FromString(bytes(message))
    direct.DiscardUnknownFields()
    through.DiscardUnknownFields()
    if direct != through:
        raise ContractBroken(f"{cls.__name__}: upb and betterproto2 read these bytes differently")


def target(seed: int) -> Target:
    pools = {cls: encodings(random.Random(seed), cls, POOL_SIZE) for cls in TYPES}
    spliced = tuple(b for pool in pools.values() for b in pool[:8])

    def generate(rng: random.Random) -> bytes:
        index = rng.randrange(len(TYPES))
        roll = rng.random()
        if roll < 0.1:
            body = rng.choice(pools[TYPES[index]])  # valid: must round-trip
        elif roll < 0.9:
            body = mutate(rng, rng.choice(pools[TYPES[index]]), pool=spliced)
        else:
            body = random_bytes(rng)
        return bytes([index]) + body

    def check(data: bytes) -> str:
        if not data:
            return "empty"
        cls = TYPES[data[0] % len(TYPES)]
        body = data[1:]
        try:
            message = parse_strict(body, cls)
        except MalformedMessage as err:
            return kind_of(err, err.reason)
        again = parse_strict(bytes(message), cls)
        if again != message:
            raise ContractBroken(f"{cls.__name__}: re-encoding does not round-trip: {message!r} -> {again!r}")
        if cls in _NRI:
            _same_in_upb(cls, body, message)
        return f"ok {cls.__name__}"

    return Target("protobuf", generate, check)
