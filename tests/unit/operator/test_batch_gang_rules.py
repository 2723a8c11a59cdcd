"""A queued Job's gang holds on every path the TrainingJob one does (issue #36 item 2; pure).

Resized or moved while queued, it is refused with the reason and never run in part; a running
one whose pod the Job controller replaced onto a place that is gone, or that kube-scheduler
refuses beside bound siblings, is released within the same bounds as a TrainingJob; one whose
queue label is removed lets go of its TrainingJob at once; its writes are conditional on the
version decided from; a template another (preempting) scheduler places is refused."""

from __future__ import annotations

from batch_jobs import job_pod, make_batch_job
from test_queued_batch_jobs import NOW, admitted, committed, detect, the_workload

from gangshare.kube.batchjob import JOB
from gangshare.kube.jobset import JOBSET
from gangshare.kube.queued import QUEUE_LABEL, STATUS_ANNOTATION, scheduler_refusal, was_queued
from gangshare.kube.queued_writes import at_version
from gangshare.operator.actions import Displacement
from gangshare.operator.conditions import iso
from gangshare.operator.lifecycle import Limits

GONE = Displacement(0, "planned node n-0 no longer exists")


def running_workload(job: dict) -> dict:
    return admitted(job, phase="Running", conditions=committed(), queuedAt=iso(NOW - 60))


def test_a_job_scaled_while_queued_is_refused_never_run_in_part() -> None:
    queued_at_two = make_batch_job().pods(2).build()
    workload_obj = the_workload(queued_at_two, phase="Queued", queuedAt=iso(NOW - 30))
    scaled = make_batch_job().pods(4).build()  # parallelism == completions: Kubernetes allows
    actions = detect(workload_obj, scaled)
    assert actions.status["phase"] == "Failed"
    assert "2 pods became 4" in actions.status["message"]
    assert "never run in part" in actions.status["message"]
    assert actions.note is not None and actions.note.startswith("Failed:")
    assert actions.job_patch is None  # still suspended: nothing of it runs


def test_a_job_whose_pods_were_moved_while_queued_is_refused() -> None:
    job = make_batch_job().build()
    workload_obj = the_workload(job, phase="Queued", queuedAt=iso(NOW - 30))
    moved = make_batch_job().pod_spec(nodeSelector={"zone": "b"}).build()
    actions = detect(workload_obj, moved)
    assert actions.status["phase"] == "Failed"
    assert "its pods' nodeSelector changed" in actions.status["message"]
    # Unchanged, it is not refused (gangshare's own gate and label are no change of shape).
    assert detect(workload_obj, make_batch_job().prepared().build()).status.get("phase") is None


def test_a_running_job_whose_replacement_is_pinned_to_a_lost_node_is_released() -> None:
    job = make_batch_job().running(0).build()
    running = job_pod(job, 0, gated=False, rank=0, attempt=0, node="n-1", phase="Running")
    replacement = job_pod(job, 1, suffix="fresh")  # its predecessor's node was deleted
    actions = detect(running_workload(job), job, [running, replacement], displaced=GONE)
    assert actions.status["phase"] == "Queued"
    assert "broke while it ran (planned node n-0 no longer exists)" in actions.status["message"]
    assert "queuedAt" not in actions.status  # keeps its place
    assert actions.job_patch == {"spec": {"suspend": True}}
    assert actions.ungate == []  # never pinned to the node that is gone


def test_a_running_job_with_every_live_pod_bound_is_not_released_for_a_broken_plan() -> None:
    """A rank that finished may leave its planned GPUs to others: the ranks still running are
    not broken by that."""
    job = make_batch_job().running(0).build()
    pods = [
        job_pod(job, 0, gated=False, rank=0, attempt=0, node="n-0", phase="Running"),
        job_pod(job, 1, gated=False, rank=1, attempt=0, node="n-0", phase="Succeeded"),
    ]
    actions = detect(running_workload(job), job, pods, displaced=GONE)
    assert actions.status.get("phase") in (None, "Running") and actions.job_patch is None


def test_a_running_jobs_replacement_refused_beside_bound_siblings_is_released_in_bounds() -> None:
    job = make_batch_job().running(0).build()
    bound = job_pod(job, 0, gated=False, rank=0, attempt=0, node="n-0", phase="Running")
    refused = job_pod(job, 1, gated=False, rank=1, attempt=0, suffix="fresh")
    refused["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/3 nodes are available: 1 Insufficient cpu",
            "lastTransitionTime": iso(NOW - 2),
        }
    ]
    bound["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": iso(NOW - 600)}
    ]
    limits = Limits(unschedulable_seconds=5.0)
    early = detect(running_workload(job), job, [bound, refused], limits=limits)
    assert early.job_patch is None and 2.5 <= (early.requeue_after or 0) <= 3.0
    late = detect(running_workload(job), job, [bound, refused], now=NOW + 3, limits=limits)
    assert late.status["phase"] == "Queued" and late.job_patch == {"spec": {"suspend": True}}
    assert "worker 1 cannot be placed" in late.status["message"]


def test_a_job_that_left_its_queue_releases_its_trainingjob_at_once() -> None:
    job = make_batch_job().running(0).build()
    workload_obj = running_workload(job)
    del job["metadata"]["labels"][QUEUE_LABEL]
    job["metadata"]["annotations"][STATUS_ANNOTATION] = "Running: all 2 pods of the Job running"
    assert was_queued(job)
    actions = detect(workload_obj, job, [])
    assert actions.delete_workload
    assert [e.reason for e in actions.job_events] == ["LeftQueue"]
    assert actions.job_patch is None and actions.status == {}


def test_writes_are_conditional_on_the_version_decided_from() -> None:
    job = make_batch_job().running(0).build()
    assert at_version({"spec": {"suspend": True}}, job) == {
        "spec": {"suspend": True},
        "metadata": {"resourceVersion": "7"},
    }
    pods = [job_pod(job, i) for i in range(2)]
    for i, pod in enumerate(pods):
        pod["metadata"]["resourceVersion"] = f"1{i}"
    actions = detect(admitted(job), job, pods)
    assert [p["metadata"]["resourceVersion"] for _, p in actions.ungate] == ["10", "11"]


def test_a_template_another_scheduler_places_is_refused_naming_its_field() -> None:
    job = make_batch_job().build()
    why = scheduler_refusal(JOB, job, "gangshare-scheduler")
    assert why is not None and why.startswith("spec.template.spec.schedulerName:")
    assert "it names default-scheduler" in why
    ours = make_batch_job().pod_spec(schedulerName="gangshare-scheduler").build()
    assert scheduler_refusal(JOB, ours, "gangshare-scheduler") is None
    jobset = {
        "spec": {
            "replicatedJobs": [
                {
                    "template": {
                        "spec": {"template": {"spec": {"schedulerName": "gangshare-scheduler"}}}
                    }
                },
                {"template": {"spec": {"template": {"spec": {}}}}},
            ]
        }
    }
    why = scheduler_refusal(JOBSET, jobset, "gangshare-scheduler")
    assert why is not None and why.startswith("spec.replicatedJobs[1].template.spec.template")
