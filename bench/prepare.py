"""NodePrepareResources / NodeUnprepareResources latency, as the kubelet sees it.

A grpcio client (in this thread) calls vgpud's v1 DRA service (in a Trio thread, over a real unix
socket) with batches of 1, 8, 64 and 256 claims; the kube facade is the in-memory fake, so the figures
are vgpud's own cost: parsing, the node lock, the checkpoint (with fsync), directories and CDI specs.
Prints p50/p99 per call and per claim for each batch size, and each batch's p50 per claim as a ratio
of a one-claim call's (measured first, in the same run). Exits 1 when a call fails for any claim or
answers for other claims than it was asked for.

    .venv/bin/python bench/prepare.py [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import trio
import trio_asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.stats import percentile
from tests import objects as o
from tests.draharness import NODE, Harness
from tests.stdproto import message_class
from vgpud.dra.service import node_services
from vgpud.grpcserve import serve

BATCHES = (1, 8, 64, 256)
V1 = "k8s.io.kubelet.pkg.apis.dra.v1"


def claim_uid(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-000000000000"


def start_server(root: Path, claims: int, ready: threading.Event) -> None:
    """The DRA node service over a fake kube holding `claims` claims; runs until the process exits."""

    async def main() -> None:
        h = Harness(root)
        for i in range(claims):
            minor = i % 2
            h.kube.add_claim(
                o.claim(
                    requests=[o.exactly("r1")],
                    results=[o.result("r1", f"vgpu-{minor}", share_id=f"s{i}")],
                    name=f"c{i}",
                    uid=claim_uid(i),
                )
            )
        async with trio_asyncio.open_loop():
            await serve(node_services(h.driver), path=root / "dra.sock", ready=lambda _b: ready.set())

    trio.run(main)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=0, help="rounds per batch size (default: by size)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="vgb", dir="/tmp"))
    ready = threading.Event()
    threading.Thread(target=start_server, args=(root, max(BATCHES), ready), daemon=True).start()
    if not ready.wait(30):
        print("server did not start", file=sys.stderr)
        return 1
    request_cls = {
        kind: message_class(f"{V1}.Node{kind}ResourcesRequest") for kind in ("Prepare", "Unprepare")
    }
    with grpc.insecure_channel(f"unix://{root / 'dra.sock'}") as channel:
        calls = {
            kind: channel.unary_unary(
                f"/{V1}.DRAPlugin/Node{kind}Resources",
                request_serializer=request_cls[kind].SerializeToString,
                response_deserializer=message_class(f"{V1}.Node{kind}ResourcesResponse").FromString,
            )
            for kind in ("Prepare", "Unprepare")
        }
        print(f"node {NODE}, fake kube, checkpoint + CDI specs under {root}")
        print(
            f"{'claims':>6} {'op':<9} {'rounds':>6} {'p50 call':>10} {'p99 call':>10} "
            f"{'p50/claim':>10} {'p99/claim':>10} {'vs 1 claim':>10}"
        )
        #: p50 per claim of a one-claim call, per op: the reference each batch's cost is a ratio of
        single: dict[str, float] = {}
        for size in BATCHES:
            rounds = args.rounds or max(5, 200 // size)
            timings: dict[str, list[float]] = {"Prepare": [], "Unprepare": []}
            for _ in range(rounds):
                for kind in ("Prepare", "Unprepare"):
                    request = request_cls[kind]()
                    for i in range(size):
                        request.claims.add(namespace=o.NAMESPACE, uid=claim_uid(i), name=f"c{i}")
                    start = time.perf_counter()
                    reply = calls[kind](request, timeout=60)
                    timings[kind].append(time.perf_counter() - start)
                    errors = [e.error for e in reply.claims.values() if e.error]
                    if set(reply.claims) != {claim_uid(i) for i in range(size)} or errors:
                        print(f"{kind} of {size} claims failed: {errors[:3]}", file=sys.stderr)
                        return 1
            for kind, values in timings.items():
                p50, p99 = percentile(values, 50) * 1e3, percentile(values, 99) * 1e3
                reference = single.setdefault(kind, p50 / size)
                print(
                    f"{size:>6} {kind:<9} {rounds:>6} {p50:>8.2f}ms {p99:>8.2f}ms "
                    f"{p50 / size:>8.3f}ms {p99 / size:>8.3f}ms {p50 / size / reference:>10.2f}"
                )
        print(f"mean Prepare per claim at 256: {statistics.mean(timings['Prepare']) / 256 * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
