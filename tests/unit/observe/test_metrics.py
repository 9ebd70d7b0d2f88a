"""The node daemon's metrics: the exposition as prometheus-client's own parser reads it, the names'
conventions, and every recorded call counted exactly once through the recorder listener."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest
from grpclib.exceptions import GRPCError
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests import objects as o
from tests.draharness import REF
from tests.events import Recording, recording
from tests.unit.hotplug.world import CLAIMS, RUNNING, SLAVE, TARGET, Access, Targets
from tests.unit.observe.node import Node, make_node
from vgpud import metrics_names as names
from vgpud._pb.nri.pkg.api.v1alpha1 import (
    Container,
    CreateContainerRequest,
    PodSandbox,
    SynchronizeRequest,
)
from vgpud._pb.vgpud.hotplug.v1 import AttachRequest, DetachRequest
from vgpud.componenthealth import HealthState
from vgpud.containers.record import Injection, NodeContainer
from vgpud.hotplug.node import HotPlug
from vgpud.hotplug.service import HotPlugService
from vgpud.hotplug.store import HOTPLUG_FILE, AttachmentStore
from vgpud.hotplug.table import AttachmentTable
from vgpud.kube.eventcorrelate import EventType
from vgpud.kube.events import Reason, pod_ref
from vgpud.nri.sync import decode_sync
from vgpud.observe.metrics import HOOK_BUCKETS, registry_result
from vgpud.recorder import HookCall, Outcome, Recorder

POD = PodSandbox(id="sb-1", name="train", namespace="ml", uid="8f0c6a5e-1b2d-4e3f-a4b5-c6d7e8f90a1b")


def families(node: Node) -> dict[str, list[Sample]]:
    """Family name (as the parser names it: counters without `_total`) -> its samples."""
    body, content_type = node.metrics.exposition()
    assert content_type.startswith("text/plain; version=")
    return {f.name: f.samples for f in text_string_to_metric_families(body.decode())}


def types(node: Node) -> dict[str, str]:
    body, _ = node.metrics.exposition()
    return {f.name: f.type for f in text_string_to_metric_families(body.decode())}


def value(samples: list[Sample], name: str, **labels: str) -> float:
    matching = [s.value for s in samples if s.name == name and s.labels == labels]
    assert len(matching) == 1, (name, labels, samples)
    return matching[0]


def family(name: names.MetricName) -> str:
    return name.name.removesuffix("_total")


async def test_exposition_has_every_node_family_with_its_labels(short_tmp: Path) -> None:
    node = make_node(short_tmp)
    await node.nri.synchronize(
        decode_sync(
            bytes(
                SynchronizeRequest(
                    pods=[POD],
                    containers=[
                        Container(id="c1", pod_sandbox_id="sb-1", name="plain", env=["A=1"]),
                        Container(
                            id="c2",
                            pod_sandbox_id="sb-1",
                            name="forged",
                            env=["MANAGER_VGPU_CLAIM_UID=0f0f0f0f-0f0f-4f0f-8f0f-0f0f0f0f0f0f"],
                        ),
                    ],
                )
            )
        )
    )
    await node.nri.create_container(CreateContainerRequest(pod=POD, container=Container(name="plain")))
    node.recorder.record(
        HookCall(
            component="registry", call="RegisterContainerDevice", outcome="rejected", detail="NOT_FOUND: x"
        )
    )
    await node.drift.check()
    found = families(node)
    node_names = [n for n in names.ALL if not n.name.startswith("vgpud_webhook_")]
    for metric in node_names:
        assert family(metric) in found, metric.name

    calls = found[family(names.HOOK_CALLS)]
    assert value(calls, "vgpud_hook_calls_total", component="nri", call="Synchronize", outcome="ok") == 1
    assert (
        value(calls, "vgpud_hook_calls_total", component="nri", call="CreateContainer", outcome="skipped")
        == 1
    )
    duration = found[family(names.HOOK_DURATION)]
    buckets = [
        float(s.labels["le"])
        for s in duration
        if s.name == "vgpud_hook_duration_seconds_bucket" and s.labels["call"] == "CreateContainer"
    ]
    assert buckets == [*HOOK_BUCKETS, float("inf")]
    assert min(buckets) < 0.001 and 2.0 in buckets  # sub-millisecond to the runtime's 2 s deadline
    labels = {"component": "nri", "call": "CreateContainer"}
    assert value(duration, "vgpud_hook_duration_seconds_count", **labels) == 1
    assert (
        value(found[family(names.REGISTRY_REQUESTS)], "vgpud_registry_requests_total", result="not_found")
        == 1
    )

    sync = found[family(names.NRI_SYNC_CONTAINERS)]
    assert value(sync, "vgpud_nri_sync_containers", kind="reported") == 2
    assert value(sync, "vgpud_nri_sync_containers", kind="rebuilt") == 0
    assert value(found[family(names.NRI_SYNC_INVALID)], "vgpud_nri_sync_invalid_containers_total") == 1
    assert value(found[family(names.NRI_EAGER_FALLBACKS)], "vgpud_nri_eager_fallbacks_total") == 0
    assert value(found[family(names.PARTITION_MODE)], "vgpud_partition_mode", mode="lazy") == 1
    assert value(found[family(names.PARTITION_CONFLICTS)], "vgpud_partition_conflicts") == 0
    health = found[family(names.COMPONENT_HEALTH)]
    assert value(health, "vgpud_component_health", component="dra-plugin", state="healthy") == 1
    assert value(health, "vgpud_component_health", component="dra-plugin", state="failing") == 0
    assert value(health, "vgpud_component_health", component="metrics", state="starting") == 1
    assert node.health.all_healthy()  # the metrics server does not count for health
    assert value(found[family(names.SERVING)], "vgpud_serving") == 1
    node.health.set("dra-plugin", HealthState.FAILING, "socket gone")
    assert value(families(node)[family(names.SERVING)], "vgpud_serving") == 0
    assert value(found[family(names.DRIFT_CHECKS)], "vgpud_drift_checks_total") == 1
    drift = found[family(names.DRIFT_DETECTED)]
    assert value(drift, "vgpud_drift_detected_total", kind="orphan-directory") == 0
    assert value(found[family(names.STREAM_CLIENTS)], "vgpud_debug_stream_clients") == 0
    (build,) = found[family(names.BUILD_INFO)]
    assert build.value == 1 and build.labels["version"]


async def test_prepare_refusals_are_counted_by_reason_in_the_metrics_and_the_state(short_tmp: Path) -> None:
    """An eager node refuses a claim reserved for two pods: counted under its reason, every other
    reason exported at 0."""
    node = make_node(short_tmp, lazy=False)
    pods = [
        o.pod(f"p{i}", uid, containers=[o.container("main", o.ref("gpu"))])
        for i, uid in enumerate((o.POD1_UID, o.POD2_UID))
    ]
    for pod in pods:
        node.harness.kube.add_pod(pod)
    node.harness.kube.add_claim(
        o.claim(requests=[o.exactly("r1")], results=[o.result("r1")], reserved_for=o.reserved(*pods))
    )
    out = await node.harness.driver.prepare([REF])
    assert "(vgpu-claim-across-pods) needs a node in NRI mode" in out[o.CLAIM_UID].error
    refusals = families(node)[family(names.PREPARE_REFUSALS)]
    total = "vgpud_prepare_refusals_total"
    assert value(refusals, total, reason="vgpu-claim-across-pods") == 1
    assert value(refusals, total, reason="multiple-vgpu-claims-per-container") == 0
    assert value(refusals, total, reason="vgpu-claims-share-a-gpu") == 0
    state = await node.state.snapshot()
    assert state["prepare_refusals"] == {
        "multiple-vgpu-claims-per-container": 0,
        "vgpu-claim-across-pods": 1,
        "vgpu-claims-share-a-gpu": 0,
    }
    (call,) = node.harness.recorder.recent(component="dra")
    assert (call.call, call.outcome, call.detail) == ("Prepare", Outcome.ERROR, out[o.CLAIM_UID].error)


async def test_eager_mode_fallback_and_no_nri_families(short_tmp: Path) -> None:
    node = make_node(short_tmp, lazy=False, nri_fallback="the NRI socket /x does not answer: refused")
    found = families(node)
    assert value(found[family(names.NRI_EAGER_FALLBACKS)], "vgpud_nri_eager_fallbacks_total") == 1
    reason = "the NRI socket /x does not answer: refused"
    assert (
        value(found[family(names.NRI_EAGER_FALLBACK_INFO)], "vgpud_nri_eager_fallback_info", reason=reason)
        == 1
    )
    assert value(found[family(names.PARTITION_MODE)], "vgpud_partition_mode", mode="eager") == 1
    assert family(names.NRI_SYNC_CONTAINERS) not in found
    assert family(names.NRI_CONNECTED) not in found


async def test_names_follow_prometheus_conventions(short_tmp: Path) -> None:
    """vgpud_ prefix, _total exactly on counters, _seconds on durations, and every exposed vgpud family
    declared in metrics_names (one module holds every name)."""
    node = make_node(short_tmp)
    await node.drift.check()
    node.recorder.record(HookCall(component="dra", call="Prepare"))
    declared = {n.name: n for n in names.ALL}
    assert len(declared) == len(names.ALL)
    kinds = types(node)
    for name, kind in kinds.items():
        if not name.startswith("vgpud_"):
            assert name.startswith("process_"), name  # prometheus-client's process collector
            continue
        if name.endswith("_created") and kinds.get(name.removesuffix("_created")) in ("counter", "histogram"):
            continue  # prometheus-client's creation time of a counter or histogram
        full = f"{name}_total" if kind == "counter" else name
        assert full in declared, f"{full} is exposed but not declared in metrics_names"
        if kind == "histogram":
            assert name.endswith("_seconds"), name
    for metric in declared.values():
        assert metric.name.startswith("vgpud_"), metric.name
        assert metric.name == metric.name.lower()
        exposed = kinds.get(metric.name.removesuffix("_total"))
        if exposed is not None and not metric.name.startswith("vgpud_webhook_"):
            assert metric.name.endswith("_total") == (exposed == "counter"), metric.name


@pytest.mark.parametrize(
    ("outcome", "detail", "result"),
    [
        ("ok", "", "ok"),
        ("rejected", "PERMISSION_DENIED: pid 7 is not a process of any pod", "permission_denied"),
        ("error", "DEADLINE_EXCEEDED: still unresolved after 60s", "deadline_exceeded"),
        ("rejected", "RESOURCE_EXHAUSTED: request message of 17000 bytes", "resource_exhausted"),
        ("error", "something: without a status", "error"),
        ("cancelled", "", "cancelled"),
    ],
)
def test_registry_result_label(outcome: str, detail: str, result: str) -> None:
    call = HookCall(
        component="registry", call="RegisterContainerDevice", outcome=Outcome(outcome), detail=detail
    )
    assert registry_result(call) == result


async def test_every_recorded_call_is_counted_once(short_tmp: Path) -> None:
    node = make_node(short_tmp)
    recorder: Recorder = node.recorder
    subscription = recorder.subscribe(buffer=1)  # a stalled subscriber is dropped; the metrics are not
    for i in range(500):
        recorder.record(HookCall(component="dra", call="Prepare", outcome="ok" if i % 5 else "error"))
    assert subscription.dropped
    calls = families(node)[family(names.HOOK_CALLS)]
    assert value(calls, "vgpud_hook_calls_total", component="dra", call="Prepare", outcome="ok") == 400
    assert value(calls, "vgpud_hook_calls_total", component="dra", call="Prepare", outcome="error") == 100


def test_a_failing_listener_never_reaches_the_hook(caplog: pytest.LogCaptureFixture) -> None:
    recorder = Recorder()
    seen: list[int] = []

    def broken(call: HookCall) -> None:
        raise RuntimeError("bug in a reader")

    recorder.add_listener(broken)
    recorder.add_listener(lambda call: seen.append(call.seq))
    stamped = recorder.record(HookCall(component="nri", call="CreateContainer"))
    assert stamped.seq == 1 and seen == [1]
    assert "hook-call listener" in caplog.text
    recorder.remove_listener(broken)
    recorder.record(HookCall(component="nri", call="CreateContainer"))
    assert seen == [1, 2]


async def test_containers_without_their_injection_are_a_gauge(short_tmp: Path) -> None:
    node = make_node(short_tmp)
    directory = PurePosixPath(short_tmp / "claims" / "c" / "p_main")
    node.nri.containers.set(
        NodeContainer(
            "c9",
            "p",
            "main",
            "ml",
            "train",
            running=True,
            claim_uid="c",
            injection=Injection.MISSING,
            directory=directory,
            missing=("env X",),
        )
    )
    found = families(node)
    assert value(found[family(names.NRI_NOT_INJECTED)], "vgpud_nri_not_injected_containers") == 1
    assert found[family(names.NRI_EAGER_FALLBACK_INFO)] == []  # no fallback: no sample


async def test_hotplug_calls_are_counted_like_every_hook(short_tmp: Path) -> None:
    """The hot-plug service records into the same recorder, so its calls reach the hook metrics."""
    node = make_node(short_tmp)
    service = HotPlugService(
        table=AttachmentTable(AttachmentStore(short_tmp / HOTPLUG_FILE, "boot")),
        targets=Targets(known={(TARGET, "app"): RUNNING}),
        claims=lambda pod: CLAIMS if pod == SLAVE else (),
        prepared=lambda uid: True,
        access=Access(),
        recorder=node.recorder,
    )
    attachments = families(node)[family(names.HOTPLUG_ATTACHMENTS)]
    assert attachments == []  # the API is not served: the family, without samples
    request = {"target_pod_uid": TARGET, "container_name": "app", "slave_pod_uid": SLAVE}
    await service.attach(AttachRequest(**request))
    for _ in range(2):
        with pytest.raises(GRPCError):
            await service.detach(DetachRequest(**{**request, "container_name": "other"}))
    calls = families(node)[family(names.HOOK_CALLS)]
    assert value(calls, "vgpud_hook_calls_total", component="hotplug", call="Attach", outcome="ok") == 1
    assert value(calls, "vgpud_hook_calls_total", component="hotplug", call="Detach", outcome="rejected") == 2
    node.hotplug = HotPlug(service, short_tmp / "hotplug.sock")
    node.rebuild()
    attachments = families(node)[family(names.HOTPLUG_ATTACHMENTS)]
    by_state = {s.labels["state"]: s.value for s in attachments}
    assert by_state == {"attaching": 0, "attached": 1, "detaching": 0}


async def test_events_are_counted_by_result(short_tmp: Path) -> None:
    node = make_node(short_tmp)
    assert family(names.EVENTS) in families(node)  # declared even where no writer runs
    record = Recording(queue_size=1)
    pod = pod_ref("ml", "train", "uid-1")
    for message in ("a", "b"):  # the second finds the queue full
        record.recorder.record(pod, EventType.WARNING, Reason.VGPU_CONTAINER_REFUSED, message)
    async with recording(record):
        await record.events()
        record.recorder.record(pod, EventType.WARNING, Reason.VGPU_CONTAINER_REFUSED, "a")
        await record.events()
    node.metrics = node.make_metrics(events=record.recorder)
    samples = families(node)[family(names.EVENTS)]
    total = "vgpud_events_total"
    counted = {result: value(samples, total, result=result) for result in ("sent", "patched", "dropped")}
    assert counted == {"sent": 1, "patched": 1, "dropped": 1}
    assert value(samples, total, result="failed") == value(samples, total, result="rate_limited") == 0


async def test_the_nodes_calls_are_exported_at_zero_before_the_first(short_tmp: Path) -> None:
    """A series born at 1 is invisible to rate() and increase(): the calls of the components that run
    here start at 0, and the first call raises them to 1."""
    node = make_node(short_tmp)
    metrics = node.make_metrics(preset_components=("dra", "nri"))
    body, _ = metrics.exposition()
    found = {f.name: f.samples for f in text_string_to_metric_families(body.decode())}
    calls = found[family(names.HOOK_CALLS)]
    for call in names.NODE_CALLS["dra"] + names.NODE_CALLS["nri"]:
        component = "dra" if call in names.NODE_CALLS["dra"] else "nri"
        for outcome in names.PRESET_OUTCOMES:
            labels = {"component": component, "call": call, "outcome": outcome}
            assert value(calls, "vgpud_hook_calls_total", **labels) == 0
    assert not [s for s in calls if s.labels.get("component") == "registry"]  # not on this node
    durations = found[family(names.HOOK_DURATION)]
    assert value(durations, "vgpud_hook_duration_seconds_count", component="nri", call="CreateContainer") == 0
    node.recorder.record(HookCall(component="dra", call="Prepare", outcome=Outcome.OK, latency_seconds=0.01))
    body, _ = metrics.exposition()
    found = {f.name: f.samples for f in text_string_to_metric_families(body.decode())}
    prepared = value(
        found[family(names.HOOK_CALLS)],
        "vgpud_hook_calls_total",
        component="dra",
        call="Prepare",
        outcome="ok",
    )
    assert prepared == 1
