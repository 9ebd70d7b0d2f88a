"""One admission review decided: look up what the rules need, apply them, record the call.

Objects that are not ours are allowed without a look-up: other resources, a pod without resource
claims, claims without a vGPU request. When a look-up fails or takes too long the answer is a denial
with code 500 (fail-closed, as `failurePolicy: Fail` would be); an object the rules cannot read is denied
with code 400. A claim or template that does not exist (yet) constrains nothing at pod creation, and
the answer carries a warning: a pod may be created before its claim, and the reservation check
(resourceclaims/status) still holds the line when the claim is allocated.

The pods a review reads are those that can change its answer: for a pod, the other pods of the
namespace that name one of its vGPU claims or that these claims are reserved for; for a claim's
reservations, the pods it is reserved for. They come from the pod cache (vgpud.webhook.podcache)
while it is current, and from a list of the namespace before (the webhook just started) or while its
watch reconnects: the same pods the rules would use out of the list, in the same order, so the same
decision, at a cost that does not grow with the namespace.

The race in rules 4 and 5 (one pod per request, per vGPU claim): two pods created at the same moment
with the same request (or claim) of one named claim each see a namespace without the other, and both
are admitted. That is accepted here rather than serialized (a webhook has no lock across API server
replicas); the invariant holds anyway because the scheduler must reserve the claim for the second pod
through a resourceclaims/status update, which `check_claim_status` denies, so the second pod stays
Pending and never runs. The pod cache lags the API server by its watch's delay (milliseconds), which
widens that race by as much; the reservation check still holds the line, because a reserved pod the
cache has not seen yet, or has without the claim named (a template's claim: its name comes in the
pod's status), is read from the API server before the rules run.

What the API server returns is read as strictly as the review itself: a claim, template or namespace
pod whose fields do not have Kubernetes' types is denied with code 400 naming the object and the field
(and logged as a warning), never a 500 from deep inside the rules. The rules over a large pod or
namespace run in a worker thread (`cpu.CpuLane`), so they never hold up the other reviews; a decision
still running at the deadline is answered with code 500.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from typing import Any

import trio

from vgpud.kube.api import KubeError, NotFound
from vgpud.recorder import Outcome, Recorder
from vgpud.webhook import rules
from vgpud.webhook.claims import (
    ApiObjectError,
    Policy,
    RuleInputError,
    claim_vgpu_requests,
    is_vgpu_claim,
    pod_claims,
)
from vgpud.webhook.cpu import INLINE_CONTAINERS, CpuLane, DecisionTooSlow
from vgpud.webhook.lookup import Lookup
from vgpud.webhook.podselect import pod_claim_names, reservations
from vgpud.webhook.review import AdmissionRequest, Decision
from vgpud.webhook.violations import Violation, summary

log = logging.getLogger("vgpud.webhook")

RESOURCE_GROUP = "resource.k8s.io"
#: below the API server's 10 s webhook timeout, so a slow API answers with our reason, not a timeout
LOOKUP_TIMEOUT_S = 8.0

#: metric results
ALLOWED, DENIED, ERROR = "allowed", "denied", "error"


def result_of(decision: Decision) -> str:
    if decision.allowed:
        return ALLOWED
    return DENIED if decision.code == 403 else ERROR


class Admitter:
    def __init__(
        self,
        lookup: Lookup,
        policy: Policy,
        *,
        recorder: Recorder | None = None,
        lookup_timeout: float = LOOKUP_TIMEOUT_S,
        cpu: CpuLane | None = None,
    ) -> None:
        self._lookup = lookup
        self._policy = policy
        self.recorder = recorder if recorder is not None else Recorder()
        self._timeout = lookup_timeout
        self.cpu = cpu if cpu is not None else CpuLane()

    async def decide(self, request: AdmissionRequest) -> Decision:
        """The answer to a well-formed review; never raises for the review's content."""
        call = f"{request.resource_path} {request.operation}"
        with self.recorder.timed("webhook", call, **_identity(request)) as timed:
            try:
                decision, checked = await self._decide(request)
            except Exception as err:  # a bug here must still answer, and never end the server
                log.exception("review %s of %s failed", request.uid, call)
                decision, checked = (
                    Decision.deny(f"vgpud webhook failed: {type(err).__name__}: {err}", 500),
                    True,
                )
            if decision.allowed:
                timed.outcome = Outcome.OK if checked else Outcome.SKIPPED
            else:
                timed.outcome = Outcome.REJECTED if decision.code == 403 else Outcome.ERROR
            timed.detail = decision.message or "; ".join(decision.warnings)
        if not decision.allowed:
            log.info("denied %s %s/%s: %s", call, request.namespace, request.name, decision.message)
        return decision

    async def _decide(self, request: AdmissionRequest) -> tuple[Decision, bool]:
        """(decision, whether the object was ours and checked)."""
        group, resource = request.resource.group, request.resource.name
        what = f"{request.resource_path} {request.namespace}/{request.name}".rstrip("/")
        try:
            with trio.fail_after(self._timeout):
                if (group, resource, request.sub_resource, request.operation) == ("", "pods", "", "CREATE"):
                    return await self._pod(request)
                if group == RESOURCE_GROUP and resource == "resourceclaims":
                    if not request.sub_resource and request.operation in ("CREATE", "UPDATE"):
                        return self._claim(request)
                    if request.sub_resource == "status" and request.operation == "UPDATE":
                        return await self._claim_status(request)
        except ApiObjectError as err:
            log.warning(
                "review %s of %s: the API server returned an object that cannot be read: %s",
                request.uid,
                what,
                err,
            )
            return Decision.deny(
                f"vgpud webhook cannot read what the API server returned for {what}: {err}", code=400
            ), True
        except RuleInputError as err:
            return Decision.deny(f"vgpud webhook cannot read {what}: {err}", code=400), True
        except KubeError as err:
            return Decision.deny(f"vgpud webhook could not check {what}: {err}", code=500), True
        except DecisionTooSlow:
            message = f"vgpud webhook could not check {what}: deciding took longer than {self._timeout:g}s"
            return Decision.deny(message, code=500), True
        except trio.TooSlowError:
            message = (
                f"vgpud webhook could not check {what}: the API server did not answer in {self._timeout:g}s"
            )
            return Decision.deny(message, code=500), True
        return Decision.allow(), False

    async def _pod(self, request: AdmissionRequest) -> tuple[Decision, bool]:
        pod = request.object_with_identity()
        if not _has_claims(pod):
            return Decision.allow(), False
        size = _containers(pod)
        # RuleInputError for a pod without namespace, name or uid
        sources = await self.cpu.run(size > INLINE_CONTAINERS, pod_claims, pod)
        namespace = pod["metadata"]["namespace"]
        warnings: list[str] = []
        claims: dict[str, Mapping[str, Any]] = {}
        for name in dict.fromkeys(sources.named.values()):
            try:
                claims[name] = _api_object(
                    await self._lookup.get_resource_claim(namespace, name), "ResourceClaim", name
                )
            except NotFound:
                warnings.append(
                    f'ResourceClaim "{name}" does not exist yet: its vGPU requests are checked when it is '
                    "reserved for this pod"
                )
        templates: dict[str, Mapping[str, Any]] = {}
        for name in dict.fromkeys(sources.templates.values()):
            try:
                templates[name] = _api_object(
                    await self._lookup.get_resource_claim_template(namespace, name),
                    "ResourceClaimTemplate",
                    name,
                )
            except NotFound:
                warnings.append(f'ResourceClaimTemplate "{name}" does not exist: no claim can be generated')
        pods: list[Mapping[str, Any]] = []
        if rules.uses_named_vgpu_claim(claims, self._policy):
            # rules 4 and 5 read the other pods that name a vGPU claim of this pod (a pod that names
            # none of them uses none of their requests), and the claims' reserved ones
            vgpu = {name: claim for name, claim in claims.items() if claim_vgpu_requests(claim, self._policy)}
            reserved = {uid: n for claim in vgpu.values() for uid, n in reservations(claim).items()}
            pods = await self._pods(namespace, vgpu.keys(), reserved)
            size += sum(_containers(other) for other in pods)
        violations = await self.cpu.run(
            size > INLINE_CONTAINERS, rules.check_pod, pod, claims, templates, pods, self._policy
        )
        return _decision(violations, warnings), True

    def _claim(self, request: AdmissionRequest) -> tuple[Decision, bool]:
        claim = request.object_with_identity()
        if not is_vgpu_claim(claim, self._policy):
            return Decision.allow(), False
        return _decision(rules.check_claim(claim, self._policy), []), True

    async def _claim_status(self, request: AdmissionRequest) -> tuple[Decision, bool]:
        claim = request.object_with_identity()
        old = request.old_object
        if not is_vgpu_claim(claim, self._policy) and not (old and is_vgpu_claim(old, self._policy)):
            return Decision.allow(), False
        status = claim.get("status")
        if not isinstance(status, Mapping) or not status.get("reservedFor"):
            return Decision.allow(), True
        namespace = claim["metadata"].get("namespace")
        if not namespace:
            raise RuleInputError("the claim has no namespace")
        # the rules read the pods the claim is (and was) reserved for, and no other
        reserved = reservations(old) | reservations(claim)
        pods = await self._pods(namespace, (), reserved, fresh_for=claim["metadata"].get("name"))
        large = sum(_containers(pod) for pod in pods) > INLINE_CONTAINERS
        violations = await self.cpu.run(large, rules.check_claim_status, claim, old, pods, self._policy)
        return _decision(violations, []), True

    async def _pods(
        self,
        namespace: str,
        claim_names: Collection[str],
        reserved: Mapping[str, str],
        *,
        fresh_for: Any = None,
    ) -> list[Mapping[str, Any]]:
        """The pods of `namespace` a review needs: from the pod cache, those naming one of
        `claim_names` or reserved (`reserved`: uid -> name); while there is no current cache, every
        pod of the namespace. `fresh_for`, a claim's name: a reserved pod the cache does not have, or
        has without that claim named, is read from the API server (the cache may lag it)."""
        cached = self._lookup.cached_pods(namespace, claim_names, reserved.keys())
        if cached is None:
            return _api_list(await self._lookup.list_pods(namespace), namespace)
        if not isinstance(fresh_for, str) or not fresh_for:
            return cached
        by_uid = {_meta(pod, "uid"): pod for pod in cached}
        stale = {
            name
            for uid, name in reserved.items()
            if name and ((pod := by_uid.get(uid)) is None or fresh_for not in pod_claim_names(pod))
        }
        read: list[Mapping[str, Any]] = []
        for name in sorted(stale):
            read += _api_list(await self._lookup.list_pods_named(namespace, name), namespace)
        return [pod for pod in cached if _meta(pod, "name") not in stale] + read


def _meta(pod: Mapping[str, Any], key: str) -> str:
    """A metadata string of a pod; "" for one that is missing or not a string (the rules reject it)."""
    meta = pod.get("metadata")
    value = meta.get(key) if isinstance(meta, Mapping) else None
    return value if isinstance(value, str) else ""


def _api_object(value: Any, kind: str, name: str) -> Mapping[str, Any]:
    """An object the API server returned, as the rules need it: a JSON object."""
    if not isinstance(value, Mapping):
        raise ApiObjectError(f"{kind} {name}: expected an object, got {type(value).__name__}")
    return value


def _api_list(value: Any, namespace: str) -> list[Mapping[str, Any]]:
    """The pods of a namespace as the API server returned them: a list of JSON objects (each one's
    fields are checked where the rules parse it)."""
    if not isinstance(value, list):
        raise ApiObjectError(
            f"the pods of namespace {namespace}: expected a list, got {type(value).__name__}"
        )
    for index, item in enumerate(value):
        if not isinstance(item, Mapping):
            kind = type(item).__name__
            raise ApiObjectError(
                f"the pods of namespace {namespace}: item {index}: expected an object, got {kind}"
            )
    return value


def _containers(pod: Mapping[str, Any]) -> int:
    """How many containers a pod dict lists (init and app): the size of the rules' work on it."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return 0
    return sum(len(v) for k in ("initContainers", "containers") if isinstance(v := spec.get(k), list))


def _has_claims(pod: Mapping[str, Any]) -> bool:
    spec = pod.get("spec")
    return isinstance(spec, Mapping) and bool(spec.get("resourceClaims"))


def _decision(violations: list[Violation], warnings: list[str]) -> Decision:
    if violations:
        return Decision.deny(summary(violations), warnings=tuple(warnings))
    return Decision.allow(warnings=tuple(warnings))


def _identity(request: AdmissionRequest) -> dict[str, str]:
    """What the recorder shows about the object: the pod, or the claim's namespace and uid."""
    meta = (request.object or request.old_object or {}).get("metadata")
    meta = meta if isinstance(meta, Mapping) else {}
    uid = meta.get("uid") if isinstance(meta.get("uid"), str) else ""
    name = meta.get("name") if isinstance(meta.get("name"), str) else ""
    identity = {"pod_namespace": request.namespace}
    if request.resource.name == "pods":
        identity.update(pod_name=name or request.name, pod_uid=uid)
    elif request.resource.name == "resourceclaims":
        identity["claim_uid"] = uid
    return identity
