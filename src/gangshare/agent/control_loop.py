"""The coordinator's period on a node: read what the node shows, decide, write it all out.

Separate from the device-plugin and read-back loops so a slow API call never delays a
squeeze, and a failing write never stops the next period.

A pod over its memory cap is removed by DELETE with a grace the agent bounds (the pod's own,
at most `removal_grace_seconds`), not through the Eviction API: a PodDisruptionBudget must not
keep borrowed memory from the guaranteed job that owns it, and a year-long grace must not
either. Should its processes still hold GPU memory a little after that grace (a kubelet that
cannot kill them, a finalizer), the agent kills them itself: it runs on the node.
"""

from __future__ import annotations

import json
import logging
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

from gangshare.agent.backend import GpuBackend
from gangshare.agent.cgroups import PidPods, pids_by_pod, pod_uid_of
from gangshare.agent.coordinator import (
    DEFAULT_GRACE_SECONDS,
    Coordinator,
    Outcome,
    PodInfo,
    busy_by_pod,
    caps_annotation,
    memory_by_pod,
)
from gangshare.agent.freezer import signal_processes
from gangshare.agent.metrics import AgentMetrics
from gangshare.agent.nodeapi import NodeApi
from gangshare.agent.podresources import PodDevices
from gangshare.agent.sdkserver import SdkServer
from gangshare.agent.throttle import Throttler
from gangshare.core.annotations import JOB_LABEL, POD_EVICTED, POD_GPU_CAPS

log = logging.getLogger("gangshare.agent")
PID_CACHE_LIMIT = 4096
RELIST_SECONDS = 60.0
# Past a removed pod's grace, how long the kubelet gets to kill it before the agent does.
KILL_SLACK_SECONDS = 5.0


def kill_pod_processes(uid: str) -> int:
    """SIGKILL every process of the pod on this host (by cgroup); how many were signalled."""
    return signal_processes(pids_by_pod().get(uid, []), signal.SIGKILL)


class ControlLoop:
    def __init__(
        self,
        coordinator: Coordinator,
        backend: GpuBackend,
        api: NodeApi,
        kubelet: Callable[[], Mapping[tuple[str, str], PodDevices]],
        sdk: SdkServer | None,
        throttler: Throttler | None,
        metrics: AgentMetrics,
        pod_of_pid: Callable[[int], str | None] = pod_uid_of,
        clock: Callable[[], float] = time.monotonic,
        kill_pod: Callable[[str], int] = kill_pod_processes,
    ) -> None:
        self.clock = clock
        self._listed_at = float("-inf")
        self.coordinator = coordinator
        self.backend = backend
        self.api = api
        self.kubelet = kubelet
        self.sdk = sdk
        self.throttler = throttler
        self.metrics = metrics
        self.pods: dict[tuple[str, str], PodInfo] = {}
        # Keyed by (PID, start time): a PID the kernel hands to another pod is looked up again.
        self._pids = PidPods(pod_of_pid, limit=PID_CACHE_LIMIT)
        self._throttled: set[str] = set()
        # Pods being removed -> when the agent kills their processes if they still hold memory.
        self._removing: dict[str, float] = {}
        self._kill_pod = kill_pod

    def once(self) -> Outcome:
        kubelet = self.kubelet()
        now = self.clock()
        # PodResources names pods, not UIDs: a pod recreated under the same name keeps its
        # key, so the UIDs are also read again now and then, not only for new names.
        if set(kubelet) - set(self.pods) or now - self._listed_at >= RELIST_SECONDS:
            self.pods = _pod_infos(self.api.pods_on_node(), kubelet)
            self._listed_at = now
        self.pods = {k: v for k, v in self.pods.items() if k in kubelet}
        processes = self.backend.processes()
        # One look per process (a /proc read or two), shared by both tallies.
        owners = {p.pid: self.pod_of_pid(p.pid) for p in processes}
        memory = memory_by_pod(processes, owners.get)
        busy = busy_by_pod(processes, owners.get)
        outcome = self.coordinator.decide(kubelet, self.pods, memory, busy)
        names = {p.uid: (p.namespace, p.name) for p in self.pods.values()}
        self._write_caps(outcome, names)
        self._remove(outcome, now)
        self._throttle(outcome, names)
        self._kill_overdue(memory, now)
        self.metrics.caps(outcome.caps, names)
        self.metrics.controls(outcome.controls)
        return outcome

    def pod_of_pid(self, pid: int) -> str | None:
        return self._pids.pod_of(pid)

    def _write_caps(self, outcome: Outcome, names: Mapping[str, tuple[str, str]]) -> None:
        for uid, caps in outcome.changed.items():
            if self.sdk is not None:
                self.sdk.push(uid, caps)
            if uid in names:
                namespace, name = names[uid]
                self.api.annotate_pod(namespace, name, uid, {POD_GPU_CAPS: caps_annotation(caps)})
        for uid, reason, message in outcome.changes:
            self.metrics.changes.labels(self.metrics.node, reason).inc()
            if uid in names:
                self.api.pod_event(*names[uid], uid, "Normal", reason, message, "CapGPU")

    def _throttle(self, outcome: Outcome, names: Mapping[str, tuple[str, str]]) -> None:
        # A pod being removed runs free: a stopped process cannot act on its SIGTERM.
        duties = {u: d for u, d in outcome.backstop.items() if u not in self._removing}
        for uid in set(duties) - self._throttled:
            cause, why = outcome.throttled.get(
                uid, ("GangThrottled", "another rank of its gang ignores its caps")
            )
            self.metrics.throttles.labels(self.metrics.node, cause).inc()
            log.warning(
                "throttling pod %s by stop/continue at duty %.2f: %s", uid, duties[uid], why
            )
            if uid in names:
                message = f"duty-cycled by stop/continue at {duties[uid]:.0%}: {why}"
                self.api.pod_event(
                    *names[uid], uid, "Warning", "OpportunisticThrottled", message, "CapGPU"
                )
        self._throttled = set(duties)
        if self.throttler is not None:
            self.throttler.set_duties(duties)

    def _remove(self, outcome: Outcome, now: float) -> None:
        by_uid = {p.uid: p for p in self.pods.values()}
        for eviction in outcome.evictions:
            pod = by_uid.get(eviction.uid)
            if eviction.uid in self._removing or pod is None:
                continue
            grace = min(pod.grace_seconds, int(self.coordinator.enforcement.removal_grace_seconds))
            record = {
                "reason": eviction.reason,
                "message": eviction.message,
                "steps": self.coordinator.steps_done(eviction.uid),
            }
            if not self.api.annotate_pod(
                pod.namespace, pod.name, eviction.uid, {POD_EVICTED: json.dumps(record)}
            ):
                continue
            refused = self.api.delete_pod(pod.namespace, pod.name, eviction.uid, grace)
            if refused is not None:
                log.warning("removal of %s/%s refused: %s", pod.namespace, pod.name, refused)
                continue
            self._removing[eviction.uid] = now + grace + KILL_SLACK_SECONDS
            self.metrics.evictions.labels(self.metrics.node, eviction.reason).inc()
            log.warning(
                "removed %s/%s (grace %ds): %s", pod.namespace, pod.name, grace, eviction.message
            )
            self.api.pod_event(
                pod.namespace,
                pod.name,
                eviction.uid,
                "Warning",
                eviction.reason,
                f"{eviction.message} (grace {grace}s)",
                "Evict",
            )

    def _kill_overdue(self, memory: Mapping[str, Mapping[int, int]], now: float) -> None:
        """Kill what a removed pod still runs past its grace, while it holds GPU memory."""
        for uid, deadline in list(self._removing.items()):
            if uid not in memory:
                if not any(p.uid == uid for p in self.pods.values()):
                    del self._removing[uid]  # gone, memory freed: done
                continue
            if now < deadline:
                continue
            killed = self._kill_pod(uid)
            log.warning(
                "pod %s still holds GPU memory past its grace: killed %d processes", uid, killed
            )
            self.metrics.evictions.labels(self.metrics.node, "GpuMemoryKilled").inc()


def _pod_infos(
    pods: list[dict[str, Any]], kubelet: Mapping[tuple[str, str], PodDevices]
) -> dict[tuple[str, str], PodInfo]:
    out: dict[tuple[str, str], PodInfo] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if key not in kubelet or not meta.get("uid"):
            continue
        job = (meta.get("labels") or {}).get(JOB_LABEL)
        gang = f"{key[0]}/{job}" if job else str(meta["uid"])
        grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
        grace = DEFAULT_GRACE_SECONDS if grace is None else max(0, int(grace))
        out[key] = PodInfo(str(meta["uid"]), key[0], key[1], gang, grace)
    return out
