"""A Kubeflow PyTorchJob queued as one gang: its adapter (kube/pytorchjob.py), pure."""

from __future__ import annotations

from typing import Any

import pytest

from gangshare.kube.claims import worker_identity
from gangshare.kube.pytorchjob import (
    PYTORCHJOB,
    REPLICA_INDEX_LABEL,
    REPLICA_TYPE_LABEL,
    parse_queued_pytorchjob,
)
from gangshare.kube.queued import workload
from gangshare.kube.queued_kinds import kind_of
from gangshare.kube.trainingjob import InvalidSpec, parse_trainingjob

UID = "pt-uid-1"


def replica(count: int, gpus: str = "2") -> dict[str, Any]:
    limits = {"nvidia.com/gpu": gpus} if gpus != "0" else {"cpu": "1"}
    return {
        "replicas": count,
        "template": {
            "spec": {
                "schedulerName": "gangshare-scheduler",
                "containers": [{"name": "pytorch", "resources": {"limits": limits}}],
            }
        },
    }


def make_job(**specs: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": "ddp",
            "namespace": "team",
            "uid": UID,
            "labels": {"gangshare.io/queue": "research"},
        },
        "spec": {
            "runPolicy": {"suspend": True},
            "pytorchReplicaSpecs": specs or {"Master": replica(1), "Worker": replica(3)},
        },
    }


def pod(kind: str, index: int, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"ddp-{kind}-{index}",
            "namespace": "team",
            "labels": {REPLICA_TYPE_LABEL: kind, REPLICA_INDEX_LABEL: str(index), **labels},
            "ownerReferences": [
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": "ddp",
                    "uid": UID,
                    "controller": True,
                }
            ],
        }
    }


def test_a_master_and_workers_of_one_shape_are_one_set_ranked_as_the_operator_ranks():
    job = make_job()
    spec = parse_queued_pytorchjob(job)
    assert (spec.workers, spec.gpus_per_worker, spec.groups) == (4, 2, ())
    assert spec.workload_name == "pytorchjob-ddp"
    body = workload(spec)
    assert kind_of(body) is PYTORCHJOB
    assert parse_trainingjob({**body, "metadata": {**body["metadata"], "uid": "x"}}).job_ref
    ranks = [PYTORCHJOB.pod_rank(pod("master", 0), job)] + [
        PYTORCHJOB.pod_rank(pod("worker", i), job) for i in range(3)
    ]
    assert ranks == [0, 1, 2, 3]
    assert PYTORCHJOB.pod_rank(pod("worker", 3), job) is None
    assert PYTORCHJOB.owns(pod("worker", 0), job)


def test_a_cpu_master_is_a_pod_set_of_its_own_ranked_after_the_workers():
    job = make_job(Master=replica(1, gpus="0"), Worker=replica(2))
    spec = parse_queued_pytorchjob(job)
    assert (spec.workers, [(g.name, g.replicas, g.gpus) for g in spec.groups]) == (
        2,
        [("master", 1, 0)],
    )
    assert PYTORCHJOB.pod_rank(pod("master", 0), job) == 2


@pytest.mark.parametrize(
    ("job", "field"),
    [
        (make_job(Worker=replica(0)), r"spec.pytorchReplicaSpecs.Worker.replicas"),
        (make_job(Master=replica(1, gpus="0")), r"containers\[0\].resources"),
    ],
)
def test_a_pytorchjob_that_is_no_gang_is_refused_naming_its_field(job, field):
    with pytest.raises(InvalidSpec, match=field):
        parse_queued_pytorchjob(job)


def test_gang_scheduling_of_its_own_is_refused():
    job = make_job()
    job["spec"]["runPolicy"]["schedulingPolicy"] = {"minAvailable": 2}
    with pytest.raises(InvalidSpec, match=r"schedulingPolicy\.minAvailable"):
        parse_queued_pytorchjob(job)


def test_resume_gates_every_replica_template_and_suspend_is_the_run_policys():
    job = make_job()
    patch = PYTORCHJOB.resume_patch(job, "pytorchjob-ddp", 1)
    assert patch["spec"]["runPolicy"] == {"suspend": False}
    assert patch["metadata"]["annotations"]["gangshare.io/attempt"] == "1"
    for kind in ("Master", "Worker"):
        template = patch["spec"]["pytorchReplicaSpecs"][kind]["template"]
        assert template["spec"]["schedulingGates"] == [{"name": "gangshare.io/gang"}]
        assert template["metadata"]["labels"]["gangshare.io/job"] == "pytorchjob-ddp"
    assert PYTORCHJOB.suspend_patch() == {"spec": {"runPolicy": {"suspend": True}}}
    assert PYTORCHJOB.suspended(job) and not PYTORCHJOB.suspended(
        {"spec": {"runPolicy": {"suspend": False}}}
    )


def test_its_pods_answer_to_the_pytorchjobs_uid():
    labelled = pod(
        "worker",
        0,
        **{
            "gangshare.io/job": "pytorchjob-ddp",
            "gangshare.io/rank": "1",
            "gangshare.io/attempt": "0",
        },
    )
    who = worker_identity(labelled)
    assert who is not None and who.batch and who.uid == UID and who.rank == 1
