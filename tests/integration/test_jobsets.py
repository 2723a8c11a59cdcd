"""A JobSet queued as one gang, on the real control plane with JobSet's own controller (built
from sigs.k8s.io/jobset by scripts/build-k8s.sh, run by the local cluster: dev/jobset.py).

A JobSet of two replicated jobs is one gang: admitted whole, every pod gated until all of them
exist, each given its own rank and place, and the JobSet completes; an unsuspended labelled
JobSet is refused by the API server, naming the field.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from test_no_stuck_gangs import reasons_of

from kube import Kube, NodePool, OperatorProcess, eventually
from tj import create, phase_is, status, trainingjob

pytestmark = pytest.mark.integration
GROUP, VERSION, PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"


def replicated(name: str, pods: int, gpus: int, pool: NodePool) -> dict[str, Any]:
    return {
        "name": name,
        "replicas": 1,
        "template": {
            "spec": {
                "parallelism": pods,
                "completions": pods,
                "completionMode": "Indexed",
                "template": {
                    "metadata": {
                        "annotations": {
                            "gangshare.io/kwok-exit-code": "0",
                            "gangshare.io/kwok-run-for": "3s",
                        }
                    },
                    "spec": {
                        "restartPolicy": "Never",
                        "schedulerName": "gangshare-scheduler",
                        "nodeSelector": {"gangshare.io/pool": pool.label},
                        "containers": [
                            {
                                "name": "trainer",
                                "image": "example.invalid/train:1",
                                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                            }
                        ],
                    },
                },
            }
        },
    }


def jobset(
    name: str, pool: NodePool, suspend: bool = True, queue: str = "default", run_for: str = "3s"
) -> dict[str, Any]:
    items = [replicated("leaders", 2, 2, pool), replicated("workers", 2, 2, pool)]
    for item in items:
        annotations = item["template"]["spec"]["template"]["metadata"]["annotations"]
        annotations["gangshare.io/kwok-run-for"] = run_for
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "JobSet",
        "metadata": {"name": name, "labels": {"gangshare.io/queue": queue}},
        "spec": {"suspend": suspend, "replicatedJobs": items},
    }


def read(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    return found


def test_a_jobset_of_two_replicated_jobs_runs_as_one_gang(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path
):
    (node,) = pool.nodes(1, 8, islands=[[0, 1, 2, 3], [4, 5, 6, 7]])
    crd.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, jobset("pair", pool)
    )
    operator = OperatorProcess(crd, tmp_path).start()
    try:
        done = eventually(
            lambda: phase_is(crd, namespace, "jobset-pair", "Succeeded", "Failed"),
            timeout=120,
            what="the JobSet's TrainingJob finished",
        )
        assert done["phase"] == "Succeeded", done
        conditions = read(crd, namespace, "pair")["status"]["conditions"]
        assert any(c["type"] == "Completed" and c["status"] == "True" for c in conditions)
        pods = crd.core.list_namespaced_pod(
            namespace, label_selector="gangshare.io/job=jobset-pair"
        ).items
        assert len(pods) == 4, [p.metadata.name for p in pods]  # one attempt, no retries
        planned = {int(w["rank"]): (w["node"], tuple(w["gpus"])) for w in done["placement"]}
        ranks = set()
        for pod in pods:
            labels = pod.metadata.labels
            rank = int(labels["gangshare.io/rank"])
            ranks.add(rank)
            # Replicated jobs in order, then the child Job's index, then the completion index.
            offset = 0 if labels["jobset.sigs.k8s.io/replicatedjob-name"] == "leaders" else 2
            assert rank == offset + int(labels["batch.kubernetes.io/job-completion-index"])
            gpus = pod.metadata.annotations["gangshare.io/planned-gpus"]
            assert (pod.spec.node_name, tuple(int(g) for g in gpus.split(","))) == planned[rank]
            assert pod.spec.node_name == node and not pod.spec.scheduling_gates
        assert ranks == {0, 1, 2, 3}
        assert "Resumed" in reasons_of(crd, namespace, "pair")
    finally:
        operator.stop()


def test_a_borrowing_jobset_is_suspended_for_its_lender_and_resumes_whole(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path, queues: Any
):
    pool.nodes(1, 8)
    cohort = f"c{uuid.uuid4().hex[:6]}"
    lender = queues("lender", nominalGPUs=8, cohort=cohort)
    borrower = queues("borrower", nominalGPUs=0, cohort=cohort)
    operator = OperatorProcess(crd, tmp_path).start()
    try:
        crd.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, jobset("lend", pool, queue=borrower, run_for="8s")
        )
        running = eventually(
            lambda: phase_is(crd, namespace, "jobset-lend", "Running"),
            timeout=60,
            what="the JobSet running on its cohort's idle quota",
        )
        assert running["borrowed"] is True
        create(
            crd,
            namespace,
            trainingjob("lender-job", 1, 8, run_for="2s", queue=lender, gpuModel=pool.model),
        )
        eventually(
            lambda: (status(crd, namespace, "jobset-lend").get("preemptions") or 0) >= 1 or None,
            timeout=60,
            what="the JobSet reclaimed and requeued",
        )
        assert eventually(
            lambda: phase_is(crd, namespace, "lender-job", "Running", "Succeeded"),
            timeout=60,
            what="the lender's job started on its own quota",
        )
        done = eventually(
            lambda: phase_is(crd, namespace, "jobset-lend", "Succeeded", "Failed"),
            timeout=150,
            what="the JobSet resumed and finished",
        )
        assert done["phase"] == "Succeeded" and done["attempt"] >= 1, done
        pods = crd.core.list_namespaced_pod(
            namespace, label_selector="gangshare.io/job=jobset-lend"
        ).items
        finished = [
            p for p in pods if p.metadata.labels.get("gangshare.io/attempt") == str(done["attempt"])
        ]
        # The resumed attempt ran whole: all four pods, each its own rank.
        assert sorted(int(p.metadata.labels["gangshare.io/rank"]) for p in finished) == [0, 1, 2, 3]
        assert {"Suspended", "Resumed"} <= reasons_of(crd, namespace, "lend")
    finally:
        operator.stop()


def test_the_api_server_refuses_a_labelled_jobset_that_is_not_suspended(
    crd: Kube, pool: NodePool, namespace: str
):
    with pytest.raises(ApiException) as refused:
        crd.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, jobset("eager", pool, suspend=False)
        )
    assert refused.value.status == 422
    message = json.loads(refused.value.body)["message"]
    assert "spec.suspend: a JobSet labelled gangshare.io/queue must be created with" in message
