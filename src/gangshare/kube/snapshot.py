"""The operator's view of the cluster for one scheduling pass, built from API objects (pure).

Nodes with what kube-scheduler will check (taints, allocatable, what bound pods
already request), then the one ledger of GPU promises (see ledger.py): bound
pods, admitted gangs' plans. Whatever had to be skipped is a warning; admitted
gangs whose plan broke are `displaced`, for the operator to requeue.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gangshare.core.annotations import AnnotationError, decode_node
from gangshare.core.cluster import Cluster
from gangshare.core.node import NodeState
from gangshare.core.queueing import RunningJob
from gangshare.kube.claims import HOLDING_PHASES, admitted_class, job_key
from gangshare.kube.ledger import Ledger
from gangshare.kube.scheduling import node_allocatable, node_taints, requests_by_node


@dataclass
class Snapshot:
    cluster: Cluster
    running: list[RunningJob] = field(default_factory=list)
    # Things the snapshot had to skip, each with the reason (surfaced in logs).
    warnings: list[str] = field(default_factory=list)
    # Admitted gangs whose promise broke before all workers were bound: job key -> reason.
    displaced: dict[str, str] = field(default_factory=dict)
    # Gangs that require one NVLink island per worker, run across islands: job key -> reason.
    off_island: dict[str, str] = field(default_factory=dict)


def parse_time(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def node_unschedulable_reason(node: dict[str, Any]) -> str | None:
    """Why no new pod may land on the node at all. Taints are not here: they keep off only
    the pods that do not tolerate them (NodeState.taints, checked per job)."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return "node is cordoned"
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return None if ready else "node is not Ready"


def decode_api_node(node: dict[str, Any], scheduling: bool) -> NodeState | None:
    """A NodeState from a Node object; with `scheduling`, its taints and allocatable too."""
    meta = node.get("metadata") or {}
    state = decode_node(
        meta.get("name", ""),
        meta.get("labels") or {},
        meta.get("annotations") or {},
        node_unschedulable_reason(node),
    )
    if state is not None and scheduling:
        state.taints = node_taints(node)
        state.allocatable = node_allocatable(node)
    return state


def running_jobs(jobs: Iterable[dict[str, Any]], default_runtime: float) -> list[RunningJob]:
    """Jobs holding GPUs, with when each is expected to end (backfill and quota usage)."""
    running = []
    for job in jobs:
        spec, status = job.get("spec") or {}, job.get("status") or {}
        if status.get("phase") not in HOLDING_PHASES or not status.get("placement"):
            continue
        gpus = sum(len(w.get("gpus") or []) for w in status["placement"])
        start = parse_time(status.get("startedAt")) or parse_time(status.get("admittedAt"))
        estimate = (
            status.get("predictedRuntimeSeconds")
            or spec.get("runtimeEstimateSeconds")
            or default_runtime
        )
        running.append(
            RunningJob(
                job_key(job),
                str(spec.get("queue", "default")),
                gpus,
                admitted_class(job),
                None if start is None else start + float(estimate),
                borrowed=bool(status.get("borrowed")),
                priority=int(spec.get("priority", 0) or 0),
                started_at=start or 0.0,
                evictions=int(status.get("preemptions") or 0) + int(status.get("evictions") or 0),
            )
        )
    return running


def build_snapshot(
    nodes: Iterable[dict[str, Any]],
    pods: Iterable[dict[str, Any]],
    jobs: Iterable[dict[str, Any]],
    default_runtime_seconds: float = 3600.0,
) -> Snapshot:
    pods, jobs = list(pods), list(jobs)
    requested = requests_by_node(pods)
    warnings: list[str] = []
    states = []
    for node in nodes:
        try:
            state = decode_api_node(node, scheduling=True)
        except AnnotationError as err:
            warnings.append(f"node {(node.get('metadata') or {}).get('name')}: {err}")
            continue
        if state is not None:
            state.requested = dict(requested.get(state.name, {}))
            states.append(state)
    ledger = Ledger()
    with ledger.batch():
        ledger.replace_nodes(states)
        warnings += ledger.replace_jobs(jobs)
        warnings += ledger.replace_pods(pods)
    warnings += ledger.warnings()
    return Snapshot(
        ledger.cluster,
        running_jobs(jobs, default_runtime_seconds),
        warnings,
        ledger.displaced(),
        ledger.off_island(),
    )
