"""How a gang gives its GPUs back: restart after a failure, or release before it ever started.

- A failure (pure classification in gangshare.core.failures) restarts the whole
  gang with back-off, or fails the job: user errors fast, infrastructure errors
  up to maxRetries.
- A release is not the job's failure: its plan broke before every worker was
  bound (a node gone or unusable, a GPU taken: `displaced`), or its workers were
  not all bound within the start deadline. The job goes straight back to Queued
  with its place in the queue kept (queuedAt unchanged), its GPUs free at once,
  and no retry counted; repeated start timeouts back off.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gangshare.core.annotations import POD_EVICTED
from gangshare.core.failures import Failure, FailureClass, RetryPolicy, decide_retry
from gangshare.operator.actions import Actions, Event, Observation
from gangshare.operator.conditions import iso, set_condition
from gangshare.operator.pod_failures import is_deleting
from gangshare.operator.worker_pods import pod_name

BACKOFF_CAP_SECONDS = 600.0


@dataclass(frozen=True)
class Release:
    reason: str  # CamelCase: GangDisplaced, GangStartTimeout
    message: str
    delay_seconds: float = 0.0
    timed_out: bool = False


def release_gang(
    status: dict[str, Any],
    current: dict[int, dict[str, Any]],
    release: Release,
    now: float,
    gen: int,
    actions: Actions,
) -> None:
    actions.delete_pods += [pod_name(p) for p in current.values() if not is_deleting(p)]
    conditions = set_condition(
        status.get("conditions"), "Admitted", False, release.reason, release.message, now, gen
    )
    conditions = set_condition(
        conditions, "GangScheduled", False, release.reason, release.message, now, gen
    )
    actions.status.update(
        {
            "phase": "Queued",
            "attempt": int(status.get("attempt", 0)) + 1,
            "placement": None,
            "serviceClass": None,
            "borrowed": None,
            "admittedAt": None,
            "startedAt": None,
            "nextRetryAt": iso(now + release.delay_seconds) if release.delay_seconds else None,
            "startFailures": int(status.get("startFailures", 0)) + int(release.timed_out),
            "message": release.message,
            "conditions": conditions,
        }
    )
    actions.events.append(Event("Warning", release.reason, release.message))


def start_timeout_delay(status: Mapping[str, Any], base_seconds: float) -> float:
    """Back-off after the n-th start timeout in a row (a constraint no plan can see repeats)."""
    failures = int(status.get("startFailures", 0))
    return float(min(BACKOFF_CAP_SECONDS, base_seconds * 2**failures))


def handle_failure(
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
    actions.delete_pods += [pod_name(p) for p in current.values() if not is_deleting(p)]
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


def detect_eviction(current: dict[int, dict[str, Any]]) -> tuple[Release, int | None] | None:
    """A worker the node's coordinator evicted: why, and the steps its SDK had reported.

    Not the job's failure: an opportunistic job gave memory back to a guaranteed one. The
    gang is requeued at once, keeping its place and its retries (AntMan: nothing is lost).
    """
    for rank in sorted(current):
        pod = current[rank]
        raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(POD_EVICTED)
        if raw is None:
            continue
        try:
            record = json.loads(raw)
        except json.JSONDecodeError:
            record = {}
        if not isinstance(record, dict):
            record = {}
        steps = record.get("steps")
        why = str(record.get("message") or "evicted by the node's coordinator")
        release = Release(
            "OpportunisticEvicted",
            f"worker {rank}: {why}; the gang is requeued, keeping its place and its retries",
        )
        return release, steps if isinstance(steps, int) and steps >= 0 else None
    return None


def requeue_evicted(
    status: dict[str, Any],
    current: dict[int, dict[str, Any]],
    now: float,
    gen: int,
    actions: Actions,
) -> bool:
    """Requeue the gang if the coordinator evicted a worker; its progress goes in the status."""
    evicted = detect_eviction(current)
    if evicted is None:
        return False
    release, steps = evicted
    _requeue_counted(status, current, release, now, gen, actions, "evictions")
    had = (status.get("progress") or {}).get("steps")
    if steps is not None and (not isinstance(had, int) or steps > had):
        actions.status["progress"] = {"steps": steps, "time": iso(now)}
    return True


def requeue_preempted(
    status: dict[str, Any],
    current: dict[int, dict[str, Any]],
    seen: Observation,
    gen: int,
    actions: Actions,
) -> bool:
    """Evict a reclaimed borrower whole and requeue it: its place, retries and restarts kept."""
    displaced = seen.displaced_now(status)
    if displaced is None or not displaced.preempted:
        return False
    release = Release(
        "Preempted",
        f"{displaced.reason}; the whole gang is evicted and requeued, keeping its place in "
        "the queue and its retries",
    )
    _requeue_counted(status, current, release, seen.now, gen, actions, "preemptions")
    return True


def requeue_off_island(
    status: dict[str, Any],
    current: dict[int, dict[str, Any]],
    seen: Observation,
    gen: int,
    actions: Actions,
    backoff_base_seconds: float,
) -> bool:
    """Release a gang whose Required NVLink islands the node did not keep, running or not:
    it would run degraded otherwise. Not the job's failure: no retry spent, its place kept,
    and a back-off in case the node does it again."""
    displaced = seen.displaced_now(status)
    if displaced is None or not displaced.off_island:
        return False
    delay = start_timeout_delay(status, backoff_base_seconds)
    release = Release(
        "GangTopologyBroken",
        f"{displaced.reason}; the gang is released and requeued in {delay:.0f}s, keeping its "
        "place in the queue and its retries",
        delay,
        timed_out=True,
    )
    _release_running(status, current, release, seen.now, gen, actions)
    return True


def _requeue_counted(
    status: dict[str, Any],
    current: dict[int, dict[str, Any]],
    release: Release,
    now: float,
    gen: int,
    actions: Actions,
    counter: str,
) -> None:
    """Release a running gang that lost its GPUs through no fault of its own, and count it."""
    _release_running(status, current, release, now, gen, actions)
    actions.status[counter] = int(status.get(counter, 0)) + 1


def _release_running(
    status: dict[str, Any],
    current: dict[int, dict[str, Any]],
    release: Release,
    now: float,
    gen: int,
    actions: Actions,
) -> None:
    """Release a gang that may be running: it is not Running any more either."""
    release_gang(status, current, release, now, gen, actions)
    actions.status["conditions"] = set_condition(
        actions.status["conditions"], "Running", False, release.reason, release.message, now, gen
    )
