"""Evictions: what they cost a job, and the engine's paths that make them.

Evictions cost (`SimConfig.checkpoint_interval`, `restart_overhead`): a run checkpoints
every c seconds of its own wall time (c per job from the trace where it has one, else the
flag), so an evicted job keeps the work (solo-seconds) it had done at the last multiple of
c of the run's elapsed time and loses the rest; each run that follows an eviction spends
its first r seconds restarting, holding its GPUs with no progress. GPU-seconds lost =
(solo-seconds of work lost + seconds of restart) x GPUs (share slots for a tenant) held:
a solo-second of work is one second of its GPUs' capacity, whatever speed it ran at
beside others (the rest of a shared GPU's time served its other tenants).

JobState is a job's state over all its runs and keeps those books; its methods are called
by the engine, in its order, when a run starts, progresses, stops or is rolled back.
Counters are the replay's totals. `Evictions` holds the Simulation's eviction paths
(engine.py's Simulation is built on it): a reclaimed borrower (`_reclaim`) and an
opportunistic tenant whose GPU's memory no longer fits (`_evict_overfull`) both end in
`_evict`; `_wake_at` is when reclaim may first take a borrower.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

from gangshare.core.cycle import CycleResult
from gangshare.core.queueing import QueuedJob, QueuePolicy, RunningJob
from gangshare.core.queues import CohortBook
from gangshare.sim.config import DEFAULT_CHECKPOINT_INTERVAL
from gangshare.sim.ledger import GpuId, GpuLedger
from gangshare.sim.metrics import JobRecord
from gangshare.sim.pending import PendingIndex
from gangshare.sim.workload import JobSpec


class RequeueRecorder(Protocol):
    """What evictions tell the replay's metrics (sim/openmetrics.py implements it)."""

    def requeued(self, key: str, reason: str) -> None: ...


@dataclass(eq=False)
class JobState:
    spec: JobSpec
    queued: QueuedJob
    gpus: list[GpuId] = field(default_factory=list)
    pending_since: float = 0.0
    queued_for: float = 0.0
    first_start: float | None = None
    start: float = 0.0
    done: float = 0.0
    speed: float = 0.0
    updated: float = 0.0
    version: int = 0
    evictions: int = 0
    # Evictions that reclaimed borrowed quota (a subset of `evictions`).
    reclaims: int = 0
    held: float = 0.0
    # Seconds it has run, over all its runs (an evicted job resumes from its checkpoint).
    ran: float = 0.0
    # Seconds of a run between two checkpoints (the trace's, else SimConfig's).
    checkpoint: float = DEFAULT_CHECKPOINT_INTERVAL
    # When the current run starts progressing (its start plus a restart's overhead).
    resume_at: float = 0.0
    # Work (solo-seconds) done at the current run's last checkpoint (or its start).
    saved: float = 0.0
    # Solo-seconds of work evictions threw away, and GPU-seconds of restarts (all runs).
    lost_work: float = 0.0
    lost_gpu_seconds: float = 0.0
    restart_gpu_seconds: float = 0.0

    def begin_run(self, gpus: list[GpuId], now: float, restart_overhead: float) -> None:
        """A run starts on `gpus`; its speed is set by the engine once the ledger has it."""
        self.gpus = gpus
        self.queued_for += now - self.pending_since
        if self.first_start is None:
            self.first_start = now
        self.start = self.updated = now
        # A run after an eviction restarts first (reloads its checkpoint) without progress.
        self.resume_at = now + (restart_overhead if self.evictions else 0.0)
        self.saved = self.done
        self.speed = 0.0

    def credit(self, now: float) -> None:
        """Add the work done since the last update (at a constant speed, none while the run
        restarts), and what had been done at the last checkpoint in that span."""
        if now <= self.updated:
            return
        speed = self.speed
        if self.checkpoint > 0:
            checkpoint = (
                self.start + math.floor((now - self.start) / self.checkpoint) * self.checkpoint
            )
            if checkpoint > self.updated:
                self.saved = self.done + speed * max(
                    0.0, checkpoint - max(self.updated, self.resume_at)
                )
        self.done += speed * max(0.0, now - max(self.updated, self.resume_at))
        if self.checkpoint == 0:
            self.saved = self.done
        self.updated = now

    def end_run(self, now: float) -> float:
        """The run stops (finished or evicted): its work, time held and time run are booked.

        Returns the GPU-seconds it spent restarting, for the replay's totals.
        """
        self.credit(now)
        width = len(self.gpus)
        self.held += width * (now - self.start)
        self.ran += now - self.start
        restart = width * (min(now, self.resume_at) - self.start)
        self.restart_gpu_seconds += restart
        self.lost_gpu_seconds += restart
        return restart

    def roll_back(self, width: int, now: float) -> float:
        """An evicted run, after `end_run`, goes back to its last checkpoint and waits again.

        `width` is what the run held (its GPUs are gone by now). Returns the GPU-seconds of
        work it lost, for the replay's totals.
        """
        lost = self.done - self.saved
        self.done = self.saved
        self.lost_work += lost
        self.lost_gpu_seconds += lost * width
        self.evictions += 1
        self.pending_since = now
        return lost * width

    def record(self, now: float, borrowed: bool) -> JobRecord:
        """The finished job's record; `borrowed`: whether its last run was on borrowed quota."""
        trace = self.spec.trace
        assert self.first_start is not None
        return JobRecord(
            key=trace.key,
            queue=trace.queue,
            service_class=self.queued.service_class.value,
            gpus=trace.gpus,
            submit=trace.submit,
            first_start=self.first_start,
            end=now,
            duration=trace.duration,
            queued=self.queued_for,
            last_run=now - self.start,
            evictions=self.evictions,
            held=self.held,
            borrowed=borrowed,
            reclaims=self.reclaims,
            lost_work=self.lost_work,
            lost_gpu_seconds=self.lost_gpu_seconds,
            restart_gpu_seconds=self.restart_gpu_seconds,
        )


@dataclass
class Counters:
    """The replay's totals (RunResult.counters); engine.py re-exports it."""

    instants: int = 0
    cycles: int = 0
    skipped_cycles: int = 0
    completions: int = 0
    ticks: int = 0
    # Every eviction (memory overflow or reclaim), and the reclaims among them.
    evictions: int = 0
    reclaims: int = 0
    # Admissions on borrowed quota.
    borrowed: int = 0
    # Backfill reservations the cycles made (a blocked head's claim on GPUs freeing up).
    reservations: int = 0
    # GPU-seconds evictions cost every job, finished or not: work lost, restart overheads.
    lost_work_gpu_seconds: float = 0.0
    restart_gpu_seconds: float = 0.0


class Evictions:
    """The Simulation's eviction paths; engine.py's Simulation sets up the state below.

    A base class, so that engine.py stays the loop; the methods keep their names there
    (a test's Simulation overrides `_evict`).
    """

    jobs: dict[str, JobState]
    running: dict[str, RunningJob]
    pending: PendingIndex
    queue_policy: QueuePolicy
    usage: dict[str, int]
    borrowed: dict[str, int]
    ledger: GpuLedger
    counters: Counters
    recorder: RequeueRecorder | None

    def _stop(self, job: JobState, now: float) -> None:
        """Take a running job off its GPUs (finished or evicted): the engine's."""
        raise NotImplementedError

    def _wake_at(self, started: float) -> float:
        """The first instant reclaim may evict a borrower started then (as the core computes
        it: `now - started_at >= minimum`, which a plain sum may miss by a rounding)."""
        minimum = self.queue_policy.reclaim_min_runtime_seconds
        when = started + minimum
        while when - started < minimum:
            when = math.nextafter(when, math.inf)
        return when

    def _awake(self, key: str, when: float) -> bool:
        """A WAKE event still names the run it was pushed for: its borrower is still running."""
        running = self.running.get(key)
        return (
            running is not None and running.borrowed and self._wake_at(running.started_at) == when
        )

    def _over_lent(self) -> bool:
        """Some cohort's borrowers hold more than it lends (reclaim was held back)."""
        queues = self.queue_policy.queues
        book = CohortBook(queues, dict(self.usage), dict(self.borrowed))
        cohorts = {spec.cohort for spec in queues.values() if spec.cohort is not None}
        return any(book.over_lent(cohort) > 0 for cohort in cohorts)

    def _reclaim(self, result: CycleResult, now: float) -> bool:
        """Evict the borrowers the cycle reclaims, whole; requeued from their checkpoint."""
        for preemption in result.preemptions:
            job = self.jobs[preemption.job.key]
            running = self.running[job.spec.key]
            if not running.borrowed:
                raise AssertionError(f"{job.spec.key}: reclaimed but not borrowing")
            if not self.queue_policy.reclaimable(running, now):
                raise AssertionError(f"{job.spec.key}: reclaimed but protected by the policy")
            self._evict(job, now)
            job.reclaims += 1
            self.counters.reclaims += 1
            if self.recorder is not None:
                self.recorder.requeued(job.spec.key, "Preempted")
        return bool(result.preemptions)

    def _evict(self, job: JobState, now: float) -> None:
        """Take a job off its GPUs and requeue it; it loses the work since its last checkpoint."""
        width = len(job.gpus)
        self._stop(job, now)
        self.counters.lost_work_gpu_seconds += job.roll_back(width, now)
        self.pending.add(job.queued)
        self.counters.evictions += 1

    def _evict_overfull(self, gids: list[GpuId], now: float) -> bool:
        """Evict opportunistic tenants, newest first, from GPUs whose memory no longer fits."""
        evicted = False
        for gid in dict.fromkeys(gids):
            while self.ledger.overfull(gid):
                tenants = self.ledger.gpus[gid].opportunistic
                if not tenants:
                    break
                newest = max(tenants, key=lambda t: (self.jobs[t.owner].start, t.owner))
                self._evict(self.jobs[newest.owner], now)
                evicted = True
                if self.recorder is not None:
                    self.recorder.requeued(newest.owner, "OpportunisticEvicted")
        return evicted
