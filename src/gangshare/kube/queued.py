"""A workload object gangshare queues through a TrainingJob it owns (pure: dicts in and out).

A batch/v1 Job (kube/batchjob.py) or a JobSet (kube/jobset.py) labelled `gangshare.io/queue`
and created suspended is one gang. The operator makes a TrainingJob for it (`workload`, whose
spec.jobRef names it), so the one policy, ledger and extender decide for it as for any
TrainingJob, while the object's own controller makes the pods. On admission the object is
unsuspended (each kind's `resume_patch`; before its first run its pod templates get the gang
gate and the job label too); each gated pod then gets its rank's planned node and GPUs, its
attempt and its rank, and its gate lifted (kube/queued_writes.py). On reclaim the object is
suspended again (its controller deletes the pods) and the TrainingJob requeued.

Kubernetes 1.35 lets a suspended Job's template change only before its first run, and then only
in labels, annotations, scheduling gates, node affinity and tolerations: the GPU resource stays
what the author wrote. So the object asks whole GPUs (`nvidia.com/gpu`) as Guaranteed, or share
slots (`gangshare.io/gpu-share`) as Opportunistic, and a Guaranteed one that borrows runs on idle
whole GPUs (core `GangRequest.whole_gpus`); what changes per attempt is written on the pods.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gangshare.core.annotations import (
    GPU_RESOURCE,
    JOB_LABEL,
    SHARE_RESOURCE,
    is_reserved_key,
)
from gangshare.core.job import ServiceClass
from gangshare.kube.scheduling import GPU_RESOURCES, container_gpus
from gangshare.kube.trainingjob import API_VERSION, GROUP, KIND, InvalidSpec, ReplicaGroup

QUEUE_LABEL = f"{GROUP}/queue"
SERVICE_CLASS_LABEL = f"{GROUP}/service-class"
PRIORITY_LABEL = f"{GROUP}/priority"
# Optional annotations on the object: its topology and the run time its author expects.
TOPOLOGY_POLICY_ANNOTATION = f"{GROUP}/topology-policy"
TOPOLOGY_SCOPE_ANNOTATION = f"{GROUP}/topology-scope"
RUNTIME_ANNOTATION = f"{GROUP}/runtime-estimate-seconds"
# What gangshare last decided about the object, for `kubectl describe` (events say it too).
STATUS_ANNOTATION = f"{GROUP}/status"
# The attempt the object was last resumed for: its pods made since are that attempt's.
ATTEMPT_ANNOTATION = f"{GROUP}/attempt"
# The Job controller labels each pod of an Indexed Job with its index (Kubernetes 1.28+).
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
_NAME_LIMIT = 45
# Where a kind run through a child (a TrainJob's JobSet) carries it beside the object's own
# fields (WorkloadKind.attach_child): a key no API object has, never written back.
CHILD_KEY = "gangshare.io/child"
_NOT_DNS_1035 = re.compile(r"[^a-z0-9-]")


def is_queued(obj: Mapping[str, Any]) -> bool:
    """Whether gangshare queues this object: it carries the queue label."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return QUEUE_LABEL in labels


def scheduler_refusal(kind: WorkloadKind, obj: Mapping[str, Any], scheduler: str) -> str | None:
    """Why the object's pods may not be queued as they are: a template that another scheduler
    places. The operator pins each pod to its planned node, and a profile with preemption (the
    default one's) would evict other tenants' pods one by one for a pinned pod whose node is
    briefly full; gangshare's profile never preempts (reclaim is the operator's, gang-aware)."""
    for path, template in kind.pod_templates(obj):
        named = (template.get("spec") or {}).get("schedulerName") or "default-scheduler"
        if named != scheduler:
            return (
                f"{path}.spec.schedulerName: a {kind.kind} queued by gangshare is placed by "
                f"{scheduler}, which never preempts other tenants' pods; set schedulerName: "
                f"{scheduler} (it names {named})"
            )
    return None


def was_queued(obj: Mapping[str, Any]) -> bool:
    """An object without the queue label that gangshare queued before (it wrote its status or
    attempt there): it left its queue, and its TrainingJob must let go of what it holds."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    return not is_queued(obj) and (
        STATUS_ANNOTATION in annotations or ATTEMPT_ANNOTATION in annotations
    )


def workload_name(name: str, prefix: str) -> str:
    """The name of the TrainingJob that queues an object: `<prefix><name>`, shortened with a
    hash when the name (a DNS subdomain of up to 63) does not fit a TrainingJob's (a
    45-character DNS-1035 label). The prefix keeps it apart from TrainingJobs users name."""
    plain = _NOT_DNS_1035.sub("-", name.lower()).strip("-")
    whole = f"{prefix}{plain}"
    if whole == f"{prefix}{name}" and len(whole) <= _NAME_LIMIT:
        return whole
    digest = hashlib.sha256(name.encode()).hexdigest()[:6]
    stem = whole[: _NAME_LIMIT - len(digest) - 1].rstrip("-")
    return f"{stem}-{digest}"


@dataclass(frozen=True)
class QueuedJobSpec:
    """What a queued object asks of gangshare, read from its labels, annotations, templates."""

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
    # The pod template scheduling reads (a JobSet's are alike: kube/jobset.py checks).
    template: dict[str, Any]
    # What spec.jobRef says of the object, and the prefix of its TrainingJob's name.
    api_version: str = "batch/v1"
    kind: str = "Job"
    prefix: str = "job-"
    # Its pods unlike the workers (a JobSet's CPU-only driver, say), ranked after them in this
    # order: its TrainingJob's spec.replicaGroups.
    groups: tuple[ReplicaGroup, ...] = ()
    # The uid its pods answer to when not its own (a TrainJob's pods are its JobSet's).
    pods_uid: str | None = None
    # Its TrainingJob is owned by it (collected with it); a pod group has no object to own it.
    owned: bool = True

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def workload_name(self) -> str:
        return workload_name(self.name, self.prefix)


@dataclass(frozen=True)
class QueueAsk:
    """The queue, class, priority, topology and run time an object's labels ask for."""

    queue: str
    service_class: ServiceClass
    priority: int
    topology: dict[str, Any]
    runtime_estimate_seconds: int | None


def queue_ask(obj: Mapping[str, Any]) -> QueueAsk:
    meta = obj.get("metadata") or {}
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
    estimate = annotations.get(RUNTIME_ANNOTATION)
    topology = {
        k: v
        for k, v in (
            ("policy", annotations.get(TOPOLOGY_POLICY_ANNOTATION)),
            ("scope", annotations.get(TOPOLOGY_SCOPE_ANNOTATION)),
        )
        if v
    }
    return QueueAsk(
        str(labels[QUEUE_LABEL]),
        service_class,
        priority,
        topology,
        None
        if estimate is None
        else _int_text(estimate, f"metadata.annotations[{RUNTIME_ANNOTATION}]"),
    )


def gang_pod_gpus(
    template: Mapping[str, Any],
    path: str,
    own: str,
    service_class: ServiceClass,
    cpu_only: bool = False,
) -> int:
    """The GPUs one pod of the gang asks (its first container's), after the template is
    checked; `path` is where the template is in the object (for the error's field).
    `cpu_only`: the pod may ask none (a pod set beside the workers)."""
    pod = template.get("spec") or {}
    containers = pod.get("containers") or []
    if not containers or not isinstance(containers[0], dict):
        raise InvalidSpec(f"{path}.spec.containers: at least one container is required")
    _refuse_gangshare_keys(template, own, path)
    if pod.get("nodeName"):
        raise InvalidSpec(
            f"{path}.spec.nodeName: gangshare places every pod; use nodeSelector or node "
            "affinity to restrict where"
        )
    return _first_container_gpus(pod, service_class, path, cpu_only)


def _int_text(raw: Any, field: str) -> int:
    text = str(raw)
    if not re.fullmatch(r"-?[0-9]{1,9}", text):
        raise InvalidSpec(f"{field}: must be a whole number, got {raw!r}")
    return int(text)


def _refuse_gangshare_keys(template: Mapping[str, Any], own: str, path: str) -> None:
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
                f"{path}.metadata.{kind}: {keys[0]} is reserved for gangshare (keys "
                "under gangshare.io/ are written by gangshare itself)"
            )


def _first_container_gpus(
    pod: Mapping[str, Any], service_class: ServiceClass, path: str, cpu_only: bool
) -> int:
    wanted = GPU_RESOURCE if service_class is ServiceClass.GUARANTEED else SHARE_RESOURCE
    first = pod["containers"][0]
    for resource in sorted(GPU_RESOURCES - {wanted}):
        if container_gpus(first, resource):
            raise InvalidSpec(
                f"{path}.spec.containers[0].resources: a {service_class.value} gang asks "
                f"for {wanted}, not {resource} (label {SERVICE_CLASS_LABEL})"
            )
    count = container_gpus(first, wanted)
    if not count and not cpu_only:
        raise InvalidSpec(
            f"{path}.spec.containers[0].resources.limits[{wanted}]: a queued gang asks for "
            "GPUs in its pods' first container"
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
                    f"{path}.spec.{kind}[{position}].resources: may not ask for "
                    f"{resource}; a gang's GPUs are its first container's"
                )
    return count


# ----- the TrainingJob that queues it --------------------------------------------------------


def workload(spec: QueuedJobSpec) -> dict[str, Any]:
    """The TrainingJob that holds the object's place in its queue. Its template is only what
    scheduling reads (requests, node selector and affinity, tolerations, priority class): the
    object's controller makes the pods, from the object's own templates."""
    ref = {"apiVersion": spec.api_version, "kind": spec.kind, "name": spec.name, "uid": spec.uid}
    body: dict[str, Any] = {
        "queue": spec.queue,
        "serviceClass": spec.service_class.value,
        "priority": spec.priority,
        "workers": spec.workers,
        "gpusPerWorker": spec.gpus_per_worker,
        "template": scheduling_template(spec.template),
        "jobRef": {**ref, "podsUID": spec.pods_uid} if spec.pods_uid else ref,
    }
    if spec.groups:
        body["replicaGroups"] = [
            {
                "name": group.name,
                "replicas": group.replicas,
                "gpus": group.gpus,
                "template": scheduling_template(group.template),
            }
            for group in spec.groups
        ]
    if spec.topology:
        body["topology"] = dict(spec.topology)
    if spec.runtime_estimate_seconds is not None:
        body["runtimeEstimateSeconds"] = spec.runtime_estimate_seconds
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": spec.workload_name,
            "namespace": spec.namespace,
            **({"ownerReferences": [{**ref, "controller": True}]} if spec.owned else {}),
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
    # spec.resources: a pod-level request stands in for the containers' (GPUs are refused there).
    for key in ("nodeSelector", "tolerations", "priorityClassName", "overhead", "resources"):
        if pod.get(key):
            kept[key] = copy.deepcopy(pod[key])
    node_affinity = (pod.get("affinity") or {}).get("nodeAffinity")
    if node_affinity:
        kept["affinity"] = {"nodeAffinity": copy.deepcopy(node_affinity)}
    return {"spec": kept}


def _spec_suspended(obj: Mapping[str, Any]) -> bool:
    return bool((obj.get("spec") or {}).get("suspend"))


def _spec_suspend_patch() -> dict[str, Any]:
    return {"spec": {"suspend": True}}


@dataclass(frozen=True)
class WorkloadKind:
    """What the operator needs to know of one kind of queued object (kube/batchjob.py's JOB,
    kube/jobset.py's JOBSET): how to read it, when it is done, and how to resume it."""

    api_version: str
    kind: str
    group: str
    version: str
    plural: str
    prefix: str  # of its TrainingJob's name
    parse: Callable[[Mapping[str, Any]], QueuedJobSpec]
    # ("Succeeded" | "Failed", why) once its controller says it is done.
    finished: Callable[[Mapping[str, Any]], tuple[str, str] | None]
    # Suspended, its controller done suspending it, no pod of its last run left (the pods).
    may_resume: Callable[[Mapping[str, Any], list[dict[str, Any]]], bool]
    # Its pods will be gated and labelled as this TrainingJob's (its name).
    prepared: Callable[[Mapping[str, Any], str], bool]
    # It ran ungated and its templates may not change any more.
    frozen: Callable[[Mapping[str, Any]], bool]
    # The merge patch that unsuspends it for an attempt (TrainingJob name, attempt).
    resume_patch: Callable[[Mapping[str, Any], str, int], dict[str, Any]]
    # A pod's rank from what its controllers wrote (None: any free rank).
    pod_rank: Callable[[Mapping[str, Any], Mapping[str, Any]], int | None]
    # Whether the pod is the object's own (its controllers', not its labels' say-so).
    owns: Callable[[Mapping[str, Any], Mapping[str, Any]], bool]
    # Its pod templates, each with the path to it in the object (for a reason's field).
    pod_templates: Callable[[Mapping[str, Any]], list[tuple[str, Mapping[str, Any]]]]
    # Whether it is suspended, and the merge patch that suspends it (spec.suspend for a Job
    # or a JobSet; a Kubeflow job keeps it in spec.runPolicy).
    suspended: Callable[[Mapping[str, Any]], bool] = _spec_suspended
    suspend_patch: Callable[[], dict[str, Any]] = _spec_suspend_patch
    # A kind run through a child object of its own name that it controls (a TrainJob's
    # JobSet): the child's kind, attached to the object before any of the above reads it
    # (`attach_child`), and the patch that prepares the child before the first resume.
    child_kind: WorkloadKind | None = None
    child_patch: Callable[[Mapping[str, Any], str], dict[str, Any] | None] | None = None
    attach_child: Callable[[Mapping[str, Any], Mapping[str, Any] | None], dict[str, Any]] | None = (
        None
    )
    # No object of its own: read from and written to its pods (kube/podgroup.py's groups).
    virtual: bool = False

    def workload_name(self, name: str) -> str:
        return workload_name(name, self.prefix)
