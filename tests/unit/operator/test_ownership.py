"""Ownership is what the controllers wrote (issue #36, item 6), pure: a queued Job's or JobSet's
pod is judged by its whole controller reference, never by a uid alone or a label alone.

A tenant in the namespace can read any Job's name and uid and write them into its own pod's
ownerReferences (admission refuses that where gangshare reads the pod: crds/pod-owner-policy.yaml,
tests/integration/test_forged_owners.py); the code must not take less than the whole reference
either, or a pod naming the right uid under another name or kind would be given a rank's plan.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from batch_jobs import UID, job_pod, make_batch_job

from gangshare.core.annotations import ATTEMPT_LABEL, JOB_LABEL
from gangshare.kube.batchjob import JOB
from gangshare.kube.jobset import (
    API_VERSION,
    JOB_INDEX_LABEL,
    JOBSET,
    JOBSET_NAME_LABEL,
    JOBSET_UID_LABEL,
    REPLICATED_JOB_LABEL,
    child_job_name,
)
from gangshare.kube.ownership import controlled_by
from gangshare.kube.queued import COMPLETION_INDEX_LABEL

JOBSET_UID = "jobset-uid-1"


def a_jobset() -> dict[str, Any]:
    def replicated(name: str, replicas: int) -> dict[str, Any]:
        pod = {"spec": {"containers": [{"name": "t"}]}}
        return {"name": name, "replicas": replicas, "template": {"spec": {"template": pod}}}

    return {
        "metadata": {"name": "pair", "namespace": "team", "uid": JOBSET_UID},
        "spec": {"suspend": True, "replicatedJobs": [replicated("a", 1), replicated("b", 2)]},
    }


def jobset_pod(job_name: str, item: str = "b", index: int = 1) -> dict[str, Any]:
    """A pod as the Job controller makes it for a child Job named `job_name`."""
    return {
        "metadata": {
            "name": f"{job_name}-0-x",
            "namespace": "team",
            "labels": {
                JOB_LABEL: "jobset-pair",
                JOBSET_NAME_LABEL: "pair",
                JOBSET_UID_LABEL: JOBSET_UID,
                REPLICATED_JOB_LABEL: item,
                JOB_INDEX_LABEL: str(index),
                COMPLETION_INDEX_LABEL: "0",
            },
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job_name,
                    "uid": f"uid-of-{job_name}",
                    "controller": True,
                }
            ],
        },
        "status": {"phase": "Running"},
    }


def with_ref(pod: dict[str, Any], **ref: Any) -> dict[str, Any]:
    forged = copy.deepcopy(pod)
    forged["metadata"]["ownerReferences"][0].update(ref)
    return forged


@pytest.mark.parametrize(
    ("forgery", "ref"),
    [
        ("another-name", {"name": "someone-elses"}),
        ("another-kind", {"kind": "TrainingJob", "apiVersion": "gangshare.io/v1alpha1"}),
        ("another-api-version", {"apiVersion": "batch/v2"}),
        ("not-the-controller", {"controller": False}),
        ("another-uid", {"uid": "someone-elses"}),
    ],
)
def test_a_pod_is_a_jobs_only_when_its_controller_reference_names_the_job_whole(forgery, ref):
    job = make_batch_job().running(0).build()
    pod = job_pod(job, 0, gated=True)
    assert JOB.owns(pod, job)
    # The Job's uid alone was enough before: a tenant's pod naming it under any name or kind.
    assert not JOB.owns(with_ref(pod, **ref), job), forgery


def test_a_job_without_a_uid_owns_nothing():
    job = make_batch_job().running(0).build()
    assert job["metadata"]["uid"] == UID
    pod = with_ref(job_pod(job, 0), uid="")
    job["metadata"]["uid"] = ""
    assert not JOB.owns(pod, job)


def test_a_jobset_pod_is_the_jobsets_only_through_a_child_job_of_its_own_name():
    jobset = a_jobset()
    assert child_job_name(jobset_pod("pair-b-1"), jobset) == "pair-b-1"
    assert JOBSET.owns(jobset_pod("pair-b-1"), jobset)
    # The uid label, readable by anyone, named the JobSet; the pod's Job is the tenant's own.
    assert not JOBSET.owns(jobset_pod("mine"), jobset)
    # A child's name for another place than the pod's labels say, or a child it does not have.
    assert not JOBSET.owns(jobset_pod("pair-a-0"), jobset)
    assert not JOBSET.owns(jobset_pod("pair-b-2", index=2), jobset)
    assert child_job_name(jobset_pod("pair-zzz-0", item="zzz", index=0), jobset) is None
    # A reference to a child Job that is no controller's, or to something else of that name.
    assert not JOBSET.owns(with_ref(jobset_pod("pair-b-1"), controller=False), jobset)
    assert not JOBSET.owns(with_ref(jobset_pod("pair-b-1"), kind="Pod"), jobset)
    # Another JobSet's pod (JobSet's controller labels pods with their own JobSet's uid).
    stranger = jobset_pod("pair-b-1")
    stranger["metadata"]["labels"][JOBSET_UID_LABEL] = "another"
    assert not JOBSET.owns(stranger, jobset)


def test_a_tenants_pod_keeps_no_jobset_from_resuming():
    jobset = a_jobset()
    jobset["status"] = {"conditions": [{"type": "Suspended", "status": "True"}]}
    tenants = jobset_pod("mine")
    tenants["metadata"]["labels"][ATTEMPT_LABEL] = "0"
    assert JOBSET.may_resume(jobset, [tenants])
    own = jobset_pod("pair-b-1")
    own["metadata"]["labels"][ATTEMPT_LABEL] = "0"
    assert not JOBSET.may_resume(jobset, [tenants, own])


def test_a_job_is_a_jobsets_by_its_controller_reference_not_its_jobset_labels():
    jobset = a_jobset()
    labels = {JOBSET_NAME_LABEL: "pair", JOBSET_UID_LABEL: JOBSET_UID}
    child: dict[str, Any] = {
        "metadata": {
            "name": "pair-b-1",
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": "JobSet",
                    "name": "pair",
                    "uid": JOBSET_UID,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        }
    }
    assert controlled_by(child, jobset, API_VERSION, "JobSet")
    # A tenant's Job under a child's name, labelled as the JobSet's: its labels say nothing.
    posing = copy.deepcopy(child)
    posing["metadata"]["ownerReferences"] = []
    assert not controlled_by(posing, jobset, API_VERSION, "JobSet")
    # A namesake JobSet deleted and made again is another owner: the uid is judged too.
    older = copy.deepcopy(child)
    older["metadata"]["ownerReferences"][0]["uid"] = "jobset-uid-0"
    assert not controlled_by(older, jobset, API_VERSION, "JobSet")
    assert not controlled_by(child, jobset, API_VERSION, "Job")
