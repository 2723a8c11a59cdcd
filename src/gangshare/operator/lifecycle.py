"""What a TrainingJob needs next, decided from what is observed (pure `detect_*`).

The operator keeps no state in memory: everything needed is in the job's status
(phase, attempt, placement, restarts) and on its pods (rank and attempt labels).
`detect_actions` turns one observation into `Actions`; `reconcile.py` carries
them out. Running it twice on the same observation asks for the same things,
which is what makes a crash at any moment harmless.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gangshare.core.annotations import RANK_LABEL
from gangshare.core.failures import Failure, FailureClass, RetryPolicy, decide_retry
from gangshare.kube.snapshot import parse_time
from gangshare.kube.trainingjob import InvalidSpec, TrainingJobSpec, parse_trainingjob
from gangshare.operator.conditions import condition, iso, set_condition
from gangshare.operator.manifests import ATTEMPT_LABEL, GANG_GATE, headless_service, worker_pod
from gangshare.operator.pod_failures import detect_failure, is_deleting

TERMINAL = ("Succeeded", "Failed")


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str  # CamelCase
    message: str


@dataclass
class Actions:
    status: dict[str, Any] = field(default_factory=dict)
    create_service: dict[str, Any] | None = None
    create_pods: list[dict[str, Any]] = field(default_factory=list)
    lift_gates: list[str] = field(default_factory=list)
    delete_pods: list[str] = field(default_factory=list)
    delete_job: bool = False
    events: list[Event] = field(default_factory=list)
    # Seconds until the job needs another look (back-off, TTL); None when events will wake it.
    requeue_after: float | None = None

    @property
    def empty(self) -> bool:
        return not (
            self.status
            or self.create_service
            or self.create_pods
            or self.lift_gates
            or self.delete_pods
            or self.delete_job
            or self.events
        )


@dataclass(frozen=True)
class Observation:
    job: dict[str, Any]
    pods: list[dict[str, Any]]
    has_service: bool
    now: float


def detect_actions(
    seen: Observation,
    scheduler_name: str,
    user_error_retries: int = 0,
    backoff_base_seconds: float = 10.0,
) -> Actions:
    status = seen.job.get("status") or {}
    phase = status.get("phase")
    generation = int((seen.job.get("metadata") or {}).get("generation", 0))
    try:
        spec = parse_trainingjob(seen.job)
    except InvalidSpec as err:
        if phase == "Failed":
            return Actions()
        return _fail_invalid(status, str(err), seen.now, generation)
    if phase is None:
        return _enqueue(spec, status, seen.now, generation, first=True)
    attempt = int(status.get("attempt", 0))
    current, stale = _split_pods(seen.pods, attempt)
    actions = Actions(delete_pods=[_name(p) for p in stale if not is_deleting(p)])
    if phase in ("Admitted", "Running"):
        retry = RetryPolicy(
            max_retries=spec.max_retries,
            user_error_retries=user_error_retries,
            backoff_base_seconds=backoff_base_seconds,
        )
        _advance_gang(spec, status, current, seen, actions, generation, scheduler_name, retry)
    elif phase == "Restarting":
        _finish_restart(spec, status, stale, seen.now, generation, actions)
    elif phase in TERMINAL:
        _after_finish(spec, status, current, seen.now, actions)
    if (
        phase not in TERMINAL
        and status.get("observedGeneration") != generation
        and not actions.status
    ):
        actions.status["observedGeneration"] = generation
    return actions


# ----- phases ------------------------------------------------------------------------------------


def _enqueue(
    spec: TrainingJobSpec, status: dict[str, Any], now: float, gen: int, first: bool
) -> Actions:
    message = f"waiting for {spec.workers}x{spec.gpus_per_worker} GPUs in queue {spec.queue}"
    patch: dict[str, Any] = {
        "phase": "Queued",
        "queuedAt": iso(now),
        "message": message,
        "observedGeneration": gen,
        "conditions": set_condition(
            status.get("conditions"), "Admitted", False, "Queued", message, now, gen
        ),
    }
    if first:
        patch.update({"attempt": 0, "restarts": 0, "userFailures": 0})
        event = Event(
            "Normal", "Queued", f"{spec.service_class} job queued in {spec.queue}: {message}"
        )
    else:
        patch["nextRetryAt"] = None
        event = Event(
            "Normal", "Requeued", f"attempt {status.get('attempt', 0)} queued again: {message}"
        )
    return Actions(status=patch, events=[event])


def _advance_gang(
    spec: TrainingJobSpec,
    status: dict[str, Any],
    current: dict[int, dict[str, Any]],
    seen: Observation,
    actions: Actions,
    gen: int,
    scheduler_name: str,
    retry: RetryPolicy,
) -> None:
    created = _is_true(status, "GangScheduled")
    failure = detect_failure(spec.workers, current, created, seen.now)
    if failure is not None:
        _handle_failure(spec, status, current, failure, seen.now, gen, actions, retry)
        return
    placement = {int(w["rank"]): w for w in status.get("placement") or []}
    if not created:
        if not seen.has_service:
            actions.create_service = headless_service(spec)
        for rank in range(spec.workers):
            if rank not in current and rank in placement:
                worker = placement[rank]
                actions.create_pods.append(
                    worker_pod(
                        spec,
                        rank,
                        worker["node"],
                        list(worker["gpus"]),
                        int(status.get("attempt", 0)),
                        scheduler_name,
                    )
                )
        if len(current) == spec.workers:
            # The whole gang exists: release every gate in one step.
            actions.lift_gates = [_name(p) for p in current.values() if _gated(p)]
            message = f"all {spec.workers} workers created; scheduling gates lifted together"
            actions.status["conditions"] = set_condition(
                status.get("conditions"),
                "GangScheduled",
                True,
                "AllWorkersCreated",
                message,
                seen.now,
                gen,
            )
            actions.events.append(Event("Normal", "GangScheduled", message))
        return
    phases = [p.get("status", {}).get("phase") for p in current.values()]
    if len(current) == spec.workers and all(ph == "Succeeded" for ph in phases):
        message = f"all {spec.workers} workers succeeded"
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
        message = f"all {spec.workers} workers running"
        actions.status.update(
            {
                "phase": "Running",
                "startedAt": iso(seen.now),
                "message": message,
                "conditions": set_condition(
                    status.get("conditions"),
                    "Running",
                    True,
                    "AllWorkersRunning",
                    message,
                    seen.now,
                    gen,
                ),
            }
        )
        actions.events.append(Event("Normal", "Running", message))


def _handle_failure(
    spec: TrainingJobSpec,
    status: dict[str, Any],
    current: dict[int, dict[str, Any]],
    failure: Failure,
    now: float,
    gen: int,
    actions: Actions,
    retry: RetryPolicy,
) -> None:
    restarts = int(status.get("restarts", 0))
    user_failures = int(status.get("userFailures", 0)) + (
        failure.failure_class is FailureClass.USER
    )
    decision = decide_retry(failure, restarts, user_failures, retry)
    last = {
        "reason": failure.reason,
        "class": failure.failure_class.value,
        "message": failure.message,
        "time": iso(now),
    }
    actions.delete_pods += [_name(p) for p in current.values() if not is_deleting(p)]
    conditions = set_condition(
        status.get("conditions"), "Running", False, failure.reason, failure.message, now, gen
    )
    conditions = set_condition(
        conditions, "GangScheduled", False, failure.reason, failure.message, now, gen
    )
    if decision.retry:
        conditions = set_condition(
            conditions, "Admitted", False, "Restarting", decision.reason, now, gen
        )
        actions.status.update(
            {
                "phase": "Restarting",
                "attempt": int(status.get("attempt", 0)) + 1,
                "restarts": restarts + 1,
                "userFailures": user_failures,
                "nextRetryAt": iso(now + decision.delay_seconds),
                "placement": None,
                "startedAt": None,
                "lastFailure": last,
                "message": decision.reason,
                "conditions": conditions,
            }
        )
        actions.events.append(
            Event("Warning", "GangRestarting", f"{failure.reason}: {decision.reason}")
        )
        actions.requeue_after = decision.delay_seconds
        return
    conditions = set_condition(
        conditions, "Failed", True, failure.reason, decision.reason, now, gen
    )
    actions.status.update(
        {
            "phase": "Failed",
            "completedAt": iso(now),
            "userFailures": user_failures,
            "placement": None,
            "lastFailure": last,
            "message": decision.reason,
            "conditions": conditions,
        }
    )
    actions.events.append(Event("Warning", "Failed", f"{failure.reason}: {decision.reason}"))


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
        actions.requeue_after = due - now
        return
    queued = _enqueue(spec, status, now, gen, first=False)
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
            actions.requeue_after = done + ttl - now


def _fail_invalid(status: dict[str, Any], message: str, now: float, gen: int) -> Actions:
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


def _gated(pod: dict[str, Any]) -> bool:
    return any(
        g.get("name") == GANG_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or []
    )


def _is_true(status: dict[str, Any], kind: str) -> bool:
    found = condition(status.get("conditions"), kind)
    return bool(found and found.get("status") == "True")


def _split_pods(
    pods: list[dict[str, Any]], attempt: int
) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:
    current: dict[int, dict[str, Any]] = {}
    stale: list[dict[str, Any]] = []
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get(ATTEMPT_LABEL) == str(attempt) and str(labels.get(RANK_LABEL, "")).isdigit():
            current[int(labels[RANK_LABEL])] = pod
        else:
            stale.append(pod)
    return current, stale
