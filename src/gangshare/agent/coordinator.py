"""The local coordinator on a node: the core's control law fed with what the node really shows.

Every period it reads, per GPU, which pod holds it as guaranteed (`nvidia.com/gpu`) and which
hold share slots (`gangshare.io/gpu-share`, opportunistic) from the kubelet's PodResources,
the guaranteed pod's step times from its SDK, and memory and SM time per pod from NVML's
process list (host PID -> cgroup -> pod). It runs `decide_gpu` per GPU, gives each
opportunistic pod its caps (pushed to its SDK and written on the pod), throttles pods that do
not keep their duty, and removes pods that stay over their memory cap, or over their duty
though throttled.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gangshare.agent.backend import GpuProcess
from gangshare.agent.devices import DeviceMap
from gangshare.agent.podresources import PodDevices
from gangshare.core.annotations import GPU_RESOURCE, SHARE_RESOURCE
from gangshare.core.coordinator import (
    Caps,
    ControlParams,
    GpuControl,
    GpuDecision,
    GpuObservation,
    decide_gpu,
)
from gangshare.core.enforcement import (
    EnforcementParams,
    Eviction,
    SdkReport,
    backstop_duties,
    cooperation,
    duty_overruns,
    measured_share,
    memory_overruns,
    pod_caps,
)
from gangshare.sdk.wire import WireCaps

log = logging.getLogger("gangshare.agent")
# Reported step seconds kept per pod for its busy share.
BUSY_WINDOW_SECONDS = 30.0


# A pod's termination grace when its spec names none (Kubernetes' default).
DEFAULT_GRACE_SECONDS = 30


@dataclass(frozen=True)
class PodInfo:
    uid: str
    namespace: str
    name: str
    gang: str
    grace_seconds: int = DEFAULT_GRACE_SECONDS  # spec.terminationGracePeriodSeconds


@dataclass
class _Reports:
    steps: list[float] = field(default_factory=list)  # not yet given to the law
    # (received at, seconds); bounded in count too, whatever a pod's SDK sends in the window.
    recent: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=4096))
    first_at: float = 0.0
    last_at: float = 0.0
    count: int | None = None


@dataclass(frozen=True)
class Outcome:
    """What one period decided, for the agent to write out."""

    caps: Mapping[str, Caps]
    changed: Mapping[str, WireCaps]
    changes: list[tuple[str, str, str]]  # (pod uid, reason, message)
    throttled: Mapping[str, tuple[str, str]]  # pod uid -> (cause, why) it ignores its caps
    # Pod uid -> duty the stop/continue backstop holds: the throttled pods and their gangs.
    backstop: Mapping[str, float]
    evictions: list[Eviction]
    controls: Mapping[int, GpuControl]


class Coordinator:
    def __init__(
        self,
        devices: DeviceMap,
        params: ControlParams | None = None,
        enforcement: EnforcementParams | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.devices = devices
        self.params = params or ControlParams()
        self.enforcement = enforcement or EnforcementParams()
        self.clock = clock
        self._lock = threading.Lock()
        self._reports: dict[str, _Reports] = {}
        self._controls: dict[int, GpuControl] = {}
        self._caps: dict[str, WireCaps] = {}
        self._over_since: dict[str, float] = {}
        self._capped_since: dict[str, float] = {}
        # Per capped pod: (at, busy share) from NVML, and the pods caught over their duty by
        # it. Once caught, a pod stays duty-cycled while it is capped: held by stop/continue it
        # measures within its duty, which says nothing about what it would do if let go.
        self._measured: dict[str, deque[tuple[float, float]]] = {}
        self._caught: dict[str, tuple[str, str]] = {}
        # Pods the backstop holds -> since when; and those measured over their duty though held.
        self._held_since: dict[str, float] = {}
        self._duty_over_since: dict[str, float] = {}
        self._generation = 0

    # ----- from the SDK server's thread ----------------------------------------------------

    def record_steps(self, uid: str, steps: tuple[float, ...], count: int | None) -> None:
        now = self.clock()
        with self._lock:
            reports = self._reports.setdefault(uid, _Reports(first_at=now))
            reports.steps.extend(steps)
            del reports.steps[: -self.params.max_level_steps]
            reports.recent.extend((now, s) for s in steps)
            while reports.recent and reports.recent[0][0] < now - BUSY_WINDOW_SECONDS:
                reports.recent.popleft()
            reports.last_at = now
            if count is not None:
                reports.count = count

    def caps_of(self, uid: str) -> WireCaps | None:
        with self._lock:
            return self._caps.get(uid)

    def steps_done(self, uid: str) -> int | None:
        with self._lock:
            reports = self._reports.get(uid)
            return None if reports is None else reports.count

    # ----- one period ----------------------------------------------------------------------

    def decide(
        self,
        kubelet: Mapping[tuple[str, str], PodDevices],
        pods: Mapping[tuple[str, str], PodInfo],
        memory: Mapping[str, Mapping[int, int]],
        busy: Mapping[str, float] | None = None,
    ) -> Outcome:
        """`memory`: pod uid -> GPU index -> MiB its processes hold (NVML); `busy`: pod uid ->
        its processes' SM share on its busiest GPU (NVML), for pods the GPU samples."""
        now = self.clock()
        guaranteed, opportunistic = self._tenants(kubelet, pods)
        with self._lock:
            steps = {uid: self._take_steps(uid) for uid in set(guaranteed.values())}
        decisions: dict[int, GpuDecision] = {}
        changes: list[tuple[str, str, str]] = []
        for gpu in self.devices.inventory.gpus:
            g = guaranteed.get(gpu.index)
            seen = GpuObservation(
                g,
                tuple(sorted(opportunistic.get(gpu.index, ()))),
                steps.get(g, ()) if g else (),
                gpu.memory_mib,
                memory.get(g, {}).get(gpu.index, 0) if g else 0,
            )
            decision = decide_gpu(self._controls.get(gpu.index), seen, now, self.params)
            decisions[gpu.index] = decision
            if decision.change is not None:
                changes += [(uid, *decision.change) for uid in seen.opportunistic]
        self._controls = {i: d.control for i, d in decisions.items() if d.control.guaranteed}
        gangs = {p.uid: p.gang for p in pods.values()}
        caps = pod_caps(decisions, gangs)
        changed = self._publishable(caps)
        with self._lock:
            reports = {uid: self._report_of(uid, now) for uid in caps}
        self._capped_since = {uid: self._capped_since.get(uid, now) for uid in caps}
        measured = self._measure(caps, busy or {}, now)
        throttled = {
            uid: why
            for uid, cap in caps.items()
            if (
                why := self._caught.get(uid)
                or cooperation(
                    cap,
                    reports[uid],
                    now,
                    self.enforcement,
                    self._capped_since[uid],
                    measured.get(uid),
                )
            )
            is not None
        }
        self._caught = {
            uid: why
            for uid, why in throttled.items()
            if why[0] == "OverDutyMeasured" and caps[uid].duty < 1.0
        }
        used = {uid: max(memory.get(uid, {}).values(), default=0) for uid in caps}
        self._over_since, evictions = memory_overruns(
            caps, used, self._over_since, now, self.enforcement
        )
        with self._lock:
            for uid in list(self._reports):
                if uid not in caps and uid not in steps:
                    del self._reports[uid]
        backstop = backstop_duties(caps, throttled, gangs)
        self._held_since, self._duty_over_since, overruns = duty_overruns(
            backstop, measured, self._held_since, self._duty_over_since, now, self.enforcement
        )
        evictions += overruns
        return Outcome(caps, changed, changes, throttled, backstop, evictions, dict(self._controls))

    def _tenants(
        self,
        kubelet: Mapping[tuple[str, str], PodDevices],
        pods: Mapping[tuple[str, str], PodInfo],
    ) -> tuple[dict[int, str], dict[int, set[str]]]:
        guaranteed: dict[int, str] = {}
        opportunistic: dict[int, set[str]] = {}
        for key, held in kubelet.items():
            info = pods.get(key)
            if info is None:
                continue  # not listed yet: counted from the next period
            for index in self.devices.indices(
                GPU_RESOURCE, list(held.devices.get(GPU_RESOURCE, ()))
            ):
                guaranteed[index] = info.uid
            slots = list(held.devices.get(SHARE_RESOURCE, ()))
            for index in self.devices.indices(SHARE_RESOURCE, slots):
                opportunistic.setdefault(index, set()).add(info.uid)
        return guaranteed, opportunistic

    def _measure(
        self, caps: Mapping[str, Caps], busy: Mapping[str, float], now: float
    ) -> dict[str, float]:
        """Each capped pod's measured busy share over the window, where NVML samples it."""
        window = self.enforcement.measure_window_seconds
        self._measured = {uid: self._measured.get(uid, deque()) for uid in caps}
        shares: dict[str, float] = {}
        for uid, samples in self._measured.items():
            if uid in busy:
                samples.append((now, busy[uid]))
            while samples and samples[0][0] <= now - window:
                samples.popleft()
            share = measured_share(samples, now, self.enforcement)
            if caps[uid].duty <= 0.0 and samples:
                # Told to stand still (the law is timing the guaranteed job alone): any busy
                # sample is over, and waiting for a window would let it spoil that baseline.
                share = max(share or 0.0, samples[-1][1])
            if share is not None:
                shares[uid] = share
        return shares

    def _take_steps(self, uid: str) -> tuple[float, ...]:
        reports = self._reports.get(uid)
        if reports is None:
            return ()
        taken, reports.steps = tuple(reports.steps), []
        return taken

    def _report_of(self, uid: str, now: float) -> SdkReport | None:
        reports = self._reports.get(uid)
        if reports is None:
            return None
        span = now - max(reports.first_at, now - BUSY_WINDOW_SECONDS)
        # A share over a few seconds says little: judge it once the window has filled a bit.
        busy = sum(s for _, s in reports.recent) / span if span >= 5.0 else None
        return SdkReport(reports.last_at, busy)

    def _publishable(self, caps: Mapping[str, Caps]) -> dict[str, WireCaps]:
        changed: dict[str, WireCaps] = {}
        with self._lock:
            for uid, cap in caps.items():
                had = self._caps.get(uid)
                if had is not None and had.duty == cap.duty and had.memory_mib == cap.memory_mib:
                    continue
                self._generation += 1
                changed[uid] = WireCaps(cap.duty, cap.memory_mib, self._generation)
                self._caps[uid] = changed[uid]
            for uid in set(self._caps) - set(caps):
                del self._caps[uid]
        return changed


def memory_by_pod(
    processes: list[GpuProcess], pod_of_pid: Callable[[int], str | None]
) -> dict[str, dict[int, int]]:
    """pod uid -> GPU index -> MiB, from NVML's per-process list."""
    out: dict[str, dict[int, int]] = {}
    for process in processes:
        uid = pod_of_pid(process.pid)
        if uid is None:
            continue
        per_gpu = out.setdefault(uid, {})
        per_gpu[process.index] = per_gpu.get(process.index, 0) + process.memory_mib
    return out


def busy_by_pod(
    processes: list[GpuProcess], pod_of_pid: Callable[[int], str | None]
) -> dict[str, float]:
    """pod uid -> its processes' summed SM share on its busiest GPU, from NVML's samples (pods
    whose GPUs give no samples are left out: their busy share is unknown, not zero)."""
    per_gpu: dict[str, dict[int, float]] = {}
    for process in processes:
        if process.sm is None:
            continue
        uid = pod_of_pid(process.pid)
        if uid is None:
            continue
        shares = per_gpu.setdefault(uid, {})
        shares[process.index] = min(1.0, shares.get(process.index, 0.0) + process.sm)
    return {uid: max(shares.values()) for uid, shares in per_gpu.items()}


def caps_annotation(caps: WireCaps) -> str:
    return json.dumps(
        {"duty": caps.duty, "memoryMiB": caps.memory_mib, "generation": caps.generation},
        separators=(",", ":"),
    )
