"""batch/v1 Jobs queued as gangs, on the real control plane (kube-controller-manager's Job
controller and garbage collector, kube-scheduler with the extender, KWOK nodes, the operator).

An Indexed Job 2x4 is admitted whole, one NVLink island per pod, and Succeeds; a Job beyond
its queue's quota borrows, is reclaimed (suspended, requeued) and resumes to Succeed; the API
server refuses a labelled Job that is not suspended, naming the field; a Job that is no gang or
names a queue that does not exist says why on itself.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from test_no_stuck_gangs import reasons_of

from kube import Kube, NodePool, OperatorProcess, eventually
from tj import create, phase_is, status, trainingjob

pytestmark = pytest.mark.integration
QUEUE_LABEL = "gangshare.io/queue"


def batch_job(
    name: str,
    queue: str,
    pods: int,
    gpus: int,
    pool: NodePool,
    *,
    run_for: str = "3s",
    indexed: bool = True,
    scheduler: str | None = "gangshare-scheduler",
    suspend: bool = True,
    gpu_resource: str = "nvidia.com/gpu",
) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "nodeSelector": {"gangshare.io/pool": pool.label},
        "containers": [
            {
                "name": "trainer",
                "image": "example.invalid/train:1",
                "resources": {"limits": {gpu_resource: str(gpus)}},
            }
        ],
    }
    if scheduler is not None:
        pod["schedulerName"] = scheduler
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
        "spec": {
            "suspend": suspend,
            "parallelism": pods,
            "completions": pods,
            "completionMode": "Indexed" if indexed else "NonIndexed",
            "backoffLimit": 4,
            "template": {
                "metadata": {
                    "annotations": {
                        "gangshare.io/kwok-exit-code": "0",
                        "gangshare.io/kwok-run-for": run_for,
                    }
                },
                "spec": pod,
            },
        },
    }


def jobs_api(kube: Kube) -> client.BatchV1Api:
    return client.BatchV1Api(kube.core.api_client)


def read_job(kube: Kube, namespace: str, name: str) -> Any:
    return jobs_api(kube).read_namespaced_job(name, namespace)


def job_done(kube: Kube, namespace: str, name: str) -> str | None:
    job = read_job(kube, namespace, name)
    done = [c.type for c in job.status.conditions or [] if c.status == "True"]
    return next((kind for kind in ("Complete", "Failed") if kind in done), None)


def note(kube: Kube, namespace: str, name: str) -> str:
    return str(
        (read_job(kube, namespace, name).metadata.annotations or {}).get("gangshare.io/status", "")
    )


def test_an_indexed_job_runs_as_one_gang_one_island_per_pod(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path
):
    (node,) = pool.nodes(1, 8, islands=[[0, 1, 2, 3], [4, 5, 6, 7]])
    # Placed by gangshare's scheduler (the admission policy asks for it: its profile never
    # preempts), each pod pinned to its planned node by the affinity gangshare adds when it
    # ungates it.
    jobs_api(crd).create_namespaced_job(namespace, batch_job("index", "default", 2, 4, pool))
    operator = OperatorProcess(crd, tmp_path).start()
    try:
        done = eventually(
            lambda: phase_is(crd, namespace, "job-index", "Succeeded", "Failed"),
            timeout=90,
            what="the Job's TrainingJob finished",
        )
        assert done["phase"] == "Succeeded", done
        assert job_done(crd, namespace, "index") == "Complete"
        pods = crd.core.list_namespaced_pod(
            namespace, label_selector="gangshare.io/job=job-index"
        ).items
        assert len(pods) == 2, [p.metadata.name for p in pods]  # one attempt, no retries
        planned = {int(w["rank"]): tuple(w["gpus"]) for w in done["placement"]}
        islands = {(0, 1, 2, 3), (4, 5, 6, 7)}
        assert set(planned.values()) == islands, planned
        for pod in pods:
            rank = int(pod.metadata.labels["gangshare.io/rank"])
            # An Indexed Job's pod is its index's worker, on that rank's island.
            assert rank == int(pod.metadata.labels["batch.kubernetes.io/job-completion-index"])
            gpus = tuple(
                int(g) for g in pod.metadata.annotations["gangshare.io/planned-gpus"].split(",")
            )
            assert gpus == planned[rank] and pod.spec.node_name == node
            assert not pod.spec.scheduling_gates
        reasons = reasons_of(crd, namespace, "index")
        assert {"Resumed"} <= reasons, reasons
        assert note(crd, namespace, "index").startswith("Succeeded:")
        described = subprocess.run(
            crd.kubectl("describe", "job", "index", "-n", namespace),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert "gangshare.io/status: Succeeded" in described, described
    finally:
        operator.stop()


def test_a_job_beyond_its_quota_borrows_is_reclaimed_and_resumes(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path, queues: Any
):
    pool.nodes(1, 8)
    cohort = f"c{uuid.uuid4().hex[:6]}"
    lender = queues("lender", nominalGPUs=8, cohort=cohort)
    borrower = queues("borrower", nominalGPUs=0, cohort=cohort)
    operator = OperatorProcess(crd, tmp_path).start()
    try:
        body = batch_job(
            "borrow",
            borrower,
            1,
            8,
            pool,
            run_for="8s",
            indexed=False,
            scheduler="gangshare-scheduler",
        )
        jobs_api(crd).create_namespaced_job(namespace, body)
        running = eventually(
            lambda: phase_is(crd, namespace, "job-borrow", "Running"),
            timeout=60,
            what="the Job running on its cohort's idle quota",
        )
        # Its template fixes nvidia.com/gpu: it borrows whole idle GPUs, reclaimed first.
        assert running["borrowed"] is True and running["serviceClass"] == "Guaranteed"
        create(
            crd,
            namespace,
            trainingjob("lender-job", 1, 8, run_for="2s", queue=lender, gpuModel=pool.model),
        )
        requeued = eventually(
            lambda: (status(crd, namespace, "job-borrow").get("preemptions") or 0) >= 1 or None,
            timeout=60,
            what="the borrowing Job reclaimed and requeued",
        )
        assert requeued
        assert eventually(
            lambda: "Suspended" in reasons_of(crd, namespace, "borrow") or None,
            what="the Job's Suspended event",
        )
        lent = eventually(
            lambda: phase_is(crd, namespace, "lender-job", "Running", "Succeeded"),
            timeout=60,
            what="the lender's job started on its own quota",
        )
        assert not lent.get("borrowed")
        done = eventually(
            lambda: phase_is(crd, namespace, "job-borrow", "Succeeded", "Failed"),
            timeout=120,
            what="the Job resumed and finished",
        )
        assert done["phase"] == "Succeeded" and done["attempt"] >= 1, done
        assert job_done(crd, namespace, "borrow") == "Complete"
        assert "Resumed" in reasons_of(crd, namespace, "borrow")
    finally:
        operator.stop()


def test_the_api_server_refuses_a_labelled_job_that_is_not_suspended(
    crd: Kube, pool: NodePool, namespace: str
):
    body = batch_job("eager", "default", 1, 1, pool, suspend=False)
    with pytest.raises(ApiException) as refused:
        jobs_api(crd).create_namespaced_job(namespace, body)
    assert refused.value.status == 422
    message = json.loads(refused.value.body)["message"]
    assert "spec.suspend: a Job labelled gangshare.io/queue must be created with suspend: true" in (
        message
    )
    # Nor may its author start it before gangshare has admitted it.
    jobs_api(crd).create_namespaced_job(namespace, batch_job("later", "default", 1, 1, pool))
    with pytest.raises(ApiException) as resumed:
        jobs_api(crd).patch_namespaced_job("later", namespace, {"spec": {"suspend": False}})
    assert resumed.value.status == 422 and "spec.suspend" in resumed.value.body


def test_a_job_that_cannot_be_queued_says_why_on_itself(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path
):
    pool.nodes(1, 8)
    missing = f"nope-{uuid.uuid4().hex[:5]}"
    jobs_api(crd).create_namespaced_job(namespace, batch_job("lost", missing, 1, 2, pool))
    nogpu = batch_job("cpu-only", "default", 1, 1, pool)
    nogpu["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    jobs_api(crd).create_namespaced_job(namespace, nogpu)
    create(crd, namespace, trainingjob("lost-tj", 1, 2, queue=missing, gpuModel=pool.model))
    operator = OperatorProcess(crd, tmp_path).start()
    try:
        why = eventually(
            lambda: (
                "does not exist" in note(crd, namespace, "lost") and note(crd, namespace, "lost")
            ),
            timeout=60,
            what="the Job's note naming its missing queue",
        )
        assert why == f"Queued: queue {missing} does not exist (spec.queue)", why
        # The same reason for a TrainingJob (not "the whole cluster holds at most 0").
        tj = eventually(
            lambda: (
                missing in (status(crd, namespace, "lost-tj").get("message") or "")
                and status(crd, namespace, "lost-tj")
            ),
            timeout=60,
            what="the TrainingJob's reason naming its missing queue",
        )
        assert tj["message"] == f"queue {missing} does not exist (spec.queue)", tj
        assert read_job(crd, namespace, "lost").spec.suspend is True
        refused = eventually(
            lambda: (
                note(crd, namespace, "cpu-only").startswith("Invalid:")
                and note(crd, namespace, "cpu-only")
            ),
            what="the GPU-less Job's refusal",
        )
        assert "spec.template.spec.containers[0].resources.limits[nvidia.com/gpu]" in refused
        assert "InvalidSpec" in reasons_of(crd, namespace, "cpu-only")
        assert read_job(crd, namespace, "cpu-only").spec.suspend is True
        with pytest.raises(ApiException):
            crd.custom.get_namespaced_custom_object(
                "gangshare.io", "v1alpha1", namespace, "trainingjobs", "job-cpu-only"
            )
    finally:
        operator.stop()
