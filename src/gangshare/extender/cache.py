"""The extender's own view of the cluster, fed by watches (nodeCacheCapable mode).

Like kube-scheduler's cache: nodes and pods from the API server, plus
*assumed* placements for pods whose bind is in flight, so two pods bound back
to back never get the same GPU. An assumption ends when the pod's own update
(with its recorded GPUs) arrives, when the bind fails (forget), or after a TTL.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from gangshare.core.annotations import NODE_TOPOLOGY, AnnotationError, decode_node
from gangshare.core.clock import Clock
from gangshare.core.cluster import Cluster
from gangshare.core.job import WorkerRequest
from gangshare.core.node import NodeState
from gangshare.extender.decisions import NodeMemo, pod_owner
from gangshare.kube.snapshot import (
    PodClaim,
    hold_claim,
    node_unschedulable_reason,
    pod_claim,
    pod_gpu_request,
)

log = logging.getLogger("gangshare.extender")
DEFAULT_ASSUME_TTL = 30.0


class ClusterCache:
    def __init__(self, clock: Clock, assume_ttl: float = DEFAULT_ASSUME_TTL) -> None:
        self.lock = threading.RLock()
        self.clock = clock
        self.assume_ttl = assume_ttl
        self.cluster = Cluster()
        self._topology: dict[str, str] = {}
        self._claims: dict[str, PodClaim] = {}
        # GPU pods as last seen, so bind needs no extra read of the pod.
        self._gpu_pods: dict[str, dict[str, Any]] = {}
        self._assumed: dict[str, tuple[PodClaim, float]] = {}
        self.memo = NodeMemo()
        self.nodes_synced = threading.Event()
        self.pods_synced = threading.Event()

    @property
    def ready(self) -> bool:
        return self.nodes_synced.is_set() and self.pods_synced.is_set()

    def assumed_count(self) -> int:
        return len(self._assumed)

    # ----- nodes ------------------------------------------------------------------

    def replace_nodes(self, nodes: list[dict[str, Any]]) -> None:
        with self.lock:
            self.cluster = Cluster()
            self._topology.clear()
            for node in nodes:
                self._add_node(node)
            self._rehold_all()
            self.nodes_synced.set()

    def upsert_node(self, node: dict[str, Any]) -> None:
        with self.lock:
            name = node["metadata"]["name"]
            topology = (node["metadata"].get("annotations") or {}).get(NODE_TOPOLOGY)
            existing = self.cluster.nodes.get(name)
            if existing is not None and topology == self._topology.get(name):
                fresh = self._decode(node)
                if fresh is not None and fresh.rack == existing.rack:
                    self._refresh_in_place(existing, fresh)
                    return
            if existing is not None:
                self.cluster.remove_node(name)
                self._topology.pop(name, None)
            if self._add_node(node):
                for claim in self._live_claims():
                    if claim.node == name:
                        self._hold(claim)

    def delete_node(self, name: str) -> None:
        with self.lock:
            if name in self.cluster.nodes:
                self.cluster.remove_node(name)
            self._topology.pop(name, None)

    # ----- pods ------------------------------------------------------------------

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            return self._gpu_pods.get(pod_owner(namespace, name))

    def replace_pods(self, pods: list[dict[str, Any]]) -> None:
        with self.lock:
            self._claims.clear()
            self._gpu_pods = {
                pod_owner(p["metadata"].get("namespace", "default"), p["metadata"]["name"]): p
                for p in pods
                if pod_gpu_request(p) is not None
            }
            for pod in pods:
                claim, warning = pod_claim(pod)
                if warning:
                    log.warning(warning)
                if claim is not None:
                    self._claims[claim.owner] = claim
            self._rehold_all()
            self.pods_synced.set()

    def upsert_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        owner = pod_owner(meta.get("namespace", "default"), meta["name"])
        claim, warning = pod_claim(pod)
        if warning:
            log.warning(warning)
        with self.lock:
            if pod_gpu_request(pod) is not None:
                self._gpu_pods[owner] = pod
            if claim is None:
                self._claims.pop(owner, None)
                if owner not in self._assumed:  # an older event must not undo a bind in flight
                    self.cluster.release(owner)
                return
            self._assumed.pop(owner, None)
            if self._claims.get(owner) == claim and self.cluster.allocations_of(owner):
                return
            self._claims[owner] = claim
            self.cluster.release(owner)
            self._hold(claim)

    def delete_pod(self, namespace: str, name: str) -> None:
        owner = pod_owner(namespace, name)
        with self.lock:
            self._claims.pop(owner, None)
            self._assumed.pop(owner, None)
            self._gpu_pods.pop(owner, None)
            self.cluster.release(owner)

    # ----- assume / forget ------------------------------------------------------------------

    def assume(
        self, owner: str, node: str, indices: tuple[int, ...], request: WorkerRequest
    ) -> None:
        """Hold GPUs for a pod whose bind is in flight (call with the lock held)."""
        claim = PodClaim(
            owner,
            node,
            request.service_class,
            request.gpus,
            indices,
            request.gpu_memory_mib,
            None,
            None,
            True,
        )
        self.cluster.release(owner)
        self._assumed[owner] = (claim, self.clock.now() + self.assume_ttl)
        self._hold(claim)

    def forget(self, owner: str) -> None:
        with self.lock:
            if self._assumed.pop(owner, None) is not None:
                self.cluster.release(owner)
                real = self._claims.get(owner)
                if real is not None:
                    self._hold(real)

    def expire_assumptions(self) -> int:
        now = self.clock.now()
        with self.lock:
            stale = [owner for owner, (_, until) in self._assumed.items() if until <= now]
        for owner in stale:
            self.forget(owner)
        return len(stale)

    # ----- internals ------------------------------------------------------------------

    def _decode(self, node: dict[str, Any]) -> NodeState | None:
        meta = node["metadata"]
        try:
            return decode_node(
                meta["name"],
                meta.get("labels") or {},
                meta.get("annotations") or {},
                node_unschedulable_reason(node),
            )
        except AnnotationError as err:
            log.warning("node %s ignored: %s", meta["name"], err)
            return None

    def _add_node(self, node: dict[str, Any]) -> bool:
        state = self._decode(node)
        if state is None:
            return False
        self.cluster.add_node(state)
        self._topology[state.name] = (node["metadata"].get("annotations") or {}).get(
            NODE_TOPOLOGY, ""
        )
        return True

    @staticmethod
    def _refresh_in_place(existing: NodeState, fresh: NodeState) -> None:
        existing.unschedulable_reason = fresh.unschedulable_reason
        existing.labels = fresh.labels
        for old, new in zip(existing.gpus, fresh.gpus, strict=True):
            old.utilization = new.utilization
            old.memory_used_mib = new.memory_used_mib
        existing.recount()

    def _live_claims(self) -> list[PodClaim]:
        assumed = [claim for claim, _ in self._assumed.values()]
        return [c for owner, c in self._claims.items() if owner not in self._assumed] + assumed

    def _rehold_all(self) -> None:
        for owner in self.cluster.owners():
            self.cluster.release(owner)
        for claim in self._live_claims():
            self._hold(claim)

    def _hold(self, claim: PodClaim) -> None:
        problem = hold_claim(self.cluster, claim)
        if problem:
            log.warning(problem)
