"""Start-time forecasts: the live snapshot replayed forward through the same scheduling cycle.

Every queued job gets the moment the operator's own cycle would admit it if every run time
were what the predictor says: running jobs end at their expected ends, each admitted job runs
for its estimate, nothing new arrives. The replay is `schedule_cycle` on a copy of the
snapshot, at each predicted completion, so a forecast follows every rule the real queue
follows (quota, cohorts and borrowing, backfill reservations, fair share, topology, gangs)
and can never disagree with it about what blocks a job now.

Two things bound what a forecast costs (bench/forecast.py measures it at 5,000 queued jobs):
  - completions within a step of one another are taken in one cycle, the step growing with
    the distance from now (`step_of`), and what a cycle admits is taken to start when a
    completion of its step freed the GPUs it took (`_begins`): far out, one cycle takes many
    completions, and the rounding of one step is not carried into the next;
  - the replay stops once every job asked about has started, or when nothing runs and
    nothing could start (what is left never starts within the horizon).

What it leaves out is said where it is used: arrivals after now (a higher-priority job that
arrives later still overtakes), Opportunistic squeezes and evictions, and failures. How far
starts fell from forecasts on replays of public traces is measured in docs/results.md.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from gangshare.core.cluster import Cluster
from gangshare.core.cycle import CycleResult, schedule_cycle
from gangshare.core.queueing import QueuedJob, QueuePolicy, RunningJob
from gangshare.core.results import Admission, Pending

__all__ = [
    "Band",
    "Forecast",
    "ForecastSettings",
    "forecast_starts",
    "naive_wait",
    "overdue_remaining",
    "step_of",
]

WEEK = 7 * 24 * 3600.0


class Cycle(Protocol):
    """The scheduling cycle the replay runs: `schedule_cycle`, or one that hands it only the
    jobs that can matter (the simulator's `decide`, tested to decide the same)."""

    def __call__(
        self,
        cluster: Cluster,
        pending: list[QueuedJob],
        running: list[RunningJob],
        policy: QueuePolicy,
        now: float,
    ) -> CycleResult: ...


@dataclass(frozen=True)
class Band:
    """Multipliers on the forecast wait that give status.forecast's earliest and latest
    starts. They are not a confidence interval: docs/results.md measures, on replays of
    public traces, how many starts fell inside and the 10th to 90th percentiles of actual /
    forecast wait, which is what a reader should trust."""

    low: float = 0.5
    high: float = 2.0


@dataclass(frozen=True)
class ForecastSettings:
    horizon_seconds: float = WEEK
    # The smallest step between replayed cycles, and the share of the distance from now that
    # a step may grow to: a start 10 h out is told to within about 30 min.
    min_step_seconds: float = 30.0
    step_share: float = 0.05
    max_cycles: int = 400
    band: Band = field(default_factory=Band)


@dataclass(frozen=True)
class Forecast:
    key: str
    queue: str
    # When the replayed cycle admits it (absolute time); None: not within the horizon (or
    # the replay's cycle budget, `max_cycles`).
    start: float | None
    earliest: float | None
    latest: float | None
    # 1-based: the order in which its queue's (and cohort's) waiting jobs are forecast to start,
    # those with no forecast last in the cycle's order.
    position: int
    queue_size: int
    cohort: str | None
    cohort_position: int | None
    # What keeps it waiting now: the cycle's reason on the snapshot itself.
    blocked_by: str

    def wait(self, now: float) -> float | None:
        return None if self.start is None else max(0.0, self.start - now)


def step_of(now: float, t: float, settings: ForecastSettings) -> float:
    return max(settings.min_step_seconds, (t - now) * settings.step_share)


def overdue_remaining(now: float, started_at: float) -> float:
    """What a running job past its predicted end is expected to run still: a quarter of
    what it has run so far (a job that overran its estimate is likely long), at least a
    minute."""
    return max(60.0, 0.25 * (now - started_at))


def naive_wait(position: int, mean_runtime: float, running: int) -> float:
    """The baseline a forecast must beat: each job ahead takes a mean run time, spread over
    the jobs that run side by side now."""
    return (position - 1) * mean_runtime / max(1, running)


def forecast_starts(
    cluster: Cluster,
    pending: Sequence[QueuedJob],
    running: Sequence[RunningJob],
    policy: QueuePolicy,
    now: float,
    settings: ForecastSettings | None = None,
    until_started: Collection[str] | None = None,
    cycle: Cycle = schedule_cycle,
) -> dict[str, Forecast]:
    """A forecast for every job of `pending`. `cluster` is the snapshot the cycle would run
    on (it is copied, never changed); `until_started` stops the replay once those jobs have
    started (the simulator asks about a few jobs at a time). Running jobs end at their
    expected ends (`overdue_remaining` once past them); waiting jobs run the estimates the
    cycle uses."""
    settings = settings or ForecastSettings()
    twin = cluster.copy()
    replay = _Replay(policy, now, settings, cycle)
    starts, first = replay.run(twin, list(pending), list(running), until_started)
    blocked = {p.job.key: p.reason for p in first}
    return _forecasts(pending, policy, now, starts, blocked, settings)


@dataclass(frozen=True)
class _Replay:
    policy: QueuePolicy
    now: float
    settings: ForecastSettings
    cycle: Cycle

    def end_of_running(self, job: RunningJob) -> float:
        """Its expected end while that is ahead; once it has outlived it, `overdue_remaining`.
        (What longer runs of its shape ran on after its age, from history, was tried: on the
        Alibaba replay it put forecasts days late; see the #38 note.)"""
        now, end = self.now, job.expected_end
        if end is not None and end > now:
            return end
        return now + overdue_remaining(now, job.started_at)

    def run_time_of(self, job: QueuedJob) -> float:
        return job.runtime_estimate or self.policy.default_runtime_seconds

    def run(
        self,
        cluster: Cluster,
        pending: list[QueuedJob],
        running: list[RunningJob],
        until_started: Collection[str] | None,
    ) -> tuple[dict[str, float], list[Pending]]:
        policy, now, settings = self.policy, self.now, self.settings
        ends: list[tuple[float, str]] = []
        live: dict[str, RunningJob] = {}
        for job in running:
            end = self.end_of_running(job)
            live[job.key] = replace(job, expected_end=end)
            heapq.heappush(ends, (end, job.key))
        # The operator's snapshot holds a running gang's pods as "<key>/<rank>"; the replay's
        # own admissions and the simulator's as the key.
        held: dict[str, list[str]] = {}
        for owner in cluster.owners():
            key = owner if owner in live else owner.rpartition("/")[0]
            if key in live:
                held.setdefault(key, []).append(owner)

        def release(key: str) -> None:
            for owner in held.pop(key, [key]):
                cluster.release(owner)

        waiting = {job.key: job for job in pending}
        wanted = set(waiting) if until_started is None else set(until_started) & set(waiting)
        starts: dict[str, float] = {}
        first: list[Pending] = []
        t, horizon = now, now + settings.horizon_seconds
        # The step's completions, in order, with the GPUs each freed.
        freed: list[tuple[float, int]] = []
        for cycle in range(settings.max_cycles):
            result = self.cycle(cluster, list(waiting.values()), list(live.values()), policy, t)
            if cycle == 0:
                first = result.pending
            for preemption in result.preemptions:
                if live.pop(preemption.job.key, None) is not None:
                    release(preemption.job.key)
            begins = _begins(result.admitted, freed, t)
            for admission, begun in zip(result.admitted, begins, strict=True):
                queued = admission.job
                del waiting[queued.key]
                starts[queued.key] = begun
                end = begun + self.run_time_of(queued)
                live[queued.key] = admission.running(begun, end)
                heapq.heappush(ends, (end, queued.key))
            if not wanted - starts.keys() or not waiting:
                break
            # Completions whose jobs were preempted in the replay are stale: skipped.
            while ends and ends[0][1] not in live:
                heapq.heappop(ends)
            if not ends:
                break  # nothing runs and nothing more could start: the rest never start
            # The next completion, and those within a step of it, in one cycle at the last of
            # them (a step's window never moves the replay's clock past its events).
            base = max(t, ends[0][0])
            if base > horizon:
                break
            limit = base + step_of(now, base, settings)
            freed = []
            while ends and ends[0][0] <= limit:
                end, key = heapq.heappop(ends)
                done = live.pop(key, None)
                if done is not None:
                    release(key)
                    freed.append((end, done.gpus))
            t = max(base, freed[-1][0]) if freed else base
        return starts, first


def _begins(
    admitted: Sequence[Admission], freed: Sequence[tuple[float, int]], t: float
) -> list[float]:
    """When each job a step admits is taken to start: in the cycle's order, each takes the
    GPUs the step's completions freed earliest (the first cycle, with nothing freed, starts
    them now). Stamping them all with the step's end instead made every step's rounding
    carry into the next, along a queue: forecasts on the Alibaba trace came out twice the
    actual waits even with the true run times."""
    if not freed:
        return [t] * len(admitted)
    begins, needed, have, i = [], 0, 0, 0
    for admission in admitted:
        needed += admission.job.gpus
        while i < len(freed) and have < needed:
            have += freed[i][1]
            i += 1
        begins.append(freed[i - 1][0])
    return begins


def _forecasts(
    pending: Sequence[QueuedJob],
    policy: QueuePolicy,
    now: float,
    starts: Mapping[str, float],
    blocked: Mapping[str, str],
    settings: ForecastSettings,
) -> dict[str, Forecast]:
    order = {job.key: i for i, job in enumerate(pending)}

    def rank(job: QueuedJob) -> tuple[float, int]:
        return (starts.get(job.key, float("inf")), order[job.key])

    by_queue: dict[str, list[QueuedJob]] = {}
    by_cohort: dict[str, list[QueuedJob]] = {}
    cohort_of = {name: spec.cohort for name, spec in policy.queues.items() if spec.cohort}
    for job in pending:
        by_queue.setdefault(job.queue, []).append(job)
        cohort = cohort_of.get(job.queue)
        if cohort is not None:
            by_cohort.setdefault(cohort, []).append(job)
    position: dict[str, int] = {}
    for jobs in by_queue.values():
        jobs.sort(key=rank)
        position.update((job.key, i + 1) for i, job in enumerate(jobs))
    in_cohort: dict[str, int] = {}
    for jobs in by_cohort.values():
        jobs.sort(key=rank)
        in_cohort.update((job.key, i + 1) for i, job in enumerate(jobs))
    band = settings.band
    out: dict[str, Forecast] = {}
    for job in pending:
        start = starts.get(job.key)
        wait = None if start is None else start - now
        out[job.key] = Forecast(
            key=job.key,
            queue=job.queue,
            start=start,
            earliest=None if wait is None else now + wait * band.low,
            latest=None if wait is None else now + wait * band.high,
            position=position[job.key],
            queue_size=len(by_queue[job.queue]),
            cohort=cohort_of.get(job.queue),
            cohort_position=in_cohort.get(job.key),
            blocked_by=blocked.get(job.key, "admitted by the next cycle"),
        )
    return out
