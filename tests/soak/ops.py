"""The soak's operations on a LocalNode: each a small named function of the soak's state and its
step; it returns what it did ("skipped: ..." when there was nothing to act on) and raises when the node
misbehaves. The pods are busybox sleepers on vGPU claims, in shapes the admission webhook's rules admit
(vgpud/webhook/rules.py; each pod is checked against them): one container; two containers, one request
of the claim each; two pods on one claim, one request each. The last needs the webhook's relaxation
`vgpu-claim-across-pods` (on in the soak's policy) and a claim that selects NRI nodes (`nriMode`): on
the eager track the scheduler finds no device for it, so there the step waits for the scheduler to say
so, then deletes the pods and the claim."""

from __future__ import annotations

import signal
import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from tests.e2e import workload as w
from tests.e2e.node import DEVICE_CLASS, DRIVER, SERVING, LocalNode
from tests.soak.plan import Step
from vgpud.observe.client import Endpoint, get_json
from vgpud.relaxations import Relaxation
from vgpud.supervisor import Backoff, HealthAfter
from vgpud.webhook.claims import Policy
from vgpud.webhook.rules import check_pod

#: live soak pods at most (a create beyond it is skipped): well inside two mock A100s at 1 GiB, 5 %
MAX_PODS = 10
MEMORY, CORES = "1Gi", "5"
#: a fault is over when vgpud is SERVING (and, NRI track, its NRI session connected) within its
#: restart backoff's cap, plus the time to start and register
RECOVER_S = Backoff().cap + 15
#: vgpud's health grace (vgpud/supervisor.py): the NRI outage outlasts it
GRACE_S = HealthAfter().grace
OUTAGE_S = GRACE_S + 10
POD_TIMEOUT_S = 120.0


class SoakError(AssertionError):
    """The node broke a promise during a step."""


@dataclass
class Pod:
    name: str
    claim: str
    #: the containers and the claim request each uses
    containers: dict[str, str]
    #: how often the soak made each container exit
    exits: dict[str, int] = field(default_factory=dict)


@dataclass
class Soak:
    node: LocalNode
    namespace: str
    pods: dict[str, Pod] = field(default_factory=dict)
    #: claim name -> the pods that use it
    claims: dict[str, set[str]] = field(default_factory=dict)
    #: seconds from each fault to SERVING (and NRI connected)
    recoveries: list[tuple[str, float]] = field(default_factory=list)
    #: vgpud processes started (a restart adds one)
    vgpud_starts: int = 1


# --------------------------------------------------------------------------------------------------
# Pods


def _policy() -> Policy:
    """The webhook's rules with the relaxation the split shape needs (its claim selects NRI nodes)."""
    return Policy(
        driver=DRIVER,
        vgpu_classes=frozenset({DEVICE_CLASS}),
        relaxations=frozenset({Relaxation.CLAIM_ACROSS_PODS}),
    )


def start_pods(soak: Soak, step: Step) -> list[str]:
    """Create the claim and the pod(s) of `step.shape`, not waiting for them; the pod names."""
    node, ns = soak.node, soak.namespace
    claim = f"c{step.index}"
    if step.shape == "single":
        requests, layout = ["gpu"], {f"p{step.index}": {"main": "gpu"}}
    elif step.shape == "pair":
        requests, layout = ["a", "b"], {f"p{step.index}": {"ca": "a", "cb": "b"}}
    else:
        requests, layout = ["a", "b"], {f"p{step.index}a": {"main": "a"}, f"p{step.index}b": {"main": "b"}}
    bodies = [w.vgpu_request(r, MEMORY, CORES) for r in requests]
    if step.shape == "split":
        bodies = [w.nri_only(body) for body in bodies]
    claim_obj = w.create_claim(node, ns, claim, bodies)
    soak.claims[claim] = set()
    for name, containers in layout.items():
        specs = [w.container(c, [("gpu", r)]) for c, r in containers.items()]
        pod = w.create_pod(node, ns, name, specs, {"gpu": claim})
        others = [
            p for p in node.get(f"/api/v1/namespaces/{ns}/pods")["items"] if p["metadata"]["name"] != name
        ]
        violations = check_pod(pod, {claim: claim_obj}, {}, others, _policy())
        if violations:
            raise SoakError(f"the soak made a pod the webhook refuses: {[str(v) for v in violations]}")
        soak.pods[name] = Pod(name, claim, containers)
        soak.claims[claim].add(name)
    return list(layout)


def kept_off(soak: Soak, shape: str) -> bool:
    """The node cannot run pods of this shape (two pods on one claim, which selects NRI nodes: eager
    track)."""
    return shape == "split" and not soak.node.nri


def wait_pods(soak: Soak, names: list[str], shape: str) -> str:
    """Until the pods run, or, for a shape the node cannot run, until the scheduler said so (the pods
    and claim then deleted); what happened."""
    node, ns = soak.node, soak.namespace
    if not kept_off(soak, shape):
        for name in names:
            w.wait_running(node, ns, name, timeout=POD_TIMEOUT_S)
        return "running"

    def said() -> bool:
        return any(e["reason"] == "FailedScheduling" for n in names for e in w.pod_events(node, ns, n))

    w.wait_for(said, timeout=POD_TIMEOUT_S, interval=0.5, what=f"FailedScheduling of {', '.join(names)}")
    for name in names:
        remove_pod(soak, name)
    return "unschedulable (a claim of two pods selects NRI nodes), deleted"


def create_pod(soak: Soak, step: Step) -> str:
    if len(soak.pods) >= MAX_PODS:
        return f"skipped: {len(soak.pods)} pods (the soak's cap)"
    names = start_pods(soak, step)
    return f"{step.shape}: {', '.join(names)} {wait_pods(soak, names, step.shape)}"


def _pick(items: list[Any], pick: float) -> Any:
    return sorted(items)[int(pick * len(items))]


def remove_pod(soak: Soak, name: str) -> None:
    """Delete the pod, and its claim once no soak pod uses it (both gone from the API on return)."""
    pod = soak.pods.pop(name)
    w.delete_pod(soak.node, soak.namespace, name, timeout=POD_TIMEOUT_S)
    users = soak.claims[pod.claim]
    users.discard(name)
    if not users:
        del soak.claims[pod.claim]
        w.release_claim(soak.node, soak.namespace, pod.claim, timeout=POD_TIMEOUT_S)


def delete_pod(soak: Soak, step: Step) -> str:
    if not soak.pods:
        return "skipped: no pod"
    name = _pick(list(soak.pods), step.pick)
    remove_pod(soak, name)
    return f"deleted {name}"


def container_exit(soak: Soak, step: Step) -> str:
    """A container's process is killed; the kubelet starts it again (restartPolicy Always). One of the
    containers that exited least so far: the kubelet's crash-loop back-off (10 s, doubling) would make
    a second exit of the same container wait."""
    node, ns = soak.node, soak.namespace
    choices = {(p, c): pod.exits.get(c, 0) for p, pod in soak.pods.items() for c in pod.containers}
    if not choices:
        return "skipped: no container"
    least = min(choices.values())
    pod_name, container = _pick([key for key, n in choices.items() if n == least], step.pick)
    soak.pods[pod_name].exits[container] = least + 1
    pod = w.get_pod(node, ns, pod_name)
    status = next(s for s in pod["status"].get("containerStatuses", []) if s["name"] == container)
    if "running" not in status.get("state", {}):
        raise SoakError(f"{pod_name}/{container} is not running: {status.get('state')}")
    restarts, cid = status["restartCount"], w.container_id(pod, container)
    node.ctr("tasks", "kill", "-s", "SIGKILL", cid)

    def restarted() -> bool:
        now = w.get_pod(node, ns, pod_name)
        s = next(s for s in now["status"].get("containerStatuses", []) if s["name"] == container)
        return s["restartCount"] > restarts and "running" in s.get("state", {}) and bool(s.get("ready"))

    w.wait_for(restarted, timeout=POD_TIMEOUT_S, interval=0.3, what=f"{pod_name}/{container} restarted")
    return f"{pod_name}/{container} exited and restarted"


# --------------------------------------------------------------------------------------------------
# Faults


def _nri_connected(node: LocalNode) -> bool:
    try:
        state = get_json(Endpoint(unix_path=node.debug_socket), "/debug/state?calls=0")
    except (OSError, RuntimeError, ValueError):
        return False
    return bool(state["nri"] and state["nri"]["session"]["connected"])


def _serving(node: LocalNode) -> bool:
    try:
        return node.vgpud_health() == SERVING
    except grpc.RpcError:
        return False


def recovered(soak: Soak, fault: str, since: float) -> None:
    """vgpud SERVING (and its NRI session connected) within RECOVER_S of `since`."""
    node = soak.node
    w.wait_for(
        lambda: _serving(node) and (not node.nri or _nri_connected(node)),
        timeout=max(1.0, since + RECOVER_S - time.monotonic()),
        interval=0.1,
        what=f"vgpud SERVING{' with NRI connected' if node.nri else ''} within {RECOVER_S:g} s of {fault}",
    )
    soak.recoveries.append((fault, time.monotonic() - since))


def restart_vgpud(soak: Soak, sig: signal.Signals) -> None:
    started = time.monotonic()
    soak.node.restart_vgpud(sig, timeout_s=RECOVER_S)
    soak.vgpud_starts += 1
    recovered(soak, f"vgpud {sig.name}", started)


def kill_vgpud(soak: Soak, step: Step) -> str:
    restart_vgpud(soak, signal.SIGKILL)
    return "vgpud SIGKILLed and back"


def term_vgpud(soak: Soak, step: Step) -> str:
    restart_vgpud(soak, signal.SIGTERM)
    return "vgpud SIGTERMed and back"


def _mid_create(soak: Soak, step: Step, sig: signal.Signals) -> str:
    if len(soak.pods) >= MAX_PODS:
        restart_vgpud(soak, sig)
        return f"{len(soak.pods)} pods (the soak's cap): vgpud {sig.name}ed alone"
    names = start_pods(soak, step)
    time.sleep(step.delay)  # the seeded point of the kill: mid-Prepare .. mid-CreateContainer
    restart_vgpud(soak, sig)
    done = wait_pods(soak, names, step.shape)
    return f"{step.shape}: vgpud {sig.name}ed {step.delay:.2f} s into creating {', '.join(names)}; {done}"


def kill_vgpud_mid_create(soak: Soak, step: Step) -> str:
    return _mid_create(soak, step, signal.SIGKILL)


def term_vgpud_mid_create(soak: Soak, step: Step) -> str:
    return _mid_create(soak, step, signal.SIGTERM)


def restart_containerd(soak: Soak, step: Step) -> str:
    node = soak.node
    node.stop_containerd()
    started = time.monotonic()
    node.start_containerd()
    recovered(soak, "containerd restart", started)
    return "containerd restarted"


def restart_kubelet(soak: Soak, step: Step) -> str:
    sig = signal.SIGKILL if step.hard else signal.SIGTERM
    started = time.monotonic()
    soak.node.restart_kubelet(sig)
    recovered(soak, f"kubelet {sig.name}", started)
    return f"kubelet {sig.name}ed and back"


def nri_outage(soak: Soak, step: Step) -> str:
    """containerd (and so the NRI socket) gone longer than vgpud's health grace, then back: vgpud says
    NOT_SERVING once the grace is over, and SERVING again within its backoff once the socket is back."""
    node = soak.node
    if not node.nri:
        return "skipped: no NRI on this track"
    node.stop_containerd()
    gone = time.monotonic()
    w.wait_for(
        lambda: not _serving(node), timeout=OUTAGE_S, interval=1.0, what=f"NOT_SERVING after {GRACE_S:g} s"
    )
    flipped = time.monotonic() - gone
    if flipped < GRACE_S - 5:
        raise SoakError(f"vgpud went NOT_SERVING {flipped:.0f} s after the NRI socket went, within its grace")
    node.start_containerd()
    started = time.monotonic()
    recovered(soak, "NRI socket back", started)
    return f"NRI gone {started - gone:.0f} s: NOT_SERVING after {flipped:.0f} s, SERVING again"


OPS: dict[str, Callable[[Soak, Step], str]] = {
    "create_pod": create_pod,
    "delete_pod": delete_pod,
    "container_exit": container_exit,
    "kill_vgpud": kill_vgpud,
    "term_vgpud": term_vgpud,
    "kill_vgpud_mid_create": kill_vgpud_mid_create,
    "term_vgpud_mid_create": term_vgpud_mid_create,
    "restart_containerd": restart_containerd,
    "restart_kubelet": restart_kubelet,
    "nri_outage": nri_outage,
}


def drain(soak: Soak) -> None:
    """Every soak pod and claim deleted (gone from the API)."""
    for name in sorted(soak.pods):
        remove_pod(soak, name)
    leftover = list(soak.claims)
    for claim in leftover:
        del soak.claims[claim]
        try:
            w.release_claim(soak.node, soak.namespace, claim, timeout=POD_TIMEOUT_S)
        except urllib.error.HTTPError as err:
            if err.code != 404:
                raise
