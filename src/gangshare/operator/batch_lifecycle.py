"""What the TrainingJob of a queued Job or JobSet needs next (pure `detect_*`, as lifecycle.py).

The TrainingJob holds the object's place in its queue and, once admitted, its plan; the
object's controllers make and retry the pods. So this lifecycle never creates or deletes a pod:
it suspends and resumes the object, and turns each gated pod of the admitted attempt into its
rank's worker. A pod its controller replaces comes back gated and is given the same rank's
place; the object's own Complete (Completed) or Failed condition ends the TrainingJob. What
differs between a Job and a JobSet is in their kube/ adapters (`WorkloadKind`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gangshare.core.annotations import RANK_LABEL
from gangshare.core.job import ServiceClass
from gangshare.kube.claims import admitted_class
from gangshare.kube.queued import STATUS_ANNOTATION, WorkloadKind, is_queued
from gangshare.kube.queued_kinds import kind_of
from gangshare.kube.queued_shape import shape_change
from gangshare.kube.queued_writes import resumed_attempt, ungate_patch
from gangshare.kube.snapshot import parse_time
from gangshare.kube.trainingjob import InvalidSpec, TrainingJobSpec, parse_trainingjob
from gangshare.operator.actions import Actions, Displacement, Event, Observation
from gangshare.operator.batch_pods import (
    by_rank,
    created,
    current_pods,
    labels,
    of_attempt,
)
from gangshare.operator.batch_pods import phase as pod_phase
from gangshare.operator.conditions import iso, set_condition
from gangshare.operator.forecasts import written_forecast_note
from gangshare.operator.gang_commit import commit_lift, start_running
from gangshare.operator.lifecycle import Limits, back_of_the_line, enqueue, fail_invalid
from gangshare.operator.requeue import (
    Release,
    release_gang,
    requeue_off_island,
    requeue_preempted,
    start_timeout_delay,
)
from gangshare.operator.starting import gated, release_broken
from gangshare.operator.worker_pods import TERMINAL, is_true

HOLDING = ("Admitted", "Running")
FROZEN = (
    "spec.suspend: the Job ran before gangshare admitted it, and a Job that has run keeps its "
    "pod template, so its pods cannot be gated as a gang: delete it and create it with "
    "suspend: true"
)


@dataclass
class BatchActions:
    status: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)  # about the TrainingJob
    job_events: list[Event] = field(default_factory=list)  # about the Job
    job_patch: dict[str, Any] | None = None  # suspend, or resume for the admitted attempt
    # Prepares the child it runs through before its first resume (a TrainJob's JobSet).
    child_patch: dict[str, Any] | None = None
    ungate: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (pod, patch)
    note: str | None = None  # the Job's gangshare.io/status annotation, when it must change
    requeue_after: float | None = None
    # The Job left its queue (its label removed): its TrainingJob goes, and what it held.
    delete_workload: bool = False

    @property
    def empty(self) -> bool:
        return not (
            self.status
            or self.events
            or self.job_events
            or self.job_patch
            or self.child_patch
            or self.ungate
            or self.note is not None
            or self.delete_workload
        )

    def take(self, actions: Actions) -> None:
        """What a shared step (enqueue, release, requeue) decided about the TrainingJob."""
        self.status.update(actions.status)
        self.events += actions.events
        if actions.requeue_after is not None:
            _wake(self, actions.requeue_after)


@dataclass(frozen=True)
class BatchObservation:
    workload: dict[str, Any]  # the TrainingJob
    job: dict[str, Any] | None  # the batch/v1 Job it queues (None: gone)
    pods: list[dict[str, Any]]  # pods labelled as the workload's, any attempt
    now: float
    displaced: Displacement | None = None


def detect_batch_actions(
    seen: BatchObservation, limits: Limits | None = None, backoff_base_seconds: float = 10.0
) -> BatchActions:
    limits = limits or Limits()
    workload, job = seen.workload, seen.job
    actions = BatchActions()
    kind = kind_of(workload)
    if kind is not None and kind.virtual and job is None:
        actions.delete_workload = True  # a pod group none of whose pods is left
        return actions
    if job is None or kind is None:
        return actions  # the garbage collector removes the TrainingJob with its Job
    status = workload.get("status") or {}
    phase = status.get("phase")
    if not is_queued(job):
        if phase not in TERMINAL:
            _leave_queue(kind, actions)
        return actions
    gen = int((workload.get("metadata") or {}).get("generation", 0))
    try:
        spec = parse_trainingjob(workload)
    except InvalidSpec as err:
        if phase != "Failed":
            actions.take(fail_invalid(status, str(err), seen.now, gen))
    else:
        finished = kind.finished(job)
        changed = None if phase in TERMINAL else shape_change(kind, job, workload)
        if phase in TERMINAL:
            pass
        elif finished is not None:
            _finish(status, finished, seen.now, gen, actions)
        elif changed is not None:
            actions.take(fail_invalid(status, changed, seen.now, gen))
        elif phase is None:
            actions.take(enqueue(spec, status, seen.now, gen, first=True))
        elif phase == "Queued" and spec.moved_since_queued(status):
            moved = Actions()
            back_of_the_line(spec, status, seen.now, gen, moved)
            actions.take(moved)
        elif phase in HOLDING:
            _advance(kind, spec, seen, status, gen, limits, backoff_base_seconds, actions)
    after = actions.status.get("phase", phase)
    unsuspended = not kind.suspended(job) and actions.job_patch is None
    if after not in HOLDING and unsuspended and kind.finished(job) is None:
        # Not admitted (or admitted no more): the Job must not run outside its queue.
        actions.job_patch = kind.suspend_patch()
        why = actions.status.get("message") or status.get("message") or "waiting for admission"
        actions.job_events.append(Event("Normal", "Suspended", f"suspended by gangshare: {why}"))
    message = actions.status.get("message", status.get("message"))
    if message and after == "Queued" and status.get("forecast"):
        message = f"{message}; {written_forecast_note(status['forecast'])}"
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    if message and annotations.get(STATUS_ANNOTATION) != f"{after}: {message}":
        actions.note = f"{after}: {message}"
    return actions


def _leave_queue(kind: WorkloadKind, actions: BatchActions) -> None:
    """A queued object whose queue label was removed is gangshare's no more: its TrainingJob
    is deleted at once, so nothing it was promised or holds stays held for it. The object is
    left as it is (the admission policy lets the label go only while it is suspended)."""
    actions.delete_workload = True
    actions.job_events.append(
        Event(
            "Normal",
            "LeftQueue",
            f"the {kind.kind} left its gangshare queue (its gangshare.io/queue label was "
            "removed): its TrainingJob is deleted, releasing its place and any GPUs it held",
        )
    )


def _finish(
    status: dict[str, Any], finished: tuple[str, str], now: float, gen: int, actions: BatchActions
) -> None:
    phase, message = finished
    conditions = set_condition(
        status.get("conditions"),
        "Completed" if phase == "Succeeded" else "Failed",
        True,
        "JobCompleted" if phase == "Succeeded" else "JobFailed",
        message,
        now,
        gen,
    )
    conditions = set_condition(conditions, "Running", False, phase, message, now, gen)
    actions.status.update(
        {"phase": phase, "completedAt": iso(now), "message": message, "conditions": conditions}
    )
    actions.events.append(Event("Normal" if phase == "Succeeded" else "Warning", phase, message))


def _advance(
    kind: WorkloadKind,
    spec: TrainingJobSpec,
    seen: BatchObservation,
    status: dict[str, Any],
    gen: int,
    limits: Limits,
    backoff_base_seconds: float,
    actions: BatchActions,
) -> None:
    job = seen.job or {}
    attempt = int(status.get("attempt", 0))
    if _released(kind, spec, seen, status, gen, limits, backoff_base_seconds, actions):
        return
    decided = admitted_class(seen.workload)
    name = str(seen.workload["metadata"]["name"])
    if kind.suspended(job) or resumed_attempt(job) != attempt:
        if not kind.suspended(job):
            # Running for another attempt (or resumed by hand): suspended first, resumed after.
            actions.job_patch = kind.suspend_patch()
        elif not kind.prepared(job, name) and kind.frozen(job):
            actions.take(fail_invalid(status, FROZEN, seen.now, gen))
        elif kind.may_resume(job, seen.pods):
            child = kind.child_patch(job, name) if kind.child_patch is not None else None
            if child is not None:
                actions.child_patch = child  # resumed on the child's next event
                return
            actions.job_patch = kind.resume_patch(job, name, attempt)
            actions.job_events.append(
                Event("Normal", "Resumed", status.get("message") or "admitted by gangshare")
            )
        # else: its controller is still suspending it; the Job's status event wakes us.
        return
    live = current_pods(kind, seen.pods, job, attempt)
    placement = {
        int(w["rank"]): (str(w["node"]), [int(g) for g in w.get("gpus") or []])
        for w in status.get("placement") or []
    }
    committed = is_true(status, "GangScheduled")
    if not committed and len(live) < spec.pod_count:
        return  # the Job controller is still making the gang's pods
    memory = spec.gpu_memory_mib if decided is ServiceClass.OPPORTUNISTIC else None
    ranked = [(p, kind.pod_rank(p, job)) for p in live]
    actions.ungate = _ungates(ranked, placement, spec.pod_count, attempt, decided, memory)
    if not committed:
        message = (
            f"all {spec.pod_count} pods of the {kind.kind} exist; scheduling gates lifted together"
        )
        commit = Actions()
        commit_lift(status, message, seen.now, gen, commit)
        actions.take(commit)
        return
    started = [
        p
        for p in live
        if (p.get("spec") or {}).get("nodeName")
        and (p.get("status") or {}).get("phase") in ("Running", "Succeeded")
    ]
    done = [p for p in of_attempt(kind, seen.pods, job, attempt) if pod_phase(p) == "Succeeded"]
    if status.get("phase") == "Admitted" and len(started) + len(done) >= spec.pod_count:
        running = Actions()
        message = f"all {spec.pod_count} pods of the {kind.kind} running"
        start_running(status, message, seen.now, gen, running)
        actions.take(running)


def _released(
    kind: WorkloadKind,
    spec: TrainingJobSpec,
    seen: BatchObservation,
    status: dict[str, Any],
    gen: int,
    limits: Limits,
    backoff_base_seconds: float,
    actions: BatchActions,
) -> bool:
    """Reclaimed, off its islands, broken (its plan, or a pod kube-scheduler refuses beside
    bound ones: before it starts, or when its controller replaces a pod later) or not started
    in time: the TrainingJob goes back to Queued (place and retries kept), the Job is
    suspended. The broken-gang rules are the ones TrainingJobs have (`release_broken`)."""
    observed = Observation(seen.workload, [], True, seen.now, seen.displaced)
    shared = Actions()
    released = requeue_preempted(status, {}, observed, gen, shared) or requeue_off_island(
        status, {}, observed, gen, shared, backoff_base_seconds
    )
    if not released:
        job = seen.job or {}
        current = by_rank(kind, seen.pods, job, int(status.get("attempt", 0)))
        running = status.get("phase") == "Running"
        release, later = release_broken(
            status,
            current,
            spec.pod_count,
            observed,
            limits.unschedulable_seconds,
            backoff_base_seconds,
            running=running,
        )
        if release is None and not running:
            release, deadline = _start_deadline(status, seen.now, limits, backoff_base_seconds)
            later = deadline if later is None or deadline is None else min(later, deadline)
        if later is not None:
            _wake(actions, later)
        if release is not None:
            release_gang(status, {}, release, seen.now, gen, shared)
            released = True
    if not released:
        return False
    actions.take(shared)
    job = seen.job or {}
    if not kind.suspended(job):
        actions.job_patch = kind.suspend_patch()
    message = str(shared.status.get("message", ""))
    actions.job_events.append(Event("Warning", "Suspended", f"suspended by gangshare: {message}"))
    return True


def _start_deadline(
    status: dict[str, Any], now: float, limits: Limits, backoff_base_seconds: float
) -> tuple[Release | None, float | None]:
    admitted = parse_time(status.get("admittedAt")) or now
    left = admitted + limits.start_timeout_seconds - now
    if left > 0:
        return None, left
    delay = start_timeout_delay(status, backoff_base_seconds)
    why = (
        f"the Job's pods were not all running within "
        f"{limits.start_timeout_seconds:.0f}s of admission; requeued in {delay:.0f}s"
    )
    return Release("GangStartTimeout", why, delay, timed_out=True), None


def _ungates(
    live: list[tuple[dict[str, Any], int | None]],
    placement: dict[int, tuple[str, list[int]]],
    workers: int,
    attempt: int,
    service_class: ServiceClass,
    memory_mib: int | None,
) -> list[tuple[str, dict[str, Any]]]:
    """Each gated pod of the attempt (with the rank its controllers' labels give it, if any)
    made its rank's worker; a pod without one takes the lowest rank no live pod holds, so a
    replacement takes its predecessor's place."""
    held = {
        int(str(labels(p).get(RANK_LABEL)))
        for p, _ in live
        if not gated(p) and str(labels(p).get(RANK_LABEL, "")).isdigit()
    }
    free = [r for r in range(workers) if r not in held and r in placement]
    out = []
    for pod, rank in sorted(((p, r) for p, r in live if gated(p)), key=lambda pr: created(pr[0])):
        if rank is None or rank in held or rank not in placement:
            rank = next((r for r in free if r not in held), None)
        if rank is None:
            continue  # more pods than the gang has places: the surplus waits gated
        held.add(rank)
        patch = ungate_patch(pod, rank, attempt, placement[rank], service_class, memory_mib)
        out.append((str(pod["metadata"]["name"]), patch))
    return out


# ----- helpers ----------------------------------------------------------------------------------


def _wake(actions: BatchActions, seconds: float) -> None:
    if actions.requeue_after is None or seconds < actions.requeue_after:
        actions.requeue_after = max(0.0, seconds)
