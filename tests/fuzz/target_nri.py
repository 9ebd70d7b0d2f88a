"""Fuzz target: NRI's byte streams, sans-IO: the mux decoder, the ttrpc frame decoder, the ttrpc server and
client halves, and CreateContainer's upb decoder (`vgpud.nri.fastcodec`).

The first input byte picks the surface and how the rest is cut into reads (the decoders must give the
same result whatever the read boundaries). Contract per input:

* `FrameDecoder.feed` never raises, and chunked feeding gives the frames one feed gives;
* `ServerConnection.receive` never raises; each request it hands out has an odd, increasing stream id
  and is answered by `respond`; each error reply it makes is one well-formed Response frame with a
  non-OK status;
* `ClientConnection.receive` never raises; each waiting call gets at most one Reply, with a payload or
  an error;
* `MuxDecoder.feed` raises only `MuxError`, and only for an over-long frame;
* `decode_create_container` raises only `MalformedMessage`, and agrees with betterproto2 on what it
  accepts; so do the upb decoders of PostStartContainer and StopContainer (the same two fields), and
  the record the hooks make of a container (`vgpud.nri.hooks.event_record`: id, pod, cgroups path,
  device rules) is the same from upb's message as from betterproto2's.
"""

from __future__ import annotations

import random

from tests.fuzz.driver import ERROR, ContractBroken, Target, kind_of, surface_inputs
from tests.fuzz.messages import encodings, random_message
from vgpud._pb import ttrpc as pb
from vgpud._pb.nri.pkg.api.v1alpha1 import (
    Container,
    CreateContainerRequest,
    LinuxContainer,
    LinuxDeviceCgroup,
    LinuxResources,
    PodSandbox,
    PostStartContainerRequest,
    StopContainerRequest,
)
from vgpud.nri import mux
from vgpud.nri.fastcodec import decode_create_container, upb_decoder
from vgpud.nri.hooks import event_record
from vgpud.nri.ttrpc import (
    ClientConnection,
    FrameDecoder,
    IncomingRequest,
    MessageType,
    OversizedFrame,
    ServerConnection,
    encode_frame,
)
from vgpud.wire import MalformedMessage, parse_strict

SERVER, CLIENT, MUX, FASTCODEC = range(4)
POOL_SIZE = 64
CLIENT_CALLS = 4


def _requests(rng: random.Random) -> bytes:
    """A stream of ttrpc frames as containerd sends them, with now and then a frame it should not send."""
    out = bytearray()
    sid = 1
    for _ in range(rng.randint(1, 4)):
        request = random_message(rng, pb.Request)
        kind = rng.choice((MessageType.REQUEST,) * 6 + (MessageType.DATA, MessageType.RESPONSE))
        flags = rng.choice((0, 0, 0, 1, 2, 4))
        out += encode_frame(sid if rng.random() < 0.9 else rng.randrange(8), kind, bytes(request), flags)
        sid += 2 * rng.randint(1, 2)
    return bytes(out)


def _responses(rng: random.Random) -> bytes:
    out = bytearray()
    for sid in rng.sample(range(1, 2 * CLIENT_CALLS + 3), rng.randint(1, 3)):
        kind = rng.choice((MessageType.RESPONSE,) * 4 + (MessageType.DATA, MessageType.REQUEST))
        out += encode_frame(sid, kind, bytes(random_message(rng, pb.Response)))
    return bytes(out)


def _muxed(rng: random.Random) -> bytes:
    out = bytearray()
    for conn, stream in ((mux.PLUGIN_CONN, _requests(rng)), (mux.RUNTIME_CONN, _responses(rng))):
        for frame in mux.encode(conn, stream):
            out += frame
    if rng.random() < 0.2:
        out[0:0] = mux._HEADER.pack(rng.choice((0, 3, 7)), 3) + b"xyz"  # a connection nobody serves
    return bytes(out)


def _chunks(data: bytes, step: int) -> list[bytes]:
    return [data[i : i + step] for i in range(0, len(data), step)] or [b""]


def _check_error_reply(reply: bytes) -> str:
    frames = FrameDecoder().feed(reply)
    if len(frames) != 1 or isinstance(frames[0], OversizedFrame) or frames[0].type != MessageType.RESPONSE:
        raise ContractBroken(f"an error reply is not one Response frame: {reply.hex()}")
    response = parse_strict(frames[0].payload, pb.Response)
    if response.status is None or response.status.code == 0:
        raise ContractBroken(f"an error reply has no error status: {response!r}")
    return response.status.message.split(":")[0]


def _server(chunks: list[bytes]) -> str:
    conn = ServerConnection()
    kinds: list[str] = []
    last = 0
    for chunk in chunks:
        for item in conn.receive(chunk):
            if isinstance(item, IncomingRequest):
                if item.stream_id % 2 == 0 or item.stream_id <= last:
                    raise ContractBroken(f"request on stream {item.stream_id} after {last}")
                last = item.stream_id
                conn.respond(item.stream_id, b"ok")
                kinds.append("request")
            else:
                kinds.append(_check_error_reply(item))
    if conn.in_flight:
        raise ContractBroken(f"answered requests still in flight: {sorted(conn.in_flight)}")
    named = ",".join(sorted(set(kinds))) or "no frame"
    return f"{ERROR}server {named}" if set(kinds) - {"request"} else f"server {named}"


def _client(chunks: list[bytes]) -> str:
    conn = ClientConnection()
    calls = [conn.request("svc", "M", b"")[0] for _ in range(CLIENT_CALLS)]
    replied: list[int] = []
    kinds: set[str] = set()
    for chunk in chunks:
        for reply in conn.receive(chunk):
            if (reply.payload is None) == (reply.error is None):
                raise ContractBroken(f"a reply needs a payload or an error: {reply!r}")
            replied.append(reply.stream_id)
            kinds.add("payload" if reply.error is None else reply.error.code.name)
    if len(set(replied)) != len(replied) or not set(replied) <= set(calls):
        raise ContractBroken(f"replies {replied} for calls {calls}")
    named = ",".join(sorted(kinds)) or "no reply"
    return f"{ERROR}client {named}" if kinds - {"payload"} else f"client {named}"


def _mux(chunks: list[bytes]) -> str:
    decoder = mux.MuxDecoder()
    server, client = ServerConnection(), ClientConnection()
    for _ in range(CLIENT_CALLS):
        client.request("svc", "M", b"")
    try:
        for chunk in chunks:
            for conn_id, piece in decoder.feed(chunk):
                if conn_id == mux.PLUGIN_CONN:
                    for item in server.receive(piece):
                        if isinstance(item, IncomingRequest):
                            server.respond(item.stream_id, b"")
                        else:
                            _check_error_reply(item)
                elif conn_id == mux.RUNTIME_CONN:
                    client.receive(piece)
                else:
                    raise ContractBroken(f"bytes for connection {conn_id}, which nobody serves")
    except mux.MuxError as err:
        if "claims" not in str(err):
            raise
        return kind_of(err, "frame too long")
    return "mux ok"


def _with_device_rules(rng: random.Random, count: int) -> tuple[bytes, ...]:
    """Requests whose container has device cgroup rules (deeper than `random_message` goes)."""
    out = []
    for _ in range(count):
        resources = LinuxResources(
            devices=[random_message(rng, LinuxDeviceCgroup) for _ in range(rng.randrange(4))]
        )
        linux = LinuxContainer(
            cgroups_path=rng.choice(["", "/kubepods/x", "k.slice:cri-containerd:ab"]), resources=resources
        )
        ctr = random_message(rng, Container)
        ctr.linux = linux
        out.append(bytes(CreateContainerRequest(pod=random_message(rng, PodSandbox), container=ctr)))
    return tuple(out)


_LIFECYCLE_DECODERS = (upb_decoder(PostStartContainerRequest), upb_decoder(StopContainerRequest))


def _fastcodec(body: bytes) -> str:
    try:
        fast = decode_create_container(body)
    except MalformedMessage as err:
        for decode in _LIFECYCLE_DECODERS:  # the same two fields: refused alike
            try:
                decode(body)
            except MalformedMessage:
                continue
            raise ContractBroken("a lifecycle decoder accepts what CreateContainer's refuses") from None
        return kind_of(err, err.reason)
    slow = parse_strict(body, CreateContainerRequest)
    for decode in _LIFECYCLE_DECODERS:
        event = decode(body)
        upb_record = event_record(event.pod, event.container, running=True, pid=event.container.pid)
        pod, ctr = slow.pod or PodSandbox(), slow.container or Container()
        if upb_record != event_record(pod, ctr, running=True, pid=ctr.pid):
            raise ContractBroken("the container's record differs between upb's and betterproto2's message")
    if (fast.pod.uid, fast.container.name, list(fast.container.env)) != (
        slow.pod.uid if slow.pod else "",
        slow.container.name if slow.container else "",
        list(slow.container.env) if slow.container else [],
    ):
        raise ContractBroken("upb and betterproto2 read the same bytes differently")
    return "fastcodec ok"


def target(seed: int) -> Target:
    rng = random.Random(seed)
    pools = (
        tuple(_requests(rng) for _ in range(POOL_SIZE)),
        tuple(_responses(rng) for _ in range(POOL_SIZE)),
        tuple(_muxed(rng) for _ in range(POOL_SIZE)),
        encodings(rng, CreateContainerRequest, POOL_SIZE // 2) + _with_device_rules(rng, POOL_SIZE // 2),
    )

    def check(data: bytes) -> str:
        if not data:
            return "empty"
        surface, step = data[0] & 3, (data[0] >> 2) + 1
        body = data[1:]
        if surface == FASTCODEC:
            return _fastcodec(body)
        chunks = _chunks(body, step)
        whole = FrameDecoder().feed(body)
        decoder = FrameDecoder()
        pieces = [frame for chunk in chunks for frame in decoder.feed(chunk)]
        if whole != pieces:
            raise ContractBroken(f"frames depend on read boundaries ({step}-byte reads)")
        if surface == SERVER:
            return _server(chunks)
        if surface == CLIENT:
            return _client(chunks)
        return _mux(chunks)

    return Target("nri", surface_inputs(pools, 96), check)
