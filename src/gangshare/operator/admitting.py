"""What an admission writes: the job's status patch, and whether an event says it too."""

from __future__ import annotations

from typing import Any

from gangshare.core.cycle import Admission
from gangshare.core.job import ServiceClass
from gangshare.kube.trainingjob import parse_trainingjob
from gangshare.operator.conditions import condition, iso, set_condition
from gangshare.operator.first_queue import FIRST_COUNTERS, is_new, place_in_line
from gangshare.operator.pending import clear_inadmissible


def admission_message(admission: Admission) -> str:
    plan = admission.plan
    nodes = ", ".join(plan.nodes)
    relaxed = " (topology preference relaxed)" if plan.relaxed else ""
    if not admission.borrowed:
        return f"admitted: {len(plan.placements)} worker(s) on {nodes}{relaxed}"
    # A gang whose GPU resource is fixed (a batch/v1 Job's) borrows whole idle GPUs.
    how = (
        "on idle whole GPUs"
        if admission.service_class is ServiceClass.GUARANTEED
        else "as Opportunistic"
    )
    return (
        f"admitted {how} on borrowed quota ({admission.job.gpus} GPUs beyond "
        f"queue {admission.job.queue}'s quota; reclaimed first when lenders return): "
        f"{len(plan.placements)} worker(s) on {nodes}{relaxed}"
    )


def admission_status(job: dict[str, Any], admission: Admission, now: float) -> dict[str, Any]:
    """The one conditional status write that commits an admission. A new job is queued and
    admitted in it (operator/first_queue.py): its place in line is its creation."""
    plan = admission.plan
    status = job.get("status") or {}
    gen = int(job["metadata"].get("generation", 0))
    message = admission_message(admission)
    queued_at = place_in_line(job, now)
    first: dict[str, Any] = {}
    if is_new(job):
        # Its place in line, and the line (a move while requeued later is judged by it).
        first = {
            "queuedAt": iso(queued_at),
            "queuedAs": parse_trainingjob(job).queued_as,
            **FIRST_COUNTERS,
        }
    return {
        **first,
        "phase": "Admitted",
        "admittedAt": iso(now),
        "forecast": None,  # said while it waited
        "queueWaitSeconds": round(max(0.0, now - queued_at), 3),
        # The run time backfill assumed at admission; running jobs' expected ends use it too.
        "predictedRuntimeSeconds": admission.job.runtime_estimate,
        "serviceClass": admission.service_class.value,
        "borrowed": admission.borrowed,
        "placement": [
            {"rank": p.rank, "node": p.node, "gpus": list(p.gpu_indices)} for p in plan.placements
        ],
        "message": message,
        "observedGeneration": gen,
        "conditions": clear_inadmissible(
            set_condition(
                status.get("conditions"), "Admitted", True, "GangAdmitted", message, now, gen
            ),
            now,
            gen,
        ),
    }


def admission_needs_event(status: dict[str, Any], admission: Admission) -> bool:
    """Whether an admission is posted as an event as well as said by the Admitted condition
    (#39: events only where a person needs the why). It is when the job was told why it
    waited (the event ends that story in `kubectl describe`), runs on borrowed quota (it is
    reclaimed first), had its topology preference relaxed, or is a later attempt; a job
    admitted at its first turn has its placement in the condition and status.message."""
    told = (condition(status.get("conditions"), "Admitted") or {}).get("reason")
    return (
        admission.borrowed
        or admission.plan.relaxed
        or told not in (None, "Queued")
        or int(status.get("attempt") or 0) > 0
    )
