"""The event loop: arrivals, completions and control ticks on a virtual clock.

At each instant, in this order: completions (their GPUs are released through
`Cluster.release`, their run time feeds the RuntimeEstimator), the control tick
(GPUs whose coordinator has settled since a change of tenants get their settled duty
cycle, see ledger.py), arrivals, then one scheduling cycle (`decide`, i.e. the core's
`schedule_cycle`) when something could be admitted. Pending jobs carry the
estimator's prediction of the moment, as the operator's do; a running job is
expected to end at its start plus the prediction it was admitted with. A cycle is skipped when only
arrivals happened and `PendingIndex.may_start` shows none of them can start:
nothing was freed, so everything that waited before still waits.

Jobs progress at the speed the ledger gives them (1.0 alone on their GPUs), so a
completion is rescheduled whenever a job's speed changes (a paused opportunistic job,
duty 0, has none until it moves again). An opportunistic job whose GPU runs out of
memory (a guaranteed job placed beside it in the same cycle) is evicted and requeued.

An evicted job loses the work since its last checkpoint and its next run restarts first:
evictions.py holds those books (JobState) and the eviction paths. Settings: config.py.

Under the `cohort` policy a job beyond its queue's quota may run on its cohort's idle
quota, as an Opportunistic tenant (the core's Admission says so). When a lender's own
jobs take that quota back, the cycle names borrowers to reclaim (`CycleResult.preemptions`):
each is evicted whole before the cycle's admissions start, keeps the work it had done
at its last checkpoint, and is requeued at its original place in its lane (its queueing
delay keeps counting). A borrower is reclaimable once it has run the policy's minimum
(`SimConfig.reclaim_min_runtime`; a wake-up event at that moment runs a cycle if its cohort
is over-lent) and while it has been evicted fewer times than the cap (`max_evictions`).

A job that could not be placed even on the empty cluster, or that asks for more
guaranteed GPUs than its queue's quota, is rejected on arrival (as the operator's
validation would) instead of blocking its lane for ever.

The node agent's reports (utilization, memory in use) are published as soon as
tenants change, and the operator cycles again at the same instant when a cycle
admitted work while opportunistic jobs wait: memory beside a just-admitted
guaranteed job can only be lent once its use is published.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from gangshare.core import ServiceClass
from gangshare.core.clock import ManualClock
from gangshare.core.coordinator import ControlParams
from gangshare.core.cycle import Admission
from gangshare.core.estimate import RuntimeEstimator
from gangshare.core.gang import never_fits
from gangshare.core.queueing import QueuedJob, QueuePolicy, RunningJob, policy_refusal
from gangshare.sim.clusters import SimCluster
from gangshare.sim.colocation import ColocationModel

# Re-exported: importers have long named SimConfig from here (its defaults: sim.config).
from gangshare.sim.config import SimConfig
from gangshare.sim.decide import borrow_room, decide, full_nodes_of
from gangshare.sim.evictions import Counters, Evictions, JobState, RequeueRecorder
from gangshare.sim.ledger import GpuId, GpuLedger
from gangshare.sim.metrics import JobRecord, TimeSeries
from gangshare.sim.pending import PendingIndex
from gangshare.sim.policy import SimPolicy
from gangshare.sim.workload import JobSpec


class Recorder(RequeueRecorder, Protocol):
    """The engine's hooks for the replay's metrics (--metrics-out: sim/openmetrics.py)."""

    def arrived(self, key: str, queue: str, service_class: str) -> None: ...

    def admitted(self, key: str, service_class: str, borrowed: bool, wait: float) -> None: ...

    def finished(self, key: str) -> None: ...

    def advance(self, sim: Simulation, start: float, end: float) -> None: ...

    def close(self, sim: Simulation, end: float) -> None: ...


__all__ = [
    "MAX_CYCLES_PER_INSTANT",
    "Counters",
    "JobState",
    "SimConfig",
    "Simulation",
]

# WAKE: a borrower's minimum run time before reclaim is over.
COMPLETE, TICK, WAKE = 0, 1, 2
# A cycle may follow a cycle at one instant (evictions, newly published memory); the bound.
MAX_CYCLES_PER_INSTANT = 4


class Simulation(Evictions):
    def __init__(
        self,
        specs: Sequence[JobSpec],
        setup: SimCluster,
        policy: SimPolicy,
        model: ColocationModel,
        config: SimConfig | None = None,
        on_progress: Callable[[int], None] | None = None,
    ) -> None:
        self.setup = setup
        self.cluster = setup.cluster
        self.policy = policy
        self.config = config = config or SimConfig()
        self.queue_policy: QueuePolicy = policy.queue_policy(
            setup.quotas,
            setup.weights,
            setup.cohorts,
            setup.borrowing_limits,
            setup.lending_limits,
            reclaim_min_runtime_seconds=config.reclaim_min_runtime,
            max_evictions_per_job=config.max_evictions,
            starvation_seconds=config.starvation,
        )
        self._quotas = self.queue_policy.quota_map()
        ordered = sorted(specs, key=lambda s: s.trace.submit)
        # Checked while the cluster is still empty; shapes repeat, so answers are kept.
        self._shapes: dict[tuple[object, ...], bool] = {}
        self.rejected = [s.key for s in ordered if not self._feasible(s)]
        refused = set(self.rejected)
        self.specs = [s for s in ordered if s.key not in refused]
        self.clock = ManualClock()
        self.estimator = RuntimeEstimator(self.queue_policy.default_runtime_seconds)
        # As the operator does each pass: estimates of the moment, unless the oracle knows.
        self.pending = PendingIndex(
            self.queue_policy, None if policy.exact_runtimes else self.estimator.predict
        )
        self.running: dict[str, RunningJob] = {}
        self.jobs: dict[str, JobState] = {}
        self.usage: dict[str, int] = {}
        # GPUs each queue holds on its cohort's lent quota (borrowed jobs, Opportunistic).
        self.borrowed: dict[str, int] = {}
        self.borrowed_gpus = 0
        self.free_gpus = sum(n.free_guaranteed for n in self.cluster.nodes.values())
        params = ControlParams(tolerance=config.tolerance, period_seconds=config.control_period)
        self.ledger = GpuLedger(
            self.cluster, model, lambda owner: self.jobs[owner].spec.workload, params
        )
        self.series = TimeSeries(config.bin_seconds)
        self.records: list[JobRecord] = []
        self.counters = Counters()
        self.on_progress = on_progress
        # Called after every instant; tests and --check-invariants hang assertions here.
        self.check: Callable[[Simulation], None] | None = None
        # Called with each instant's arrivals before its cycle (sim/forecast_accuracy.py).
        self.probe: Callable[[Simulation, list[QueuedJob], float], None] | None = None
        # The operator's and agents' series over the replay (--metrics-out), when asked for.
        self.recorder: Recorder | None = None
        self._events: list[tuple[float, int, int, str, int]] = []
        self._seq = 0
        self._ticks: set[float] = set()
        self._now = 0.0
        self.wall_seconds = 0.0

    def _feasible(self, spec: JobSpec) -> bool:
        """Could the job run at all: what the core's cycle marks Inadmissible never is pending
        here, so the pending index may assume every job it holds can run (see decide.py)."""
        gang = spec.gang
        queued = QueuedJob(spec.key, gang, spec.trace.submit, spec.trace.queue, spec.priority)
        if policy_refusal(self.queue_policy, queued) is not None:
            return False
        shape: tuple[object, ...] = (gang.service_class, gang.workers, gang.gpus_per_worker)
        shape += (gang.gpu_model, gang.gpu_memory_mib, gang.topology, gang.constraints)
        shape += (gang.companions,)
        if shape not in self._shapes:
            self._shapes[shape] = never_fits(self.cluster, gang) is None
        return self._shapes[shape]

    # ----- the loop ------------------------------------------------------------------------

    def run(self) -> list[JobRecord]:
        began = time.perf_counter()
        arrivals, i, events = self.specs, 0, self._events
        if arrivals:
            self._now = arrivals[0].trace.submit
            self.clock.set(self._now)
        while True:
            self._drop_stale()
            if i >= len(arrivals) and not events:
                break
            now = min(
                arrivals[i].trace.submit if i < len(arrivals) else float("inf"),
                events[0][0] if events else float("inf"),
            )
            self._advance(now)
            freed = tick = wake = False
            while events and events[0][0] <= now:
                when, _, kind, key, version = heapq.heappop(events)
                if kind == TICK:
                    tick = True
                    self._ticks.discard(when)
                elif kind == WAKE:
                    wake = wake or self._awake(key, when)
                elif key in self.running and self.jobs[key].version == version:
                    self._finish(self.jobs[key], now)
                    freed = True
            if tick:
                self.counters.ticks += 1
                self._update_speeds(self.ledger.control(now), now)
            arrived: list[QueuedJob] = []
            while i < len(arrivals) and arrivals[i].trace.submit <= now:
                arrived.append(self._arrive(arrivals[i], now))
                i += 1
            if arrived and self.probe is not None:
                self.probe(self, arrived, now)
            if (self.pending and (freed or self._any_may_start(arrived))) or (
                wake and self._over_lent()
            ):
                self._cycles(now)
            elif arrived:
                self.counters.skipped_cycles += 1
            self._schedule_tick()
            self.counters.instants += 1
            if self.check is not None:
                self.check(self)
            if self.on_progress is not None:
                self.on_progress(len(self.records))
        if self.recorder is not None:
            self.recorder.close(self, self._now)
        self.wall_seconds = time.perf_counter() - began
        return self.records

    def _drop_stale(self) -> None:
        """Events that would do nothing; left in the heap, they would still move time.

        A completion superseded by a speed change, or a tick with no GPU left to adjust.
        """
        events = self._events
        while events:
            when, _, kind, key, version = events[0]
            if kind == TICK:
                settled = self.ledger.next_settled()
                if settled is not None and settled <= when:
                    return
                self._ticks.discard(when)
            elif kind == WAKE:
                if self._awake(key, when):
                    return
            elif key in self.running and self.jobs[key].version == version:
                return
            heapq.heappop(events)

    def _advance(self, now: float) -> None:
        ledger = self.ledger
        waiting = 1.0 if self.pending else 0.0
        values: tuple[float, ...] = (ledger.util_sum, ledger.memory_sum, ledger.busy)
        values += (ledger.guaranteed, ledger.slots_used, waiting, waiting * ledger.util_sum)
        values += (waiting * ledger.memory_sum, ledger.beside, ledger.beside_speed)
        values += (float(self.borrowed_gpus),)
        self.series.add(self._now, now, values)
        if self.recorder is not None:
            self.recorder.advance(self, self._now, now)
        self._now = now
        self.clock.set(now)

    def _push(self, when: float, kind: int, key: str = "", version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, kind, key, version))

    def _schedule_tick(self) -> None:
        when = self.ledger.next_settled()
        if when is not None and when not in self._ticks:
            self._ticks.add(when)
            self._push(when, TICK)

    # ----- arrivals and admission (evictions: evictions.py) -------------------------------

    def _arrive(self, spec: JobSpec, now: float) -> QueuedJob:
        trace = spec.trace
        # The true run time under sjf-oracle or oracle-runtimes, else predicted when read.
        estimate = trace.duration if self.policy.exact_runtimes else None
        queued = QueuedJob(spec.key, spec.gang, trace.submit, trace.queue, spec.priority, estimate)
        checkpoint = spec.checkpoint_interval
        if checkpoint is None:
            checkpoint = self.config.checkpoint_interval
        self.jobs[spec.key] = JobState(spec, queued, pending_since=now, checkpoint=checkpoint)
        self.pending.add(queued)
        if self.recorder is not None:
            self.recorder.arrived(spec.key, trace.queue, queued.service_class.value)
        return queued

    def _headroom(self) -> dict[str, int]:
        return {q: quota - self.usage.get(q, 0) for q, quota in self._quotas.items()}

    def _any_may_start(self, arrived: list[QueuedJob]) -> bool:
        if not arrived:
            return False
        headroom = self._headroom()
        room = borrow_room(self.queue_policy, self.usage, self.borrowed)
        full = full_nodes_of(self.cluster, self.queue_policy)
        return any(self.pending.may_start(q, self.free_gpus, headroom, room, full) for q in arrived)

    def _cycles(self, now: float) -> None:
        for _ in range(MAX_CYCLES_PER_INSTANT):
            self.counters.cycles += 1
            result = decide(
                self.cluster,
                self.pending,
                list(self.running.values()),
                self.queue_policy,
                now,
                free_gpus=self.free_gpus,
                usage=self.usage,
                share_slots=self.ledger.slots_total - self.ledger.slots_used,
                borrowed=self.borrowed,
            )
            self.counters.reservations += len(result.reservations)
            # Reclaimed borrowers leave first: the admitted plans were made beside them.
            reclaimed = self._reclaim(result, now)
            if not result.admitted:
                if reclaimed:
                    continue
                return
            touched: list[GpuId] = []
            for admission in result.admitted:
                touched.extend(self._start(admission, now))
            evicted = self._evict_overfull(touched, now)
            if not (evicted or reclaimed or self.pending.opportunistic):
                return

    def _start(self, admission: Admission, now: float) -> list[GpuId]:
        queued = admission.job  # as the cycle saw it, with the estimate it used
        job = self.jobs[queued.key]
        self.pending.remove(queued.key)
        gpus = [(p.node, g) for p in admission.plan.placements for g in p.gpu_indices]
        job.begin_run(gpus, now, self.config.restart_overhead)
        # The class it runs as: Opportunistic on borrowed quota, whatever it asked for.
        cls = admission.service_class
        expected = now + (queued.runtime_estimate or self.queue_policy.default_runtime_seconds)
        self.running[queued.key] = admission.running(now, expected, job.evictions)
        if cls is ServiceClass.GUARANTEED:
            self.usage[queued.queue] = self.usage.get(queued.queue, 0) + queued.gpus
            self.free_gpus -= queued.gpus
        if admission.borrowed:
            self.borrowed[queued.queue] = self.borrowed.get(queued.queue, 0) + queued.gpus
            self.borrowed_gpus += queued.gpus
            self.counters.borrowed += 1
            if self.queue_policy.reclaim_min_runtime_seconds > 0:
                self._push(self._wake_at(now), WAKE, queued.key)
        if self.recorder is not None:
            # As the operator: the wait runs from queuedAt, which a requeue keeps.
            wait = now - job.spec.trace.submit
            self.recorder.admitted(queued.key, cls.value, admission.borrowed, wait)
        owners = self.ledger.refresh(job.gpus, now)
        owners.add(queued.key)
        self._update_speeds(owners, now)
        return job.gpus

    # ----- progress and completion --------------------------------------------------------

    def _update_speeds(self, owners: set[str], now: float) -> None:
        for owner in sorted(owners):
            job = self.jobs[owner]
            if owner not in self.running:
                continue
            speed = self.ledger.speed_of(owner, job.gpus)
            if speed == job.speed:
                continue
            job.credit(now)
            job.speed = speed
            job.version += 1
            if speed > 0:  # else paused (duty 0): its end is pushed when it moves again
                remaining = max(0.0, job.spec.trace.duration - job.done)
                begin = max(now, job.resume_at)
                self._push(begin + remaining / speed, COMPLETE, owner, job.version)

    # JobState.credit, under the name it had when it lived here (tests call it so).
    _credit = staticmethod(JobState.credit)

    def _stop(self, job: JobState, now: float) -> None:
        """Take a running job off its GPUs (finished or evicted)."""
        key = job.spec.key
        self.counters.restart_gpu_seconds += job.end_run(now)
        running = self.running.pop(key)
        if running.service_class is ServiceClass.GUARANTEED:
            self.usage[running.queue] -= running.gpus
            self.free_gpus += running.gpus
        if running.borrowed:
            self.borrowed[running.queue] -= running.gpus
            self.borrowed_gpus -= running.gpus
        self.cluster.release(key)
        gpus, job.gpus = job.gpus, []
        job.speed = 0.0
        job.version += 1
        self._update_speeds(self.ledger.refresh(gpus, now), now)

    def _finish(self, job: JobState, now: float) -> None:
        trace = job.spec.trace
        borrowed = self.running[trace.key].borrowed
        self._stop(job, now)
        self.counters.completions += 1
        if self.recorder is not None:
            self.recorder.finished(trace.key)
        # All its runs: the last alone would teach the estimator that an evicted job is short.
        self.estimator.observe(trace.queue, trace.gpus, job.ran)
        self.records.append(job.record(now, borrowed))

    @property
    def unfinished(self) -> list[str]:
        return sorted(k for k in self.jobs if k in self.pending or k in self.running)
