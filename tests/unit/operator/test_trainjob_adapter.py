"""A Kubeflow Trainer TrainJob queued as one gang through the JobSet Trainer makes for it: its
adapter (kube/trainjob.py), pure."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gangshare.kube.claims import job_hold
from gangshare.kube.jobset import JOB_INDEX_LABEL, JOBSET, JOBSET_UID_LABEL, REPLICATED_JOB_LABEL
from gangshare.kube.queued import COMPLETION_INDEX_LABEL, workload
from gangshare.kube.queued_kinds import parent_of
from gangshare.kube.trainingjob import InvalidSpec
from gangshare.kube.trainjob import TRAINJOB, runs_a_trainjob, with_child

TJ_UID, JS_UID = "tj-uid", "js-uid"


def make_trainjob(**labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": "llm",
            "namespace": "team",
            "uid": TJ_UID,
            "labels": {"gangshare.io/queue": "research", **labels},
        },
        "spec": {"runtimeRef": {"name": "torch"}, "trainer": {"numNodes": 2}, "suspend": True},
    }


def make_child(gpus: str = "2", owner_uid: str = TJ_UID) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": "llm",
            "namespace": "team",
            "uid": JS_UID,
            "ownerReferences": [
                {
                    "apiVersion": "trainer.kubeflow.org/v1alpha1",
                    "kind": "TrainJob",
                    "name": "llm",
                    "uid": owner_uid,
                    "controller": True,
                }
            ],
        },
        "spec": {
            "suspend": True,
            "replicatedJobs": [
                {
                    "name": "node",
                    "replicas": 1,
                    "template": {
                        "spec": {
                            "parallelism": 2,
                            "completions": 2,
                            "template": {
                                "spec": {
                                    "schedulerName": "gangshare-scheduler",
                                    "containers": [
                                        {
                                            "name": "node",
                                            "resources": {"limits": {"nvidia.com/gpu": gpus}},
                                        }
                                    ],
                                }
                            },
                        }
                    },
                }
            ],
        },
    }


def test_a_trainjob_is_sized_from_its_jobset_and_its_pods_answer_to_the_jobsets_uid():
    job = with_child(make_trainjob(), make_child())
    spec = TRAINJOB.parse(job)
    assert (spec.workers, spec.gpus_per_worker, spec.workload_name) == (2, 2, "trainjob-llm")
    body = workload(spec)
    assert body["spec"]["jobRef"] == {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "name": "llm",
        "uid": TJ_UID,
        "podsUID": JS_UID,
    }
    body["status"] = {"phase": "Admitted", "placement": [{"rank": 0, "node": "n", "gpus": [0, 1]}]}
    hold, _ = job_hold(body)
    assert hold is not None and hold.uid == JS_UID and hold.batch


def test_a_jobset_another_trainjob_controls_is_not_its_child():
    job = with_child(make_trainjob(), make_child(owner_uid="someone-else"))
    with pytest.raises(InvalidSpec, match=r"spec\.runtimeRef: Trainer has made no JobSet"):
        TRAINJOB.parse(job)


def test_its_runtimes_bad_template_is_named_as_the_runtimes():
    job = with_child(make_trainjob(), make_child(gpus="0"))
    with pytest.raises(InvalidSpec, match="its runtime ClusterTrainingRuntime torch"):
        TRAINJOB.parse(job)


def test_its_jobset_is_queued_through_it_only():
    child = make_child()
    assert runs_a_trainjob(child) == "llm"
    assert parent_of(JOBSET, child) == (TRAINJOB, "llm")
    plain = copy.deepcopy(child)
    plain["metadata"]["ownerReferences"] = []
    assert parent_of(JOBSET, plain) is None


def test_the_jobset_is_prepared_before_the_trainjob_is_resumed():
    job = with_child(make_trainjob(), make_child())
    patch = TRAINJOB.child_patch(job, "trainjob-llm")
    assert patch is not None
    (item,) = patch["spec"]["replicatedJobs"]
    template = item["template"]["spec"]["template"]
    assert template["metadata"]["labels"]["gangshare.io/job"] == "trainjob-llm"
    assert template["spec"]["schedulingGates"] == [{"name": "gangshare.io/gang"}]
    # The parallelism and the rest of the replicated job ride along (a list is replaced whole).
    assert item["template"]["spec"]["parallelism"] == 2
    prepared_child = copy.deepcopy(make_child())
    prepared_child["spec"]["replicatedJobs"] = patch["spec"]["replicatedJobs"]
    prepared = with_child(make_trainjob(), prepared_child)
    assert TRAINJOB.child_patch(prepared, "trainjob-llm") is None
    assert TRAINJOB.prepared(prepared, "trainjob-llm")
    assert TRAINJOB.resume_patch(prepared, "trainjob-llm", 3)["spec"] == {"suspend": False}


def test_its_pods_are_ranked_and_owned_as_its_jobsets():
    job = with_child(make_trainjob(), make_child())
    pod = {
        "metadata": {
            "labels": {
                REPLICATED_JOB_LABEL: "node",
                JOB_INDEX_LABEL: "0",
                COMPLETION_INDEX_LABEL: "1",
                JOBSET_UID_LABEL: JS_UID,
            },
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "llm-node-0",
                    "uid": "j",
                    "controller": True,
                }
            ],
        }
    }
    assert TRAINJOB.pod_rank(pod, job) == 1
    assert TRAINJOB.owns(pod, job)
    assert not TRAINJOB.owns(pod, with_child(make_trainjob(), None))
