"""The TrainingJob resource as the operator reads it: spec parsing into core objects.

The CRD schema and its CEL rules reject most bad input at the API server; this
is the second line (quantities, cross-field sense) and its errors name the field
so they can land in a Failed condition instead of a crash loop.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gangshare.core.constraints import UNCONSTRAINED, PodConstraints
from gangshare.core.job import (
    GangRequest,
    PodSet,
    ServiceClass,
    Topology,
    TopologyPolicy,
    TopologyScope,
)
from gangshare.core.queueing import PodPriority, QueuedJob
from gangshare.kube.quantity import QuantityError, to_mib
from gangshare.kube.scheduling import pod_constraints
from gangshare.kube.shapes import ShapeError, Shapes, parse_shapes
from gangshare.kube.template_checks import InvalidSpec as InvalidSpec
from gangshare.kube.template_checks import check_template, checkpoint_path

GROUP = "gangshare.io"
VERSION = "v1alpha1"
PLURAL = "trainingjobs"
KIND = "TrainingJob"
API_VERSION = f"{GROUP}/{VERSION}"

DEFAULT_SLOWDOWN_TOLERANCE = 0.05
# An Opportunistic worker over its memory cap is deleted; its grace bounds how long it keeps the
# memory (the CRD's rule, the chart's share-pod-grace policy for any gpu-share pod, and the
# worker manifests, which clamp rather than refuse: a job created before the rule keeps running).
OPPORTUNISTIC_MAX_GRACE_SECONDS = 30
MAX_NAME_LENGTH = 45
# The name becomes the workers' headless Service and the stem of their hostnames: a DNS-1035
# label (lowercase letters, digits, '-', starting with a letter), as Service names must be.
NAME_PATTERN = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
NAME_RULE = (
    "metadata.name: must be a DNS-1035 label (lowercase letters, digits and '-', starting "
    "with a letter, ending with a letter or digit): it names the workers' Service and hostnames"
)


def worker_pod_name(job: str, rank: int) -> str:
    """A worker's pod name and hostname; the ledger recognizes workers by it too."""
    return f"{job}-worker-{rank}"


def group_pod_name(job: str, group: str, index: int) -> str:
    """A replica group's pod name and hostname (spec.replicaGroups)."""
    return f"{job}-{group}-{index}"


@dataclass(frozen=True)
class ReplicaGroup:
    """One of spec.replicaGroups: pods of their own shape beside the workers."""

    name: str
    replicas: int
    gpus: int
    template: dict[str, Any]
    constraints: PodConstraints = field(default=UNCONSTRAINED)


@dataclass(frozen=True)
class JobRef:
    """The object a TrainingJob queues (a batch/v1 Job or a JobSet), as spec.jobRef names it."""

    api_version: str
    kind: str
    name: str
    uid: str


@dataclass(frozen=True)
class TrainingJobSpec:
    namespace: str
    name: str
    uid: str
    generation: int
    service_class: ServiceClass
    queue: str
    priority: int
    workers: int
    gpus_per_worker: int
    gpu_memory_mib: int | None
    gpu_model: str | None
    topology: Topology
    runtime_estimate_seconds: float | None
    max_retries: int
    ttl_seconds_after_finished: int | None
    slowdown_tolerance: float
    template: dict[str, Any]
    # What kube-scheduler will check of each worker besides GPUs (from the template).
    constraints: PodConstraints = field(default=UNCONSTRAINED)
    # spec.checkpoint.path: every attempt's GANGSHARE_CHECKPOINT_DIR.
    checkpoint_path: str | None = None
    # spec.jobRef: the batch/v1 Job whose pods are this job's workers (kube/batchjob.py); the
    # TrainingJob is then only its place in the queue, as a Kueue Workload is.
    job_ref: JobRef | None = None
    # spec.replicaGroups: the gang's other pods, ranked after the workers in this order.
    groups: tuple[ReplicaGroup, ...] = ()
    # spec.shapes still open to shape advice, whether spec.reshape lets the operator take
    # one, and whether it has (workers and gpus_per_worker are then status.reshapedTo's).
    shapes: Shapes = field(default_factory=lambda: Shapes(0, 0))

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def total_gpus(self) -> int:
        return self.workers * self.gpus_per_worker + sum(g.replicas * g.gpus for g in self.groups)

    @property
    def pod_count(self) -> int:
        """Every pod of the gang: its workers and its replica groups' pods."""
        return self.workers + sum(g.replicas for g in self.groups)

    def group_of(self, rank: int) -> tuple[ReplicaGroup, int] | None:
        """The replica group rank `rank` belongs to and its index there; None for a worker."""
        start = self.workers
        for group in self.groups:
            if start <= rank < start + group.replicas:
                return group, rank - start
            start += group.replicas
        return None

    def pod_name(self, rank: int) -> str:
        found = self.group_of(rank)
        if found is None:
            return worker_pod_name(self.name, rank)
        return group_pod_name(self.name, found[0].name, found[1])

    @property
    def queued_as(self) -> dict[str, Any]:
        """The line a place (status.queuedAt) is held in: status.queuedAs records it."""
        return {"queue": self.queue, "priority": self.priority}

    def moved_since_queued(self, status: Mapping[str, Any]) -> bool:
        """Moved to another queue or priority since its place was taken; a status from before
        queuedAs was recorded counts as not moved."""
        recorded = status.get("queuedAs")
        return isinstance(recorded, dict) and recorded != self.queued_as

    @property
    def priority_class_name(self) -> str | None:
        name = (self.template.get("spec") or {}).get("priorityClassName")
        return str(name) if name else None

    def gang(self) -> GangRequest:
        return GangRequest(
            self.key,
            self.workers,
            self.gpus_per_worker,
            self.service_class,
            self.topology,
            self.gpu_memory_mib,
            self.gpu_model,
            self.constraints,
            # A Job's template fixes its GPU resource: borrowing cannot move it to share slots.
            whole_gpus=self.job_ref is not None,
            companions=tuple(
                PodSet(g.name, g.replicas, g.gpus, g.constraints) for g in self.groups
            ),
            worker_set="worker",
            alternative_shapes=self.shapes.alternatives,
        )

    def queued(
        self,
        submitted_at: float,
        runtime_estimate: float | None = None,
        priority_classes: Mapping[str, int] | None = None,
    ) -> QueuedJob:
        """`priority_classes`: PriorityClass name -> value, to judge the template's class by."""
        name = self.priority_class_name
        pod_priority = (
            PodPriority(name, (priority_classes or {}).get(name))
            if name is not None and priority_classes is not None
            else None
        )
        return QueuedJob(
            self.key,
            self.gang(),
            submitted_at,
            self.queue,
            self.priority,
            runtime_estimate if runtime_estimate is not None else self.runtime_estimate_seconds,
            pod_priority,
        )


def _int(spec: dict[str, Any], field: str, default: int | None, low: int, high: int) -> int | None:
    value = spec.get(field, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSpec(f"spec.{field}: must be an integer, got {value!r}")
    if not low <= value <= high:
        raise InvalidSpec(f"spec.{field}: must be between {low} and {high}, got {value}")
    return value


def _enum(raw: Any, field: str, kind: type[Any], default: Any) -> Any:
    try:
        return kind(raw if raw is not None else default)
    except ValueError:
        allowed = ", ".join(m.value for m in kind)
        raise InvalidSpec(f"{field}: must be one of {allowed}, got {raw!r}") from None


def parse_trainingjob(obj: dict[str, Any]) -> TrainingJobSpec:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise InvalidSpec("spec: required")
    name = str(meta.get("name", ""))
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidSpec(f"metadata.name: at most {MAX_NAME_LENGTH} characters")
    if not NAME_PATTERN.match(name):
        raise InvalidSpec(NAME_RULE)
    service_class = _enum(spec.get("serviceClass"), "spec.serviceClass", ServiceClass, "Guaranteed")
    topo = spec.get("topology") or {}
    topology = Topology(
        _enum(topo.get("policy"), "spec.topology.policy", TopologyPolicy, "Preferred"),
        _enum(topo.get("scope"), "spec.topology.scope", TopologyScope, "NVLink"),
        _int(topo, "relaxAfterSeconds", None, 0, 604800) if "relaxAfterSeconds" in topo else None,
    )
    memory = None
    if spec.get("gpuMemory") is not None:
        if service_class is not ServiceClass.OPPORTUNISTIC:
            raise InvalidSpec("spec.gpuMemory: only Opportunistic jobs set gpuMemory")
        try:
            memory = to_mib(spec["gpuMemory"], "spec.gpuMemory")
        except QuantityError as err:
            raise InvalidSpec(str(err)) from None
    template = spec.get("template")
    containers = (
        (template or {}).get("spec", {}).get("containers") if isinstance(template, dict) else None
    )
    if not isinstance(template, dict) or not isinstance(containers, list) or not containers:
        raise InvalidSpec("spec.template.spec.containers: at least one container is required")
    check_template(template, "spec.template")
    workers = _int(spec, "workers", None, 1, 1024) or _missing("spec.workers")
    # A queued object's pods are named by its controller: only a TrainingJob's own need room.
    groups = _replica_groups(spec.get("replicaGroups"), name, workers, "jobRef" not in spec)
    tolerance = spec.get("slowdownTolerance", DEFAULT_SLOWDOWN_TOLERANCE)
    if not isinstance(tolerance, int | float) or not 0 <= tolerance <= 1:
        raise InvalidSpec(f"spec.slowdownTolerance: must be between 0 and 1, got {tolerance!r}")
    estimate = _int(spec, "runtimeEstimateSeconds", None, 1, 31536000)
    own = _int(spec, "gpusPerWorker", None, 1, 64) or _missing("spec.gpusPerWorker")
    try:
        shapes = parse_shapes(spec, obj.get("status") or {}, workers, own)
    except ShapeError as err:
        raise InvalidSpec(str(err)) from None
    return TrainingJobSpec(
        namespace=str(meta.get("namespace", "")),
        name=name,
        uid=str(meta.get("uid", "")),
        generation=int(meta.get("generation", 0)),
        service_class=service_class,
        queue=str(spec.get("queue", "default")),
        priority=_int(spec, "priority", 0, -1000000, 1000000) or 0,
        workers=shapes.workers,
        gpus_per_worker=shapes.gpus_per_worker,
        gpu_memory_mib=memory,
        gpu_model=spec.get("gpuModel") or None,
        topology=topology,
        runtime_estimate_seconds=float(estimate) if estimate is not None else None,
        max_retries=_int(spec, "maxRetries", 3, 0, 100) or 0,
        ttl_seconds_after_finished=_int(spec, "ttlSecondsAfterFinished", None, 0, 31536000),
        slowdown_tolerance=float(tolerance),
        template=template,
        constraints=pod_constraints(template["spec"]),
        checkpoint_path=checkpoint_path(spec.get("checkpoint"), template["spec"]),
        job_ref=_job_ref(spec.get("jobRef")),
        groups=groups,
        shapes=shapes,
    )


def _replica_groups(raw: Any, job: str, workers: int, own_pods: bool) -> tuple[ReplicaGroup, ...]:
    """spec.replicaGroups read and checked as the CRD's schema does (the second line)."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or len(raw) > 8:
        raise InvalidSpec("spec.replicaGroups: a list of at most 8 groups")
    groups: list[ReplicaGroup] = []
    pods = workers
    for position, item in enumerate(raw):
        path = f"spec.replicaGroups[{position}]"
        if not isinstance(item, dict):
            raise InvalidSpec(f"{path}: must be an object")
        name = item.get("name")
        if not isinstance(name, str) or not NAME_PATTERN.match(name) or len(name) > 63:
            raise InvalidSpec(f"{path}.name: a DNS-1035 label of at most 63 characters")
        if name == "worker" or any(g.name == name for g in groups):
            raise InvalidSpec(f"{path}.name: {name!r} names another group (or the workers)")
        try:
            replicas = _int(item, "replicas", None, 1, 1024)
            gpus = _int(item, "gpus", 0, 0, 64) or 0
        except InvalidSpec as err:  # _int names spec.<field>: this is the group's
            raise InvalidSpec(str(err).replace("spec.", f"{path}.", 1)) from None
        template = item.get("template")
        containers = (
            (template.get("spec") or {}).get("containers") if isinstance(template, dict) else None
        )
        if not isinstance(template, dict) or not isinstance(containers, list) or not containers:
            raise InvalidSpec(
                f"{path}.template.spec.containers: at least one container is required"
            )
        check_template(template, f"{path}.template")
        if replicas is None:
            raise InvalidSpec(f"{path}.replicas: required")
        pods += replicas
        if own_pods and len(f"{job}-{name}-{replicas - 1}") > 63:
            raise InvalidSpec(f"{path}.name: {job}-{name}-N must fit a 63-character hostname")
        groups.append(
            ReplicaGroup(name, replicas, gpus, template, pod_constraints(template["spec"]))
        )
    if pods > 1024:
        raise InvalidSpec(f"spec.replicaGroups: a gang has at most 1024 pods, this has {pods}")
    return tuple(groups)


def _job_ref(raw: Any) -> JobRef | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not all(raw.get(k) for k in ("kind", "name", "uid")):
        raise InvalidSpec("spec.jobRef: needs kind, name and uid")
    queued = (
        ("batch/v1", "Job"),
        ("jobset.x-k8s.io/v1alpha2", "JobSet"),
        ("kubeflow.org/v1", "PyTorchJob"),
        ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
        ("v1", "PodGroup"),
    )
    if (raw.get("apiVersion"), raw.get("kind")) not in queued:
        raise InvalidSpec(
            f"spec.jobRef: only batch/v1 Jobs, jobset.x-k8s.io/v1alpha2 JobSets, "
            f"kubeflow.org/v1 PyTorchJobs, trainer.kubeflow.org/v1alpha1 TrainJobs and pod groups "
            f"are queued "
            f"this way, got {raw.get('apiVersion')} {raw.get('kind')}"
        )
    return JobRef(str(raw["apiVersion"]), str(raw["kind"]), str(raw["name"]), str(raw["uid"]))


def _missing(field: str) -> int:
    raise InvalidSpec(f"{field}: required")
