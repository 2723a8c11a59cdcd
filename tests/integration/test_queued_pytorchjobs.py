"""A Kubeflow PyTorchJob queued as one gang, on the real control plane with the
training-operator (v1.8.1, built from its Go module by scripts/build-k8s.sh, run by the local
cluster: dev/kubeflow.py).

A PyTorchJob of a Master and two Workers is one gang: admitted whole, every pod gated until all
of them exist, each given its rank's planned node and GPUs, and it ends by its own Succeeded; a
borrowing one is suspended (runPolicy.suspend) when its lender returns and resumed whole; an
unsuspended labelled one is refused by the API server, naming the field.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from borrowing import reclaimed_and_resumed
from kubernetes.client.exceptions import ApiException
from test_no_stuck_gangs import reasons_of
from test_unlike_pod_sets import assert_plan_honoured

from kube import Kube, NodePool, OperatorProcess, eventually
from tj import phase_is

pytestmark = pytest.mark.integration
GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "pytorchjobs"


def replica(count: int, gpus: int, pool: NodePool, run_for: str) -> dict[str, Any]:
    return {
        "replicas": count,
        "restartPolicy": "Never",
        "template": {
            "metadata": {
                "annotations": {
                    "gangshare.io/kwok-exit-code": "0",
                    "gangshare.io/kwok-run-for": run_for,
                }
            },
            "spec": {
                "schedulerName": "gangshare-scheduler",
                "nodeSelector": {"gangshare.io/pool": pool.label},
                "containers": [
                    {
                        "name": "pytorch",
                        "image": "example.invalid/train:1",
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                    }
                ],
            },
        },
    }


def pytorchjob(
    name: str, pool: NodePool, suspend: bool = True, queue: str = "default", run_for: str = "3s"
) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PyTorchJob",
        "metadata": {"name": name, "labels": {"gangshare.io/queue": queue}},
        "spec": {
            "runPolicy": {"suspend": suspend},
            "pytorchReplicaSpecs": {
                "Master": replica(1, 2, pool, run_for),
                "Worker": replica(2, 2, pool, run_for),
            },
        },
    }


def read(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    return found


def succeeded(obj: dict[str, Any]) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Succeeded" and c["status"] == "True" for c in conditions)


def test_a_pytorchjob_runs_as_one_gang_of_master_and_workers(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path
):
    pool.nodes(2, 4)
    name = "ddp-" + uuid.uuid4().hex[:5]
    crd.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, pytorchjob(name, pool)
    )
    operator = OperatorProcess(crd, tmp_path).start()
    try:
        done = eventually(
            lambda: phase_is(crd, namespace, f"pytorchjob-{name}", "Succeeded", "Failed"),
            timeout=120,
            what="the PyTorchJob's TrainingJob finished",
        )
        assert done["phase"] == "Succeeded", done
        assert succeeded(read(crd, namespace, name))
        pods = assert_plan_honoured(crd, namespace, f"pytorchjob-{name}", done)
        ranks = {
            (
                p.metadata.labels["training.kubeflow.org/replica-type"],
                p.metadata.labels["training.kubeflow.org/replica-index"],
            ): int(p.metadata.labels["gangshare.io/rank"])
            for p in pods
        }
        # Ranked as the training-operator ranks them: the master 0, worker i at i + 1.
        assert ranks == {("master", "0"): 0, ("worker", "0"): 1, ("worker", "1"): 2}
        # 3 pods x 2 GPUs on two 4-GPU nodes: the plan spans both, each pod where it was planned.
        assert len({p.spec.node_name for p in pods}) == 2
        assert "Resumed" in reasons_of(crd, namespace, name)
    finally:
        operator.stop()


def test_a_borrowing_pytorchjob_is_suspended_for_its_lender_and_resumes_whole(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path, queues: Any
):
    def submit(queue: str) -> None:
        body = pytorchjob("lend", pool, queue=queue, run_for="8s")
        crd.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    _, last = reclaimed_and_resumed(
        crd,
        pool,
        namespace,
        tmp_path,
        queues,
        submit,
        "pytorchjob-lend",
        # Reclaimed by suspension: the training-operator deletes the pods.
        suspended=lambda: read(crd, namespace, "lend")["spec"]["runPolicy"]["suspend"] is True,
    )
    assert succeeded(read(crd, namespace, "lend"))
    # The resumed attempt ran whole: all three pods, each its own rank.
    assert sorted(int(p.metadata.labels["gangshare.io/rank"]) for p in last) == [0, 1, 2]
    assert {"Suspended", "Resumed"} <= reasons_of(crd, namespace, "lend")


def test_the_api_server_refuses_a_labelled_pytorchjob_that_is_not_suspended(
    crd: Kube, pool: NodePool, namespace: str
):
    with pytest.raises(ApiException) as refused:
        crd.custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, pytorchjob("eager", pool, suspend=False)
        )
    assert refused.value.status == 422
    message = json.loads(refused.value.body)["message"]
    assert "spec.runPolicy.suspend: a PyTorchJob labelled gangshare.io/queue" in message
