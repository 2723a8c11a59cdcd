"""What a TrainingJob needs next, decided from what is observed (pure `detect_*`).

The operator keeps no state in memory: everything needed is in the job's status
(phase, attempt, placement, restarts) and on its pods (rank and attempt labels).
`detect_actions` turns one observation into `Actions`; `reconcile.py` carries
them out. Running it twice on the same observation asks for the same things,
which is what makes a crash at any moment harmless.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gangshare.core.annotations import ATTEMPT_LABEL, RANK_LABEL
from gangshare.core.failures import DEFAULT_IMAGE_PULL_GRACE_SECONDS, RetryPolicy
from gangshare.kube.claims import admitted_class
from gangshare.kube.snapshot import parse_time
from gangshare.kube.trainingjob import InvalidSpec, TrainingJobSpec, parse_trainingjob
from gangshare.operator.actions import Actions, Event, Observation
from gangshare.operator.conditions import condition, iso, set_condition
from gangshare.operator.first_queue import (
    first_queue_status,
    grace_left,
    place_in_line,
    queued_status,
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
from gangshare.operator.starting import Pods, gang_nudges, gated, release_before_start

TERMINAL = ("Succeeded", "Failed")
# Worker names are the same in every attempt. A pod of an earlier attempt whose phase is final
# has left the operator's pod watch (informers.LIVE_PODS): when its kubelet completes its
# deletion, no event says so. While such a pod holds the name of a worker to create, the job
# looks again this often; less often the longer the pod outlives its deletion deadline (a
# dead node's pods wait for the force-delete).
NAME_POLL_SECONDS = 0.5
NAME_POLL_MAX_SECONDS = 5.0
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
    current, stale = _split_pods(seen.pods, attempt, spec.uid)
    actions = Actions(delete_pods=[_name(p) for p in stale if not is_deleting(p)])
    for pod in [*current.values(), *stale]:
        left = _until_stuck(pod, seen.now, limits)
        if left is not None and left <= 0:
            actions.force_delete_pods.append(_name(pod))
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
    created = _is_true(status, "GangScheduled")
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
    if status.get("phase") == "Admitted" and not _all_bound(current, spec.pod_count):
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
        taken = {_name(p): p for p in gang.stale}
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
                holder = taken.get(_name(pod))
                if holder is None:
                    actions.create_pods.append(pod)
                else:
                    _wait_for_name(holder, seen.now, actions)
        if len(current) == spec.pod_count:
            # The whole gang exists: commit to starting it (the status, written first, is what
            # the gang barrier passes on), then release every gate in one step.
            actions.lift_gates = [_name(p) for p in current.values() if gated(p)]
            message = f"all {spec.pod_count} pods created; scheduling gates lifted together"
            commit_lift(status, message, seen.now, gen, actions)
        return
    # Committed but interrupted (the operator stopped between two lifts): finish the lift.
    actions.lift_gates = [_name(p) for p in current.values() if gated(p)]
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


def commit_lift(
    status: dict[str, Any], message: str, now: float, gen: int, actions: Actions
) -> None:
    """The whole gang exists: GangScheduled commits the lift of every gate (the extender's
    barrier passes on it, and whichever reconcile comes next lifts any gate left)."""
    actions.status["conditions"] = _gang_scheduled(status, message, now, gen)
    actions.events.append(Event("Normal", "GangScheduled", message))


def _gang_scheduled(
    status: dict[str, Any], message: str, now: float, gen: int
) -> list[dict[str, Any]]:
    """The status's conditions with GangScheduled True: every worker exists."""
    return set_condition(
        status.get("conditions"), "GangScheduled", True, "AllWorkersCreated", message, now, gen
    )


def lone_worker_committed(
    status: dict[str, Any], current: Pods, workers: int, now: float, gen: int
) -> dict[str, Any] | None:
    """The status with GangScheduled set, for a one-worker gang whose worker exists ungated
    (manifests.worker_pod makes it so); None for any other gang. Such a gang has nothing to
    commit (no sibling, no gate, and the extender's barrier passes it alone), so the condition
    rides on the next status write its worker causes (Running, done, failed) instead of
    costing one of its own: a TrainingJob status write was the API server's dearest request in
    bench/scale.py (30% of its CPU at four a job)."""
    if workers != 1 or len(current) != 1 or any(gated(p) for p in current.values()):
        return None
    return {**status, "conditions": _gang_scheduled(status, "its one worker created", now, gen)}


def start_running(
    status: dict[str, Any], message: str, now: float, gen: int, actions: Actions
) -> None:
    """An admitted gang all of whose workers run (or already finished) is Running: its
    condition and status.startedAt say when, with no event (the decision was the admission,
    told by the Admitted event)."""
    actions.status.update(
        {
            "phase": "Running",
            "startedAt": iso(now),
            "startFailures": 0,
            "message": message,
            "conditions": set_condition(
                status.get("conditions"), "Running", True, "AllWorkersRunning", message, now, gen
            ),
        }
    )


def as_admitted(spec: TrainingJobSpec, job: dict[str, Any]) -> TrainingJobSpec:
    """The spec with the class admission decided: its workers ask for that class's GPUs."""
    decided = admitted_class(job)
    return spec if decided is spec.service_class else replace(spec, service_class=decided)


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
            _name(p) for p in current.values() if not is_deleting(p) and not _terminal(p)
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


# ----- helpers ----------------------------------------------------------------------------------


def _name(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["name"])


def _terminal(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL


def _is_true(status: dict[str, Any], kind: str) -> bool:
    found = condition(status.get("conditions"), kind)
    return bool(found and found.get("status") == "True")


def _all_bound(current: dict[int, dict[str, Any]], workers: int) -> bool:
    return len(current) == workers and all(
        (p.get("spec") or {}).get("nodeName") for p in current.values()
    )


def _until_stuck(pod: dict[str, Any], now: float, limits: Limits) -> float | None:
    """Seconds until a deleting pod counts as stuck (<= 0: it is); None if not deleting."""
    deadline = parse_time((pod.get("metadata") or {}).get("deletionTimestamp"))
    return None if deadline is None else deadline + limits.stuck_pod_seconds - now


def _wait_for_name(holder: dict[str, Any], now: float, actions: Actions) -> None:
    """A worker whose name a pod of an earlier attempt still holds is created once that pod is
    gone (a create now is refused: the name is taken). A live holder's own watch events (its
    final phase, its deletion) wake the job; one whose phase is final sends none, so the job
    looks again shortly."""
    if not _terminal(holder):
        return
    deadline = parse_time((holder.get("metadata") or {}).get("deletionTimestamp"))
    overdue = 0.0 if deadline is None else max(0.0, now - deadline)
    wake(actions, min(NAME_POLL_MAX_SECONDS, max(NAME_POLL_SECONDS, overdue / 4)))


def wake(actions: Actions, seconds: float) -> None:
    """Ask for another look in `seconds` (the earliest of all such asks wins)."""
    if actions.requeue_after is None or seconds < actions.requeue_after:
        actions.requeue_after = max(0.0, seconds)


def _owned_by(pod: dict[str, Any], uid: str) -> bool:
    return any(
        ref.get("controller") and ref.get("uid") == uid
        for ref in (pod.get("metadata") or {}).get("ownerReferences") or []
    )


def _split_pods(
    pods: list[dict[str, Any]], attempt: int, uid: str
) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:
    """This attempt's workers by rank, and the job's older pods; pods the job does not control
    (whatever their labels say) are neither: the operator never acts on them."""
    current: dict[int, dict[str, Any]] = {}
    stale: list[dict[str, Any]] = []
    for pod in pods:
        if not _owned_by(pod, uid):
            continue
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get(ATTEMPT_LABEL) == str(attempt) and str(labels.get(RANK_LABEL, "")).isdigit():
            current[int(labels[RANK_LABEL])] = pod
        else:
            stale.append(pod)
    return current, stale
