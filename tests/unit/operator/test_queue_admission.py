"""Borrowed admissions and reclaims in the operator's pure parts: pods, requeue, Queue status."""

from jobs import make_job, pod

from gangshare.core.cycle import Admission, CycleResult, Pending, PendingKind, Preemption
from gangshare.core.gang import GangPlan, WorkerPlacement
from gangshare.core.job import GangRequest, ServiceClass
from gangshare.core.queueing import QueuedJob, QueuePolicy, RunningJob
from gangshare.core.queues import QueueSpec
from gangshare.kube.claims import admitted_class, job_hold
from gangshare.kube.snapshot import running_jobs
from gangshare.operator.actions import Displacement
from gangshare.operator.lifecycle import Observation, detect_actions
from gangshare.operator.queue_status import changed_fields, queue_statuses

NOW = 1_800_000_000.0
PLACEMENT = [{"rank": 0, "node": "n-0", "gpus": [0, 1]}]


def borrowed_job(phase: str = "Admitted"):
    return (
        make_job("j")
        .spec(workers=1, gpusPerWorker=2, queue="b", priority=3)
        .status(
            phase=phase,
            attempt=2,
            restarts=1,
            placement=PLACEMENT,
            observedGeneration=1,
            serviceClass="Opportunistic",
            borrowed=True,
            admittedAt="2027-01-15T08:00:00Z",
        )
    )


def test_a_borrowed_gang_holds_and_asks_for_share_slots_whatever_its_spec_says():
    job = borrowed_job().build()
    assert job["spec"].get("serviceClass", "Guaranteed") == "Guaranteed"
    assert admitted_class(job) is ServiceClass.OPPORTUNISTIC
    hold, warning = job_hold(job)
    assert warning is None and hold is not None
    assert hold.service_class is ServiceClass.OPPORTUNISTIC
    actions = detect_actions(Observation(job, [], True, NOW), "gangshare-scheduler")
    (created,) = actions.create_pods
    limits = created["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"gangshare.io/gpu-share": "2"}
    assert created["metadata"]["labels"]["gangshare.io/service-class"] == "Opportunistic"
    (running,) = running_jobs([job], 3600.0)
    assert running.borrowed and running.priority == 3
    assert running.service_class is ServiceClass.OPPORTUNISTIC


def test_a_reclaimed_running_borrower_is_evicted_whole_and_requeued_keeping_its_retries():
    job = borrowed_job("Running").condition("GangScheduled", True).build()
    pods = [pod("j", 0, phase="Running", node="n-0", attempt=2)]
    reason = "reclaimed: cohort c's lenders took their quota back"
    actions = detect_actions(
        Observation(job, pods, True, NOW, Displacement(2, reason, preempted=True)),
        "gangshare-scheduler",
    )
    assert actions.delete_pods == ["j-worker-0"]
    assert actions.status["phase"] == "Queued"
    assert actions.status["attempt"] == 3
    assert actions.status["preemptions"] == 1
    assert actions.status["placement"] is None and actions.status["borrowed"] is None
    assert "restarts" not in actions.status  # a reclaim is not the job's failure
    assert "queuedAt" not in actions.status  # its place in the queue is kept
    assert [(e.type, e.reason) for e in actions.events] == [("Warning", "Preempted")]
    assert reason in actions.events[0].message
    stale = Observation(job, pods, True, NOW, Displacement(1, reason, preempted=True))
    assert detect_actions(stale, "gangshare-scheduler").status.get("phase") != "Queued"


def _queued(key: str, queue: str, gpus: int, at: float) -> QueuedJob:
    return QueuedJob(key, GangRequest(key, 1, gpus), at, queue)


def test_queue_status_counts_admitted_borrowed_preempted_and_names_the_head():
    specs = {"a": QueueSpec("a", 8, cohort="c"), "b": QueueSpec("b", 0, cohort="c")}
    policy = QueuePolicy(queues=specs)
    running = [
        RunningJob("ns/old", "b", 8, ServiceClass.OPPORTUNISTIC, borrowed=True),
        RunningJob("ns/kept", "b", 2, ServiceClass.OPPORTUNISTIC, borrowed=True),
    ]
    plan = GangPlan("ns/new", (WorkerPlacement(0, "n-0", tuple(range(8))),))
    result = CycleResult(
        admitted=[Admission(_queued("ns/new", "a", 8, 5.0), plan)],
        pending=[
            Pending(_queued("ns/late", "a", 4, 9.0), "behind", PendingKind.BEHIND),
            Pending(_queued("ns/first", "b", 4, 1.0), "cohort c lends 0", PendingKind.QUOTA),
            Pending(_queued("ns/second", "b", 4, 2.0), "cohort c lends 0", PendingKind.QUOTA),
        ],
        preemptions=[Preemption(running[0], "reclaimed")],
    )
    statuses = queue_statuses(specs, policy, running, result)
    assert statuses["a"] == {
        "pendingJobs": 1,
        "admittedJobs": 1,
        "guaranteedGPUs": 8,
        "borrowedGPUs": 0,
        "headJob": None,
        "headReason": None,
    }
    assert statuses["b"]["borrowedGPUs"] == 2 and statuses["b"]["admittedJobs"] == 1
    assert statuses["b"]["headJob"] == "ns/first"
    assert statuses["b"]["headReason"] == "cohort c lends 0"
    assert changed_fields(statuses["a"], statuses["a"]) == {}
    assert changed_fields({"pendingJobs": 3}, {"pendingJobs": 1}) == {"pendingJobs": 1}
