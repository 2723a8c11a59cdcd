"""Ownership a tenant can forge (issue #36, item 6), on the real API server with the policies
`kubectl apply -f crds/` installs (crds/pod-owner-policy.yaml, crds/job-owner-policy.yaml).

A tenant with the built-in `edit` role (impersonated) reads a queued Job's name and uid, as
anyone in its namespace can, and writes them into its own pod's ownerReferences with the gang's
labels: the pod would be given one of the gang's ranks and its plan, the real pod left gated.
The API server refuses it, and an update that adds such a reference, naming the field; only the
Job controller's own user may write one (and JobSet's controller a Job's reference to a JobSet).
The local cluster's controllers run as system:masters, which the policies exempt; the trusted
users are played by impersonation.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from test_batch_jobs import batch_job, jobs_api

from kube import Kube, NodePool, OperatorProcess, eventually, gpu_pod, grant_edit
from tj import phase_is

pytestmark = pytest.mark.integration
JOB_LABEL = "gangshare.io/job"
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
JOB_REFUSED = (
    "metadata.ownerReferences: a controller reference to a Job is written by the Job "
    "controller only"
)
UID_REFUSED = "metadata.labels[jobset.sigs.k8s.io/jobset-uid]: written by the Job controller only"
JOBSET_REFUSED = (
    "metadata.ownerReferences: a controller reference to a JobSet is written by JobSet's "
    "controller only"
)
TEMPLATE_UID_REFUSED = (
    "spec.template.metadata.labels[jobset.sigs.k8s.io/jobset-uid]: written by JobSet's "
    "controller only"
)
JOB_CONTROLLER = "system:serviceaccount:kube-system:job-controller"
GARBAGE_COLLECTOR = "system:serviceaccount:kube-system:generic-garbage-collector"
JOBSET_NAMESPACE, JOBSET_ACCOUNT = "jobset-system", "jobset-controller-manager"


def impersonating(kube: Kube, user: str) -> client.ApiClient:
    return client.ApiClient(
        kube.api_client.configuration, header_name="Impersonate-User", header_value=user
    )


@pytest.fixture
def tenant(kube: Kube, namespace: str) -> client.ApiClient:
    """The user `tenant`, who may edit everything in the test's namespace (ClusterRole edit)."""
    grant_edit(kube, namespace)
    return impersonating(kube, "tenant")


def refusal(call: Callable[[], Any]) -> str | None:
    try:
        call()
    except ApiException as err:
        return str(err.body) if err.status in (403, 422) else None
    return None


def refused(call: Callable[[], Any], message: str) -> None:
    answer = refusal(call)
    assert answer is not None and message in answer, answer


def refused_once_live(create: Callable[[str], Any], message: str) -> None:
    """`create(name)` refused, with a new name each try: admission picks a policy installed
    moments ago up within seconds, and a pod created before then is no refusal."""
    attempts = iter(range(1000))

    def answer() -> str | None:
        body = refusal(lambda: create(f"probe-{next(attempts)}"))
        return body if body is not None and message in body else None

    eventually(answer, timeout=30, what=f"refused with {message!r}")


def controller(api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pod(name: str, labels: dict[str, str], *refs: dict[str, Any], gated: bool = True) -> Any:
    body = gpu_pod(name, 4, labels=labels, scheduler="no-such-scheduler")
    body.metadata.owner_references = list(refs) or None
    if gated:
        body.spec.scheduling_gates = [client.V1PodSchedulingGate(name="gangshare.io/gang")]
    return body


def test_a_tenants_pod_may_not_join_another_jobs_gang(
    crd: Kube, pool: NodePool, namespace: str, tmp_path: Path, tenant: client.ApiClient
):
    (node,) = pool.nodes(1, 8)
    jobs_api(crd).create_namespaced_job(
        namespace, batch_job("victim", "default", 2, 4, pool, run_for="6s")
    )
    operator = OperatorProcess(crd, tmp_path).start()
    try:
        eventually(
            lambda: phase_is(crd, namespace, "job-victim", "Admitted", "Running"),
            timeout=60,
            what="the Job's gang admitted",
        )
        job = jobs_api(crd).read_namespaced_job("victim", namespace).metadata
        ref = controller("batch/v1", "Job", job.name, job.uid)
        gang = {JOB_LABEL: "job-victim", "batch.kubernetes.io/job-completion-index": "0"}
        pods = client.CoreV1Api(tenant)

        # A bare pod naming the Job as its controller, gated and labelled as the gang's pods are.
        refused_once_live(
            lambda name: pods.create_namespaced_pod(namespace, pod(name, gang, ref)), JOB_REFUSED
        )
        # Nor may an update add the reference to a pod the tenant made bare.
        pods.create_namespaced_pod(namespace, pod("bare", gang))
        add_ref = {"metadata": {"ownerReferences": [ref]}}
        refused(lambda: pods.patch_namespaced_pod("bare", namespace, add_ref), JOB_REFUSED)
        # ...or the JobSet uid label that makes a Job's pod a JobSet's.
        relabel = {"metadata": {"labels": {JOBSET_UID_LABEL: str(uuid.uuid4())}}}
        refused(lambda: pods.patch_namespaced_pod("bare", namespace, relabel), UID_REFUSED)
        # A pod gangshare never reads (no gangshare.io/ label) is not its business, until it
        # takes the gang's label: then its reference is judged as if the pod were new. (The
        # patch names the reference again: the Job controller releases a pod its selector does
        # not match, and may have by now.)
        pods.create_namespaced_pod(namespace, pod("plain", {}, ref, gated=False))
        join = {"metadata": {"labels": gang, "ownerReferences": [ref]}}
        refused(lambda: pods.patch_namespaced_pod("plain", namespace, join), JOB_REFUSED)

        done = eventually(
            lambda: phase_is(crd, namespace, "job-victim", "Succeeded", "Failed"),
            timeout=90,
            what="the Job's gang finished",
        )
        assert done["phase"] == "Succeeded", done
        # Its ranks went to the Job's own pods only; the tenant's pod stayed gated, no rank.
        workers = [
            p
            for p in crd.core.list_namespaced_pod(namespace, label_selector=JOB_LABEL).items
            if "gangshare.io/rank" in (p.metadata.labels or {})
        ]
        assert len(workers) == 2, [p.metadata.name for p in workers]
        for worker in workers:
            (owner,) = worker.metadata.owner_references
            assert (owner.kind, owner.name, owner.uid) == ("Job", "victim", job.uid)
            assert worker.spec.node_name == node
        bare = crd.core.read_namespaced_pod("bare", namespace)
        assert "gangshare.io/rank" not in bare.metadata.labels and bare.spec.scheduling_gates
    finally:
        operator.stop()


def test_only_the_job_controller_makes_a_gangshare_pod_a_jobs(
    crd: Kube, namespace: str, tenant: client.ApiClient
):
    # A Job another controller manages (spec.managedBy): the Job controller leaves the pods
    # that name it alone, and it exists, so the garbage collector does too.
    body = batch_job("owner", "default", 1, 4, NodePool(crd, namespace))
    del body["metadata"]["labels"]
    body["spec"]["managedBy"] = "example.com/elsewhere"
    job = jobs_api(crd).create_namespaced_job(namespace, body).metadata
    ref = controller("batch/v1", "Job", job.name, job.uid)
    gang = {JOB_LABEL: "job-owner"}
    # The Job controller's account (its bootstrap role may create pods everywhere).
    by_job_controller = client.CoreV1Api(impersonating(crd, JOB_CONTROLLER))
    by_job_controller.create_namespaced_pod(namespace, pod("made", gang, ref))
    # The kube-controller-manager's own user, where it runs without per-controller accounts
    # (and is granted the controllers' rights: here, edit in the namespace).
    grant_edit(crd, namespace, "system:kube-controller-manager")
    manager = client.CoreV1Api(impersonating(crd, "system:kube-controller-manager"))
    eventually(
        lambda: manager.create_namespaced_pod(namespace, pod("dry", gang, ref), dry_run="All"),
        what="the controller manager's pod admitted (RBAC binding live)",
    )

    pods = client.CoreV1Api(tenant)
    refused_once_live(
        lambda name: pods.create_namespaced_pod(namespace, pod(name, gang, ref)), JOB_REFUSED
    )
    # Pointing the Job's pod at another Job is writing a reference too.
    moved = crd.core.read_namespaced_pod("made", namespace)
    moved.metadata.owner_references[0].uid = str(uuid.uuid4())
    refused(lambda: pods.replace_namespaced_pod("made", namespace, moved), JOB_REFUSED)
    # Removing it is anyone's: the garbage collector orphans pods so (and the tenant may delete
    # the pod anyway). Given back, it is judged as written anew.
    orphan = [{"op": "remove", "path": "/metadata/ownerReferences"}]
    gc = client.CoreV1Api(impersonating(crd, GARBAGE_COLLECTOR))
    gc.patch_namespaced_pod("made", namespace, orphan, dry_run="All")
    pods.patch_namespaced_pod("made", namespace, orphan)
    assert not crd.core.read_namespaced_pod("made", namespace).metadata.owner_references
    add_ref = {"metadata": {"ownerReferences": [ref]}}
    refused(lambda: pods.patch_namespaced_pod("made", namespace, add_ref), JOB_REFUSED)


def test_only_jobsets_controller_makes_a_gangshare_job_a_jobsets(
    crd: Kube, namespace: str, tenant: client.ApiClient
):
    owner = controller("jobset.x-k8s.io/v1alpha2", "JobSet", "pair", str(uuid.uuid4()))
    uid_label = {JOBSET_UID_LABEL: owner["uid"]}

    def child(name: str, *refs: dict[str, Any], labels: dict[str, str] | None = None) -> Any:
        """A suspended Job whose pods carry the JobSet's gangshare label (not queued itself)."""
        body = batch_job(name, "default", 1, 4, NodePool(crd, namespace))
        body["metadata"] = {"name": name, "ownerReferences": list(refs)}
        body["spec"]["template"]["metadata"]["labels"] = {
            JOB_LABEL: "jobset-pair",
            **(labels or {}),
        }
        return body

    jobs = client.BatchV1Api(tenant)
    refused_once_live(
        lambda name: jobs.create_namespaced_job(namespace, child(name, owner)), JOBSET_REFUSED
    )
    # Nor the uid label the Job controller copies onto every pod, which says whose pods they are.
    refused(
        lambda: jobs.create_namespaced_job(namespace, child("labelled", labels=uid_label)),
        TEMPLATE_UID_REFUSED,
    )
    # A Job the tenant made while gangshare did not read it is judged anew once it would.
    plain = child("plain")
    plain["spec"]["template"]["metadata"]["labels"] = {}
    jobs.create_namespaced_job(namespace, plain)
    join = {"metadata": {"labels": {JOB_LABEL: "jobset-pair"}, "ownerReferences": [owner]}}
    refused(lambda: jobs.patch_namespaced_job("plain", namespace, join), JOBSET_REFUSED)

    # JobSet's controller, under its own account (granted edit here, as its ClusterRole would).
    client.RbacAuthorizationV1Api(crd.api_client).create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="jobset-controller-edit"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="edit"
            ),
            subjects=[
                client.RbacV1Subject(
                    kind="ServiceAccount", name=JOBSET_ACCOUNT, namespace=JOBSET_NAMESPACE
                )
            ],
        ),
    )
    jobset_controller = client.BatchV1Api(
        impersonating(crd, f"system:serviceaccount:{JOBSET_NAMESPACE}:{JOBSET_ACCOUNT}")
    )
    made = child("pair-workers-0", owner, labels=uid_label)
    eventually(
        lambda: jobset_controller.create_namespaced_job(namespace, made, dry_run="All"),
        what="JobSet's controller makes its child Job (RBAC binding live)",
    )


@pytest.mark.parametrize("policy", ["gangshare-pod-owners", "gangshare-job-owners"])
def test_the_ownership_policies_type_check_against_the_servers_schemas(crd: Kube, policy: str):
    admission = client.AdmissionregistrationV1Api(crd.api_client)

    def checked() -> Any:
        return admission.read_validating_admission_policy(policy).status.type_checking

    # An expression that names a field the schema lacks is only a warning here, and a policy
    # that silently never refuses.
    found = eventually(checked, what=f"{policy} type-checked")
    assert not found.expression_warnings, found.expression_warnings


PYTORCHJOB_REFUSED = (
    "metadata.ownerReferences: a controller reference to a PyTorchJob is written by the "
    "training-operator only"
)
TRAINING_OPERATOR = "system:serviceaccount:kubeflow:training-operator"


def test_only_the_training_operator_makes_a_gangshare_pod_a_pytorchjobs(
    crd: Kube, namespace: str, tenant: client.ApiClient
):
    # Only the reference is judged: the PyTorchJob it names need not exist for the refusal.
    ref = controller("kubeflow.org/v1", "PyTorchJob", "ddp", str(uuid.uuid4()))
    gang = {JOB_LABEL: "pytorchjob-ddp"}
    pods = client.CoreV1Api(tenant)
    refused_once_live(
        lambda name: pods.create_namespaced_pod(namespace, pod(name, gang, ref)),
        PYTORCHJOB_REFUSED,
    )
    grant_edit(crd, namespace, TRAINING_OPERATOR)
    operator = client.CoreV1Api(impersonating(crd, TRAINING_OPERATOR))
    eventually(
        lambda: operator.create_namespaced_pod(namespace, pod("made", gang, ref), dry_run="All"),
        what="the training-operator's pod admitted (RBAC binding live)",
    )


GATE_REFUSED = "spec.schedulingGates: the gangshare.io/gang gate is lifted by gangshare only"
OPERATOR = "system:serviceaccount:gangshare-system:gangshare-operator"


def test_only_gangshares_operator_lifts_the_gang_gate(
    crd: Kube, namespace: str, tenant: client.ApiClient
):
    """crds/gang-gate-policy.yaml: a tenant who may update its pods cannot let a gated pod of a
    queued gang skip its queue by lifting the gate itself; it may delete the pod."""
    pods = client.CoreV1Api(tenant)
    lift = {"spec": {"schedulingGates": None}}
    attempts = iter(range(1000))

    def tenants_lift() -> str | None:
        name = f"gated-{next(attempts)}"
        pods.create_namespaced_pod(namespace, pod(name, {JOB_LABEL: "job-x"}))
        body = refusal(lambda: pods.patch_namespaced_pod(name, namespace, lift))
        return body if body is not None and GATE_REFUSED in body else None

    # Admission picks a policy installed moments ago up within seconds.
    eventually(tenants_lift, timeout=30, what="the tenant's lift refused")
    grant_edit(crd, namespace, OPERATOR)
    operator = client.CoreV1Api(impersonating(crd, OPERATOR))
    eventually(
        lambda: operator.patch_namespaced_pod("gated-0", namespace, lift, dry_run="All"),
        what="the operator's lift admitted (RBAC binding live)",
    )
    pods.delete_namespaced_pod("gated-0", namespace, grace_period_seconds=0)
