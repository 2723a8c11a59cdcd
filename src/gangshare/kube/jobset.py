"""A JobSet (sigs.k8s.io/jobset) queued by gangshare as one gang (pure; kube/queued.py shares).

The gang is every pod of every replicated job: sum of `replicas` x `parallelism`. Its workers
are the replicated jobs alike with the first that asks GPUs; every other replicated job (a
CPU-only driver beside GPU workers, as in JobSet's own driver/worker pattern, or workers of
another shape) is a pod set of the same gang, placed with it all or nothing. A pod's rank runs
through the workers' replicated jobs, then the others, each in listed order: the replicated
job's offset, plus its job index times its parallelism, plus the pod's completion index.
JobSet's own controller suspends and resumes the child Jobs, copies the pod template's labels
and scheduling gates onto them when it resumes them, and clears their start time first, so a
JobSet's templates stay preparable.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gangshare.core.job import ServiceClass
from gangshare.kube.ownership import controller_ref, refers_to
from gangshare.kube.queued import (
    COMPLETION_INDEX_LABEL,
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
    resume_body,
    run_left,
    suspended,
    suspended_condition,
    template_gated,
)
from gangshare.kube.trainingjob import InvalidSpec

API_VERSION = "jobset.x-k8s.io/v1alpha2"
PREFIX = "jobset-"
# What JobSet's controller writes on each child Job and its pods.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"


def replicated_jobs(jobset: Mapping[str, Any]) -> list[dict[str, Any]]:
    listed = (jobset.get("spec") or {}).get("replicatedJobs") or []
    return [r for r in listed if isinstance(r, dict)]


def _replicated_job_named(jobset: Mapping[str, Any], name: Any) -> dict[str, Any] | None:
    return next((r for r in replicated_jobs(jobset) if r.get("name") == name), None)


def pod_template(replicated: Mapping[str, Any]) -> dict[str, Any]:
    return (((replicated.get("template") or {}).get("spec") or {}).get("template")) or {}


def _shape(replicated: Mapping[str, Any], path: str) -> tuple[int, int]:
    """(replicas, parallelism) of one replicated job, each child Job a gang slice."""
    replicas = replicated.get("replicas", 1)
    job = (replicated.get("template") or {}).get("spec") or {}
    parallelism = job.get("parallelism", 1)
    for field, value in (("replicas", replicas), ("template.spec.parallelism", parallelism)):
        if not isinstance(value, int) or value < 1:
            raise InvalidSpec(f"{path}.{field}: at least 1, got {value!r}")
    completions = job.get("completions")
    if completions is not None and completions != parallelism:
        raise InvalidSpec(
            f"{path}.template.spec.completions: a gang runs all its pods at once, so it must "
            f"equal parallelism ({parallelism}), got {completions}"
        )
    return replicas, parallelism


def pod_set_asks(
    jobset: Mapping[str, Any], prefix: str = PREFIX, service_class: ServiceClass | None = None
) -> list[PodSetAsk]:
    """Each replicated job as a pod set, in listed order; `prefix` names the TrainingJob that
    queues it (a TrainJob's JobSet is queued as its TrainJob's), `service_class` the class its
    queue label asks (the JobSet's own by default)."""
    service_class = service_class or queue_ask(jobset).service_class
    own = workload_name(str((jobset.get("metadata") or {}).get("name", "")), prefix)
    found = []
    for position, item in enumerate(replicated_jobs(jobset)):
        path = f"spec.replicatedJobs[{position}]"
        replicas, parallelism = _shape(item, path)
        template = pod_template(item)
        gpus = gang_pod_gpus(
            template, f"{path}.template.spec.template", own, service_class, cpu_only=True
        )
        found.append(PodSetAsk(str(item.get("name", "")), replicas * parallelism, gpus, template))
    return found


def parse_queued_jobset(jobset: Mapping[str, Any]) -> QueuedJobSpec:
    """The gang a labelled JobSet is; InvalidSpec names the JobSet's field. Its GPU workers are
    the replicated jobs alike with the first that asks GPUs; any other replicated job (a
    CPU-only driver, workers of another shape) is a pod set of the same gang."""
    asks = pod_set_asks(jobset)
    if not asks:
        raise InvalidSpec("spec.replicatedJobs: at least one replicated job is required")
    return pod_sets_gang(
        jobset,
        asks,
        "spec.replicatedJobs[].template.spec.template.spec.containers[0].resources",
        api_version=API_VERSION,
        kind="JobSet",
        prefix=PREFIX,
    )


def jobset_finished(jobset: Mapping[str, Any]) -> tuple[str, str] | None:
    return finished_by_conditions(jobset, "Completed", "JobSet")


def may_resume(jobset: Mapping[str, Any], pods: list[dict[str, Any]]) -> bool:
    """Suspended, its controller says so, and none of its pods is left running: its child
    Jobs count pods per Job, so the pods themselves are asked."""
    return suspended(jobset) and suspended_condition(jobset) and not run_left(jobset, pods, owns)


def templates_prepared(jobset: Mapping[str, Any], workload_job: str) -> bool:
    return all(template_gated(pod_template(r), workload_job) for r in replicated_jobs(jobset))


def never_frozen(jobset: Mapping[str, Any]) -> bool:
    """JobSet's controller clears a child Job's start time before it resumes it."""
    return False


def resume_patch(jobset: Mapping[str, Any], workload_job: str, attempt: int) -> dict[str, Any]:
    """Unsuspend the JobSet for `attempt`; before its first run every replicated job's pod
    template is gated and labelled as `workload_job`'s in the same write (a merge patch
    replaces the list whole, so it carries every replicated job)."""
    patch = resume_body(attempt)
    if templates_prepared(jobset, workload_job):
        return patch
    replicated = []
    for item in replicated_jobs(jobset):
        template = pod_template(item)
        replicated.append(with_pod_template(item, template, gated_template(template, workload_job)))
    patch["spec"]["replicatedJobs"] = replicated
    return patch


def with_pod_template(
    item: Mapping[str, Any], template: Mapping[str, Any], gated: Mapping[str, Any]
) -> dict[str, Any]:
    """The replicated job whole (a merge patch replaces the list whole), its pod template's
    labels and spec merged with `gated` (gated_template's patch)."""
    merged_template = {
        **template,
        "metadata": {
            **(template.get("metadata") or {}),
            "labels": {
                **((template.get("metadata") or {}).get("labels") or {}),
                **gated["metadata"]["labels"],
            },
        },
        "spec": {**(template.get("spec") or {}), **gated["spec"]},
    }
    job_template = item.get("template") or {}
    return {
        **item,
        "template": {
            **job_template,
            "spec": {**(job_template.get("spec") or {}), "template": merged_template},
        },
    }


def pod_rank(
    pod: Mapping[str, Any],
    jobset: Mapping[str, Any],
    prefix: str = PREFIX,
    service_class: ServiceClass | None = None,
) -> int | None:
    """The workers' replicated jobs in order, then each other one (parse_queued_jobset's
    order); within one, the child Job's index, then the pod's completion index. `prefix` and
    `service_class` as pod_set_asks takes them (a TrainJob's JobSet is ranked as its own)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    index, completion = label_int(pod, JOB_INDEX_LABEL), label_int(pod, COMPLETION_INDEX_LABEL)
    item = next(
        (r for r in replicated_jobs(jobset) if r.get("name") == labels.get(REPLICATED_JOB_LABEL)),
        None,
    )
    if index is None or completion is None or item is None:
        return None
    try:
        replicas, parallelism = _shape(item, "spec.replicatedJobs[]")
        found = rank_offset(pod_set_asks(jobset, prefix, service_class), str(item.get("name")))
    except InvalidSpec:
        return None
    if found is None or index >= replicas or completion >= parallelism:
        return None
    return found[0] + index * parallelism + completion


def pod_templates(jobset: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    return [
        (f"spec.replicatedJobs[{i}].template.spec.template", pod_template(r))
        for i, r in enumerate(replicated_jobs(jobset))
    ]


def child_job_name(pod: Mapping[str, Any], jobset: Mapping[str, Any]) -> str | None:
    """The name JobSet's controller gives the child Job the pod's labels place it in,
    `<jobset>-<replicated job>-<index>`; None when the JobSet has no such child."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    index = label_int(pod, JOB_INDEX_LABEL)
    item = next(
        (r for r in replicated_jobs(jobset) if r.get("name") == labels.get(REPLICATED_JOB_LABEL)),
        None,
    )
    if item is None or index is None:
        return None
    replicas = item.get("replicas", 1)
    if not isinstance(replicas, int) or index >= replicas:
        return None
    return f"{(jobset.get('metadata') or {}).get('name')}-{item['name']}-{index}"


def owns(pod: Mapping[str, Any], jobset: Mapping[str, Any]) -> bool:
    """A pod of one of the JobSet's child Jobs: its controller is the batch/v1 Job of the
    child's name, and it carries the JobSet's uid label. Only the controllers write either on a
    pod gangshare reads: the Job reference and the uid label the Job controller alone
    (crds/pod-owner-policy.yaml), copying the label from its Job's template, which JobSet's
    controller alone labels (crds/job-owner-policy.yaml). So neither a tenant's pod naming a
    child Job nor a tenant's own Job made under a deleted child's name is the JobSet's."""
    uid = (jobset.get("metadata") or {}).get("uid")
    labels = (pod.get("metadata") or {}).get("labels") or {}
    child = child_job_name(pod, jobset)
    return (
        child is not None
        and refers_to(controller_ref(pod), "batch/v1", "Job", child)
        and bool(uid)
        and labels.get(JOBSET_UID_LABEL) == uid
    )


JOBSET = WorkloadKind(
    api_version=API_VERSION,
    kind="JobSet",
    group="jobset.x-k8s.io",
    version="v1alpha2",
    plural="jobsets",
    prefix=PREFIX,
    parse=parse_queued_jobset,
    finished=jobset_finished,
    may_resume=may_resume,
    prepared=templates_prepared,
    frozen=never_frozen,
    resume_patch=resume_patch,
    pod_rank=pod_rank,
    owns=owns,
    pod_templates=pod_templates,
)
