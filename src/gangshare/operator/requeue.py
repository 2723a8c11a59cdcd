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

from dataclasses import dataclass
from typing import Any

from gangshare.core.failures import Failure, FailureClass, RetryPolicy, decide_retry
from gangshare.operator.actions import Actions, Event
from gangshare.operator.conditions import iso, set_condition
from gangshare.operator.pod_failures import is_deleting

BACKOFF_CAP_SECONDS = 600.0


@dataclass(frozen=True)
class Release:
    reason: str  # CamelCase: GangDisplaced, GangStartTimeout
    message: str
    delay_seconds: float = 0.0
    timed_out: bool = False


def _name(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["name"])


def release_gang(
    status: dict[str, Any],
    current: dict[int, dict[str, Any]],
    release: Release,
    now: float,
    gen: int,
    actions: Actions,
) -> None:
    actions.delete_pods += [_name(p) for p in current.values() if not is_deleting(p)]
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
            "admittedAt": None,
            "startedAt": None,
            "nextRetryAt": iso(now + release.delay_seconds) if release.delay_seconds else None,
            "startFailures": int(status.get("startFailures", 0)) + int(release.timed_out),
            "message": release.message,
            "conditions": conditions,
        }
    )
    actions.events.append(Event("Warning", release.reason, release.message))


def start_timeout_delay(status: dict[str, Any], base_seconds: float) -> float:
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
