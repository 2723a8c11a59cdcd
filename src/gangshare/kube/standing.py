"""The operator's snapshot kept current from what changed, not rebuilt every pass (pure).

`build_snapshot` makes a pass's view from every Node, Pod and TrainingJob; at 4,000 pods it
was 68% of the operator's busy samples, a cost that grows with what exists (#39). Here one
ledger (kube/ledger.py, the one the extender keeps from its watches) lives across passes,
and each pass applies only the objects that changed since the last: a node is decoded again
only when what its NodeState is made from changed, a pod moves only its own requests and
claims, a job only its own plan and running record.

What it builds must be what `build_snapshot` builds from the same objects: an audit now and
then rebuilds from everything and compares (`snapshot_drift`); the operator counts and logs
any drift and starts afresh from the rebuild. Order aside (node and running-job order, the
free-GPU index's ties), the two are the same state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gangshare.core.annotations import AnnotationError
from gangshare.core.node import NodeState
from gangshare.core.queueing import RunningJob
from gangshare.kube.ledger import Ledger
from gangshare.kube.scheduling import TERMINAL_POD_PHASES, pod_requests
from gangshare.kube.snapshot import (
    Snapshot,
    decode_api_node,
    node_unschedulable_reason,
    running_jobs,
)

Objects = Mapping[str, "dict[str, Any] | None"]


class StandingSnapshot:
    def __init__(self, default_runtime_seconds: float = 3600.0) -> None:
        self.default_runtime_seconds = default_runtime_seconds
        self.ledger = Ledger()
        # node name -> what its NodeState was decoded from (a new object with the same
        # inputs, a heartbeat, changes nothing)
        self._node_inputs: dict[str, tuple[Any, ...]] = {}
        self._node_warnings: dict[str, str] = {}
        # pod key -> (node, its requests) while bound and live; node -> their sum
        self._pod_requests: dict[str, tuple[str, dict[str, int]]] = {}
        self._requested: dict[str, dict[str, int]] = {}
        self._pod_warnings: dict[str, str] = {}
        self._job_warnings: dict[str, str] = {}
        self._running: dict[str, RunningJob] = {}

    @classmethod
    def of(
        cls,
        nodes: Iterable[dict[str, Any]],
        pods: Iterable[dict[str, Any]],
        jobs: Iterable[dict[str, Any]],
        default_runtime_seconds: float = 3600.0,
    ) -> StandingSnapshot:
        """One loaded from everything at once (a start, or the repair after drift)."""
        standing = cls(default_runtime_seconds)
        standing.apply(
            {_key(n): n for n in nodes}, {_key(p): p for p in pods}, {_key(j): j for j in jobs}
        )
        return standing

    def apply(self, nodes: Objects, pods: Objects, jobs: Objects) -> None:
        """Take in what changed (key -> the object now, None: gone); nodes holds claims once,
        at the end."""
        with self.ledger.batch():
            for name, node in nodes.items():
                self._apply_node(name, node)
            for key, job in jobs.items():
                self._apply_job(key, job)
            for key, pod in pods.items():
                self._apply_pod(key, pod)

    def snapshot(self) -> Snapshot:
        """The pass's view. Its cluster is the standing one: a cycle plans on it only inside
        `cluster.undone_after()`."""
        warnings = [
            *self._node_warnings.values(),
            *self._job_warnings.values(),
            *self._pod_warnings.values(),
            *self.ledger.warnings(),
        ]
        return Snapshot(
            self.ledger.cluster,
            sorted(self._running.values(), key=lambda r: r.key),
            warnings,
            self.ledger.displaced(),
            self.ledger.off_island(),
        )

    # ----- one object ----------------------------------------------------------------------------

    def _apply_node(self, name: str, node: dict[str, Any] | None) -> None:
        inputs = None if node is None else _node_inputs(node)
        if inputs is not None and self._node_inputs.get(name) == inputs:
            return
        self._node_warnings.pop(name, None)
        state: NodeState | None = None
        if node is not None:
            try:
                state = decode_api_node(node, scheduling=True)
            except AnnotationError as err:
                self._node_warnings[name] = f"node {name}: {err}"
        if inputs is None:
            self._node_inputs.pop(name, None)
        else:
            self._node_inputs[name] = inputs
        if state is None:
            if name in self.ledger.cluster.nodes:
                self.ledger.remove_node(name)
            return
        state.requested = dict(self._requested.get(name, {}))
        self.ledger.add_node(state)

    def _apply_job(self, key: str, job: dict[str, Any] | None) -> None:
        if job is not None and (job.get("metadata") or {}).get("deletionTimestamp"):
            job = None  # a pass leaves deleting jobs out (SchedulerLoop.run_once)
        self._job_warnings.pop(key, None)
        self._running.pop(key, None)
        if job is None:
            namespace, _, name = key.partition("/")
            self.ledger.remove_job(namespace, name)
            return
        warning = self.ledger.set_job(job)
        if warning:
            self._job_warnings[key] = warning
        for running in running_jobs([job], self.default_runtime_seconds):
            self._running[key] = running

    def _apply_pod(self, key: str, pod: dict[str, Any] | None) -> None:
        self._move_requests(key, None if pod is None else _bound_requests(pod))
        self._pod_warnings.pop(key, None)
        if pod is None:
            namespace, _, name = key.partition("/")
            self.ledger.remove_pod(namespace, name)
            return
        warning = self.ledger.set_pod(pod)
        if warning:
            self._pod_warnings[key] = warning

    def _move_requests(self, key: str, now: tuple[str, dict[str, int]] | None) -> None:
        """What kube-scheduler counts a pod as taking from its node, moved with the pod: the
        node's requests are the bound pods' plus what the ledger holds there (a plan's)."""
        was = self._pod_requests.pop(key, None)
        if was == now:
            if now is not None:
                self._pod_requests[key] = now
            return
        if was is not None:
            self._add_requests(*was, -1)
        if now is not None:
            self._pod_requests[key] = now
            self._add_requests(*now, 1)

    def _add_requests(self, node: str, amounts: dict[str, int], sign: int) -> None:
        total = self._requested.setdefault(node, {})
        state = self.ledger.cluster.nodes.get(node)
        for name, amount in amounts.items():
            total[name] = total.get(name, 0) + sign * amount
            if state is not None:
                state.requested[name] = state.requested.get(name, 0) + sign * amount
        if state is not None:
            self.ledger.cluster.touch(node)


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


def _node_inputs(node: dict[str, Any]) -> tuple[Any, ...]:
    """Everything decode_api_node reads from a Node."""
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status")
    return (
        meta.get("labels"),
        meta.get("annotations"),
        node_unschedulable_reason(node),
        spec.get("taints"),
        (status or {}).get("allocatable"),
    )


def _bound_requests(pod: dict[str, Any]) -> tuple[str, dict[str, int]] | None:
    """(node, requests) of a live pod bound to a node, as requests_by_node counts it."""
    node = (pod.get("spec") or {}).get("nodeName")
    if not node or (pod.get("status") or {}).get("phase") in TERMINAL_POD_PHASES:
        return None
    return node, pod_requests(pod.get("spec") or {})
