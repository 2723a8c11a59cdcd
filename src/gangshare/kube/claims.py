"""What a pod or a TrainingJob claims of the GPUs, read from API objects (pure).

Only the operator's own pods are gang workers: a pod named `<job>-worker-<rank>`,
labelled with the job's attempt, whose controller is the TrainingJob's uid. The
job's plan comes from its status (written only by the operator), never from a
pod's annotations. Any other pod claims GPUs only once bound to a node.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from functools import cached_property
from typing import Any

from gangshare.core.annotations import (
    ATTEMPT_LABEL,
    GPU_RESOURCE,
    JOB_LABEL,
    POD_ASSIGNED_GPUS,
    POD_GPU_MEMORY,
    POD_PLANNED_GPUS,
    RANK_LABEL,
    REPLICA_GROUP_LABEL,
    SHARE_RESOURCE,
    AnnotationError,
    decode_gpu_indices,
)
from gangshare.core.constraints import PodConstraints
from gangshare.core.job import ServiceClass
from gangshare.kube import podgroup
from gangshare.kube.jobset import JOBSET_UID_LABEL
from gangshare.kube.pytorchjob import API_VERSION as PYTORCHJOB_API_VERSION
from gangshare.kube.pytorchjob import KIND as PYTORCHJOB_KIND
from gangshare.kube.quantity import to_mib
from gangshare.kube.scheduling import TERMINAL_POD_PHASES, gpu_devices, pod_constraints
from gangshare.kube.trainingjob import GROUP, KIND, group_pod_name, worker_pod_name

HOLDING_PHASES = ("Admitted", "Running")


class ClaimKind(IntEnum):
    """Precedence when a node's GPUs are handed out: facts first, plans last."""

    FACT = 0  # a pod bound to the node: the kubelet may be running it
    ASSUMED = 1  # a bind the extender decided and has not seen come back yet
    PLAN = 2  # an admitted gang's worker not bound yet


@dataclass(frozen=True)
class Claim:
    owner: str
    kind: ClaimKind
    node: str
    service_class: ServiceClass
    count: int
    indices: tuple[int, ...] | None
    memory_mib: int | None = None
    # Non-GPU requests a plan promises on its node (facts are counted from the pod list).
    resources: tuple[tuple[str, int], ...] = ()
    job: str | None = None
    constraints: PodConstraints | None = None


@dataclass(frozen=True)
class WorkerIdentity:
    job: str  # namespace/name
    uid: str
    rank: int
    attempt: int
    # Controlled by a batch/v1 Job (a queued Job's pod), not by the TrainingJob itself.
    batch: bool = False


@dataclass(frozen=True)
class PodFacts:
    owner: str
    node: str | None  # spec.nodeName, once bound
    service_class: ServiceClass
    count: int
    indices: tuple[int, ...] | None
    memory_mib: int | None
    identity: WorkerIdentity | None


@dataclass(frozen=True)
class JobHold:
    """An admitted TrainingJob's promise: rank -> (node, GPUs), from its status."""

    key: str
    uid: str
    attempt: int
    service_class: ServiceClass
    memory_mib: int | None
    placement: tuple[tuple[int, str, tuple[int, ...]], ...]
    constraints: PodConstraints
    # spec.topology says Required, NVLink scope: no worker may run across NVLink islands.
    islands_required: bool = False
    # The operator has committed to lifting every gate of this attempt (its GangScheduled
    # condition, written before the first gate comes off): the gang barrier is passed.
    lift_committed: bool = False
    # A queued batch/v1 Job's (spec.jobRef): its workers are the Job's pods.
    batch: bool = False
    # spec.replicaGroups: (first rank, group name, constraints) of each, in rank order.
    groups: tuple[tuple[int, str, PodConstraints], ...] = ()

    def group_of(self, rank: int) -> tuple[int, str, PodConstraints] | None:
        """The replica group rank `rank` is in (None: a worker)."""
        found = None
        for group in self.groups:
            if rank >= group[0]:
                found = group
        return found

    def constraints_of(self, rank: int) -> PodConstraints:
        group = self.group_of(rank)
        return self.constraints if group is None else group[2]

    def pod_name(self, rank: int) -> str:
        """The name of a TrainingJob's own pod of this rank (the only name it may have)."""
        job = self.key.partition("/")[2]
        group = self.group_of(rank)
        if group is None:
            return worker_pod_name(job, rank)
        return group_pod_name(job, group[1], rank - group[0])

    def rank_owner(self, rank: int) -> str:
        return f"{self.key}/{rank}"

    def plan_of(self, rank: int) -> tuple[str, tuple[int, ...]] | None:
        return self._plans.get(rank)

    @cached_property
    def _plans(self) -> dict[int, tuple[str, tuple[int, ...]]]:
        # Asked for every worker of a gang on every pod event: a scan per rank made a 512-worker
        # gang's events cost 512 x 512 steps each.
        return {rank: (node, gpus) for rank, node, gpus in self.placement}


def pod_owner(namespace: str, name: str) -> str:
    return f"pod:{namespace}/{name}"


def job_key(job: dict[str, Any]) -> str:
    """A TrainingJob's key in the ledger: namespace/name."""
    meta = job.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def gpu_request(pod: dict[str, Any]) -> tuple[ServiceClass, int] | None:
    """(class, GPUs) a pod holds, counted over all its containers as the kubelet counts them
    (a sidecar's GPUs included): whole GPUs are Guaranteed, share slots Opportunistic."""
    asked = gpu_devices(pod.get("spec") or {})
    if asked.get(GPU_RESOURCE):
        return ServiceClass.GUARANTEED, asked[GPU_RESOURCE]
    if asked.get(SHARE_RESOURCE):
        return ServiceClass.OPPORTUNISTIC, asked[SHARE_RESOURCE]
    return None


def worker_identity(pod: dict[str, Any]) -> WorkerIdentity | None:
    """Who the pod says it works for; the ledger checks the claim against the job itself. A
    TrainingJob's worker is named `<job>-worker-<rank>` and controlled by the TrainingJob; a
    queued batch/v1 Job's pod is controlled by that Job (the TrainingJob's spec.jobRef.uid),
    and named by the Job controller."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    job = labels.get(JOB_LABEL)
    rank, attempt = str(labels.get(RANK_LABEL, "")), str(labels.get(ATTEMPT_LABEL, ""))
    if not job or not rank.isdigit() or not attempt.isdigit():
        return None
    controller = next(
        (ref for ref in meta.get("ownerReferences") or [] if ref.get("controller")), None
    )
    group = podgroup.group_name(pod)
    if group is not None and job == podgroup.PREFIX + group:
        # A pod group's member answers to its group (kube/podgroup.py); its job label, rank
        # and attempt are gangshare's alone to write (the chart's reserved-keys policy).
        namespace = str(meta.get("namespace"))
        uid = podgroup.group_uid(namespace, group)
        return WorkerIdentity(f"{namespace}/{job}", uid, int(rank), int(attempt), batch=True)
    if controller is None:
        return None
    # A replica group's pod is named by its group and index; which rank that is, the job's
    # hold says (kube/ledger.py looks each rank's pod up by its one name).
    group = labels.get(REPLICA_GROUP_LABEL)
    named = meta.get("name") == worker_pod_name(job, int(rank)) or (
        bool(group) and str(meta.get("name", "")).startswith(f"{job}-{group}-")
    )
    own = (
        controller.get("kind") == KIND
        and str(controller.get("apiVersion", "")).startswith(f"{GROUP}/")
        and controller.get("name") == job
        and named
    )
    made_by = (controller.get("apiVersion"), controller.get("kind"))
    batch = made_by == ("batch/v1", "Job")
    # A PyTorchJob's pods are the training-operator's, controlled by the PyTorchJob itself.
    kubeflow = made_by == (PYTORCHJOB_API_VERSION, PYTORCHJOB_KIND)
    if not (own or batch or kubeflow):
        return None
    # A JobSet's pods are its child Jobs': they answer to the JobSet's uid, which its
    # controller labels them with.
    uid = str(controller.get("uid")) if own or kubeflow else str(labels.get(JOBSET_UID_LABEL) or "")
    return WorkerIdentity(
        f"{meta.get('namespace')}/{job}",
        uid or str(controller.get("uid")),
        int(rank),
        int(attempt),
        batch=not own,
    )


def recorded_indices(pod: dict[str, Any], count: int) -> tuple[tuple[int, ...] | None, str | None]:
    """The GPUs recorded on a bound pod: the agent's published assignment (the kubelet's
    truth), else the extender's Binding; (None, warning) when unreadable."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    for key in (POD_ASSIGNED_GPUS, POD_PLANNED_GPUS):
        if key in annotations:
            try:
                indices = decode_gpu_indices(key, annotations[key])
            except AnnotationError as err:
                return None, str(err)
            return (indices if len(indices) == count else None), None
    return None, None


def pod_facts(pod: dict[str, Any]) -> tuple[PodFacts | None, str | None]:
    """(facts, warning) for a live pod that asks for GPUs; (None, None) for any other pod."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if status.get("phase") in TERMINAL_POD_PHASES:
        return None, None
    asked = gpu_request(pod)
    if asked is None and JOB_LABEL in (meta.get("labels") or {}):
        # A gang's CPU-only pod (a launcher, a driver): no GPUs, but bound it is its rank's
        # fact, so the plan stops holding its CPU beside the pod list's count of it.
        asked = (ServiceClass.GUARANTEED, 0)
    if asked is None:
        return None, None
    owner = pod_owner(meta.get("namespace", "default"), meta.get("name", ""))
    node = spec.get("nodeName") or None
    indices, warning = recorded_indices(pod, asked[1]) if node and asked[1] else (None, None)
    memory = None
    raw = (meta.get("annotations") or {}).get(POD_GPU_MEMORY)
    if asked[0] is ServiceClass.OPPORTUNISTIC and raw and raw.isdigit():
        memory = int(raw)
    facts = PodFacts(owner, node, asked[0], asked[1], indices, memory, worker_identity(pod))
    return facts, (f"{owner}: {warning}" if warning else None)


def admitted_class(job: dict[str, Any]) -> ServiceClass:
    """The class the job holds GPUs as: what admission decided, else what its spec asks.

    A job admitted beyond its queue's quota runs Opportunistic on its cohort's borrowed
    capacity whatever its spec says (AntMan); admission records that in status.serviceClass.
    """
    decided = (job.get("status") or {}).get("serviceClass")
    asked = (job.get("spec") or {}).get("serviceClass", "Guaranteed")
    try:
        return ServiceClass(decided or asked)
    except ValueError:
        return ServiceClass(asked)


def job_hold(job: dict[str, Any]) -> tuple[JobHold | None, str | None]:
    """(hold, warning) for a TrainingJob that holds GPUs (admitted or running with a placement)."""
    meta, spec, status = job.get("metadata") or {}, job.get("spec") or {}, job.get("status") or {}
    if status.get("phase") not in HOLDING_PHASES or not status.get("placement"):
        return None, None
    key = job_key(job)
    try:
        service_class = admitted_class(job)
        memory = None
        if service_class is ServiceClass.OPPORTUNISTIC and spec.get("gpuMemory") is not None:
            memory = to_mib(spec["gpuMemory"], "spec.gpuMemory")
        placement = tuple(
            (int(w["rank"]), str(w["node"]), tuple(int(g) for g in w.get("gpus") or []))
            for w in status["placement"]
        )
        groups = _hold_groups(spec)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        return None, f"{key}: status.placement or spec unreadable ({err})"
    template_spec = ((spec.get("template") or {}).get("spec")) or {}
    topology = spec.get("topology") or {}
    islands_required = topology.get("policy") == "Required" and topology.get("scope", "NVLink") in (
        "NVLink",
        None,
    )
    lift_committed = any(
        c.get("type") == "GangScheduled" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    # A queued Job's pods are controlled by the Job: they answer to its uid.
    ref = spec.get("jobRef") if isinstance(spec.get("jobRef"), dict) else None
    # A TrainJob's pods are its JobSet's: they answer to the JobSet's uid (podsUID).
    uid = str(ref.get("podsUID") or ref.get("uid", "")) if ref else str(meta.get("uid", ""))
    return (
        JobHold(
            key,
            uid,
            int(status.get("attempt", 0) or 0),
            service_class,
            memory,
            placement,
            pod_constraints(template_spec),
            islands_required,
            lift_committed,
            batch=ref is not None,
            groups=groups,
        ),
        None,
    )


def _hold_groups(spec: dict[str, Any]) -> tuple[tuple[int, str, PodConstraints], ...]:
    first = int(spec.get("workers", 0) or 0)
    found = []
    for group in spec.get("replicaGroups") or []:
        template_spec = ((group.get("template") or {}).get("spec")) or {}
        found.append((first, str(group.get("name", "")), pod_constraints(template_spec)))
        first += int(group.get("replicas", 0) or 0)
    return tuple(found)
