"""A batch/v1 Job queued by gangshare as one gang (pure; the shared part is kube/queued.py).

The gang is `parallelism` pods (`completions` equal to it, or unset): an Indexed Job's pod is
its index's rank, any other takes a free rank. The Job's template is prepared (gated, labelled)
in the write that first resumes it, since Kubernetes 1.35 keeps a Job's template once it has
run (`MutableSchedulingDirectivesForSuspendedJobs` is alpha and off).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gangshare.kube.ownership import controlled_by
from gangshare.kube.queued import (
    COMPLETION_INDEX_LABEL,
    QueuedJobSpec,
    WorkloadKind,
    gang_pod_gpus,
    queue_ask,
    workload_name,
)
from gangshare.kube.queued_writes import (
    finished_by_conditions,
    gated_template,
    label_int,
    resume_body,
    suspended,
    suspended_condition,
    template_gated,
)
from gangshare.kube.trainingjob import InvalidSpec

PREFIX = "job-"


def parse_queued_job(job: Mapping[str, Any]) -> QueuedJobSpec:
    """The gang a labelled Job is; InvalidSpec names the Job's field that makes it no gang."""
    meta, spec = job.get("metadata") or {}, job.get("spec") or {}
    ask = queue_ask(job)
    parallelism = spec.get("parallelism", 1)
    if not isinstance(parallelism, int) or not 1 <= parallelism <= 1024:
        raise InvalidSpec(f"spec.parallelism: a gang has 1 to 1024 pods, got {parallelism!r}")
    completions = spec.get("completions")
    if completions is not None and completions != parallelism:
        raise InvalidSpec(
            f"spec.completions: a gang runs all its pods at once, so it must equal "
            f"spec.parallelism ({parallelism}), got {completions}"
        )
    template = spec.get("template") or {}
    name = str(meta.get("name", ""))
    own = workload_name(name, PREFIX)
    gpus = gang_pod_gpus(template, "spec.template", own, ask.service_class)
    return QueuedJobSpec(
        namespace=str(meta.get("namespace", "")),
        name=name,
        uid=str(meta.get("uid", "")),
        queue=ask.queue,
        service_class=ask.service_class,
        priority=ask.priority,
        workers=parallelism,
        gpus_per_worker=gpus,
        indexed=spec.get("completionMode") == "Indexed",
        topology=ask.topology,
        runtime_estimate_seconds=ask.runtime_estimate_seconds,
        template=template,
    )


def job_finished(job: Mapping[str, Any]) -> tuple[str, str] | None:
    """("Succeeded" | "Failed", why) once the Job controller says the Job is done."""
    return finished_by_conditions(job, "Complete", "Job")


def may_resume(job: Mapping[str, Any], pods: list[dict[str, Any]] | None = None) -> bool:
    """Suspended, and its controller done suspending it: no pod of the last run is active."""
    return (
        suspended(job) and suspended_condition(job) and not (job.get("status") or {}).get("active")
    )


def _template(job: Mapping[str, Any]) -> Mapping[str, Any]:
    return (job.get("spec") or {}).get("template") or {}


def template_prepared(job: Mapping[str, Any], workload_job: str) -> bool:
    return template_gated(_template(job), workload_job)


def template_frozen(job: Mapping[str, Any]) -> bool:
    """A Job that has started keeps its template: gangshare prepares it before its first run."""
    return bool((job.get("status") or {}).get("startTime"))


def resume_patch(job: Mapping[str, Any], workload_job: str, attempt: int) -> dict[str, Any]:
    """Unsuspend the Job for `attempt`. Before its first run its template is prepared in the
    same write: its pods are made behind the gang gate and labelled as `workload_job`'s, for
    every attempt to come (the template may not change once the Job has started)."""
    patch = resume_body(attempt)
    if not template_prepared(job, workload_job):
        patch["spec"]["template"] = gated_template(_template(job), workload_job)
    return patch


def pod_rank(pod: Mapping[str, Any], job: Mapping[str, Any] | None = None) -> int | None:
    """An Indexed Job's pod is its index's worker."""
    return label_int(pod, COMPLETION_INDEX_LABEL)


def pod_templates(job: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    return [("spec.template", _template(job))]


def owns(pod: Mapping[str, Any], job: Mapping[str, Any]) -> bool:
    """The Job controller made the pod for this Job: its controller reference names the Job
    whole (kind, apiVersion, name, uid), and only the Job controller may write one on a pod
    gangshare reads (crds/pod-owner-policy.yaml), so another tenant's pod cannot claim it."""
    return controlled_by(pod, job, "batch/v1", "Job")


JOB = WorkloadKind(
    api_version="batch/v1",
    kind="Job",
    group="batch",
    version="v1",
    plural="jobs",
    prefix=PREFIX,
    parse=parse_queued_job,
    finished=job_finished,
    may_resume=may_resume,
    prepared=template_prepared,
    frozen=template_frozen,
    resume_patch=resume_patch,
    pod_rank=pod_rank,
    owns=owns,
    pod_templates=pod_templates,
)
