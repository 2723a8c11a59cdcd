"""A batch/v1 Job queued by gangshare, as the operator reads and writes it (pure: dicts in, out).

A Job created suspended with the label `gangshare.io/queue` is a gang of `parallelism`
pods. The operator queues it through a TrainingJob it owns (`workload`: spec.jobRef names
the Job), so the one policy, ledger and extender decide for it as for any TrainingJob; the
Job controller makes the pods. On admission the Job is unsuspended (`resume_patch`; before
its first run its template gets the gang gate and the job label too); each gated pod then
gets its rank's planned node and GPUs, its attempt and its rank (`ungate_patch`) and its gate
lifted. On reclaim the Job is suspended again (its controller deletes the pods) and the
TrainingJob requeued.

Kubernetes 1.35 lets a suspended Job's template change only before its first run, and then
only in labels, annotations, scheduling gates, node affinity and tolerations: its GPU resource
stays what the author wrote. So a Job asks whole GPUs (`nvidia.com/gpu`) as Guaranteed, or
share slots (`gangshare.io/gpu-share`) as Opportunistic, and a Guaranteed Job that borrows
runs on idle whole GPUs (core `GangRequest.whole_gpus`); what changes per attempt is written
on the pods.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gangshare.core.annotations import (
    ATTEMPT_LABEL,
    CLASS_LABEL,
    GPU_RESOURCE,
    JOB_LABEL,
    POD_GPU_MEMORY,
    POD_PLANNED_GPUS,
    POD_PLANNED_NODE,
    RANK_LABEL,
    SHARE_RESOURCE,
    encode_gpu_indices,
    is_reserved_key,
)
from gangshare.core.job import ServiceClass
from gangshare.kube.scheduling import GANG_GATE, GPU_RESOURCES, container_gpus, pin_to_node
from gangshare.kube.trainingjob import API_VERSION, GROUP, KIND, InvalidSpec

QUEUE_LABEL = f"{GROUP}/queue"
SERVICE_CLASS_LABEL = f"{GROUP}/service-class"
PRIORITY_LABEL = f"{GROUP}/priority"
# Optional annotations on the Job: its topology and the run time its author expects.
TOPOLOGY_POLICY_ANNOTATION = f"{GROUP}/topology-policy"
TOPOLOGY_SCOPE_ANNOTATION = f"{GROUP}/topology-scope"
RUNTIME_ANNOTATION = f"{GROUP}/runtime-estimate-seconds"
# What gangshare last decided about the Job, for `kubectl describe job` (events say it too).
STATUS_ANNOTATION = f"{GROUP}/status"
# The attempt the Job was last resumed for: its pods made since are that attempt's.
ATTEMPT_ANNOTATION = f"{GROUP}/attempt"
# The Job controller labels each pod of an Indexed Job with its index (Kubernetes 1.28+).
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
WORKLOAD_PREFIX = "job-"
_NAME_LIMIT = 45
_NOT_DNS_1035 = re.compile(r"[^a-z0-9-]")


def is_queued_job(job: Mapping[str, Any]) -> bool:
    """Whether gangshare queues this Job: it carries the queue label."""
    labels = (job.get("metadata") or {}).get("labels") or {}
    return QUEUE_LABEL in labels


def workload_name(job_name: str) -> str:
    """The name of the TrainingJob that queues a Job: `job-<name>`, shortened with a hash when
    the Job's name (a DNS subdomain of up to 63) does not fit a TrainingJob's (a 45-character
    DNS-1035 label). The prefix keeps it apart from TrainingJobs users name themselves."""
    plain = _NOT_DNS_1035.sub("-", job_name.lower()).strip("-")
    whole = f"{WORKLOAD_PREFIX}{plain}"
    if whole == f"{WORKLOAD_PREFIX}{job_name}" and len(whole) <= _NAME_LIMIT:
        return whole
    digest = hashlib.sha256(job_name.encode()).hexdigest()[:6]
    stem = whole[: _NAME_LIMIT - len(digest) - 1].rstrip("-")
    return f"{stem}-{digest}"


@dataclass(frozen=True)
class QueuedJobSpec:
    """What a queued Job asks of gangshare, read from its labels, annotations and template."""

    namespace: str
    name: str
    uid: str
    queue: str
    service_class: ServiceClass
    priority: int
    workers: int
    gpus_per_worker: int
    indexed: bool
    topology: dict[str, Any]
    runtime_estimate_seconds: int | None
    template: dict[str, Any]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_queued_job(job: Mapping[str, Any]) -> QueuedJobSpec:
    """The gang a labelled Job is; InvalidSpec names the Job's field that makes it no gang."""
    meta, spec = job.get("metadata") or {}, job.get("spec") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    raw_class = labels.get(SERVICE_CLASS_LABEL, ServiceClass.GUARANTEED.value)
    try:
        service_class = ServiceClass(raw_class)
    except ValueError:
        raise InvalidSpec(
            f"metadata.labels[{SERVICE_CLASS_LABEL}]: must be Guaranteed or Opportunistic, "
            f"got {raw_class!r}"
        ) from None
    priority = _int_text(labels.get(PRIORITY_LABEL, "0"), f"metadata.labels[{PRIORITY_LABEL}]")
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
    pod = template.get("spec") or {}
    containers = pod.get("containers") or []
    if not containers or not isinstance(containers[0], dict):
        raise InvalidSpec("spec.template.spec.containers: at least one container is required")
    _refuse_gangshare_keys(template, workload_name(str(meta.get("name", ""))))
    if pod.get("nodeName"):
        raise InvalidSpec(
            "spec.template.spec.nodeName: gangshare places every pod; use nodeSelector or node "
            "affinity to restrict where"
        )
    gpus = _first_container_gpus(pod, service_class)
    estimate = annotations.get(RUNTIME_ANNOTATION)
    return QueuedJobSpec(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        queue=str(labels[QUEUE_LABEL]),
        service_class=service_class,
        priority=priority,
        workers=parallelism,
        gpus_per_worker=gpus,
        indexed=spec.get("completionMode") == "Indexed",
        topology={
            k: v
            for k, v in (
                ("policy", annotations.get(TOPOLOGY_POLICY_ANNOTATION)),
                ("scope", annotations.get(TOPOLOGY_SCOPE_ANNOTATION)),
            )
            if v
        },
        runtime_estimate_seconds=(
            None
            if estimate is None
            else _int_text(estimate, f"metadata.annotations[{RUNTIME_ANNOTATION}]")
        ),
        template=template,
    )


def _int_text(raw: Any, field: str) -> int:
    text = str(raw)
    if not re.fullmatch(r"-?[0-9]{1,9}", text):
        raise InvalidSpec(f"{field}: must be a whole number, got {raw!r}")
    return int(text)


def _refuse_gangshare_keys(template: Mapping[str, Any], own: str) -> None:
    """A pod's job, rank and attempt labels are how the ledger knows a gang's workers: a
    template that wrote them itself could pass its pods off as another gang's. The one it may
    carry is the job label gangshare put there itself, naming the Job's own TrainingJob."""
    meta = template.get("metadata") or {}
    labels = [
        key
        for key, value in (meta.get("labels") or {}).items()
        if str(key).startswith(f"{GROUP}/") and not (key == JOB_LABEL and value == own)
    ]
    # The simulation markers (KWOK's run time and exit code) are a tenant's to set.
    annotations = [key for key in meta.get("annotations") or {} if is_reserved_key(str(key))]
    for kind, keys in (("labels", labels), ("annotations", annotations)):
        if keys:
            raise InvalidSpec(
                f"spec.template.metadata.{kind}: {keys[0]} is reserved for gangshare (keys "
                "under gangshare.io/ are written by gangshare itself)"
            )


def _first_container_gpus(pod: Mapping[str, Any], service_class: ServiceClass) -> int:
    wanted = GPU_RESOURCE if service_class is ServiceClass.GUARANTEED else SHARE_RESOURCE
    first = pod["containers"][0]
    for resource in sorted(GPU_RESOURCES - {wanted}):
        if container_gpus(first, resource):
            raise InvalidSpec(
                f"spec.template.spec.containers[0].resources: a {service_class.value} Job asks "
                f"for {wanted}, not {resource} (label {SERVICE_CLASS_LABEL})"
            )
    count = container_gpus(first, wanted)
    if not count:
        raise InvalidSpec(
            f"spec.template.spec.containers[0].resources.limits[{wanted}]: a queued Job asks "
            "for GPUs in its first container"
        )
    others = [
        (kind, position, c)
        for kind, start, group in (
            ("initContainers", 0, pod.get("initContainers") or []),
            ("containers", 1, (pod.get("containers") or [])[1:]),
        )
        for position, c in enumerate(group, start=start)
        if isinstance(c, dict)
    ]
    for kind, position, container in others:
        for resource in sorted(GPU_RESOURCES):
            if container_gpus(container, resource):
                raise InvalidSpec(
                    f"spec.template.spec.{kind}[{position}].resources: may not ask for "
                    f"{resource}; a gang's GPUs are its first container's"
                )
    return count


# ----- the TrainingJob that queues it --------------------------------------------------------


def workload(spec: QueuedJobSpec) -> dict[str, Any]:
    """The TrainingJob that holds the Job's place in its queue. Its template is only what
    scheduling reads (requests, node selector and affinity, tolerations, priority class): the
    Job controller makes the pods, from the Job's own template."""
    body: dict[str, Any] = {
        "queue": spec.queue,
        "serviceClass": spec.service_class.value,
        "priority": spec.priority,
        "workers": spec.workers,
        "gpusPerWorker": spec.gpus_per_worker,
        "template": scheduling_template(spec.template),
        "jobRef": {"apiVersion": "batch/v1", "kind": "Job", "name": spec.name, "uid": spec.uid},
    }
    if spec.topology:
        body["topology"] = dict(spec.topology)
    if spec.runtime_estimate_seconds is not None:
        body["runtimeEstimateSeconds"] = spec.runtime_estimate_seconds
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": workload_name(spec.name),
            "namespace": spec.namespace,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": spec.name,
                    "uid": spec.uid,
                    "controller": True,
                }
            ],
        },
        "spec": body,
    }


def scheduling_template(template: Mapping[str, Any]) -> dict[str, Any]:
    pod = template.get("spec") or {}

    def slim(container: Mapping[str, Any]) -> dict[str, Any]:
        resources = {
            kind: {k: v for k, v in (amounts or {}).items() if k not in GPU_RESOURCES}
            for kind, amounts in (container.get("resources") or {}).items()
            if kind in ("requests", "limits")
        }
        out = {"name": container.get("name", ""), "image": container.get("image", "")}
        if resources:
            out["resources"] = resources
        if container.get("restartPolicy"):
            out["restartPolicy"] = container["restartPolicy"]  # a sidecar's requests add up
        return out

    kept: dict[str, Any] = {"containers": [slim(c) for c in pod.get("containers") or []]}
    if pod.get("initContainers"):
        kept["initContainers"] = [slim(c) for c in pod["initContainers"]]
    for key in ("nodeSelector", "tolerations", "priorityClassName", "overhead"):
        if pod.get(key):
            kept[key] = copy.deepcopy(pod[key])
    node_affinity = (pod.get("affinity") or {}).get("nodeAffinity")
    if node_affinity:
        kept["affinity"] = {"nodeAffinity": copy.deepcopy(node_affinity)}
    return {"spec": kept}


# ----- the Job's state and its writes --------------------------------------------------------


def job_suspended(job: Mapping[str, Any]) -> bool:
    return bool((job.get("spec") or {}).get("suspend"))


def job_finished(job: Mapping[str, Any]) -> tuple[str, str] | None:
    """("Succeeded" | "Failed", why) once the Job controller says the Job is done."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            return "Succeeded", "the Job completed"
        if cond.get("type") == "Failed":
            why = cond.get("message") or cond.get("reason") or "the Job failed"
            return "Failed", f"the Job failed: {why}"
    return None


def resumed_attempt(job: Mapping[str, Any]) -> int | None:
    """The attempt the Job was last resumed for (None: never)."""
    raw = ((job.get("metadata") or {}).get("annotations") or {}).get(ATTEMPT_ANNOTATION)
    return int(raw) if isinstance(raw, str) and raw.isdigit() else None


def template_prepared(job: Mapping[str, Any], workload_job: str) -> bool:
    """Whether the Job's pods will be made gated and labelled as `workload_job`'s."""
    template = (job.get("spec") or {}).get("template") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    gates = (template.get("spec") or {}).get("schedulingGates") or []
    return labels.get(JOB_LABEL) == workload_job and any(g.get("name") == GANG_GATE for g in gates)


def may_resume(job: Mapping[str, Any]) -> bool:
    """Suspended, and its controller done suspending it: no pod of the last run is active."""
    status = job.get("status") or {}
    suspended = any(
        c.get("type") == "Suspended" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return job_suspended(job) and suspended and not status.get("active")


def template_frozen(job: Mapping[str, Any]) -> bool:
    """A Job that has started keeps its template (Kubernetes 1.35 without the alpha gate
    MutableSchedulingDirectivesForSuspendedJobs): gangshare prepares it before its first run."""
    return bool((job.get("status") or {}).get("startTime"))


def suspend_patch() -> dict[str, Any]:
    return {"spec": {"suspend": True}}


def resume_patch(job: Mapping[str, Any], workload_job: str, attempt: int) -> dict[str, Any]:
    """Unsuspend the Job for `attempt`. Before its first run its template is prepared in the
    same write: its pods are made behind the gang gate and labelled as `workload_job`'s, for
    every attempt to come (the template may not change once the Job has started)."""
    patch: dict[str, Any] = {
        "metadata": {"annotations": {ATTEMPT_ANNOTATION: str(attempt)}},
        "spec": {"suspend": False},
    }
    if not template_prepared(job, workload_job):
        template = (job.get("spec") or {}).get("template") or {}
        gates = [
            g
            for g in (template.get("spec") or {}).get("schedulingGates") or []
            if g.get("name") != GANG_GATE
        ]
        patch["spec"]["template"] = {
            "metadata": {"labels": {JOB_LABEL: workload_job}},
            "spec": {"schedulingGates": [*gates, {"name": GANG_GATE}]},
        }
    return patch


def status_annotation_patch(message: str) -> dict[str, Any]:
    return {"metadata": {"annotations": {STATUS_ANNOTATION: message}}}


def pod_rank(pod: Mapping[str, Any]) -> int | None:
    """A pod's rank: the one gangshare gave it, else an Indexed Job's completion index."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    for key in (RANK_LABEL, COMPLETION_INDEX_LABEL):
        raw = labels.get(key)
        if isinstance(raw, str) and raw.isdigit():
            return int(raw)
    return None


def ungate_patch(
    pod: Mapping[str, Any],
    rank: int,
    attempt: int,
    placed: tuple[str, list[int]],
    service_class: ServiceClass,
    memory_mib: int | None,
) -> dict[str, Any]:
    """A gated pod made its rank's worker for `attempt`: planned node and GPUs recorded, pinned
    to the node (a gated pod's affinity may still be narrowed), the gang gate lifted. One
    write."""
    node, gpus = placed
    spec = pod.get("spec") or {}
    annotations = {POD_PLANNED_NODE: node, POD_PLANNED_GPUS: encode_gpu_indices(gpus)}
    if memory_mib is not None:
        annotations[POD_GPU_MEMORY] = str(memory_mib)
    gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != GANG_GATE]
    return {
        "metadata": {
            "labels": {
                RANK_LABEL: str(rank),
                ATTEMPT_LABEL: str(attempt),
                CLASS_LABEL: service_class.value,
            },
            "annotations": annotations,
        },
        "spec": {
            "affinity": pin_to_node(spec.get("affinity"), node),
            "schedulingGates": gates or None,
        },
    }
