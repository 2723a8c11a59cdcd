"""A new TrainingJob's first place in line, and who writes it.

A job's first queueing used to be its own status write, made by the reconciler on the job's
create event, followed by the pass's admission write: two writes where one says it all
(#39: one status write when a job is Queued and Admitted in the same pass). Now the pass
owns a new job's first status: it considers jobs with no phase yet as waiting since their
creation, and writes their first status with its decision, the admission or the reason the
job waits. The reconciler writes it only for a job no pass has written within
FIRST_QUEUE_GRACE_SECONDS (a pass that did not run, a budget that ran out); every such write
is conditional on the job's resourceVersion, so the two never both land.

Both stamp the place in line at the job's creation, so the place a pass judged a new job by
is the one its status records, whoever writes it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gangshare.kube.snapshot import parse_time
from gangshare.kube.trainingjob import TrainingJobSpec
from gangshare.operator.conditions import iso, set_condition

# How long the reconciler leaves a new job's first status to the scheduling pass. Passes
# come every second or sooner; a busy one (thousands of admissions) takes a few seconds.
FIRST_QUEUE_GRACE_SECONDS = 30.0


def is_new(job: Mapping[str, Any]) -> bool:
    """A job no one has queued yet (a TrainingJob holding a batch/v1 Job's place is queued
    by its own lifecycle, which suspends the Job first)."""
    status = job.get("status") or {}
    return status.get("phase") is None and not (job.get("spec") or {}).get("jobRef")


def created_at(job: Mapping[str, Any]) -> float | None:
    return parse_time((job.get("metadata") or {}).get("creationTimestamp"))


def queued_message(spec: TrainingJobSpec) -> str:
    groups = "".join(f" + {g.replicas}x{g.gpus} ({g.name})" for g in spec.groups)
    return f"waiting for {spec.pod_count}x{spec.gpus_per_worker}{groups} GPUs in queue {spec.queue}"


def place_in_line(job: Mapping[str, Any], now: float) -> float:
    """When the job took its place in line: its creation while it is new, else
    status.queuedAt (now when neither is known)."""
    if is_new(job):
        return created_at(job) or now
    return parse_time((job.get("status") or {}).get("queuedAt")) or now


# A job's counters at its first queueing.
FIRST_COUNTERS = {"attempt": 0, "restarts": 0, "userFailures": 0}


def queued_status(
    spec: TrainingJobSpec,
    status: Mapping[str, Any],
    queued_at: float,
    now: float,
    gen: int,
) -> dict[str, Any]:
    """The status fields of a job taking its place in line (phase Queued, queuedAt,
    queuedAs, the Admitted condition saying so)."""
    message = queued_message(spec)
    return {
        "phase": "Queued",
        "queuedAt": iso(queued_at),
        "queuedAs": spec.queued_as,
        "message": message,
        "observedGeneration": gen,
        "conditions": set_condition(
            status.get("conditions"), "Admitted", False, "Queued", message, now, gen
        ),
    }


def first_queue_status(
    spec: TrainingJobSpec,
    status: Mapping[str, Any],
    queued_at: float,
    now: float,
    gen: int,
) -> dict[str, Any]:
    """queued_status with the counters at zero: a job's first queueing."""
    return {**queued_status(spec, status, queued_at, now, gen), **FIRST_COUNTERS}


def grace_left(job: Mapping[str, Any], now: float, grace: float) -> float:
    """Seconds the reconciler still leaves a new job's first status to the pass (0: write
    it now). A job with no creation time (a test's) is written at once."""
    created = created_at(job)
    if created is None or grace <= 0:
        return 0.0
    return max(0.0, created + grace - now)
