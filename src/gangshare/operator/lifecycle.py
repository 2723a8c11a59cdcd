"""What a TrainingJob needs next, decided from what is observed (pure `detect_*`).

The operator keeps no state in memory: everything needed is in the job's status
(phase, attempt, placement, restarts) and on its pods (rank and attempt labels).
`detect_actions` turns one observation into `Actions`; `reconcile.py` carries
them out. Running it twice on the same observation asks for the same things,
which is what makes a crash at any moment harmless.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gangshare.core.failures import DEFAULT_IMAGE_PULL_GRACE_SECONDS, RetryPolicy
from gangshare.kube.snapshot import parse_time
from gangshare.kube.trainingjob import InvalidSpec, TrainingJobSpec, parse_trainingjob
from gangshare.operator.actions import Actions, Event, Observation
from gangshare.operator.conditions import iso, set_condition
from gangshare.operator.first_queue import (
    first_queue_status,
    grace_left,
    place_in_line,
    queued_status,
)
from gangshare.operator.gang_commit import (
    as_admitted,
    commit_lift,
    lone_worker_committed,
    start_running,
)
from gangshare.operator.manifests import headless_service, worker_pod
from gangshare.operator.pod_failures import detect_failure, is_deleting, pull_grace_left
from gangshare.operator.requeue import (
    handle_failure,
    release_gang,
    requeue_evicted,
    requeue_off_island,
    requeue_preempted,
)
from gangshare.operator.starting import gang_nudges, gated, release_before_start
from gangshare.operator.worker_pods import (
    TERMINAL,
    all_bound,
    is_terminal,
    is_true,
    pod_name,
    split_pods,
    until_stuck,
    wait_for_name,
    wake,
)

__all__ = ["Actions", "Event", "Limits", "Observation", "detect_actions"]


@dataclass(frozen=True)
class Limits:
    """Bounds that keep a job from holding GPUs forever."""

    # An admitted gang whose workers are not all bound by then is released and requeued.
    start_timeout_seconds: float = 120.0
    # A pod still present this long past its deletion deadline is force-deleted: its node is
    # gone or dead, and no kubelet will ever confirm the deletion.
    stuck_pod_seconds: float = 60.0
    # The kubelet's own image-pull retries get this long before the gang restarts elsewhere.
    image_pull_grace_seconds: float = DEFAULT_IMAGE_PULL_GRACE_SECONDS
    # A gang partly bound while kube-scheduler refuses a worker for a reason of its own is
    # released this long after its first worker was bound (operator/starting.py).
    unschedulable_seconds: float = 5.0
    # A new job's first status is left this long to the scheduling pass, which writes it
    # with its decision (operator/first_queue.py); 0: the reconciler writes it at once.
    first_queue_grace_seconds: float = 0.0


def detect_actions(
    seen: Observation,
    scheduler_name: str,
    user_error_retries: int = 0,
    backoff_base_seconds: float = 10.0,
    limits: Limits = Limits(),
) -> Actions:
    status = seen.job.get("status") or {}
    phase = status.get("phase")
    generation = int((seen.job.get("metadata") or {}).get("generation", 0))
    try:
        spec = parse_trainingjob(seen.job)
    except InvalidSpec as err:
        if phase == "Failed":
            return Actions()
        return fail_invalid(status, str(err), seen.now, generation)
    if phase is None:
        grace = grace_left(seen.job, seen.now, limits.first_queue_grace_seconds)
        if grace > 0:  # the scheduling pass writes it with its decision (first_queue.py)
            return Actions(requeue_after=grace)
        queued_at = place_in_line(seen.job, seen.now)
        return enqueue(spec, status, seen.now, generation, first=True, queued_at=queued_at)
    attempt = int(status.get("attempt", 0))
    current, stale = split_pods(seen.pods, attempt, spec.uid)
    actions = Actions(delete_pods=[pod_name(p) for p in stale if not is_deleting(p)])
    for pod in [*current.values(), *stale]:
        left = until_stuck(pod, seen.now, limits.stuck_pod_seconds)
        if left is not None and left <= 0:
            actions.force_delete_pods.append(pod_name(pod))
        elif left is not None:
            wake(actions, left)
    if phase in ("Admitted", "Running"):
        retry = RetryPolicy(
            max_retries=spec.max_retries,
            user_error_retries=user_error_retries,
            backoff_base_seconds=backoff_base_seconds,
        )
        gang = _Gang(spec, status, current, seen, generation, limits, retry, tuple(stale))
        _advance_gang(gang, actions, scheduler_name)
    elif phase == "Restarting":
        _finish_restart(spec, status, stale, seen.now, generation, actions)
    elif phase == "Queued" and spec.moved_since_queued(status):
        back_of_the_line(spec, status, seen.now, generation, actions)
    elif phase in TERMINAL:
        _after_finish(spec, status, current, seen.now, actions)
    if (
        phase not in TERMINAL
        and status.get("observedGeneration") != generation
        and not actions.status
    ):
        actions.status["observedGeneration"] = generation
    return actions


def job_needs_reconcile(job: Mapping[str, Any]) -> bool:
    """Whether the TrainingJob itself, its pods aside, can give the reconciler work (asked
    on its own watch events and by the backstop resync). A Queued job whose status is current
    has none: its pods (of an earlier attempt) send their own events, and each pending-reason
    write would otherwise cost a reconcile (three reads) per job. A batch/v1 Job's
    TrainingJob always has: its reasons are mirrored onto the Job."""
    meta = job.get("metadata") or {}
    status = job.get("status") or {}
    return (
        status.get("phase") != "Queued"
        or bool((job.get("spec") or {}).get("jobRef"))
        or bool(meta.get("deletionTimestamp"))
        or status.get("observedGeneration") != meta.get("generation")
    )


# ----- phases ------------------------------------------------------------------------------------


def enqueue(
    spec: TrainingJobSpec,
    status: dict[str, Any],
    now: float,
    gen: int,
    first: bool,
    queued_at: float | None = None,
) -> Actions:
    """Queue the job: its first time at `queued_at` (its creation; operator/first_queue.py),
    again after a release at `now`."""
    # A job's first queueing posts no event: its phase, its Admitted condition and
    # status.message say it, and an event a job is an API request (#39: events only where a
    # person needs the why). Queued again, it is told why.
    at = now if queued_at is None else queued_at
    if first:
        return Actions(status=first_queue_status(spec, status, at, now, gen))
    patch = {**queued_status(spec, status, at, now, gen), "nextRetryAt": None}
    event = Event(
        "Normal", "Requeued", f"attempt {status.get('attempt', 0)} queued again: {patch['message']}"
    )
    return Actions(status=patch, events=[event])


def back_of_the_line(
    spec: TrainingJobSpec, status: dict[str, Any], now: float, gen: int, actions: Actions
) -> None:
    """A place in line is held in one queue at one priority: a job moved while it waits (the
    CRD allows that only while Queued) is queued again from the back of its new line."""
    was = status.get("queuedAs") or {}
    actions.status.update(
        {"queuedAt": iso(now), "queuedAs": spec.queued_as, "observedGeneration": gen}
    )
    actions.events.append(
        Event(
            "Normal",
            "Moved",
            f"moved from queue {was.get('queue')} (priority {was.get('priority')}) to queue "
            f"{spec.queue} (priority {spec.priority}): queued again from the back",
        )
    )


@dataclass(frozen=True)
class _Gang:
    spec: TrainingJobSpec
    status: dict[str, Any]
    current: dict[int, dict[str, Any]]
    seen: Observation
    gen: int
    limits: Limits
    retry: RetryPolicy
    # The job's pods of earlier attempts, still there (going away: detect_actions deletes them).
    stale: tuple[dict[str, Any], ...] = ()


def _advance_gang(gang: _Gang, actions: Actions, scheduler_name: str) -> None:
    spec, status, current, seen, gen = gang.spec, gang.status, gang.current, gang.seen, gang.gen
    created = is_true(status, "GangScheduled")
    lone = (
        None if created else lone_worker_committed(status, current, spec.pod_count, seen.now, gen)
    )
    if lone is not None:
        status, created = lone, True
    if requeue_evicted(status, current, seen.now, gen, actions):
        return
    if requeue_preempted(status, current, seen, gen, actions):
        return
    if requeue_off_island(status, current, seen, gen, actions, gang.retry.backoff_base_seconds):
        return
    failure = detect_failure(
        spec.pod_count,
        current,
        created,
        seen.now,
        gang.limits.image_pull_grace_seconds,
        seen.neighbours,
    )
    if failure is not None:
        handle_failure(status, current, failure, seen.now, gen, actions, gang.retry)
        return
    pulling = pull_grace_left(current, seen.now, gang.limits.image_pull_grace_seconds)
    if pulling is not None:
        wake(actions, pulling)
    if status.get("phase") == "Admitted" and not all_bound(current, spec.pod_count):
        release, later = release_before_start(
            status,
            current,
            spec.pod_count,
            seen,
            gang.limits.start_timeout_seconds,
            gang.limits.unschedulable_seconds,
            gang.retry.backoff_base_seconds,
        )
        if release is not None:
            release_gang(status, current, release, seen.now, gen, actions)
            return
        if later is not None:
            wake(actions, later)
        if created:
            actions.nudge_pods = gang_nudges(current, spec.pod_count)
    placement = {int(w["rank"]): w for w in status.get("placement") or []}
    if not created:
        if not seen.has_service and spec.pod_count > 1:
            # Only a gang's workers look each other up; a lone worker is its own master, and its
            # Service (with the Endpoints and EndpointSlice it makes) was three of the API
            # server's twenty requests per one-GPU job (bench/scale.py).
            actions.create_service = headless_service(spec)
        taken = {pod_name(p): p for p in gang.stale}
        for rank in range(spec.pod_count):
            if rank not in current and rank in placement:
                worker = placement[rank]
                pod = worker_pod(
                    as_admitted(spec, seen.job),
                    rank,
                    worker["node"],
                    list(worker["gpus"]),
                    int(status.get("attempt", 0)),
                    scheduler_name,
                    resume_step=(status.get("progress") or {}).get("steps"),
                )
                holder = taken.get(pod_name(pod))
                if holder is None:
                    actions.create_pods.append(pod)
                else:
                    wait_for_name(holder, seen.now, actions)
        if len(current) == spec.pod_count:
            # The whole gang exists: commit to starting it (the status, written first, is what
            # the gang barrier passes on), then release every gate in one step.
            actions.lift_gates = [pod_name(p) for p in current.values() if gated(p)]
            message = f"all {spec.pod_count} pods created; scheduling gates lifted together"
            commit_lift(status, message, seen.now, gen, actions)
        return
    # Committed but interrupted (the operator stopped between two lifts): finish the lift.
    actions.lift_gates = [pod_name(p) for p in current.values() if gated(p)]
    phases = [p.get("status", {}).get("phase") for p in current.values()]
    if len(current) == spec.pod_count and all(ph == "Succeeded" for ph in phases):
        message = f"all {spec.pod_count} pods succeeded"
        conditions = set_condition(
            status.get("conditions"), "Completed", True, "Succeeded", message, seen.now, gen
        )
        conditions = set_condition(
            conditions, "Running", False, "Completed", message, seen.now, gen
        )
        actions.status.update(
            {
                "phase": "Succeeded",
                "completedAt": iso(seen.now),
                "message": message,
                "conditions": conditions,
            }
        )
        actions.events.append(Event("Normal", "Completed", message))
    elif status.get("phase") == "Admitted" and all(ph in ("Running", "Succeeded") for ph in phases):
        start_running(status, f"all {spec.pod_count} pods running", seen.now, gen, actions)


def _finish_restart(
    spec: TrainingJobSpec,
    status: dict[str, Any],
    stale: list[dict[str, Any]],
    now: float,
    gen: int,
    actions: Actions,
) -> None:
    if stale:
        return  # old workers are still going away; their deletion events wake us
    due = parse_time(status.get("nextRetryAt")) or now
    if now < due:
        wake(actions, due - now)
        return
    queued = enqueue(spec, status, now, gen, first=False)
    actions.status.update(queued.status)
    actions.events += queued.events


def _after_finish(
    spec: TrainingJobSpec,
    status: dict[str, Any],
    current: dict[int, dict[str, Any]],
    now: float,
    actions: Actions,
) -> None:
    if status.get("phase") == "Failed":
        # A failed gang gives its GPUs back at once.
        actions.delete_pods += [
            pod_name(p) for p in current.values() if not is_deleting(p) and not is_terminal(p)
        ]
    ttl = spec.ttl_seconds_after_finished
    done = parse_time(status.get("completedAt"))
    if ttl is not None and done is not None:
        if now >= done + ttl:
            actions.delete_job = True
        else:
            wake(actions, done + ttl - now)


def fail_invalid(status: dict[str, Any], message: str, now: float, gen: int) -> Actions:
    conditions = set_condition(
        status.get("conditions"), "Failed", True, "InvalidSpec", message, now, gen
    )
    return Actions(
        status={
            "phase": "Failed",
            "completedAt": iso(now),
            "message": message,
            "observedGeneration": gen,
            "lastFailure": {
                "reason": "InvalidSpec",
                "class": "User",
                "message": message,
                "time": iso(now),
            },
            "conditions": conditions,
        },
        events=[Event("Warning", "InvalidSpec", message)],
    )
