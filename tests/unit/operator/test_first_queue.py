"""A new job's first status: the pass writes it with its decision (one write for Queued and
Admitted), the reconciler only once the grace is over; and which admissions post an event."""

from __future__ import annotations

from typing import Any

from fake_apiserver import FakeApiServer
from jobs import make_job, nodes

from gangshare.core.clock import ManualClock
from gangshare.core.cycle import Pending, PendingKind
from gangshare.core.queueing import QueuePolicy
from gangshare.kube.queue import default_queue_object
from gangshare.kube.trainingjob import parse_trainingjob
from gangshare.operator.actions import Observation
from gangshare.operator.informers import Informers
from gangshare.operator.lifecycle import Limits, detect_actions
from gangshare.operator.metrics import OperatorMetrics
from gangshare.operator.pending import detect_pending_write
from gangshare.operator.reconcile import OperatorOptions, Reconciler
from gangshare.operator.scheduler import SchedulerLoop
from gangshare.operator.waiting import WaitingJobs

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
CREATED = "2027-01-15T07:59:50Z"  # ten seconds before NOW
GRACE = Limits(first_queue_grace_seconds=30.0)


def new_job(name: str = "fresh", **spec: Any) -> dict[str, Any]:
    job = make_job(name).spec(**spec).build()
    job["metadata"]["creationTimestamp"] = CREATED
    return job


def test_the_reconciler_leaves_a_new_job_to_the_pass_until_the_grace_is_over():
    job = new_job()
    early = detect_actions(Observation(job, [], True, NOW), "gangshare", limits=GRACE)
    assert not early.status and early.requeue_after == 20.0
    late = detect_actions(Observation(job, [], True, NOW + 20.0), "gangshare", limits=GRACE)
    assert late.status["phase"] == "Queued"
    # Its place in line is its creation, the place a pass would have judged it by.
    assert late.status["queuedAt"] == CREATED
    assert (late.status["attempt"], late.status["restarts"]) == (0, 0)
    # Without the grace (no pass beside it), at once.
    at_once = detect_actions(Observation(job, [], True, NOW), "gangshare")
    assert at_once.status["phase"] == "Queued" and at_once.status["queuedAt"] == CREATED


def test_a_new_job_waits_from_its_creation_and_one_holding_a_jobs_place_is_not_new():
    held = new_job("held", jobRef={"apiVersion": "batch/v1", "kind": "Job", "name": "j"})
    queued = make_job("queued").status(phase="Queued", queuedAt="2027-01-15T07:00:00Z").build()
    waiting = WaitingJobs(3600.0).queued([new_job(), held, queued], NOW)
    assert [(j.key, j.submitted_at) for j in waiting] == [
        ("team/fresh", NOW - 10.0),
        ("team/queued", NOW - 3600.0),
    ]


def test_a_new_job_left_waiting_gets_its_first_status_and_its_reason_in_one_write():
    job = new_job()
    pending = Pending(parse_trainingjob(job).queued(NOW - 10.0), "quota: 8 of 8", PendingKind.QUOTA)
    write = detect_pending_write(job, pending, QueuePolicy(), NOW)
    assert write is not None and write.transition
    status = write.status
    assert (status["phase"], status["queuedAt"], status["message"]) == (
        "Queued",
        CREATED,
        "quota: 8 of 8",
    )
    assert (status["attempt"], status["restarts"], status["userFailures"]) == (0, 0, 0)
    admitted = [c for c in status["conditions"] if c["type"] == "Admitted"]
    assert [(c["status"], c["reason"]) for c in admitted] == [("False", "QuotaExceeded")]


def run_pass(job: dict[str, Any]) -> FakeApiServer:
    server = FakeApiServer(job, [], queues=[default_queue_object()])
    api = server.kube_api()
    informers = Informers()
    informers.nodes.replace(nodes({"nodePools": [{"name": "n", "count": 1, "gpusPerNode": 2}]}))
    informers.pods.replace([])
    informers.jobs.replace([job])
    metrics = OperatorMetrics()
    clock = ManualClock(NOW)
    reconciler = Reconciler(api, clock, OperatorOptions(limits=GRACE), metrics)
    loop = SchedulerLoop(
        api, reconciler, QueuePolicy(), clock, metrics=metrics, informers=informers
    )
    assert loop.run_once().admitted == [f"team/{job['metadata']['name']}"]
    return server


def test_a_new_job_the_first_pass_admits_is_queued_and_admitted_in_one_status_write():
    server = run_pass(new_job())
    statuses = [c for c in server.calls if c[0] == "patch_namespaced_custom_object_status"]
    # One write: no Queued before it (its worker's pod is made; no status follows until it runs).
    assert statuses == [("patch_namespaced_custom_object_status", "fresh")], server.calls
    status = server.job["status"]
    assert status["phase"] == "Admitted"
    assert (status["queuedAt"], status["queueWaitSeconds"], status["attempt"]) == (
        CREATED,
        10.0,
        0,
    )
    # The line it was queued in: a move while requeued later is judged by it.
    assert status["queuedAs"] == {"queue": "default", "priority": 0}
    # Admitted at its first turn: the condition says it, no event.
    events = [c for c in server.calls if c[0] == "create_namespaced_event"]
    assert events == [], events


def test_an_admission_after_a_told_wait_or_on_borrowed_quota_posts_an_event():
    told = make_job("told").status(phase="Queued", queuedAt="2027-01-15T07:59:00Z").build()
    told["status"]["conditions"] = [
        {"type": "Admitted", "status": "False", "reason": "QuotaExceeded", "message": "full"}
    ]
    server = run_pass(told)
    events = [c for c in server.calls if c[0] == "create_namespaced_event"]
    assert len(events) == 1
    again = make_job("again").status(phase="Queued", attempt=1, queuedAt=CREATED).build()
    server = run_pass(again)
    assert len([c for c in server.calls if c[0] == "create_namespaced_event"]) == 1
