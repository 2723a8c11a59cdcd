"""A Kubeflow PyTorchJob (kubeflow.org/v1, training-operator) queued by gangshare as one gang
(pure; kube/queued.py shares).

The gang is every replica of every replica type (Master, then Worker, then any other). Its
workers are the replica types alike with the first that asks GPUs (a Master and Workers of one
shape are one set, ranked as the training-operator ranks them: the master 0, worker i at i+1);
a replica type unlike them (a CPU-only master, say) is a pod set of the same gang, ranked after.
The training-operator makes the pods itself (`<job>-<type>-<index>`, controlled by the
PyTorchJob, labelled with their replica type and index), deletes them when the job is suspended
(`spec.runPolicy.suspend`) and makes them again from the templates when it is resumed; the
templates stay mutable, so each resume prepares them (gated, labelled) in the same write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gangshare.kube.ownership import controlled_by
from gangshare.kube.queued import (
    QueuedJobSpec,
    WorkloadKind,
    gang_pod_gpus,
    queue_ask,
    workload_name,
)
from gangshare.kube.queued_podsets import PodSetAsk, pod_sets_gang, rank_offset
from gangshare.kube.queued_writes import (
    finished_by_conditions,
    gated_template,
    label_int,
    resume_attempt_annotation,
    run_left,
    template_gated,
)
from gangshare.kube.trainingjob import InvalidSpec

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
PREFIX = "pytorchjob-"
# What the training-operator writes on each pod it makes.
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
# The training-operator's own order: the master first (rank 0), then the workers.
_TYPE_ORDER = {"Master": 0, "Worker": 1}


def _replica_specs(job: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    specs = (job.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    found = [(str(k), v) for k, v in specs.items() if isinstance(v, dict)]
    return sorted(found, key=lambda kv: (_TYPE_ORDER.get(kv[0], 2), kv[0]))


def _run_policy(job: Mapping[str, Any]) -> Mapping[str, Any]:
    return (job.get("spec") or {}).get("runPolicy") or {}


def _asks(job: Mapping[str, Any]) -> list[PodSetAsk]:
    service_class = queue_ask(job).service_class
    own = workload_name(str((job.get("metadata") or {}).get("name", "")), PREFIX)
    found = []
    for kind, spec in _replica_specs(job):
        path = f"spec.pytorchReplicaSpecs.{kind}"
        replicas = spec.get("replicas", 1)
        if not isinstance(replicas, int) or replicas < 1:
            raise InvalidSpec(f"{path}.replicas: at least 1, got {replicas!r}")
        template = spec.get("template") or {}
        gpus = gang_pod_gpus(template, f"{path}.template", own, service_class, cpu_only=True)
        found.append(PodSetAsk(kind.lower(), replicas, gpus, template))
    return found


def parse_queued_pytorchjob(job: Mapping[str, Any]) -> QueuedJobSpec:
    """The gang a labelled PyTorchJob is; InvalidSpec names the PyTorchJob's field."""
    asks = _asks(job)
    if not asks:
        raise InvalidSpec("spec.pytorchReplicaSpecs: at least one replica type is required")
    if (_run_policy(job).get("schedulingPolicy") or {}).get("minAvailable") is not None:
        raise InvalidSpec(
            "spec.runPolicy.schedulingPolicy.minAvailable: gangshare admits the whole gang at "
            "once; leave gang scheduling to it"
        )
    return pod_sets_gang(
        job,
        asks,
        "spec.pytorchReplicaSpecs[].template.spec.containers[0].resources",
        api_version=API_VERSION,
        kind=KIND,
        prefix=PREFIX,
    )


def suspended(job: Mapping[str, Any]) -> bool:
    return bool(_run_policy(job).get("suspend"))


def pytorchjob_finished(job: Mapping[str, Any]) -> tuple[str, str] | None:
    return finished_by_conditions(job, "Succeeded", "PyTorchJob")


def may_resume(job: Mapping[str, Any], pods: list[dict[str, Any]]) -> bool:
    """Suspended, and no pod of its last run left: the training-operator deletes them on
    suspend, and a pod still going away would be counted twice beside its successor."""
    return suspended(job) and not run_left(job, pods, owns)


def templates_prepared(job: Mapping[str, Any], workload_job: str) -> bool:
    return all(
        template_gated(spec.get("template") or {}, workload_job) for _, spec in _replica_specs(job)
    )


def never_frozen(job: Mapping[str, Any]) -> bool:
    """The training-operator lets a suspended PyTorchJob's templates change."""
    return False


def suspend_patch() -> dict[str, Any]:
    return {"spec": {"runPolicy": {"suspend": True}}}


def resume_patch(job: Mapping[str, Any], workload_job: str, attempt: int) -> dict[str, Any]:
    """Unsuspend for `attempt`, every replica type's template gated and labelled as
    `workload_job`'s in the same write (a merge patch of the map keeps the other fields)."""
    patch: dict[str, Any] = {
        **resume_attempt_annotation(attempt),
        "spec": {"runPolicy": {"suspend": False}},
    }
    if templates_prepared(job, workload_job):
        return patch
    patch["spec"]["pytorchReplicaSpecs"] = {
        kind: {"template": gated_template(spec.get("template") or {}, workload_job)}
        for kind, spec in _replica_specs(job)
    }
    return patch


def pod_rank(pod: Mapping[str, Any], job: Mapping[str, Any]) -> int | None:
    """The workers' replica types in order (the master first), then the others; within one,
    the pod's replica index."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    index = label_int(pod, REPLICA_INDEX_LABEL)
    kind = str(labels.get(REPLICA_TYPE_LABEL, "")).lower()
    if index is None or not kind:
        return None
    try:
        found = rank_offset(_asks(job), kind)
    except InvalidSpec:
        return None
    if found is None or index >= found[1].pods:
        return None
    return found[0] + index


def pod_templates(job: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    return [
        (f"spec.pytorchReplicaSpecs.{kind}.template", spec.get("template") or {})
        for kind, spec in _replica_specs(job)
    ]


def owns(pod: Mapping[str, Any], job: Mapping[str, Any]) -> bool:
    """The training-operator made the pod for this PyTorchJob: its controller reference names
    the job whole (crds/pod-owner-policy.yaml lets only the training-operator write one)."""
    return controlled_by(pod, job, API_VERSION, KIND)


PYTORCHJOB = WorkloadKind(
    api_version=API_VERSION,
    kind=KIND,
    group="kubeflow.org",
    version="v1",
    plural="pytorchjobs",
    prefix=PREFIX,
    parse=parse_queued_pytorchjob,
    finished=pytorchjob_finished,
    may_resume=may_resume,
    prepared=templates_prepared,
    frozen=never_frozen,
    resume_patch=resume_patch,
    pod_rank=pod_rank,
    owns=owns,
    pod_templates=pod_templates,
    suspended=suspended,
    suspend_patch=suspend_patch,
)
