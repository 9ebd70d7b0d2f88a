"""Scale: what a node and the webhook cost as the cluster grows, against a real etcd + kube-apiserver.

The bench fills one API server (tests/kubeapi.py, never restarted) with N ResourceClaims allocated on
other nodes (1,000 of them; the claims spread over 50 namespaces, each reserved for one pod there and
labelled as that node's Prepare labels it, where this tree's vgpud has such a label:
vgpud.dra.claimlabel) and M pods in one namespace, and reports each figure as a ratio to the empty
cluster (N = 0, M = 0) measured in the same run.

Per node, for each N (filled up to N, then a fresh `vgpud run` with mock GPUs and the chart's
recommended gates, NRISupport + DevicePluginClientMode, as tests/vgpudproc.py starts it; without a
runtime NRI socket the node falls back to eager mode, and its claim and pod caches still run, which the
bench checks in its debug state and prints):
  - start -> SERVING, and -> both caches listed;
  - RSS (VmRSS) 5 s after SERVING and the caches listed ("settled"), and the peak (VmHWM);
  - bytes and requests between vgpud and the API server from process start to settled, and per hour:
    a window of --window seconds while the bench patches claims on other nodes at --churn-rate per
    second (none at N = 0), extrapolated to an hour, plus the informers' relists (every 600 s: 6 an
    hour, each counted as the start-up traffic, an upper bound of one relist).
  Bytes: vgpud's kubeconfig points at a counting TCP proxy on 127.0.0.1 (TLS passes through it).
  Requests: the API server's audit log, Metadata level for vgpud's own user (a client certificate of a
  CA given to the server, one user per run) and nothing for anyone else; a watch counts once.

Webhook, for each M (M pods naming other claims, plus the 2 pods a shared vGPU claim is reserved for):
a fresh `vgpud webhook` (self-signed TLS, admin kubeconfig) gets AdmissionReviews over keep-alive HTTPS
(not registered with the API server), one at a time: a resourceclaims/status UPDATE reserving the
shared claim for 1 pod (allowed) or 2 (denied: one claim across pods), and a pod CREATE naming a free
vGPU claim (allowed) or the shared one (denied); p50/p99 of --reviews of each kind after 20 warm-ups.
Before measuring: where the webhook runs a pod cache, its first list (from its log); then every review
decided as expected twice in a row, and 2 s more.

Goals (printed, recorded; they fail the exit status only with --require-goals): node cost flat (RSS and
start bytes at the largest N within 10% of N = 0); webhook p99 at the largest M within 2x of M = 0.
Exits 1 when the bench's own check fails: a fill count a list disagrees with, vgpud never SERVING or
its caches not running, a review decided otherwise than expected, a churn update failing. Needs
`make kube` and `make build` (the control library `vgpud run` installs; or LIBRARY_SOURCE and
REGISTER_CLIENT_SOURCE); about 6 minutes at the defaults on 2 CPUs (filling 50,000 claims: about
2 minutes), 1 to 2 with --quick.

    .venv/bin/python bench/scale.py [--claims 0,5000,50000] [--pods 0,2000,10000] [--window 60]
                                    [--quick] [--require-goals] [--churn-rate 20] [--reviews 200] [--keep]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.lib.apiload import RESOURCE, VGPU_CLASS, Admin, Churn, claim_allocation, fill, other_claim, pod
from bench.lib.apitraffic import ClientCa, CountingProxy, Traffic, audit_args, audit_policy, audit_requests
from bench.lib.results import Figure, emit
from bench.lib.stats import percentile
from tests import objects as o
from tests.kubeapi import ApiServer, apiserver_available, free_port, kube_env, start_apiserver
from tests.unit.webhook.builders import claim_review, review
from tests.unit.webhook.process import WebhookProcess
from tests.vgpudproc import SERVING, Vgpud, ensure_node
from vgpud.artifacts import DEFAULT_LIBRARY_SOURCE, DEFAULT_REGISTER_CLIENT_SOURCE
from vgpud.kube.informer import RESYNC_INTERVAL
from vgpud.observe.client import Endpoint, get_json

GATES = "NRISupport=true,DevicePluginClientMode=true"
NODE = "bench-node"
OTHER_NODES = 1000
CLAIM_NAMESPACES = 50
POD_NAMESPACE = "bench-pods"
SHARED_CLAIM, FREE_CLAIM = "bench-shared", "bench-free"
CACHES = ("claim-cache", "pod-cache")
SETTLE_S = 5.0
SERVING_TIMEOUT_S = 300.0
WARMUP = 20
RELISTS_PER_HOUR = 3600 / RESYNC_INTERVAL
#: goals: the node's RSS and start bytes at the largest N within this of N = 0; webhook p99 at the
#: largest M within this of M = 0
NODE_GOAL, WEBHOOK_GOAL = 1.10, 2.0
MIB = 1 << 20


class BenchFailure(RuntimeError):
    """The bench's own check failed: the figures cannot be trusted."""


def prepared_labels(node: str) -> dict[str, str]:
    """The labels a claim prepared on `node` carries, where this vgpud's Prepare writes one (the node
    label its claim cache selects: vgpud.dra.claimlabel); none in a tree without it."""
    try:
        from vgpud.dra.claimlabel import node_claim_labels  # absent before issue 33
    except ImportError:
        return {}
    return node_claim_labels(o.DRIVER, node)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt (once) while inside, so every `finally` runs."""

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        print(f"\n{signal.Signals(signum).name} received: stopping", file=sys.stderr, flush=True)
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def claim_ns(k: int) -> str:
    return f"bench-c-{k % CLAIM_NAMESPACES:02d}"


def node_of(k: int) -> str:
    return f"other-node-{k % OTHER_NODES}"


# --------------------------------------------------------------------------------------------------
# The cluster


class Cluster:
    """The API server, its admin, the audit log and the client CA, and what has been filled so far."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.ca = ClientCa(workdir / "pki")
        self.audit_log = workdir / "audit.log"
        flags = [*audit_args(audit_policy(workdir / "audit-policy.yaml"), self.audit_log)]
        flags.append(f"--client-ca-file={self.ca.cert}")
        self.api: ApiServer = start_apiserver(workdir / "kube", extra_args=flags)
        self.admin = Admin(self.api.url, self.api.token, self.api.ssl_context())
        self.claims = 0
        self.pods = 0
        for k in range(CLAIM_NAMESPACES):
            self.namespace(claim_ns(k))
        ensure_node(self.api, NODE)
        self.admin.call(
            "POST",
            f"{RESOURCE}/deviceclasses",
            {
                "metadata": {"name": VGPU_CLASS},
                "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{o.DRIVER}'"}}]},
            },
            ok=(409,),
        )

    def namespace(self, name: str) -> None:
        self.admin.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}}, ok=(409,))

    def stop(self) -> None:
        self.admin.close()
        self.api.stop()

    def fill_claims(self, n: int) -> float:
        """Claims allocated on other nodes, up to `n`; the claims per second (0 when none were made)."""

        def make(k: int) -> None:
            ns, name = claim_ns(k), f"claim-{k}"
            body = other_claim(name, prepared_labels(node_of(k)))
            self.admin.call("POST", f"{RESOURCE}/namespaces/{ns}/resourceclaims", body)
            status = claim_allocation(node_of(k), pod=f"pod-{k}", pod_uid=str(uuid.uuid4()))
            path = f"{RESOURCE}/namespaces/{ns}/resourceclaims/{name}/status"
            self.admin.call("PATCH", path, {"status": status}, "application/merge-patch+json")

        rate = fill("claims", self.claims, n, make)
        self.claims = max(self.claims, n)
        listed = self.admin.count(f"{RESOURCE}/resourceclaims")
        if listed != self.claims:
            raise BenchFailure(f"filled {self.claims:,} claims but the API server lists {listed:,}")
        return rate

    def churn(self, rate: float) -> Churn | None:
        """Annotation patches of the filled claims (allocated on other nodes), `rate` per second."""
        if not self.claims:
            return None
        count = self.claims

        def update(i: int) -> None:
            k = (i * 7919) % count
            body = {"metadata": {"annotations": {"bench.vgpud/churn": str(i)}}}
            path = f"{RESOURCE}/namespaces/{claim_ns(k)}/resourceclaims/claim-{k}"
            self.admin.call("PATCH", path, body, "application/merge-patch+json")

        return Churn(update, rate).start()

    def delete_node_slices(self) -> None:
        """The ResourceSlices vgpud published, so the next vgpud starts as the first did."""
        selector = f"spec.nodeName={NODE}"
        self.admin.call("DELETE", f"{RESOURCE}/resourceslices?fieldSelector={selector}", ok=(404,))


# --------------------------------------------------------------------------------------------------
# One node


@dataclass
class NodeRun:
    n: int
    serving_s: float
    synced_s: float
    rss: int
    hwm: int
    start: Traffic
    start_requests: Counter[str]
    window_s: float
    window: Traffic
    window_requests: Counter[str]
    churned: float
    caches: dict[str, str]
    mode: str
    listed: str

    @property
    def bytes_per_hour(self) -> float:
        return self.window.total * 3600 / self.window_s + RELISTS_PER_HOUR * self.start.total

    @property
    def requests_per_hour(self) -> float:
        window = sum(self.window_requests.values()) * 3600 / self.window_s
        return window + RELISTS_PER_HOUR * sum(self.start_requests.values())


def memory(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def wait_serving(vgpud: Vgpud, began: float) -> float:
    """Seconds from `began` (monotonic) to the health service's SERVING."""
    while time.monotonic() - began < SERVING_TIMEOUT_S:
        if vgpud.proc.poll() is not None:
            raise BenchFailure(f"vgpud exited with {vgpud.proc.returncode} before SERVING:\n{tail(vgpud)}")
        try:
            if vgpud.health() == SERVING:
                return time.monotonic() - began
        except grpc.RpcError:
            pass
        time.sleep(0.05)
    raise BenchFailure(f"vgpud not SERVING after {SERVING_TIMEOUT_S:.0f} s:\n{tail(vgpud)}")


def wait_caches(vgpud: Vgpud, began: float) -> tuple[float, dict[str, Any]]:
    """Seconds from `began` until both caches are healthy (their first list is in), and the state."""
    debug = Endpoint(unix_path=vgpud.dra_socket.parent / "debug.sock")
    state: dict[str, Any] = {}
    while time.monotonic() - began < SERVING_TIMEOUT_S:
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            state = get_json(debug, "/debug/state")
            components = state.get("components") or {}
            if all((components.get(c) or {}).get("state") == "healthy" for c in CACHES):
                return time.monotonic() - began, state
        time.sleep(0.2)
    components = state.get("components") or {}
    found = {c: (components.get(c) or {}).get("state", "absent") for c in CACHES}
    raise BenchFailure(f"vgpud's caches not running after {SERVING_TIMEOUT_S:.0f} s: {found}\n{tail(vgpud)}")


def tail(vgpud: Vgpud, lines: int = 25) -> str:
    return "\n".join(vgpud.output().splitlines()[-lines:])


def measure_node(cluster: Cluster, n: int, window: float, churn_rate: float) -> NodeRun:
    """A fresh vgpud against the cluster as filled, measured; stopped (by PID) before returning."""
    api = cluster.api
    port = int(api.url.rsplit(":", 1)[1])
    root = Path(tempfile.mkdtemp(prefix="vgs", dir="/tmp"))  # short: unix socket paths
    proxy = CountingProxy(("127.0.0.1", port))
    user = f"vgpud-n{n}"
    kubeconfig = cluster.ca.kubeconfig(
        root / "kubeconfig",
        server=f"https://127.0.0.1:{proxy.port}",
        server_ca=api.ca_file.read_bytes(),
        user=user,
    )
    vgpud: Vgpud | None = None
    try:
        wall0, began = time.time(), time.monotonic()
        vgpud = Vgpud(
            root, node=NODE, port=free_port(), kubeconfig=kubeconfig, extra=["--feature-gates", GATES]
        )
        serving_s = wait_serving(vgpud, began)
        synced_s, state = wait_caches(vgpud, began)
        time.sleep(max(0.0, began + max(serving_s, synced_s) + SETTLE_S - time.monotonic()))
        rss, hwm = memory(vgpud.proc.pid)
        start, wall1 = proxy.traffic(), time.time()
        churn = cluster.churn(churn_rate)
        try:
            w0, before = time.time(), proxy.traffic()
            time.sleep(window)
            w1, after = time.time(), proxy.traffic()
        finally:
            if churn is not None:
                churn.stop()
        if churn is not None and churn.errors:
            raise BenchFailure(f"churn updates failed: {churn.errors[:3]}")
        if vgpud.proc.poll() is not None:
            raise BenchFailure(f"vgpud exited with {vgpud.proc.returncode} while measured:\n{tail(vgpud)}")
        try:
            code = vgpud.stop(signal.SIGTERM, timeout=30)
        except subprocess.TimeoutExpired:
            raise BenchFailure(f"vgpud did not stop in 30 s after SIGTERM:\n{tail(vgpud)}") from None
        if code != 0:
            raise BenchFailure(f"vgpud exited with {code} on SIGTERM:\n{tail(vgpud)}")
        cluster.delete_node_slices()  # not in `finally`: an interrupted run must not wait for the API
        time.sleep(0.5)  # the last audit events are written
        start_requests = audit_requests(cluster.audit_log, user, wall0, wall1)
        window_requests = audit_requests(cluster.audit_log, user, w0, w1)
        if not start_requests or not start.total:
            raise BenchFailure(f"no requests or bytes from vgpud seen at start: {start_requests}, {start}")
        components = state.get("components") or {}
        listed = re.findall(r"resource claim cache: (\d+) listed", vgpud.output())
        return NodeRun(
            n=n,
            serving_s=serving_s,
            synced_s=synced_s,
            rss=rss,
            hwm=hwm,
            start=start,
            start_requests=start_requests,
            window_s=w1 - w0,
            window=after - before,
            window_requests=window_requests,
            churned=churn.achieved if churn is not None else 0.0,
            caches={c: (components.get(c) or {}).get("state", "absent") for c in CACHES},
            mode=f"{state.get('mode')} mode"
            + (" (NRISupport fell back: no runtime NRI socket)" if state.get("nri_fallback") else ""),
            listed=listed[0] if listed else "?",
        )
    finally:
        if vgpud is not None:
            vgpud.kill()
        proxy.close()
        shutil.rmtree(root, ignore_errors=True)


# --------------------------------------------------------------------------------------------------
# The webhook


class Webhook:
    """Fixtures in the pods' namespace (a shared vGPU claim reserved for two pods, a free one) and the
    four reviews that read them; one fresh `vgpud webhook` per measurement."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        admin = cluster.admin
        cluster.namespace(POD_NAMESPACE)
        base = f"{RESOURCE}/namespaces/{POD_NAMESPACE}/resourceclaims"
        shared = other_claim(SHARED_CLAIM)
        first = shared["spec"]["devices"]["requests"][0]
        shared["spec"]["devices"]["requests"] = [{**first, "name": "r0"}, {**first, "name": "r1"}]
        admin.call("POST", base, shared)
        admin.call("POST", base, other_claim(FREE_CLAIM))
        self.holders = [
            admin.call(
                "POST",
                f"/api/v1/namespaces/{POD_NAMESPACE}/pods",
                pod(f"reserved-{c}", node_of(0), {c: (SHARED_CLAIM, [r])}),
            )
            for c, r in (("a", "r0"), ("b", "r1"))
        ]
        status = claim_allocation(node_of(0), pod="", pod_uid="", requests=("r0", "r1"))
        allocated = admin.call(
            "PATCH", f"{base}/{SHARED_CLAIM}/status", {"status": status}, "application/merge-patch+json"
        )
        refs = [
            {"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]}
            for p in self.holders
        ]
        self.reviews: dict[str, list[tuple[bytes, bool]]] = {
            "claim": [
                (self._claim(allocated, refs[:1]), True),  # one pod: allowed
                (self._claim(allocated, refs), False),  # a second pod on one claim (rule 5): denied
            ],
            "pod": [
                (self._pod(FREE_CLAIM), True),  # a vGPU claim nobody uses: allowed
                (self._pod(SHARED_CLAIM), False),  # the claim two pods use: denied
            ],
        }

    @staticmethod
    def _claim(allocated: dict[str, Any], reserved: list[dict[str, str]]) -> bytes:
        new = json.loads(json.dumps(allocated))
        new["status"]["reservedFor"] = reserved
        return json.dumps(
            claim_review(new, sub_resource="status", operation="UPDATE", old=allocated)
        ).encode()

    @staticmethod
    def _pod(claim: str) -> bytes:
        newcomer = o.pod(
            "newcomer",
            str(uuid.uuid4()),
            containers=[o.container("main", o.ref("gpu"))],
            claims={"gpu": claim},
            namespace=POD_NAMESPACE,
        )
        return json.dumps(review(newcomer)).encode()

    def fill_pods(self, m: int) -> float:
        """Pods naming other claims in the namespace, up to `m` (besides the two holders)."""

        def make(k: int) -> None:
            body = pod(f"pod-{k}", node_of(k), {"main": (f"claim-x{k}", [])})
            self.cluster.admin.call("POST", f"/api/v1/namespaces/{POD_NAMESPACE}/pods", body)

        cluster = self.cluster
        rate = fill("pods", cluster.pods, m, make)
        cluster.pods = max(cluster.pods, m)
        listed = cluster.admin.count(f"/api/v1/namespaces/{POD_NAMESPACE}/pods")
        if listed != cluster.pods + len(self.holders):
            raise BenchFailure(f"filled {cluster.pods + 2:,} pods but the API server lists {listed:,}")
        return rate


@dataclass
class WebhookRun:
    m: int
    ready_s: float
    #: what the webhook's pod cache did before the reviews (or that it has none)
    cache: str
    ms: dict[str, list[float]] = field(default_factory=dict)
    rss: int = 0


class ReviewClient:
    """Reviews over one keep-alive HTTPS connection, as the API server's pool sends them."""

    def __init__(self, process: WebhookProcess) -> None:
        self.process = process
        self.conn: http.client.HTTPSConnection | None = None

    def post(self, body: bytes) -> tuple[float, dict[str, Any]]:
        """(seconds, the review's response); a connection the server closed is opened again."""
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPSConnection(
                    "127.0.0.1", self.process.port, context=self.process.context(), timeout=60
                )
            began = time.perf_counter()
            try:
                self.conn.request("POST", "/validate", body, {"Content-Type": "application/json"})
                response = self.conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt == 2:
                    raise
                continue
            elapsed = time.perf_counter() - began
            if response.status != 200:
                raise BenchFailure(f"the webhook answered HTTP {response.status}: {data[:300]!r}")
            return elapsed, json.loads(data)["response"]
        raise AssertionError("unreachable")

    def get(self, path: str) -> int:
        conn = http.client.HTTPSConnection(
            "127.0.0.1", self.process.port, context=self.process.context(), timeout=10
        )
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def measure_webhook(hook: Webhook, m: int, reviews: int, workdir: Path) -> WebhookRun:
    """A fresh webhook: ready (every review decided as expected), warmed up, then `reviews` of each kind."""
    workdir.mkdir(parents=True)
    process = WebhookProcess(workdir, port=free_port(), kubeconfig=hook.cluster.api.kubeconfig)
    client = ReviewClient(process)
    try:
        began = time.monotonic()
        process.wait_serving(60)
        cache = wait_webhook_cache(process, began)
        ready_s = wait_decisions(process, client, hook, began)
        run = WebhookRun(m, ready_s, cache)
        for kind, variants in hook.reviews.items():
            times: list[float] = []
            for i in range(WARMUP + reviews):
                body, allowed = variants[i % len(variants)]
                elapsed, answer = client.post(body)
                if answer.get("allowed") is not allowed:
                    raise BenchFailure(f"a {kind} review was decided {answer}, expected allowed={allowed}")
                if i >= WARMUP:
                    times.append(elapsed * 1e3)
            run.ms[kind] = times
        run.rss = memory(process.proc.pid)[0]
        return run
    finally:
        client.close()
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            process.stop(15)
        process.kill()


def wait_webhook_cache(process: WebhookProcess, began: float) -> str:
    """Where the webhook runs a cache (a supervised component named so), the wait for its first list;
    what it logged of it."""
    if not re.search(r"component \S*cache\S* is starting", process.output()):
        return "no cache component: reviews list their namespace"
    while not (
        synced := re.search(r"(\S+ )?pod cache: (\d+) listed|pod cache synced: (\d+)", process.output())
    ):
        if time.monotonic() - began > SERVING_TIMEOUT_S:
            raise BenchFailure(f"the webhook's cache did not list in {SERVING_TIMEOUT_S:.0f} s")
        time.sleep(0.1)
    pods = synced.group(2) or synced.group(3)
    return f"pod cache listed {pods} pods {time.monotonic() - began:.1f} s after start"


def wait_decisions(process: WebhookProcess, client: ReviewClient, hook: Webhook, began: float) -> float:
    """Seconds until /readyz (where the webhook has one) is ok and each review is decided as expected
    twice in a row; then two more seconds for a cache to settle."""
    deadline = began + SERVING_TIMEOUT_S
    while client.get("/readyz") not in (200, 404):
        if time.monotonic() > deadline:
            raise BenchFailure(f"the webhook's /readyz is not ok after {SERVING_TIMEOUT_S:.0f} s")
        time.sleep(0.2)
    streak, last = 0, {}
    while streak < 2:
        if time.monotonic() > deadline:
            raise BenchFailure(f"the webhook never decided every review as expected; last answers: {last}")
        right = True
        for kind, variants in hook.reviews.items():
            for body, allowed in variants:
                _, answer = client.post(body)
                last[kind] = answer
                right = right and answer.get("allowed") is allowed
        streak = streak + 1 if right else 0
        if not right:
            time.sleep(0.5)
    ready = time.monotonic() - began
    time.sleep(2.0)
    return ready


# --------------------------------------------------------------------------------------------------
# Report


def ratio(value: float, reference: float) -> float:
    return value / reference if reference else float("nan")


def mib(value: float) -> float:
    return value / MIB


def requests_text(counts: Counter[str], scale: float = 1.0) -> str:
    return ", ".join(f"{what} {count * scale:,.0f}" for what, count in counts.most_common()) or "none"


def x(value: float, reference: float) -> str:
    """A ratio column: '1.00x', '102.9x'."""
    r = ratio(value, reference)
    return f"{r:.2f}x" if r < 100 else f"{r:.0f}x"


def print_nodes(runs: list[NodeRun], window: float, churn_rate: float) -> None:
    ref = runs[0]
    print(f"\nnode: one `vgpud run` (mock GPUs, --feature-gates {GATES}); N claims allocated on other nodes")
    print(
        f"{'N claims':>9} {'SERVING':>8} {'caches':>7} {'RSS MiB':>8} {'(x)':>7} {'HWM MiB':>8} "
        f"{'start MiB':>9} {'(x)':>7} {'start req':>9} {'MiB/h':>8} {'(x)':>7} {'req/h':>7} {'(x)':>7} "
        f"{'churn/s':>7}"
    )
    for run in runs:
        print(
            f"{run.n:>9,} {run.serving_s:>7.2f}s {run.synced_s:>6.2f}s {mib(run.rss):>8.1f} "
            f"{x(run.rss, ref.rss):>7} {mib(run.hwm):>8.1f} {mib(run.start.total):>9.2f} "
            f"{x(run.start.total, ref.start.total):>7} {sum(run.start_requests.values()):>9,} "
            f"{mib(run.bytes_per_hour):>8.1f} {x(run.bytes_per_hour, ref.bytes_per_hour):>7} "
            f"{run.requests_per_hour:>7,.0f} {x(run.requests_per_hour, ref.requests_per_hour):>7} "
            f"{run.churned:>7.1f}"
        )
    print(
        f"  SERVING, caches: seconds from process start to the health service's SERVING, and to both "
        f"caches healthy (listed). RSS: {SETTLE_S:.0f} s after both (HWM: the peak). start: bytes both "
        f"ways through the proxy, and requests (audit log), from process start to then. per hour: a "
        f"{window:g} s window while the bench patched claims on other nodes at {churn_rate:g}/s (none "
        f"at N = 0: the empty cluster has none), x 3600/{window:g}, plus {RELISTS_PER_HOUR:.0f} relists "
        f"(the informers relist every {RESYNC_INTERVAL:.0f} s) each counted as the start-up traffic (an "
        f"upper bound of one relist); watch reopenings that fall outside the window are not counted."
    )
    for run in runs:
        caches = ", ".join(f"{name} {state}" for name, state in run.caches.items())
        print(
            f"  N={run.n:,}: {run.mode}; {caches} (debug state); vgpud's claim cache listed "
            f"{run.listed} claims; MiB up/down: start {mib(run.start.up):.2f}/{mib(run.start.down):.2f}, "
            f"window {mib(run.window.up):.2f}/{mib(run.window.down):.2f}"
        )
        print(f"    requests at start: {requests_text(run.start_requests)}")
        per_hour = requests_text(run.window_requests, 3600 / run.window_s)
        print(f"    requests opened in the window, per hour: {per_hour}")


def print_webhook(runs: list[WebhookRun]) -> None:
    ref = runs[0]
    print(
        "\nwebhook: a fresh `vgpud webhook` per M; M pods naming other claims in its namespace, plus the "
        "2 a shared vGPU claim is reserved for"
    )
    print(
        f"{'M pods':>7} {'ready':>7} {'claim p50':>11} {'p99':>10} {'(x)':>7} {'pod p50':>10} {'p99':>10} "
        f"{'(x)':>7} {'RSS MiB':>8}"
    )
    r99 = {k: percentile(ref.ms[k], 99) for k in ("claim", "pod")}
    for run in runs:
        c50, c99, p50, p99 = (percentile(run.ms[k], q) for k in ("claim", "pod") for q in (50, 99))
        print(
            f"{run.m:>7,} {run.ready_s:>6.1f}s {c50:>9.2f}ms {c99:>8.2f}ms {x(c99, r99['claim']):>7} "
            f"{p50:>8.2f}ms {p99:>8.2f}ms {x(p99, r99['pod']):>7} {mib(run.rss):>8.1f}"
        )
    counts = "/".join(str(len(v)) for v in runs[0].ms.values())
    print(
        f"  claim: resourceclaims/status UPDATE reserving the shared claim for 1 pod (allowed) or 2 "
        f"(denied: one claim across pods), alternating; pod: pod CREATE naming a free vGPU claim "
        f"(allowed) or the shared one (denied), alternating; {counts} reviews after {WARMUP} warm-ups "
        f"each, one at a time over a keep-alive connection. ready: start -> every review decided as "
        f"expected. RSS: after the reviews."
    )
    for run in runs:
        print(f"  M={run.m:,}: {run.cache}")


@dataclass
class Goal:
    key: str
    text: str
    value: float

    @property
    def met(self) -> bool:
        return self.value <= (NODE_GOAL if self.key in ("rss", "start") else WEBHOOK_GOAL)


def goals(nodes: list[NodeRun], hooks: list[WebhookRun]) -> dict[str, Goal]:
    out: dict[str, Goal] = {}
    if len(nodes) > 1:
        ref, big = nodes[0], nodes[-1]
        within = f"at N={big.n:,} within {NODE_GOAL - 1:.0%} of N=0"
        out["rss"] = Goal("rss", f"node cost flat: RSS {within}", ratio(big.rss, ref.rss))
        start = ratio(big.start.total, ref.start.total)
        out["start"] = Goal("start", f"node cost flat: start bytes {within}", start)
    if len(hooks) > 1:
        ref_h, big_h = hooks[0], hooks[-1]
        for kind in ("claim", "pod"):
            value = ratio(percentile(big_h.ms[kind], 99), percentile(ref_h.ms[kind], 99))
            text = f"webhook {kind} review p99 at M={big_h.m:,} within {WEBHOOK_GOAL:g}x of M=0"
            out[kind] = Goal(kind, text, value)
    return out


def figures(nodes: list[NodeRun], hooks: list[WebhookRun], met: dict[str, Goal]) -> list[Figure]:
    """The largest N's and M's figures against N = 0 and M = 0."""
    out: list[Figure] = []
    node_goal, hook_goal = f"<= {NODE_GOAL:g}x N=0", f"<= {WEBHOOK_GOAL:g}x M=0"
    if nodes:
        ref, big = nodes[0], nodes[-1]
        n, against = f"N={big.n:,}", "N=0 claims, same run"

        def node(name: str, value: float, unit: str, reference: float, goal: str = "") -> Figure:
            done = met[goal].met if goal in met else None
            aim = node_goal if goal else ""
            return Figure(name, value, unit, against, ratio(value, reference), aim, done)

        out += [
            node(f"node RSS, {n} claims", mib(big.rss), "MiB", mib(ref.rss), "rss"),
            node(f"node start bytes, {n}", mib(big.start.total), "MiB", mib(ref.start.total), "start"),
            node(f"node start -> SERVING, {n}", big.serving_s, "s", ref.serving_s),
            node(f"node API MiB per hour, {n}", mib(big.bytes_per_hour), "MiB", mib(ref.bytes_per_hour)),
            node(f"node API requests per hour, {n}", big.requests_per_hour, "", ref.requests_per_hour),
        ]
    if hooks:
        ref_h, big_h = hooks[0], hooks[-1]
        for kind in ("claim", "pod"):
            value, reference = percentile(big_h.ms[kind], 99), percentile(ref_h.ms[kind], 99)
            done = met[kind].met if kind in met else None
            name = f"webhook {kind} review p99, M={big_h.m:,} pods"
            against = "M=0 pods, same run"
            out.append(Figure(name, value, "ms", against, ratio(value, reference), hook_goal, done))
    return out


# --------------------------------------------------------------------------------------------------
# Main


def counts(text: str) -> list[int]:
    values = [int(v.replace("_", "")) for v in text.split(",") if v.strip()]
    if not values or values[0] != 0 or values != sorted(set(values)):
        raise argparse.ArgumentTypeError(f"{text!r}: increasing counts starting at 0 (the reference)")
    return values


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--claims", type=counts, default=[0, 5000, 50000], help="N values (default 0,5000,50000)")
    add("--pods", type=counts, default=[0, 2000, 10000], help="M values (default 0,2000,10000)")
    add("--window", type=float, default=60.0, help="steady-state window, seconds (default 60)")
    add("--churn-rate", type=float, default=20.0, help="claim updates per second (default 20)")
    add("--reviews", type=int, default=200, help="reviews of each kind per M (default 200)")
    add("--quick", action="store_true", help="a smoke run: N 0,2000, M 0,1000, window 15")
    add("--require-goals", action="store_true", help="exit 1 when a goal is not met, too")
    add("--keep", action="store_true", help="keep the work directory (logs, audit log)")
    args = parser.parse_args()
    if args.quick:
        args.claims, args.pods, args.window = [0, 2000], [0, 1000], 15.0
    if args.window <= 0 or args.churn_rate <= 0 or args.reviews < 2:
        parser.error("--window and --churn-rate must be > 0, --reviews >= 2")
    return args


@dataclass
class Results:
    nodes: list[NodeRun] = field(default_factory=list)
    hooks: list[WebhookRun] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)


def run(args: argparse.Namespace, workdir: Path, began: float) -> Results:
    """Every measurement, in order; the cluster is stopped (by PID) whatever happens."""
    results = Results()
    cluster: Cluster | None = None
    try:
        with stop_on_signals():
            cluster = Cluster(workdir)
            print(f"API server up ({time.monotonic() - began:.1f} s)")
            for n in args.claims:
                cluster.fill_claims(n)
                print(f"vgpud at N = {n:,} claims ...", flush=True)
                results.nodes.append(measure_node(cluster, n, args.window, args.churn_rate))
            hook = Webhook(cluster)
            for m in args.pods:
                hook.fill_pods(m)
                print(f"webhook at M = {m:,} pods ...", flush=True)
                results.hooks.append(measure_webhook(hook, m, args.reviews, workdir / f"webhook-{m}"))
    except BenchFailure as err:
        results.wrong.append(str(err))
    except Exception as err:  # a bug or an API error: what was measured is still printed
        traceback.print_exc()
        results.wrong.append(f"{type(err).__name__}: {err}")
    finally:
        if cluster is not None:
            cluster.stop()
    return results


def missing() -> str:
    """ "" when this machine can run the bench, else what it lacks."""
    if not apiserver_available():
        return "etcd + kube-apiserver are not installed: run hack/install-kube.sh (make kube)"
    for env, default in (
        ("LIBRARY_SOURCE", DEFAULT_LIBRARY_SOURCE),
        ("REGISTER_CLIENT_SOURCE", DEFAULT_REGISTER_CLIENT_SOURCE),
    ):
        path = Path(os.environ.get(env) or default)
        if not path.is_file():
            return f"no {path.name} at {path}, which `vgpud run` installs: run make build (or set {env})"
    return ""


def main() -> int:
    args = parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # progress lines through a pipe too
    why = missing()
    if why:
        print(f"scale: {why}", file=sys.stderr)
        emit("scale", [], ok=False)
        return 2
    began = time.monotonic()
    print(
        f"scale bench: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, kube-apiserver "
        f"{kube_env().get('KUBE_VERSION', '?')}; N = {args.claims}, M = {args.pods}, window {args.window:g} s"
    )
    workdir = Path(tempfile.mkdtemp(prefix="vgscale-", dir="/tmp"))
    try:
        results = run(args, workdir, began)
    except KeyboardInterrupt:
        print("scale: interrupted; everything it started is stopped", file=sys.stderr)
        return 130
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if results.nodes:
        print_nodes(results.nodes, args.window, args.churn_rate)
    if results.hooks:
        print_webhook(results.hooks)
    met = goals(results.nodes, results.hooks)
    if met:
        print("\ngoals (a goal not met fails the exit status only with --require-goals):")
    for goal in met.values():
        print(f"  {goal.text}: {goal.value:.2f}x -> {'met' if goal.met else 'NOT MET'}")
    print(f"\nwall time {time.monotonic() - began:.0f} s")
    for line in results.wrong:
        print(f"FAILED: {line}", file=sys.stderr)
    emit("scale", figures(results.nodes, results.hooks, met), ok=not results.wrong)
    if results.wrong:
        return 1
    return 1 if args.require_goals and not all(g.met for g in met.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
