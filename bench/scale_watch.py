"""What bench/scale.py sees of the cluster: every TrainingJob's phase and every pod's GPUs.

Two watches over all namespaces (gangshare.kube.follow, as the operator's own stores) keep,
on the client's clock, when each job was first Running and when each pod was first bound
and first Running. The pod watch also checks, on every event, the one invariant a scale run
must never break: no GPU of a node is held by two live pods (a terminating pod still holds
its GPUs), and no node holds more GPUs than it has.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from gangshare.core.annotations import GPU_RESOURCE, SHARE_RESOURCE
from gangshare.core.job import ServiceClass
from gangshare.kube.claims import gpu_request, recorded_indices
from gangshare.kube.follow import follow
from gangshare.kube.quantity import to_int

GROUP, VERSION = "gangshare.io", "v1alpha1"
TERMINAL = ("Succeeded", "Failed")


@dataclass
class JobSeen:
    phase: str = ""
    running: float | None = None  # first seen Running (client clock)
    at: dict[str, float] = field(default_factory=dict)  # phase -> first seen (client clock)
    said: list[tuple[float, str]] = field(default_factory=list)  # each new status message
    failed: bool = False
    reason: str = ""


@dataclass
class PodSeen:
    namespace: str
    node: str
    shared: bool  # Opportunistic: share slots beside others, not whole GPUs
    gpus: int  # whole GPUs, or share slots when shared
    indices: tuple[int, ...] | None


@dataclass
class DoubleHold:
    node: str
    pods: list[str]
    what: str


@dataclass
class Observer:
    core: client.CoreV1Api
    custom: client.CustomObjectsApi
    # Per node: whole GPUs and share slots, from the nodes' allocatable at start.
    capacity: dict[str, tuple[int, int]] = field(default_factory=dict)
    jobs: dict[str, JobSeen] = field(default_factory=dict)  # "ns/name"
    pods: dict[str, PodSeen] = field(default_factory=dict)  # "ns/name" of bound live pods
    # Per namespace, per pod UID: first seen bound, first seen Running.
    bound_at: dict[str, dict[str, float]] = field(default_factory=dict)
    running_at: dict[str, dict[str, float]] = field(default_factory=dict)
    violations: list[DoubleHold] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    synced: dict[str, bool] = field(default_factory=lambda: {"jobs": False, "pods": False})

    def start(self) -> None:
        for node in self.core.list_node().items:
            allocatable = node.status.allocatable or {}
            self.capacity[node.metadata.name] = (
                to_int(allocatable.get(GPU_RESOURCE, "0"), GPU_RESOURCE),
                to_int(allocatable.get(SHARE_RESOURCE, "0"), SHARE_RESOURCE),
            )
        threads = [
            (
                "jobs",
                lambda **kw: self.custom.list_cluster_custom_object(
                    GROUP, VERSION, "trainingjobs", **kw
                ),
                self._replace_jobs,
                self._apply_job,
            ),
            ("pods", self.core.list_pod_for_all_namespaces, self._replace_pods, self._apply_pod),
        ]
        for name, call, replace, apply in threads:
            thread = threading.Thread(
                target=follow,
                args=(name, call, replace, apply, self.stop, lambda: None),
                daemon=True,
            )
            thread.start()
        deadline = time.monotonic() + 120
        while not all(self.synced.values()):
            if time.monotonic() > deadline:
                raise SystemExit("the bench's watches did not sync within 120 s")
            time.sleep(0.05)

    # -- jobs --------------------------------------------------------------------------------
    def _replace_jobs(self, items: list[dict[str, Any]]) -> None:
        for job in items:
            self._apply_job("ADDED", job)
        self.synced["jobs"] = True

    def _apply_job(self, kind: str, job: dict[str, Any]) -> None:
        meta = job["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        with self.lock:
            if kind == "DELETED":
                self.jobs.pop(key, None)
                return
            seen = self.jobs.setdefault(key, JobSeen())
            status = job.get("status") or {}
            seen.phase = status.get("phase", "")
            seen.at.setdefault(seen.phase or "New", time.perf_counter())
            reason = status.get("message") or ""
            if reason != seen.reason:
                seen.said.append((time.perf_counter(), reason))
            seen.reason = reason
            if seen.phase == "Running" and seen.running is None:
                seen.running = time.perf_counter()
            seen.failed = seen.failed or seen.phase == "Failed"

    # -- pods --------------------------------------------------------------------------------
    def _replace_pods(self, items: list[dict[str, Any]]) -> None:
        for pod in items:
            self._apply_pod("ADDED", pod)
        self.synced["pods"] = True

    def _apply_pod(self, kind: str, pod: dict[str, Any]) -> None:
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        key = f"{meta['namespace']}/{meta['name']}"
        now = time.perf_counter()
        with self.lock:
            node = spec.get("nodeName")
            if node:
                self.bound_at.setdefault(meta["namespace"], {}).setdefault(meta["uid"], now)
            if status.get("phase") == "Running":
                self.running_at.setdefault(meta["namespace"], {}).setdefault(meta["uid"], now)
            if kind == "DELETED" or status.get("phase") in TERMINAL or not node:
                # Unbound pods hold nothing; a deleted or finished one no longer does.
                self.pods.pop(key, None)
                return
            asked = gpu_request(pod)
            if asked is None:
                return
            shared, count = asked[0] is ServiceClass.OPPORTUNISTIC, asked[1]
            indices, _ = recorded_indices(pod, count)
            known = self.pods.get(key)
            if known is None or known.node != node or known.indices != indices:
                self.pods[key] = PodSeen(meta["namespace"], node, shared, count, indices)
                self._check_node(node)

    def _check_node(self, node: str) -> None:
        """Whole GPUs are exclusive among Guaranteed pods; share slots (Opportunistic, beside
        anyone, as AntMan) must not exceed the node's."""
        held = [(k, p) for k, p in self.pods.items() if p.node == node]
        whole, slots = self.capacity.get(node, (0, 0))
        for shared, limit, what in ((False, whole, "GPUs"), (True, slots, "share slots")):
            mine = [(k, p) for k, p in held if p.shared is shared]
            total = sum(p.gpus for _, p in mine)
            if total > limit:
                pods = [k for k, _ in mine]
                self.violations.append(DoubleHold(node, pods, f"{total} {what} of {limit} held"))
        owner: dict[int, str] = {}
        for key, pod in held:
            for index in () if pod.shared else pod.indices or ():
                if index in owner:
                    self.violations.append(
                        DoubleHold(node, [owner[index], key], f"GPU {index} held twice")
                    )
                owner[index] = key

    # -- questions the scenarios ask ----------------------------------------------------------
    def pods_held(self, namespaces: set[str]) -> int:
        """Bound live pods of these namespaces (terminating ones included: they still hold)."""
        with self.lock:
            return sum(1 for p in self.pods.values() if p.namespace in namespaces)

    def running_jobs(self, keys: list[str]) -> int:
        with self.lock:
            return sum(1 for k in keys if self.jobs.get(k, JobSeen()).phase == "Running")

    def pods_running(self, namespace: str) -> dict[str, float]:
        with self.lock:
            return dict(self.running_at.get(namespace, {}))

    def phases(self, namespace: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        with self.lock:
            for key, job in self.jobs.items():
                if key.startswith(namespace + "/"):
                    counts[job.phase or "New"] = counts.get(job.phase or "New", 0) + 1
        return counts

    def wait(self, what: str, check: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(0.05)
