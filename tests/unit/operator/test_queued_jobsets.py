"""A JobSet queued as one gang: its adapter (kube/jobset.py), pure."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gangshare.core.annotations import JOB_LABEL
from gangshare.kube.claims import worker_identity
from gangshare.kube.jobset import (
    JOB_INDEX_LABEL,
    JOBSET,
    JOBSET_UID_LABEL,
    REPLICATED_JOB_LABEL,
    parse_queued_jobset,
)
from gangshare.kube.queued import COMPLETION_INDEX_LABEL, workload
from gangshare.kube.queued_kinds import kind_of
from gangshare.kube.scheduling import GANG_GATE
from gangshare.kube.trainingjob import InvalidSpec, parse_trainingjob

UID = "jobset-uid-1"


def replicated(name: str, replicas: int, pods: int, gpus: str = "2") -> dict[str, Any]:
    return {
        "name": name,
        "replicas": replicas,
        "template": {
            "spec": {
                "parallelism": pods,
                "completions": pods,
                "completionMode": "Indexed",
                "template": {
                    "spec": {
                        "containers": [
                            {"name": "t", "resources": {"limits": {"nvidia.com/gpu": gpus}}}
                        ]
                    }
                },
            }
        },
    }


def make_jobset(*items: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": "pair",
            "namespace": "team",
            "uid": UID,
            "labels": {"gangshare.io/queue": "research"},
        },
        "spec": {
            "suspend": True,
            "replicatedJobs": list(items) or [replicated("a", 1, 2), replicated("b", 2, 1)],
        },
    }


def child_pod(item: str, job_index: int, completion: int, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"pair-{item}-{job_index}-{completion}-x",
            "namespace": "team",
            "labels": {
                REPLICATED_JOB_LABEL: item,
                JOB_INDEX_LABEL: str(job_index),
                COMPLETION_INDEX_LABEL: str(completion),
                JOBSET_UID_LABEL: UID,
                **labels,
            },
            # Its child Job's, as JobSet's controller names it: <jobset>-<replicated>-<index>.
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": f"pair-{item}-{job_index}",
                    "uid": "child",
                    "controller": True,
                }
            ],
        }
    }


def test_a_jobset_is_one_gang_of_all_its_replicated_jobs_pods():
    spec = parse_queued_jobset(make_jobset())
    assert (spec.workers, spec.gpus_per_worker, spec.workload_name) == (4, 2, "jobset-pair")
    body = workload(spec)
    assert body["spec"]["jobRef"]["kind"] == "JobSet"
    tj = parse_trainingjob({**body, "metadata": {**body["metadata"], "uid": "x"}})
    assert tj.job_ref is not None and tj.gang().whole_gpus
    assert kind_of(body) is JOBSET


@pytest.mark.parametrize(
    ("items", "field"),
    [
        ((replicated("a", 0, 2),), r"spec.replicatedJobs\[0\].replicas"),
        ((replicated("a", 1, 2, gpus="0"),), r"containers\[0\].resources"),
    ],
)
def test_a_jobset_that_is_no_gang_is_refused_naming_its_field(items, field):
    with pytest.raises(InvalidSpec, match=field):
        parse_queued_jobset(make_jobset(*items))


def test_a_cpu_driver_beside_gpu_workers_is_one_gang_of_two_pod_sets():
    """JobSet's own driver/worker pattern: the driver asks no GPUs."""
    jobset = make_jobset(replicated("driver", 1, 1, gpus="0"), replicated("workers", 2, 2))
    spec = parse_queued_jobset(jobset)
    assert (spec.workers, spec.gpus_per_worker) == (4, 2)
    assert [(g.name, g.replicas, g.gpus) for g in spec.groups] == [("driver", 1, 0)]
    body = workload(spec)
    assert [g["name"] for g in body["spec"]["replicaGroups"]] == ["driver"]
    tj = parse_trainingjob({**body, "metadata": {**body["metadata"], "uid": "x"}})
    gang = tj.gang()
    assert gang.pod_count == 5 and gang.total_gpus == 8
    assert [(p.name, p.count, p.gpus) for p in gang.pod_sets] == [
        ("worker", 4, 2),
        ("driver", 1, 0),
    ]
    # The workers are ranked first, the driver after them, whatever the listed order.
    assert JOBSET.pod_rank(child_pod("workers", 1, 1), jobset) == 3
    assert JOBSET.pod_rank(child_pod("driver", 0, 0), jobset) == 4


def test_gpu_pods_of_another_shape_are_a_pod_set_of_their_own():
    jobset = make_jobset(replicated("a", 1, 2), replicated("b", 1, 1, gpus="4"))
    spec = parse_queued_jobset(jobset)
    assert (spec.workers, spec.gpus_per_worker) == (2, 2)
    assert [(g.name, g.replicas, g.gpus) for g in spec.groups] == [("b", 1, 4)]
    assert JOBSET.pod_rank(child_pod("b", 0, 0), jobset) == 2


def test_ranks_run_through_the_replicated_jobs_in_order():
    jobset = make_jobset()
    ranks = [
        JOBSET.pod_rank(child_pod("a", 0, 0), jobset),
        JOBSET.pod_rank(child_pod("a", 0, 1), jobset),
        JOBSET.pod_rank(child_pod("b", 0, 0), jobset),
        JOBSET.pod_rank(child_pod("b", 1, 0), jobset),
    ]
    assert ranks == [0, 1, 2, 3]
    assert JOBSET.pod_rank(child_pod("b", 2, 0), jobset) is None  # no such child Job
    assert JOBSET.pod_rank(child_pod("zzz", 0, 0), jobset) is None


def test_the_first_resume_gates_every_replicated_jobs_pods():
    jobset = make_jobset()
    patch = JOBSET.resume_patch(jobset, "jobset-pair", 0)
    assert patch["spec"]["suspend"] is False
    for item in patch["spec"]["replicatedJobs"]:
        template = item["template"]["spec"]["template"]
        assert template["metadata"]["labels"][JOB_LABEL] == "jobset-pair"
        assert {"name": GANG_GATE} in template["spec"]["schedulingGates"]
        assert template["spec"]["containers"][0]["name"] == "t"  # the rest is kept
    prepared = copy.deepcopy(jobset)
    prepared["spec"]["replicatedJobs"] = patch["spec"]["replicatedJobs"]
    assert JOBSET.prepared(prepared, "jobset-pair")
    assert "replicatedJobs" not in JOBSET.resume_patch(prepared, "jobset-pair", 1)["spec"]


def test_a_jobset_pod_answers_to_the_jobsets_uid():
    jobset = make_jobset()
    pod = child_pod("a", 0, 1, **{JOB_LABEL: "jobset-pair", "gangshare.io/rank": "1"})
    pod["metadata"]["labels"]["gangshare.io/attempt"] = "0"
    assert JOBSET.owns(pod, jobset)
    who = worker_identity(pod)
    assert who is not None and who.uid == UID and who.batch
    stranger = copy.deepcopy(pod)
    stranger["metadata"]["labels"][JOBSET_UID_LABEL] = "another"
    assert not JOBSET.owns(stranger, jobset)
