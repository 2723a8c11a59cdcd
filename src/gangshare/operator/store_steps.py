"""Which steps a reconcile may take from the operator's watch-fed stores alone (no job GET,
no pod LIST), and which send it to a fresh read from the API server.

A store that lags only ever shows more to do (a pod that ended has left the live-pod store;
one just created is not there yet), so a step is trusted when a lagging store cannot make
it wrong: a forward status step, written under the job's resourceVersion precondition, and
a first attempt's first workers, which only the leader creates (its creates are assumed into
the stores). Everything else (deletions, restarts, later attempts) is decided again from
the API server.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gangshare.operator.actions import Actions


@dataclass(frozen=True)
class CachedReads:
    """The operator's watch-fed stores (operator/informers.py), as a reconcile reads them:
    a job by namespace/name, and the live pods of a job."""

    job: Callable[[str], dict[str, Any] | None]
    pods: Callable[[str, str], list[dict[str, Any]]]


def creates_nothing(job: dict[str, Any], actions: Actions) -> bool:
    """Actions that create or delete no object (pods, the Service, the job); `job` only for
    the shape `Reconciler._from_stores` asks of what it trusts."""
    return not (
        actions.create_service
        or actions.create_pods
        or actions.delete_pods
        or actions.force_delete_pods
        or actions.delete_job
    )


def first_workers(job: dict[str, Any], pods: list[dict[str, Any]], actions: Actions) -> bool:
    """Actions that create the first workers of a job's first attempt, admitted, none of whose
    pods the stores hold: the step after the pass's own admission, taken from the stores
    (#39: a job GET and a pod LIST a job less). Only the leader creates workers and its
    creates are assumed into the stores, so the stores miss none of a first attempt's; a
    create that meets a pod anyway (an ended one leaves the live-pod store) sends the
    reconcile to a fresh read before anything else is decided."""
    status = job.get("status") or {}
    return (
        not pods
        and status.get("phase") == "Admitted"
        and not status.get("attempt")
        and bool(actions.create_pods)
        and not (actions.delete_pods or actions.force_delete_pods or actions.delete_job)
        and not actions.lift_gates
    )


def forward_status_step(job: dict[str, Any], actions: Actions) -> bool:
    """Actions that only write status (and events) taking a new job to Queued or an admitted
    gang to Running: what most watch events of a healthy job ask for."""
    if not creates_nothing(job, actions) or actions.lift_gates or actions.nudge_pods:
        return False
    before = (job.get("status") or {}).get("phase")
    after = actions.status.get("phase")
    return (before, after) in ((None, "Queued"), ("Admitted", "Running"))
