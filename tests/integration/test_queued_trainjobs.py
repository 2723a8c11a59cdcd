"""A Kubeflow Trainer TrainJob queued as one gang, on the real control plane with Trainer's
controller (v2.0.0) and JobSet's (both built from their Go modules by scripts/build-k8s.sh, run
by the local cluster: dev/kubeflow.py, dev/jobset.py).

A TrainJob labelled gangshare.io/queue is queued through the JobSet Trainer makes for it, sized
from that JobSet, and that JobSet is never queued a second time (even when the TrainJob's
spec.labels copy the queue label onto it); it is admitted whole, each pod pinned to its rank's
planned node and GPUs, and it ends by its own Complete; a borrowing one is suspended when its
lender returns and resumed whole; an unsuspended labelled one is refused, naming the field.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from borrowing import reclaimed_and_resumed
from kubernetes.client.exceptions import ApiException
from test_no_stuck_gangs import reasons_of
from test_unlike_pod_sets import assert_plan_honoured

from kube import Kube, NodePool, OperatorProcess, eventually
from tj import get, phase_is

pytestmark = pytest.mark.integration
GROUP, VERSION, PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"


@pytest.fixture
def runtime(crd: Kube, pool: NodePool) -> Iterator[str]:
    """A torch ClusterTrainingRuntime whose nodes ask 2 GPUs each, placed by gangshare's
    scheduler on the test's pool (a platform team writes these once)."""
    name = f"torch-gs-{uuid.uuid4().hex[:6]}"
    pod_template = {
        "metadata": {
            "annotations": {"gangshare.io/kwok-exit-code": "0", "gangshare.io/kwok-run-for": "4s"}
        },
        "spec": {
            "restartPolicy": "OnFailure",
            "schedulerName": "gangshare-scheduler",
            "nodeSelector": {"gangshare.io/pool": pool.label},
            "containers": [
                {
                    "name": "node",
                    "image": "example.invalid/train:1",
                    "resources": {"limits": {"nvidia.com/gpu": "2"}},
                }
            ],
        },
    }
    node = {
        "name": "node",
        "template": {
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
            "spec": {"template": pod_template},
        },
    }
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": 2}},
            "template": {"spec": {"replicatedJobs": [node]}},
        },
    }
    crd.custom.create_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", body)
    yield name
    crd.custom.delete_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", name)


def trainjob(
    name: str,
    runtime: str,
    nodes: int,
    queue: str = "default",
    suspend: bool = True,
    child_labelled: bool = True,
) -> dict[str, Any]:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name, "labels": {"gangshare.io/queue": queue}},
        "spec": {
            "runtimeRef": {"name": runtime},
            "trainer": {"numNodes": nodes},
            "suspend": suspend,
            # Trainer copies these onto the JobSet: it must still be queued once, as the TrainJob.
            "labels": {"gangshare.io/queue": queue},
        },
    }
    if not child_labelled:
        del body["spec"]["labels"]
    return body


def read(kube: Kube, namespace: str, name: str, plural: str = PLURAL) -> dict[str, Any]:
    group, version = (GROUP, VERSION) if plural == PLURAL else ("jobset.x-k8s.io", "v1alpha2")
    found: dict[str, Any] = kube.custom.get_namespaced_custom_object(
        group, version, namespace, plural, name
    )
    return found


def complete(obj: dict[str, Any]) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Complete" and c["status"] == "True" for c in conditions)


def test_a_trainjob_runs_as_one_gang_through_its_jobset(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path, runtime: str
):
    pool.nodes(2, 4)
    name = "llm-" + uuid.uuid4().hex[:5]
    crd.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, trainjob(name, runtime, 3)
    )
    operator = OperatorProcess(crd, tmp_path).start()
    try:
        done = eventually(
            lambda: phase_is(crd, namespace, f"trainjob-{name}", "Succeeded", "Failed"),
            timeout=150,
            what="the TrainJob's TrainingJob finished",
        )
        assert done["phase"] == "Succeeded", done
        assert complete(read(crd, namespace, name))
        record = get(crd, namespace, f"trainjob-{name}")
        child = read(crd, namespace, name, "jobsets")
        # Sized from the JobSet Trainer made: 3 nodes x 2 GPUs.
        assert (record["spec"]["workers"], record["spec"]["gpusPerWorker"]) == (3, 2)
        assert record["spec"]["jobRef"]["kind"] == "TrainJob"
        assert record["spec"]["jobRef"]["podsUID"] == child["metadata"]["uid"]
        # Its JobSet carries the queue label too, and was never queued on its own.
        assert child["metadata"]["labels"]["gangshare.io/queue"] == "default"
        with pytest.raises(ApiException) as missing:
            get(crd, namespace, f"jobset-{name}")
        assert missing.value.status == 404
        pods = assert_plan_honoured(crd, namespace, f"trainjob-{name}", done)
        ranks = sorted(
            (
                int(p.metadata.labels["batch.kubernetes.io/job-completion-index"]),
                int(p.metadata.labels["gangshare.io/rank"]),
            )
            for p in pods
        )
        assert ranks == [(0, 0), (1, 1), (2, 2)]  # one attempt; the node rank is the gang rank
        assert len({p.spec.node_name for p in pods}) == 2  # 6 GPUs on two 4-GPU nodes
        assert "Resumed" in reasons_of(crd, namespace, name)
    finally:
        operator.stop()


def test_a_borrowing_trainjob_is_suspended_for_its_lender_and_resumes_whole(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path, queues: Any, runtime: str
):
    def submit(queue: str) -> None:
        # Its JobSet unlabelled this time: ranked with the TrainJob's own queue labels.
        body = trainjob("lend", runtime, 2, queue=queue, child_labelled=False)
        crd.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    def suspended() -> bool:
        found = read(crd, namespace, "lend")
        return found["spec"]["suspend"] is True or complete(found)

    _, last = reclaimed_and_resumed(
        crd, pool, namespace, tmp_path, queues, submit, "trainjob-lend", suspended
    )
    assert complete(read(crd, namespace, "lend"))
    assert sorted(int(p.metadata.labels["gangshare.io/rank"]) for p in last) == [0, 1]
    assert {"Suspended", "Resumed"} <= reasons_of(crd, namespace, "lend")


def test_the_api_server_refuses_a_labelled_trainjob_that_is_not_suspended(
    crd: Kube, pool: NodePool, namespace: str, runtime: str
):
    with pytest.raises(ApiException) as refused:
        crd.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, trainjob("eager", runtime, 1, suspend=False)
        )
    assert refused.value.status == 422
    message = json.loads(refused.value.body)["message"]
    assert "spec.suspend: a TrainJob labelled gangshare.io/queue" in message


def test_a_trainjob_whose_runtime_is_missing_is_refused_naming_it(crd: Kube, namespace: str):
    # Trainer's own webhook looks the runtime up: the API server refuses the TrainJob, so it
    # never reaches a queue.
    with pytest.raises(ApiException) as refused:
        crd.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, trainjob("lost", "no-such-runtime", 1)
        )
    assert refused.value.status in (400, 403, 422), refused.value
    message = json.loads(refused.value.body)["message"]
    assert "no-such-runtime" in message, message
