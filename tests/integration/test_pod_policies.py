"""The chart's pod policies against a tenant, on the real API server (issue #25, items 3 and 8).

The chart's reserved-pod-keys and share-pod-grace policies are rendered by helm and applied. A
tenant with the built-in `edit` role in its namespace (impersonated) may not remove gangshare's
keys from a worker, nor pass a pod off as a TrainingJob's worker (issue #36, item 6), and nobody
may create a pod that shares GPUs with a grace period long enough to keep the GPU memory its
eviction should free.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from chart import apply, delete, render
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kube import Kube, eventually, gpu_pod, grant_edit, new_namespace

pytestmark = pytest.mark.integration
SHARE = "gangshare.io/gpu-share"
YEAR = 31536000


@pytest.fixture(scope="module")
def policies(kube: Kube) -> Iterator[str]:
    """The release's namespace; its policies apply to every namespace."""
    release = f"pods-{uuid.uuid4().hex[:6]}"
    made = new_namespace(kube)
    namespace = next(made)
    manifests = render(
        kube, release, namespace, ["admission-policies.yaml"], "admissionPolicies.templates=false"
    )
    apply(kube, manifests)
    try:
        yield namespace
    finally:
        delete(kube, manifests)
        next(made, None)


@pytest.fixture
def tenant(kube: Kube, namespace: str) -> client.CoreV1Api:
    """The user `tenant`, who may edit everything in the test's namespace (ClusterRole edit)."""
    grant_edit(kube, namespace)
    impersonating = client.ApiClient(
        kube.api_client.configuration, header_name="Impersonate-User", header_value="tenant"
    )
    return client.CoreV1Api(impersonating)


def refusal(call: Any) -> str | None:
    try:
        call()
    except ApiException as err:
        return str(err.body) if err.status in (403, 422) else None
    return None


def refused_once_live(create: Any, message: str) -> str:
    """The refusal of `create(name)`, with a new name each try: admission's informers pick a new
    policy up within moments, and a pod created before then is not a refusal."""
    attempts = iter(range(1000))

    def answer() -> str | None:
        body = refusal(lambda: create(f"probe-{next(attempts)}"))
        return body if body is not None and message in body else None

    return eventually(answer, timeout=30, what=f"refused with {message!r}")


def test_a_tenant_may_not_remove_gangshare_keys_from_a_worker(
    policies: str, kube: Kube, namespace: str, tenant: client.CoreV1Api
):
    # As the operator writes a worker (an admin here: system:masters may).
    worker = gpu_pod(
        "worker-0",
        1,
        annotations={"gangshare.io/planned-gpus": "0", "gangshare.io/planned-node": "n"},
        labels={"gangshare.io/job": "train", "gangshare.io/rank": "0"},
        scheduler="no-such-scheduler",
    )
    kube.core.create_namespaced_pod(namespace, worker)

    def forge(name: str) -> None:
        forged = gpu_pod(name, 1, annotations={"gangshare.io/assigned-gpus": "0"})
        tenant.create_namespaced_pod(namespace, forged)

    refused_once_live(forge, "metadata.annotations: keys under gangshare.io/")

    def patch(body: dict[str, Any]) -> str | None:
        return refusal(lambda: tenant.patch_namespaced_pod("worker-0", namespace, body))

    removed = patch({"metadata": {"annotations": {"gangshare.io/planned-gpus": None}}})
    assert removed is not None, "the tenant removed the worker's planned GPUs"
    assert (
        "metadata.annotations: keys under gangshare.io/ (planned and assigned GPUs) are removed "
        "by gangshare only" in removed
    ), removed
    removed = patch({"metadata": {"labels": {"gangshare.io/job": None}}})
    assert removed is not None, "the tenant removed the worker's job label"
    assert (
        "metadata.labels: keys under gangshare.io/ (job, rank, attempt) are removed by gangshare "
        "only" in removed
    ), removed
    # A replace that drops every key is a removal too.
    current = kube.core.read_namespaced_pod("worker-0", namespace)
    current.metadata.annotations = {}
    replaced = refusal(lambda: tenant.replace_namespaced_pod("worker-0", namespace, current))
    assert replaced is not None and "are removed by gangshare only" in replaced, replaced
    # The tenant's own keys stay the tenant's, beside gangshare's.
    tenant.patch_namespaced_pod(
        "worker-0", namespace, {"metadata": {"annotations": {"example.com/owner": "me"}}}
    )
    kept = kube.core.read_namespaced_pod("worker-0", namespace).metadata
    assert kept.annotations["gangshare.io/planned-gpus"] == "0"
    assert kept.labels["gangshare.io/job"] == "train"


@pytest.mark.parametrize("where", ["containers", "initContainers"])
def test_a_pod_sharing_gpus_may_not_outlast_its_eviction(
    policies: str, kube: Kube, namespace: str, tenant: client.CoreV1Api, where: str
):
    def pod(name: str, grace: int, resource: str = SHARE) -> client.V1Pod:
        body = gpu_pod(name, 1, resource, scheduler="no-such-scheduler")
        body.spec.termination_grace_period_seconds = grace
        if where == "initContainers":
            sidecar = body.spec.containers[0]
            sidecar.name, sidecar.restart_policy = "sidecar", "Always"
            body.spec.init_containers = [sidecar]
            body.spec.containers = [client.V1Container(name="main", image="example.invalid/m:1")]
        return body

    message = (
        "spec.terminationGracePeriodSeconds: at most 30 seconds for pods that ask for "
        "gangshare.io/gpu-share"
    )

    def year_long(name: str) -> None:
        tenant.create_namespaced_pod(namespace, pod(name, YEAR))

    refused_once_live(year_long, message)
    # Not even a cluster admin's: the bound is what the agent's eviction relies on.
    by_admin = refusal(lambda: kube.core.create_namespaced_pod(namespace, pod("admin", YEAR)))
    assert by_admin is not None and message in by_admin, by_admin
    tenant.create_namespaced_pod(namespace, pod("bounded", 30))
    # Whole GPUs are not squeezed by a neighbour's eviction: their grace is the tenant's.
    tenant.create_namespaced_pod(namespace, pod("whole", YEAR, "nvidia.com/gpu"))


def test_a_tenant_may_not_pass_a_pod_off_as_a_trainingjobs_worker(
    policies: str, kube: Kube, namespace: str, tenant: client.CoreV1Api
):
    # The operator takes a pod of a worker's name that its TrainingJob controls for one it made
    # (issue #36, item 6): a tenant's pod made under that name, naming the TrainingJob, may not.
    training_job = {
        "apiVersion": "gangshare.io/v1alpha1",
        "kind": "TrainingJob",
        "name": "train",
        "uid": str(uuid.uuid4()),
        "controller": True,
    }
    message = "metadata.ownerReferences: a reference to a TrainingJob is written by gangshare only"

    def squat(name: str) -> None:
        body = gpu_pod(name, 1, scheduler="no-such-scheduler")
        body.metadata.owner_references = [training_job]
        tenant.create_namespaced_pod(namespace, body)

    refused_once_live(squat, message)
    # Nor may an update add one to a pod the tenant made plain.
    tenant.create_namespaced_pod(namespace, gpu_pod("train-worker-0", 1, scheduler="x"))
    claim = {"metadata": {"ownerReferences": [training_job]}}
    refused = refusal(lambda: tenant.patch_namespaced_pod("train-worker-0", namespace, claim))
    assert refused is not None and message in refused, refused
