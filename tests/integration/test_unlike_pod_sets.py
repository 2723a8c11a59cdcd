"""Gangs of unlike pods on the real control plane: a JobSet's CPU-only driver beside its GPU
workers (JobSet's own driver/worker pattern), and a TrainingJob's replica group (a CPU-only
launcher beside its workers). Each is admitted whole, every pod pinned to its planned node (the
GPU pods to their planned GPUs), and ends by its own completion.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from borrowing import reclaimed_and_resumed
from test_jobsets import GROUP, PLURAL, VERSION, read, replicated

from kube import Kube, NodePool, OperatorProcess, eventually
from tj import create, phase_is, trainingjob

pytestmark = pytest.mark.integration
CPU_REQUESTS = {"cpu": "500m", "memory": "256Mi"}


def cpu_only(item: dict[str, Any]) -> dict[str, Any]:
    container = item["template"]["spec"]["template"]["spec"]["containers"][0]
    container["resources"] = {"requests": dict(CPU_REQUESTS), "limits": dict(CPU_REQUESTS)}
    return item


def assert_plan_honoured(kube: Kube, namespace: str, job: str, done: dict[str, Any]) -> list[Any]:
    pods = kube.core.list_namespaced_pod(namespace, label_selector=f"gangshare.io/job={job}").items
    planned = {int(w["rank"]): (w["node"], tuple(w["gpus"])) for w in done["placement"]}
    assert sorted(int(p.metadata.labels["gangshare.io/rank"]) for p in pods) == sorted(planned)
    for pod in pods:
        rank = int(pod.metadata.labels["gangshare.io/rank"])
        node, gpus = planned[rank]
        assert pod.spec.node_name == node, (pod.metadata.name, node)
        assert pod.metadata.annotations["gangshare.io/planned-node"] == node
        recorded = pod.metadata.annotations.get("gangshare.io/planned-gpus")
        if gpus:
            assert tuple(int(g) for g in recorded.split(",")) == gpus, pod.metadata.name
        else:
            assert recorded is None, pod.metadata.name  # a CPU-only pod is planned a node only
        assert not pod.spec.scheduling_gates
    return list(pods)


def test_a_jobsets_cpu_driver_and_gpu_workers_run_as_one_gang(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path
):
    pool.nodes(2, 8, islands=[[0, 1, 2, 3], [4, 5, 6, 7]])
    items = [cpu_only(replicated("driver", 1, 0, pool)), replicated("workers", 4, 2, pool)]
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "JobSet",
        "metadata": {"name": "dw", "labels": {"gangshare.io/queue": "default"}},
        "spec": {"suspend": True, "replicatedJobs": items},
    }
    crd.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    operator = OperatorProcess(crd, tmp_path).start()
    try:
        done = eventually(
            lambda: phase_is(crd, namespace, "jobset-dw", "Succeeded", "Failed"),
            timeout=120,
            what="the JobSet's TrainingJob finished",
        )
        assert done["phase"] == "Succeeded", done
        record = crd.custom.get_namespaced_custom_object(
            "gangshare.io", "v1alpha1", namespace, "trainingjobs", "jobset-dw"
        )
        assert (record["spec"]["workers"], record["spec"]["gpusPerWorker"]) == (4, 2)
        assert [(g["name"], g["replicas"], g["gpus"]) for g in record["spec"]["replicaGroups"]] == [
            ("driver", 1, 0)
        ]
        pods = assert_plan_honoured(crd, namespace, "jobset-dw", done)
        assert len(pods) == 5  # one attempt, no retries
        driver = next(
            p
            for p in pods
            if p.metadata.labels["jobset.sigs.k8s.io/replicatedjob-name"] == "driver"
        )
        # Ranked after the workers though listed first; placed beside them.
        assert driver.metadata.labels["gangshare.io/rank"] == "4"
        worker_nodes = {p.spec.node_name for p in pods if p is not driver}
        assert driver.spec.node_name in worker_nodes
        conditions = read(crd, namespace, "dw")["status"]["conditions"]
        assert any(c["type"] == "Completed" and c["status"] == "True" for c in conditions)
    finally:
        operator.stop()


def test_a_trainingjob_with_a_cpu_launcher_group_runs_as_one_gang(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path
):
    pool.nodes(1, 8)
    body = trainingjob("mpi", 2, 4, gpuModel=pool.model)
    launcher = {
        "metadata": {
            "annotations": {
                "gangshare.io/kwok-exit-code": "0",
                "gangshare.io/kwok-run-for": "2s",
            }
        },
        "spec": {
            "containers": [
                {
                    "name": "launcher",
                    "image": "example.invalid/launch:1",
                    "resources": {"requests": dict(CPU_REQUESTS)},
                }
            ]
        },
    }
    body["spec"]["replicaGroups"] = [{"name": "launcher", "replicas": 1, "template": launcher}]
    create(crd, namespace, body)
    operator = OperatorProcess(crd, tmp_path).start()
    try:
        done = eventually(
            lambda: phase_is(crd, namespace, "mpi", "Succeeded", "Failed"),
            timeout=90,
            what="the TrainingJob finished",
        )
        assert done["phase"] == "Succeeded", done
        pods = {p.metadata.name: p for p in assert_plan_honoured(crd, namespace, "mpi", done)}
        assert sorted(pods) == ["mpi-launcher-0", "mpi-worker-0", "mpi-worker-1"]
        launcher_pod = pods["mpi-launcher-0"]
        assert launcher_pod.metadata.labels["gangshare.io/replica-group"] == "launcher"
        assert launcher_pod.metadata.labels["gangshare.io/rank"] == "2"
        limits = launcher_pod.spec.containers[0].resources.limits or {}
        assert "nvidia.com/gpu" not in limits
        env = {e.name: e.value for e in launcher_pod.spec.containers[0].env}
        assert env["GANGSHARE_REPLICA_GROUP"] == "launcher"
        assert env["MASTER_ADDR"].startswith("mpi-worker-0.mpi.")
        worker_limits = pods["mpi-worker-0"].spec.containers[0].resources.limits
        assert worker_limits["nvidia.com/gpu"] == "4"
    finally:
        operator.stop()


def test_a_borrowing_gang_with_a_launcher_is_reclaimed_and_resumed_whole(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path, queues: Any
):
    def submit(queue: str) -> None:
        body = trainingjob("mpi", 2, 4, run_for="8s", queue=queue, gpuModel=pool.model)
        annotations = dict(body["spec"]["template"]["metadata"]["annotations"])
        launcher = {
            "metadata": {"annotations": annotations},
            "spec": {"containers": [{"name": "launcher", "image": "example.invalid/l:1"}]},
        }
        body["spec"]["replicaGroups"] = [{"name": "launcher", "replicas": 1, "template": launcher}]
        create(crd, namespace, body)

    _, last = reclaimed_and_resumed(crd, pool, namespace, tmp_path, queues, submit, "mpi")
    # The resumed attempt ran whole, its launcher with it.
    assert sorted(p.metadata.name for p in last) == [
        "mpi-launcher-0",
        "mpi-worker-0",
        "mpi-worker-1",
    ]
