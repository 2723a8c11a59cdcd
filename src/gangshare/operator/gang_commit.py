"""The status steps that commit a gang and start it running (pure), shared by the
TrainingJob lifecycle and the batch/v1 Job one."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gangshare.kube.claims import admitted_class
from gangshare.kube.trainingjob import TrainingJobSpec
from gangshare.operator.actions import Actions, Event
from gangshare.operator.conditions import iso, set_condition
from gangshare.operator.starting import Pods, gated


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
