"""Kubeflow Trainer v2.0.0 and training-operator v1.8.1 on their own, on the real control plane
(built from their Go modules by scripts/build-k8s.sh, run by the local cluster after JobSet's
controller: dev/kubeflow.py), with no gangshare involvement: no queue label, no operator, pods on
the default scheduler and KWOK's simulated GPU nodes.

What the controllers put on their children, as seen here (for mapping pods to ranks):

- TrainJob T -> JobSet T (same name and namespace), controller ownerReference to the TrainJob,
  `spec.suspend` = the TrainJob's. Its labels/annotations are the runtime's `template.metadata`
  ones merged with the TrainJob's `spec.labels`/`spec.annotations` (not its metadata labels);
  Trainer adds no label of its own (there is no `trainer.kubeflow.org/trainjob-name`): the
  JobSet's name is the TrainJob's. The runtime's replicated job `node` (marked
  `trainer.kubeflow.org/trainjob-ancestor-step: trainer`, a label that reaches the child Job but
  not its pods) gets replicas 1, parallelism = completions = `spec.trainer.numNodes` (else
  `mlPolicy.numNodes`), completionMode Indexed (JobSet's default); container `node` gets
  PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (from the pod's
  `batch.kubernetes.io/job-completion-index` annotation), PET_MASTER_ADDR `T-node-0-0.T`,
  PET_MASTER_PORT and container port 29500.
- Its pods (`T-node-0-<index>-<random>`) carry JobSet's and the Job's labels only:
  `jobset.sigs.k8s.io/` `jobset-name: T`, `jobset-uid`, `replicatedjob-name: node`,
  `replicatedjob-replicas`, `job-index`, `job-global-index`, `job-group-index`, `group-name`,
  `group-replicas`, `global-replicas`, `job-key`, `restart-attempt`, and
  `batch.kubernetes.io/job-completion-index` (= the node rank, also an annotation),
  `batch.kubernetes.io/job-name`, `batch.kubernetes.io/controller-uid`.
- PyTorchJob P -> pods `P-master-0`, `P-worker-<i>` (no Job) and headless Services of the same
  names (port 23456), each pod with a controller ownerReference to the PyTorchJob and the labels
  `training.kubeflow.org/job-name: P`, `training.kubeflow.org/operator-name:
  pytorchjob-controller`, `training.kubeflow.org/replica-type: master|worker` (lower case),
  `training.kubeflow.org/replica-index` (per replica type, from 0), and
  `training.kubeflow.org/job-role: master` on the master only. Env: RANK / PET_NODE_RANK 0 for the
  master and i+1 for worker i, WORLD_SIZE / PET_NNODES, MASTER_ADDR `P-master-0`, MASTER_PORT
  23456; workers get an init container `init-pytorch` (alpine:3.10, waits for the master's DNS;
  KWOK skips it).

Per-pod overrides of a TrainJob (v2.0.0): `spec.podSpecOverrides`, a list of
{`targetJobs: [{name}]` (the runtime's replicated jobs), `serviceAccountName`, `nodeSelector`,
`tolerations`, `volumes`, `initContainers`/`containers` (by name: `env`, `volumeMounts`; no env
on the `node` container), `schedulingGates`}: no affinity (an unknown field, pruned), no resources
(`spec.trainer.resourcesPerNode`). Trainer's webhook refuses any change to it unless the update
leaves the TrainJob suspended and no replicated job of its JobSet has active pods. While the
TrainJob is suspended Trainer re-applies the JobSet from it (server-side apply: a field dropped
from the overrides leaves the JobSet too). But JobSet made the child Jobs, suspended, when the
JobSet was created, and on resume it only merges the JobSet's pod-template labels, annotations,
nodeSelector, tolerations and schedulingGates into them: overrides changed while suspended add
to what the pods get; a value removed, or another field, does not reach them. Below, the pool's
nodeSelector is set that way.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kube import Kube, NodePool, eventually

pytestmark = pytest.mark.integration
TRAINER = ("trainer.kubeflow.org", "v1alpha1")
JOBSET = ("jobset.x-k8s.io", "v1alpha2")
KUBEFLOW = ("kubeflow.org", "v1")
# The image the other integration tests name: KWOK never pulls it.
IMAGE = "example.invalid/train:1"
RUN = {"gangshare.io/kwok-exit-code": "0", "gangshare.io/kwok-run-for": "3s"}


@pytest.fixture(scope="module", autouse=True)
def controllers(kube: Kube) -> None:
    for name in ("jobset-controller", "trainer-controller-manager", "training-operator"):
        if name not in kube.state.pids:
            # Not a skip: `make test` builds them (the k8s target) before any test runs.
            pytest.fail(f"{name} is not running: run scripts/build-k8s.sh (make k8s) to build it")


@pytest.fixture
def pool(kube: Kube, namespace: str) -> Iterator[NodePool]:
    """The test's own GPU nodes, without gangshare's CRDs (the shared `pool` needs them)."""
    created = NodePool(kube, namespace)
    yield created
    created.cleanup()


@pytest.fixture
def runtime(kube: Kube) -> Iterator[str]:
    """A minimal torch ClusterTrainingRuntime: one replicated job `node` whose container `node`
    runs a short shell command (KWOK ends it with exit code 0); no node selector."""
    name = f"torch-min-{uuid.uuid4().hex[:6]}"
    container = {
        "name": "node",
        "image": IMAGE,
        "command": ["sh", "-c", "echo node rank $PET_NODE_RANK; exit 0"],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    pod_template = {
        "metadata": {"annotations": dict(RUN)},
        "spec": {
            "restartPolicy": "OnFailure",
            "containers": [container],
        },
    }
    node = {
        "name": "node",
        "template": {
            # Marks the job Trainer sizes with numNodes and fills with torchrun's env.
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
            "spec": {"template": pod_template},
        },
    }
    body = {
        "apiVersion": "/".join(TRAINER),
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": 1}},
            "template": {"spec": {"replicatedJobs": [node]}},
        },
    }
    kube.custom.create_cluster_custom_object(*TRAINER, "clustertrainingruntimes", body)
    yield name
    kube.custom.delete_cluster_custom_object(*TRAINER, "clustertrainingruntimes", name)


def condition(obj: dict[str, Any], kind: str) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)


def kube_batch(kube: Kube) -> client.BatchV1Api:
    return client.BatchV1Api(kube.api_client)


def pods(kube: Kube, namespace: str, selector: str) -> list[Any]:
    return list(kube.core.list_namespaced_pod(namespace, label_selector=selector).items)


def test_a_suspended_trainjob_makes_a_suspended_jobset_and_runs_to_completion_once_resumed(
    kube: Kube, pool: NodePool, namespace: str, runtime: str
):
    pool.nodes(1, 8)
    name = "tj-" + uuid.uuid4().hex[:6]

    def trainjob() -> dict[str, Any]:
        found: dict[str, Any] = kube.custom.get_namespaced_custom_object(
            *TRAINER, namespace, "trainjobs", name
        )
        return found

    def jobset() -> dict[str, Any]:
        found: dict[str, Any] = kube.custom.get_namespaced_custom_object(
            *JOBSET, namespace, "jobsets", name
        )
        return found

    kube.custom.create_namespaced_custom_object(
        *TRAINER,
        namespace,
        "trainjobs",
        {
            "apiVersion": "/".join(TRAINER),
            "kind": "TrainJob",
            "metadata": {"name": name},
            "spec": {
                "runtimeRef": {"name": runtime},
                "trainer": {"numNodes": 2},
                "suspend": True,
                "labels": {"example.com/team": "a"},
            },
        },
    )
    child = eventually(jobset, timeout=60, what="the TrainJob's JobSet")
    assert child["spec"]["suspend"] is True
    assert child["metadata"]["labels"] == {"example.com/team": "a"}
    (owner,) = child["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("TrainJob", name, True)
    (node,) = child["spec"]["replicatedJobs"]
    assert node["name"] == "node" and node["replicas"] == 1
    assert node["template"]["spec"]["parallelism"] == 2
    (container,) = node["template"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["PET_NNODES"]["value"] == "2"
    assert env["PET_MASTER_ADDR"]["value"] == f"{name}-node-0-0.{name}"
    assert "batch.kubernetes.io/job-completion-index" in str(env["PET_NODE_RANK"]["valueFrom"])
    eventually(
        lambda: condition(trainjob(), "Suspended"), timeout=30, what="the TrainJob Suspended"
    )
    selector = f"jobset.sigs.k8s.io/jobset-name={name}"
    assert pods(kube, namespace, selector) == []

    # Where its pods go, told while suspended: it reaches the JobSet, then the pods.
    place = {"gangshare.io/pool": pool.label}
    overrides = [{"targetJobs": [{"name": "node"}], "nodeSelector": place}]
    kube.custom.patch_namespaced_custom_object(
        *TRAINER, namespace, "trainjobs", name, {"spec": {"podSpecOverrides": overrides}}
    )
    eventually(
        lambda: (
            jobset()["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"].get(
                "nodeSelector"
            )
            == place
        ),
        timeout=30,
        what="the override on the suspended JobSet",
    )
    assert pods(kube, namespace, selector) == []

    kube.custom.patch_namespaced_custom_object(
        *TRAINER, namespace, "trainjobs", name, {"spec": {"suspend": False}}
    )
    done = eventually(
        lambda: job if condition(job := trainjob(), "Complete") else None,
        timeout=120,
        what="the TrainJob Complete",
    )
    assert not condition(done, "Failed")
    child = jobset()
    assert child["spec"]["suspend"] is False and condition(child, "Completed")
    ran = pods(kube, namespace, selector)
    ranks = sorted(p.metadata.labels["batch.kubernetes.io/job-completion-index"] for p in ran)
    assert ranks == ["0", "1"], [p.metadata.name for p in ran]  # one attempt, no retries
    for pod in ran:
        labels = pod.metadata.labels
        assert pod.status.phase == "Succeeded"
        assert pod.spec.node_name in pool.names and pod.spec.node_selector == place
        assert labels["jobset.sigs.k8s.io/replicatedjob-name"] == "node"
        assert labels["jobset.sigs.k8s.io/job-index"] == "0"
        assert labels["jobset.sigs.k8s.io/jobset-uid"] == child["metadata"]["uid"]
        assert not any(k.startswith("trainer.kubeflow.org/") for k in labels)
    (job,) = kube_batch(kube).list_namespaced_job(namespace, label_selector=selector).items
    assert job.metadata.labels["trainer.kubeflow.org/trainjob-ancestor-step"] == "trainer"


def test_a_suspended_pytorchjob_creates_no_pods_until_resumed_then_succeeds(
    kube: Kube, pool: NodePool, namespace: str
):
    pool.nodes(1, 8)
    name = "pt-" + uuid.uuid4().hex[:6]

    def replica(count: int) -> dict[str, Any]:
        return {
            "replicas": count,
            "restartPolicy": "OnFailure",
            "template": {
                "metadata": {"annotations": dict(RUN)},
                "spec": {
                    "nodeSelector": {"gangshare.io/pool": pool.label},
                    "containers": [
                        {
                            "name": "pytorch",
                            "image": IMAGE,
                            "command": ["sh", "-c", "echo rank $RANK; exit 0"],
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
        }

    kube.custom.create_namespaced_custom_object(
        *KUBEFLOW,
        namespace,
        "pytorchjobs",
        {
            "apiVersion": "/".join(KUBEFLOW),
            "kind": "PyTorchJob",
            "metadata": {"name": name},
            "spec": {
                "runPolicy": {"suspend": True},
                "pytorchReplicaSpecs": {"Master": replica(1), "Worker": replica(2)},
            },
        },
    )

    def read() -> dict[str, Any]:
        found: dict[str, Any] = kube.custom.get_namespaced_custom_object(
            *KUBEFLOW, namespace, "pytorchjobs", name
        )
        return found

    eventually(lambda: condition(read(), "Suspended"), timeout=60, what="the PyTorchJob Suspended")
    selector = f"training.kubeflow.org/job-name={name}"
    assert pods(kube, namespace, selector) == []

    kube.custom.patch_namespaced_custom_object(
        *KUBEFLOW, namespace, "pytorchjobs", name, {"spec": {"runPolicy": {"suspend": False}}}
    )
    done = eventually(
        lambda: job if condition(job := read(), "Succeeded") else None,
        timeout=120,
        what="the PyTorchJob Succeeded",
    )
    assert not condition(done, "Failed")
    ran = pods(kube, namespace, selector)
    roles = sorted(
        (
            p.metadata.labels["training.kubeflow.org/replica-type"],
            p.metadata.labels["training.kubeflow.org/replica-index"],
        )
        for p in ran
    )
    assert roles == [("master", "0"), ("worker", "0"), ("worker", "1")]
    for pod in ran:
        labels = pod.metadata.labels
        (owner,) = pod.metadata.owner_references
        assert (owner.kind, owner.name, owner.controller) == ("PyTorchJob", name, True)
        assert pod.spec.node_name in pool.names
        assert pod.status.phase == "Succeeded"
        env = {e.name: e.value for e in pod.spec.containers[0].env}
        master = labels["training.kubeflow.org/replica-type"] == "master"
        rank = 0 if master else int(labels["training.kubeflow.org/replica-index"]) + 1
        assert (env["RANK"], env["WORLD_SIZE"]) == (str(rank), "3")
        assert env["MASTER_ADDR"] == f"{name}-master-0"
        assert (labels.get("training.kubeflow.org/job-role") == "master") == master
