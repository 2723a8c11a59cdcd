"""The coordinator's period on a node: read what the node shows, decide, write it all out.

Separate from the device-plugin and read-back loops so a slow API call never delays a
squeeze, and a failing write never stops the next period.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from gangshare.agent.backend import GpuBackend
from gangshare.agent.cgroups import pod_uid_of
from gangshare.agent.coordinator import (
    Coordinator,
    Outcome,
    PodInfo,
    caps_annotation,
    memory_by_pod,
)
from gangshare.agent.metrics import AgentMetrics
from gangshare.agent.nodeapi import NodeApi
from gangshare.agent.podresources import PodDevices
from gangshare.agent.sdkserver import SdkServer
from gangshare.agent.throttle import Throttler
from gangshare.core.annotations import JOB_LABEL, POD_EVICTED, POD_GPU_CAPS

log = logging.getLogger("gangshare.agent")
PID_CACHE_LIMIT = 4096
RELIST_SECONDS = 60.0


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
        self._pod_of_pid = pod_of_pid
        self.pods: dict[tuple[str, str], PodInfo] = {}
        self._pids: dict[int, str | None] = {}
        self._throttled: set[str] = set()
        self._evicting: set[str] = set()

    def once(self) -> Outcome:
        kubelet = self.kubelet()
        now = self.clock()
        # PodResources names pods, not UIDs: a pod recreated under the same name keeps its
        # key, so the UIDs are also read again now and then, not only for new names.
        if set(kubelet) - set(self.pods) or now - self._listed_at >= RELIST_SECONDS:
            self.pods = _pod_infos(self.api.pods_on_node(), kubelet)
            self._listed_at = now
            self._pids.clear()  # a PID the kernel reused now belongs to another pod
        self.pods = {k: v for k, v in self.pods.items() if k in kubelet}
        memory = memory_by_pod(self.backend.processes(), self.pod_of_pid)
        outcome = self.coordinator.decide(kubelet, self.pods, memory)
        names = {p.uid: (p.namespace, p.name) for p in self.pods.values()}
        self._write_caps(outcome, names)
        self._throttle(outcome, names)
        self._evict(outcome, names)
        self.metrics.caps(outcome.caps, names)
        self.metrics.controls(outcome.controls)
        return outcome

    def pod_of_pid(self, pid: int) -> str | None:
        if pid not in self._pids:
            if len(self._pids) > PID_CACHE_LIMIT:
                self._pids.clear()
            self._pids[pid] = self._pod_of_pid(pid)
        return self._pids[pid]

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
        duties = outcome.backstop
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

    def _evict(self, outcome: Outcome, names: Mapping[str, tuple[str, str]]) -> None:
        for eviction in outcome.evictions:
            if eviction.uid in self._evicting or eviction.uid not in names:
                continue
            namespace, name = names[eviction.uid]
            record = {
                "reason": eviction.reason,
                "message": eviction.message,
                "steps": self.coordinator.steps_done(eviction.uid),
            }
            if not self.api.annotate_pod(
                namespace, name, eviction.uid, {POD_EVICTED: json.dumps(record)}
            ):
                continue
            refused = self.api.evict_pod(namespace, name, eviction.uid)
            if refused is not None:
                log.warning("eviction of %s/%s refused: %s", namespace, name, refused)
                continue
            self._evicting.add(eviction.uid)
            self.metrics.evictions.labels(self.metrics.node, eviction.reason).inc()
            log.warning("evicted %s/%s: %s", namespace, name, eviction.message)
            self.api.pod_event(
                namespace, name, eviction.uid, "Warning", eviction.reason, eviction.message, "Evict"
            )
        live = {p.uid for p in self.pods.values()}
        self._evicting &= live


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
        out[key] = PodInfo(str(meta["uid"]), key[0], key[1], gang)
    return out
