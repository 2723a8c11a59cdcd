"""batch/v1 Jobs queued as gangs: the adapter (kube/batchjob.py) and their lifecycle, pure."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from batch_jobs import UID, job_pod, make_batch_job

from gangshare.core.annotations import (
    ATTEMPT_LABEL,
    CLASS_LABEL,
    JOB_LABEL,
    POD_PLANNED_GPUS,
    POD_PLANNED_NODE,
    RANK_LABEL,
)
from gangshare.kube.batchjob import parse_queued_job
from gangshare.kube.claims import job_hold, pod_facts
from gangshare.kube.ledger import Ledger
from gangshare.kube.queued import ATTEMPT_ANNOTATION, STATUS_ANNOTATION, workload, workload_name
from gangshare.kube.scheduling import GANG_GATE
from gangshare.kube.trainingjob import InvalidSpec, parse_trainingjob
from gangshare.operator.actions import Displacement
from gangshare.operator.batch_lifecycle import BatchObservation, detect_batch_actions
from gangshare.operator.conditions import iso
from gangshare.operator.lifecycle import Limits

NOW = 1_800_000_000.0
PLACEMENT = [
    {"rank": 0, "node": "n-0", "gpus": [0, 1, 2, 3]},
    {"rank": 1, "node": "n-0", "gpus": [4, 5, 6, 7]},
]


def the_workload(job: dict[str, Any], **status: Any) -> dict[str, Any]:
    """The TrainingJob the operator made for `job`, as the API server returns it."""
    body = workload(parse_queued_job(job))
    body["metadata"].update({"uid": "tj-uid", "generation": 1, "resourceVersion": "3"})
    if status:
        body["status"] = {"attempt": 0, "observedGeneration": 1, **status}
    return body


def admitted(job: dict[str, Any], **more: Any) -> dict[str, Any]:
    status = {
        "phase": "Admitted",
        "placement": PLACEMENT,
        "admittedAt": iso(NOW - 5),
        "serviceClass": "Guaranteed",
        "message": "admitted: 2 worker(s) on n-0",
        **more,
    }
    return the_workload(job, **status)


def committed() -> list[dict[str, Any]]:
    return [{"type": "GangScheduled", "status": "True", "reason": "AllWorkersCreated"}]


def detect(workload_obj, job, pods=(), displaced=None, now=NOW, limits=None):
    seen = BatchObservation(workload_obj, job, list(pods), now, displaced)
    return detect_batch_actions(seen, limits or Limits(), 1.0)


# ----- reading a Job ------------------------------------------------------------------------


def test_a_labelled_indexed_job_is_a_gang_of_its_parallelism():
    spec = parse_queued_job(make_batch_job().label("gangshare.io/priority", "5").build())
    assert (spec.queue, spec.workers, spec.gpus_per_worker, spec.priority) == ("research", 2, 4, 5)
    assert spec.indexed
    body = workload(spec)
    tj = parse_trainingjob({**body, "metadata": {**body["metadata"], "uid": "x"}})
    assert tj.job_ref is not None and tj.job_ref.uid == UID
    assert tj.gang().whole_gpus  # its template fixes nvidia.com/gpu: it never borrows slots
    assert body["metadata"]["ownerReferences"][0]["uid"] == UID  # deleted with its Job
    assert body["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "2"}
    }


def test_a_jobs_pod_level_resources_reach_its_trainingjobs_constraints():
    # spec.resources on the Job's pod template is what kube-scheduler counts for its pods.
    asked = {"requests": {"cpu": "32", "memory": "256Gi"}}
    body = workload(parse_queued_job(make_batch_job().pod_spec(resources=asked).build()))
    assert body["spec"]["template"]["spec"]["resources"] == asked
    tj = parse_trainingjob({**body, "metadata": {**body["metadata"], "uid": "x"}})
    assert tj.constraints.resource_map() == {"cpu": 32_000, "memory": 256 * 2**30, "pods": 1}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda b: b.label("gangshare.io/service-class", "Best"), "gangshare.io/service-class"),
        (lambda b: b.label("gangshare.io/priority", "high"), "gangshare.io/priority"),
        (lambda b: b.spec(completions=4), "spec.completions"),
        (lambda b: b.spec(parallelism=0, completions=0), "spec.parallelism"),
        (lambda b: b.pods(2, gpus="0"), "limits[nvidia.com/gpu]"),
        (lambda b: b.label("gangshare.io/service-class", "Opportunistic"), "not nvidia.com/gpu"),
        (lambda b: b.template_labels(**{"gangshare.io/rank": "0"}), "gangshare.io/rank"),
        (lambda b: b.template_labels(**{"gangshare.io/job": "someone-else"}), "gangshare.io/job"),
        (lambda b: b.pod_spec(nodeName="n-0"), "spec.template.spec.nodeName"),
        (
            lambda b: b.pod_spec(
                containers=[
                    {"name": "t", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                    {"name": "side", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
                ]
            ),
            "containers[1].resources",
        ),
    ],
)
def test_a_job_that_is_no_gang_is_refused_naming_its_field(change, field):
    with pytest.raises(InvalidSpec, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_queued_job(change(make_batch_job()).build())


def test_the_job_label_gangshare_wrote_itself_is_no_refusal():
    job = make_batch_job().prepared().build()
    assert parse_queued_job(job).workers == 2
    kwok = make_batch_job().build()
    kwok["spec"]["template"]["metadata"]["annotations"] = {"gangshare.io/kwok-run-for": "2s"}
    assert parse_queued_job(kwok).workers == 2


def test_workload_names_are_trainingjob_names_and_tell_jobs_apart():
    assert parse_queued_job(make_batch_job().build()).workload_name == "job-train"
    long = "a" * 60
    other = "a" * 59 + "b"
    for name in (long, other, "Upper.dots.x"):
        made = workload_name(name, "job-")
        assert len(made) <= 45 and made[0].isalpha() and made == made.lower(), made
        assert "." not in made
    assert workload_name(long, "job-") != workload_name(other, "job-")


# ----- the lifecycle -----------------------------------------------------------------------


def test_a_new_jobs_trainingjob_is_queued_and_the_job_stays_suspended():
    job = make_batch_job().build()
    actions = detect(the_workload(job), job)
    assert actions.status["phase"] == "Queued"
    assert actions.job_patch is None  # it is suspended already
    assert actions.note == "Queued: waiting for 2x4 GPUs in queue research"


def test_a_job_resumed_by_hand_before_admission_is_suspended_again():
    job = make_batch_job().build()
    job["spec"]["suspend"] = False
    actions = detect(the_workload(job, phase="Queued", message="waiting"), job)
    assert actions.job_patch == {"spec": {"suspend": True}}
    assert [e.reason for e in actions.job_events] == ["Suspended"]


def test_admission_resumes_the_job_and_prepares_its_template_before_its_first_run():
    job = make_batch_job().build()
    actions = detect(admitted(job), job)
    patch = actions.job_patch
    assert patch is not None and patch["spec"]["suspend"] is False
    assert patch["metadata"]["annotations"][ATTEMPT_ANNOTATION] == "0"
    template = patch["spec"]["template"]
    assert template["metadata"]["labels"] == {JOB_LABEL: "job-train"}
    assert template["spec"]["schedulingGates"] == [{"name": GANG_GATE}]
    # Once it has run, its template is only ever resumed as it is.
    again = make_batch_job().prepared().started_once().build()
    later = detect(admitted(job, attempt=1), again)
    assert later.job_patch == {
        "metadata": {"annotations": {ATTEMPT_ANNOTATION: "1"}},
        "spec": {"suspend": False},
    }


def test_a_job_still_being_suspended_is_not_resumed_yet():
    job = make_batch_job().prepared().started_once().build()
    job["status"]["active"] = 1  # its controller has pods of the last run still active
    assert detect(admitted(job, attempt=1), job).job_patch is None


def test_a_job_that_ran_outside_its_queue_ungated_cannot_be_queued_and_fails():
    job = make_batch_job().started_once().build()
    actions = detect(admitted(job), job)
    assert actions.status["phase"] == "Failed"
    assert actions.status["message"].startswith("spec.suspend: the Job ran before gangshare")


def test_the_whole_gang_is_ungated_at_once_each_pod_on_its_indexs_place():
    job = make_batch_job().running(0).build()
    pods = [job_pod(job, 1, suffix="zzzzz"), job_pod(job, 0)]
    actions = detect(admitted(job), job, pods[:1])
    assert actions.ungate == [] and "conditions" not in actions.status  # one pod still missing
    actions = detect(admitted(job), job, pods)
    assert [c["type"] for c in actions.status["conditions"]] == ["GangScheduled"]
    by_pod = dict(actions.ungate)
    assert set(by_pod) == {"train-0-abcde", "train-1-zzzzz"}
    first = by_pod["train-1-zzzzz"]
    assert first["metadata"]["labels"] == {
        RANK_LABEL: "1",
        ATTEMPT_LABEL: "0",
        CLASS_LABEL: "Guaranteed",
    }
    assert first["metadata"]["annotations"][POD_PLANNED_NODE] == "n-0"
    assert first["metadata"]["annotations"][POD_PLANNED_GPUS] == "4,5,6,7"
    assert first["spec"]["schedulingGates"] is None
    terms = first["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n-0"]}]}
    ]


def test_a_pod_the_job_controller_replaces_takes_its_predecessors_place():
    job = make_batch_job().running(0).build()
    running = job_pod(job, 0, gated=False, rank=0, attempt=0, node="n-0", phase="Running")
    failed = job_pod(job, 1, gated=False, rank=1, attempt=0, node="n-0", phase="Failed")
    replacement = job_pod(job, 1, suffix="fresh")
    actions = detect(admitted(job, conditions=committed()), job, [running, failed, replacement])
    assert [name for name, _ in actions.ungate] == ["train-1-fresh"]
    assert actions.ungate[0][1]["metadata"]["labels"][RANK_LABEL] == "1"
    assert "conditions" not in actions.status  # committed already


def test_a_pod_that_lies_about_its_job_is_not_ungated():
    job = make_batch_job().running(0).build()
    stranger = job_pod(job, 0)
    stranger["metadata"]["ownerReferences"][0]["uid"] = "someone-elses"
    actions = detect(admitted(job), job, [stranger, job_pod(job, 1)])
    assert actions.ungate == []  # only one of the Job's own pods exists


def test_all_pods_running_is_running():
    job = make_batch_job().running(0).build()
    pods = [
        job_pod(job, i, gated=False, rank=i, attempt=0, node="n-0", phase="Running")
        for i in range(2)
    ]
    actions = detect(admitted(job, conditions=committed()), job, pods)
    assert actions.status["phase"] == "Running"
    assert actions.note == "Running: all 2 pods of the Job running"


def test_a_reclaimed_job_is_suspended_and_requeued_keeping_its_place():
    job = make_batch_job().running(0).build()
    workload_obj = admitted(job, phase="Running", conditions=committed(), queuedAt=iso(NOW - 60))
    reclaim = Displacement(0, "reclaimed: cohort c's lenders need their quota", preempted=True)
    actions = detect(workload_obj, job, [], displaced=reclaim)
    assert actions.status["phase"] == "Queued"
    assert actions.status["attempt"] == 1 and actions.status["preemptions"] == 1
    assert "queuedAt" not in actions.status  # its place in line is kept
    assert actions.job_patch == {"spec": {"suspend": True}}
    assert [e.reason for e in actions.events] == ["Preempted"]
    assert [e.reason for e in actions.job_events] == ["Suspended"]


def test_a_gang_not_started_in_time_gives_its_gpus_back():
    job = make_batch_job().running(0).build()
    late = admitted(job)
    late["status"]["admittedAt"] = iso(NOW - 500)
    actions = detect(late, job, [job_pod(job, 0)], limits=Limits(start_timeout_seconds=120))
    assert actions.status["phase"] == "Queued" and actions.job_patch == {"spec": {"suspend": True}}
    assert actions.status["nextRetryAt"] is not None


def test_the_jobs_own_end_ends_its_trainingjob():
    job = make_batch_job().running(0).condition("Complete").build()
    actions = detect(admitted(job, phase="Running", conditions=committed()), job)
    assert actions.status["phase"] == "Succeeded"
    assert actions.job_patch is None  # a finished Job is never suspended
    failed = make_batch_job().running(0).condition("Failed").build()
    failed["status"]["conditions"][-1]["message"] = "BackoffLimitExceeded"
    actions = detect(admitted(failed, phase="Running"), failed)
    assert actions.status["phase"] == "Failed"
    assert "BackoffLimitExceeded" in actions.status["message"]


def test_the_note_is_written_only_when_it_changes():
    job = make_batch_job().build()
    queued = the_workload(job, phase="Queued", message="waiting for 2x4 GPUs in queue research")
    job["metadata"]["annotations"][STATUS_ANNOTATION] = (
        "Queued: waiting for 2x4 GPUs in queue research"
    )
    assert detect(queued, job).empty
    moved = copy.deepcopy(queued)
    moved["status"]["message"] = "queue research does not exist (spec.queue)"
    assert detect(moved, job).note == "Queued: queue research does not exist (spec.queue)"


# ----- the ledger knows the Job's pods as the gang's workers ---------------------------------


def test_a_bound_job_pod_is_its_ranks_fact_and_an_impostor_is_not():
    job = make_batch_job().running(0).build()
    hold, _ = job_hold(admitted(job, phase="Running"))
    assert hold is not None and hold.batch and hold.uid == UID
    pod = job_pod(job, 1, gated=False, rank=1, attempt=0, node="n-0", phase="Running")
    pod["metadata"]["annotations"][POD_PLANNED_GPUS] = "4,5,6,7"
    facts, _ = pod_facts(pod)
    assert facts is not None and facts.identity is not None and facts.identity.batch
    ledger = Ledger()
    ledger.replace_jobs([admitted(job, phase="Running")])
    ledger.replace_pods([pod])
    assert ledger.verified_worker(facts) is ledger.job("team/job-train")
    # A pod naming the Job's uid but controlled "by a TrainingJob" of that name is no worker.
    impostor = copy.deepcopy(pod)
    impostor["metadata"]["ownerReferences"][0].update(
        {"apiVersion": "gangshare.io/v1alpha1", "kind": "TrainingJob", "name": "job-train"}
    )
    wrong, _ = pod_facts(impostor)
    assert wrong is not None and wrong.identity is None  # not named <job>-worker-<rank>
