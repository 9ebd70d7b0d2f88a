"""What one NodePrepareResources call does with each claim, decided from facts read once (no I/O).

The shell gathers (`vgpud.dra.gather`: the claims, their reserved pods, the other claims the rules
need) before the node lock and loads the checkpoint under it; `decide` then answers per claim, in
request order, with one `Decision`:

- `Replay`: prepared already (PrepareCompleted): the recorded devices, nothing else (no rule runs, so
  nothing a lookup could not check fails it);
- `Refuse`: a failure before any side effect: a use this node cannot serve (`PrepareRefusal`,
  `vgpud.partition.nrionly.use_refusal`), a device that is no GPU of this node or is prepared for
  another claim already, adminAccess, or a claim the index had prepared and the checkpoint no longer
  has (its use was never checked);
- `Start`: record PrepareStarted (rolling back an interrupted Prepare first), then write `plan`: the
  partitions (the assigner's result), the CDI spec, the devices and the PrepareCompleted entry. A
  plan that could not be computed (the eager assigner refuses a claim reserved for several pods) is
  `failure`: it fails after PrepareStarted, which the shell rolls back at once, as before.

Pure: nothing here reads a file, the clock or the network, or awaits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vgpud.dra.checkpoint import Checkpoint, ClaimEntry, PreparedDevice, PrepareState
from vgpud.dra.claimedits import NodeFacts, PrepareError, build_claim_spec, gpu_for
from vgpud.partition.assigner import Mode, PartitionAssigner, PrepareResult
from vgpud.partition.model import ClaimView, PodView
from vgpud.partition.nrionly import PrepareRefusal, use_refusal

if TYPE_CHECKING:
    from vgpud.dra.claimindex import ClaimRef


@dataclass(frozen=True)
class ClaimFacts:
    """What the shell read for one claim before the node lock: all that `decide` needs of the API."""

    ref: ClaimRef
    claim: ClaimView
    #: the pods it is reserved for that still exist (eager: always read; NRI: only with neighbours)
    pods: tuple[PodView, ...] = ()
    #: the other claims the use rule judges it with, by name (eager: every one its containers use;
    #: NRI: the neighbours they use)
    others: Mapping[str, ClaimView] = field(default_factory=dict, hash=False)
    #: NRI: the other vGPU claims of its namespace on one of its GPUs, by name
    neighbours: frozenset[str] = frozenset()
    #: the claim index had it prepared: a replay, so nothing else was read
    replay: bool = False


@dataclass(frozen=True)
class Replay:
    """Prepared already: answer with the recorded devices."""

    ref: ClaimRef
    devices: tuple[PreparedDevice, ...]


@dataclass(frozen=True)
class Refuse:
    """Failed before any side effect (a refusal is counted by its reason)."""

    ref: ClaimRef
    error: PrepareError | PrepareRefusal


@dataclass(frozen=True)
class Plan:
    """One claim's side effects: its directories (`result`), its CDI spec and what is recorded once
    they are written."""

    claim: ClaimView
    result: PrepareResult
    spec: dict = field(hash=False)
    devices: tuple[PreparedDevice, ...]
    completed: ClaimEntry


@dataclass(frozen=True)
class Start:
    """Prepare it: `started` recorded first (after rolling back what an interrupted Prepare left, when
    `rollback_first`), then `plan` written; with `failure` instead of a plan, it fails after
    PrepareStarted."""

    ref: ClaimRef
    started: ClaimEntry
    rollback_first: bool
    plan: Plan | None = None
    failure: Exception | None = None


Decision = Replay | Refuse | Start

#: (device, pool, share id) -> the checkpoint's claims that have it prepared, in checkpoint order
PreparedIndex = dict[tuple[str, str, str | None], list[tuple[str, ClaimEntry]]]


def decide(
    batch: Sequence[ClaimFacts],
    checkpoint: Checkpoint,
    node: NodeFacts,
    assigner: PartitionAssigner,
    gpu_names: Mapping[str, str],
) -> list[Decision]:
    """One decision per claim of `batch`, in its order, against the `checkpoint` loaded under the
    node lock. `gpu_names` describes a device name in a refusal's message."""
    prepared = prepared_index(checkpoint)  # the batch's own PrepareStarted entries prepare no devices
    #: the claims this batch starts, as the checkpoint will have them (a UID the kubelet repeats)
    started: dict[str, ClaimEntry] = {}
    decisions: list[Decision] = []
    for facts in batch:
        ref, claim = facts.ref, facts.claim
        entry = started.get(ref.uid) or checkpoint.claims.get(ref.uid)
        if entry is not None and entry.state is PrepareState.COMPLETED:
            decisions.append(Replay(ref, entry.prepared_devices))
            continue
        try:
            refused = _use_refusal(facts, assigner.mode, node.driver, gpu_names)
            if refused is not None:
                raise refused
            check_devices(node, claim, prepared)
        except (PrepareError, PrepareRefusal) as err:
            decisions.append(Refuse(ref, err))
            continue
        start = ClaimEntry(
            state=PrepareState.STARTED,
            name=claim.name,
            namespace=claim.namespace,
            vgpu=bool(claim.devices),
            mode=assigner.mode.value,
        )
        started[ref.uid] = start
        try:
            plan = _plan(facts, node, assigner)
        except Exception as err:  # whatever it is, it is this claim's error
            decisions.append(Start(ref, start, entry is not None, failure=err))
            continue
        decisions.append(Start(ref, start, entry is not None, plan))
    return decisions


def _use_refusal(
    facts: ClaimFacts, mode: Mode, driver: str, gpu_names: Mapping[str, str]
) -> PrepareRefusal | PrepareError | None:
    """Why the claim's use is refused, or None. A claim gathered as a replay was not looked up: the
    checkpoint no longer has it, so it cannot be prepared unchecked (the kubelet retries)."""
    ref = facts.ref
    if facts.replay:
        return PrepareError(
            f"claim {ref.namespace}/{ref.name} was unprepared while this Prepare ran, "
            "before its use was checked: try again"
        )
    return use_refusal(
        facts.claim,
        facts.pods,
        facts.others,
        mode=mode,
        neighbours=facts.neighbours,
        driver=driver,
        gpu_names=gpu_names,
    )


def _plan(facts: ClaimFacts, node: NodeFacts, assigner: PartitionAssigner) -> Plan:
    """The claim's partitions, CDI spec and PrepareCompleted entry; raises what fails it."""
    claim = facts.claim
    result = assigner.prepare(claim, facts.pods)
    spec, devices = build_claim_spec(node, claim, result)
    completed = ClaimEntry(
        state=PrepareState.COMPLETED,
        name=claim.name,
        namespace=claim.namespace,
        prepared_devices=devices,
        partition=result.record.to_dict(),
        vgpu=bool(devices),
        status={
            "reservedFor": [{"resource": "pods", "name": r.name, "uid": r.uid} for r in claim.reserved_for]
        },
        mode=assigner.mode.value,
    )
    return Plan(claim, result, spec, devices, completed)


def prepared_index(checkpoint: Checkpoint) -> PreparedIndex:
    """Built once per call, so checking a batch is not claims x prepared claims."""
    index: PreparedIndex = {}
    for uid, other in checkpoint.claims.items():
        for prepared in other.prepared_devices:
            index.setdefault((prepared.device, prepared.pool, prepared.share_id), []).append((uid, other))
    return index


def check_devices(node: NodeFacts, claim: ClaimView, prepared: PreparedIndex) -> None:
    """Every result is a GPU of this node and not already prepared for another claim (PrepareError)."""
    for device in claim.devices:
        if device.admin_access:
            raise PrepareError(
                f"claim {claim.namespace}/{claim.name}: adminAccess is not supported "
                f"for vGPU device {device.device}"
            )
        gpu_for(node, device)
        for uid, other in prepared.get((device.device, device.pool, device.share_id), ()):
            if uid != claim.uid:
                raise PrepareError(
                    f"device {device.device} (share {device.share_id or '-'}) is already prepared "
                    f"for claim {other.namespace}/{other.name} ({uid})"
                )
