"""A core `Cluster` built from API objects (plain dicts as the API server returns them).

Who holds which GPUs comes from two places: an admitted TrainingJob's recorded
placement (it holds its GPUs from admission on, before its pods exist), and
every other live pod that requests GPUs (its published assignment, else its
recorded plan, else the core's own choice on its node). Pure: no API calls, so
the operator, the extender and the simulator tests can all build the same snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gangshare.core.annotations import (
    GPU_RESOURCE,
    JOB_LABEL,
    POD_ASSIGNED_GPUS,
    POD_GPU_MEMORY,
    POD_PLANNED_GPUS,
    POD_PLANNED_NODE,
    RANK_LABEL,
    SHARE_RESOURCE,
    AnnotationError,
    decode_gpu_indices,
    decode_node,
)
from gangshare.core.choose import choose_gpus
from gangshare.core.cluster import AllocationError, Cluster
from gangshare.core.job import ServiceClass, WorkerRequest
from gangshare.core.queueing import RunningJob
from gangshare.kube.quantity import QuantityError, to_int

HOLDING_PHASES = ("Admitted", "Running")
TERMINAL_POD_PHASES = ("Succeeded", "Failed")


@dataclass
class Snapshot:
    cluster: Cluster
    running: list[RunningJob] = field(default_factory=list)
    # Things the snapshot had to skip, each with the reason (surfaced in logs).
    warnings: list[str] = field(default_factory=list)


def parse_time(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def node_unschedulable_reason(node: dict[str, Any]) -> str | None:
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return "node is cordoned"
    for taint in spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute"):
            return (
                f"node has taint {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')}"
            )
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return None if ready else "node is not Ready"


def pod_gpu_request(pod: dict[str, Any]) -> tuple[ServiceClass, int] | None:
    """(class, GPUs) a pod asks for: whole GPUs are Guaranteed, share slots Opportunistic."""
    whole = share = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        asked = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        try:
            whole += to_int(asked.get(GPU_RESOURCE, 0), GPU_RESOURCE)
            share += to_int(asked.get(SHARE_RESOURCE, 0), SHARE_RESOURCE)
        except QuantityError:
            continue
    if whole:
        return ServiceClass.GUARANTEED, whole
    if share:
        return ServiceClass.OPPORTUNISTIC, share
    return None


def build_snapshot(
    nodes: Iterable[dict[str, Any]],
    pods: Iterable[dict[str, Any]],
    jobs: Iterable[dict[str, Any]],
    default_runtime_seconds: float = 3600.0,
) -> Snapshot:
    snapshot = Snapshot(Cluster())
    for node in nodes:
        meta = node.get("metadata") or {}
        try:
            state = decode_node(
                meta.get("name", ""),
                meta.get("labels") or {},
                meta.get("annotations") or {},
                node_unschedulable_reason(node),
            )
        except AnnotationError as err:
            snapshot.warnings.append(f"node {meta.get('name')}: {err}")
            continue
        if state is not None:
            snapshot.cluster.add_node(state)
    held = _hold_job_placements(snapshot, jobs, default_runtime_seconds)
    _hold_pods(snapshot, pods, held)
    return snapshot


def _hold_job_placements(
    snapshot: Snapshot, jobs: Iterable[dict[str, Any]], default_runtime: float
) -> set[tuple[str, str]]:
    held: set[tuple[str, str]] = set()
    for job in jobs:
        meta, spec, status = (
            job.get("metadata") or {},
            job.get("spec") or {},
            job.get("status") or {},
        )
        if status.get("phase") not in HOLDING_PHASES or not status.get("placement"):
            continue
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        service_class = ServiceClass(spec.get("serviceClass", "Guaranteed"))
        memory = None
        if service_class is ServiceClass.OPPORTUNISTIC and spec.get("gpuMemory") is not None:
            try:
                memory = -(-to_int(spec["gpuMemory"], "spec.gpuMemory") // 2**20)
            except QuantityError:
                memory = None
        gpus = 0
        for worker in status["placement"]:
            node = worker.get("node")
            if node not in snapshot.cluster.nodes:
                snapshot.warnings.append(f"{key}: placement on unknown node {node}")
                continue
            try:
                snapshot.cluster.allocate(
                    key,
                    f"{key}/{worker.get('rank')}",
                    node,
                    worker.get("gpus") or [],
                    service_class,
                    memory,
                )
            except AllocationError as err:
                snapshot.warnings.append(f"{key}: {err}")
                continue
            held.add((key, str(worker.get("rank"))))
            gpus += len(worker.get("gpus") or [])
        start = parse_time(status.get("startedAt")) or parse_time(status.get("admittedAt"))
        estimate = (
            status.get("predictedRuntimeSeconds")
            or spec.get("runtimeEstimateSeconds")
            or default_runtime
        )
        snapshot.running.append(
            RunningJob(
                key,
                str(spec.get("queue", "default")),
                gpus,
                service_class,
                None if start is None else start + float(estimate),
            )
        )
    return held


@dataclass(frozen=True)
class PodClaim:
    """The GPUs a live pod holds or is promised: where, how many, which (when recorded)."""

    owner: str
    node: str
    service_class: ServiceClass
    count: int
    indices: tuple[int, ...] | None
    memory_mib: int | None
    job: str | None
    rank: str | None
    bound: bool


def pod_claim(pod: dict[str, Any]) -> tuple[PodClaim | None, str | None]:
    """(claim, warning): a pod holds GPUs once bound, or once the operator planned its node."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if status.get("phase") in TERMINAL_POD_PHASES:
        return None, None
    asked = pod_gpu_request(pod)
    if asked is None:
        return None, None
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    node = spec.get("nodeName") or annotations.get(POD_PLANNED_NODE)
    if not node:
        return None, None
    owner = f"pod:{meta.get('namespace')}/{meta.get('name')}"
    indices, warning = _recorded_indices(annotations, owner)
    job = labels.get(JOB_LABEL)
    claim = PodClaim(
        owner=owner,
        node=node,
        service_class=asked[0],
        count=asked[1],
        indices=indices if indices is not None and len(indices) == asked[1] else None,
        memory_mib=_int_annotation(annotations.get(POD_GPU_MEMORY)),
        job=f"{meta.get('namespace')}/{job}" if job else None,
        rank=str(labels.get(RANK_LABEL)) if job else None,
        bound=bool(spec.get("nodeName")),
    )
    return claim, warning


def hold_claim(cluster: Cluster, claim: PodClaim) -> str | None:
    """Allocate a claim in the cluster; returns a warning when it cannot be held."""
    if claim.node not in cluster.nodes:
        return f"{claim.owner}: on unknown node {claim.node}"
    indices = claim.indices
    if indices is None:
        req = WorkerRequest(claim.count, claim.service_class, gpu_memory_mib=claim.memory_mib)
        indices = choose_gpus(cluster.node(claim.node), req)
    if indices is None:
        return f"{claim.owner}: no room left on {claim.node} for its {claim.count} GPU(s)"
    try:
        cluster.allocate(
            claim.owner, claim.owner, claim.node, indices, claim.service_class, claim.memory_mib
        )
    except AllocationError as err:
        return f"{claim.owner}: {err}"
    return None


def _hold_pods(
    snapshot: Snapshot, pods: Iterable[dict[str, Any]], held: set[tuple[str, str]]
) -> None:
    for pod in pods:
        claim, warning = pod_claim(pod)
        if warning:
            snapshot.warnings.append(warning)
        if claim is None or (claim.job, claim.rank) in held:
            continue  # no GPUs, or its job's placement already holds them
        problem = hold_claim(snapshot.cluster, claim)
        if problem:
            snapshot.warnings.append(problem)


def _recorded_indices(
    annotations: dict[str, str], owner: str
) -> tuple[tuple[int, ...] | None, str | None]:
    for key in (POD_ASSIGNED_GPUS, POD_PLANNED_GPUS):
        if key in annotations:
            try:
                return decode_gpu_indices(key, annotations[key]), None
            except AnnotationError as err:
                return None, f"{owner}: {err}"
    return None, None


def _int_annotation(raw: str | None) -> int | None:
    try:
        return int(raw) if raw else None
    except ValueError:
        return None
