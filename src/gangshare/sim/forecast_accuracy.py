"""How close start-time forecasts come to the starts that follow, measured on a replay.

At the submission of every `every`-th job, the probe asks `core.forecast.forecast_starts`
for its start, on the replay's live state: the cluster, every pending job with the
estimates of the moment, the running jobs with the ends they were admitted with. That is
what the operator sees when it forecasts. The replay then goes on as always (the probe
changes nothing: the forecast runs on a copy), and the job's actual first start is
compared with the forecast, side by side with the naive forecast
(`core.forecast.naive_wait`: the jobs ahead in its queue times the mean run time so far,
spread over the jobs running).

Errors are on the wait (start minus submission), in seconds. "Within 25 %" allows a
minute: a job forecast to start at once that starts 20 s later is right.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gangshare.core.cluster import Cluster
from gangshare.core.cycle import CycleResult
from gangshare.core.estimate import quantile
from gangshare.core.forecast import ForecastSettings, forecast_starts, naive_wait
from gangshare.core.queueing import QueuedJob, QueuePolicy, RunningJob
from gangshare.sim.decide import decide
from gangshare.sim.engine import Simulation
from gangshare.sim.metrics import JobRecord
from gangshare.sim.pending import PendingIndex

SLACK_SECONDS = 60.0
LONG_WAIT_SECONDS = 600.0


@dataclass(frozen=True)
class Sample:
    key: str
    submit: float
    # None: not forecast to start within the horizon.
    forecast_wait: float | None
    naive_wait: float


@dataclass
class ForecastProbe:
    every: int = 50
    settings: ForecastSettings = field(default_factory=ForecastSettings)
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0
    _arrived: int = 0
    _finished_seconds: float = 0.0
    _finished: int = 0
    _seen_records: int = 0

    def __call__(self, sim: Simulation, arrived: Sequence[QueuedJob], now: float) -> None:
        asked = []
        for job in arrived:
            self._arrived += 1
            if self._arrived % self.every == 0:
                asked.append(job)
        if not asked:
            return
        began = time.perf_counter()
        for record in sim.records[self._seen_records :]:
            self._finished_seconds += record.duration
        self._finished += len(sim.records) - self._seen_records
        self._seen_records = len(sim.records)
        pending = list(sim.pending)
        running = list(sim.running.values())
        keys = {job.key for job in asked}
        out = forecast_starts(
            sim.cluster,
            pending,
            running,
            sim.queue_policy,
            now,
            self.settings,
            keys,
            IndexedCycle(pending, sim.queue_policy),
        )
        mean = (
            self._finished_seconds / self._finished
            if self._finished
            else sim.queue_policy.default_runtime_seconds
        )
        for job in asked:
            ahead = sum(1 for p in pending if p.queue == job.queue and p.submitted_at <= now)
            self.samples.append(
                Sample(job.key, now, out[job.key].wait(now), naive_wait(ahead, mean, len(running)))
            )
        self.seconds += time.perf_counter() - began


class IndexedCycle:
    """The replay's cycle as the engine runs it: `decide` on a pending index, which hands
    the core only the jobs that can matter (its tests compare it with `schedule_cycle` on
    every pending job). The replay removes exactly what each cycle admits."""

    def __init__(self, pending: Sequence[QueuedJob], policy: QueuePolicy) -> None:
        self.index = PendingIndex(policy)
        for job in pending:
            self.index.add(job)

    def __call__(
        self,
        cluster: Cluster,
        pending: list[QueuedJob],
        running: list[RunningJob],
        policy: QueuePolicy,
        now: float,
    ) -> CycleResult:
        result = decide(cluster, self.index, running, policy, now)
        for admission in result.admitted:
            self.index.remove(admission.job.key)
        return result


@dataclass(frozen=True)
class Errors:
    jobs: int
    median: float
    p90: float
    within: float  # share within 25 % (or a minute)


@dataclass(frozen=True)
class Accuracy:
    samples: int
    # Sampled jobs that started before the replay ended (the others have no actual start).
    started: int
    # Of those, how many the forecast gave no start within its horizon, and how many of
    # these did wait longer than the horizon (the forecast was right about them).
    beyond: int
    beyond_right: int
    # Errors over the jobs the forecast gave a start, for it and for the naive forecast.
    forecast: Errors
    naive: Errors
    # The same, for those that waited at least LONG_WAIT_SECONDS.
    long_forecast: Errors
    long_naive: Errors
    # 10th and 90th percentiles of actual / forecast wait (forecast waits of a minute or more).
    ratio_p10: float
    ratio_p90: float
    # Share of actual starts inside the forecast's band (the settings' multipliers).
    in_band: float
    seconds_per_forecast: float

    def to_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        for name in ("forecast", "naive", "long_forecast", "long_naive"):
            out[name] = dict(getattr(self, name).__dict__)
        return out


def _errors(pairs: Sequence[tuple[float, float]]) -> Errors:
    if not pairs:
        return Errors(0, math.nan, math.nan, math.nan)
    errors = sorted(abs(f - a) for f, a in pairs)
    within = sum(1 for f, a in pairs if abs(f - a) <= max(0.25 * a, SLACK_SECONDS))
    return Errors(len(pairs), quantile(errors, 0.5), quantile(errors, 0.9), within / len(pairs))


def accuracy(probe: ForecastProbe, records: Sequence[JobRecord]) -> Accuracy:
    starts = {r.key: r.first_start for r in records}
    forecast: list[tuple[float, float]] = []
    naive: list[tuple[float, float]] = []
    ratios: list[float] = []
    started = beyond = beyond_right = in_band = 0
    settings = probe.settings
    for sample in probe.samples:
        start = starts.get(sample.key)
        if start is None:
            continue
        started += 1
        actual = start - sample.submit
        if sample.forecast_wait is None:
            beyond += 1
            beyond_right += actual > settings.horizon_seconds
            continue
        forecast.append((sample.forecast_wait, actual))
        naive.append((sample.naive_wait, actual))
        low = sample.forecast_wait * settings.band.low
        high = sample.forecast_wait * settings.band.high
        in_band += low - SLACK_SECONDS <= actual <= high + SLACK_SECONDS
        if sample.forecast_wait >= SLACK_SECONDS:
            ratios.append(actual / sample.forecast_wait)
    ratios.sort()

    def long(pairs: list[tuple[float, float]]) -> list[tuple[float, float]]:
        return [(f, a) for f, a in pairs if a >= LONG_WAIT_SECONDS]

    return Accuracy(
        samples=len(probe.samples),
        started=started,
        beyond=beyond,
        beyond_right=beyond_right,
        forecast=_errors(forecast),
        naive=_errors(naive),
        long_forecast=_errors(long(forecast)),
        long_naive=_errors(long(naive)),
        ratio_p10=quantile(ratios, 0.1) if ratios else math.nan,
        ratio_p90=quantile(ratios, 0.9) if ratios else math.nan,
        in_band=in_band / len(forecast) if forecast else math.nan,
        seconds_per_forecast=probe.seconds / max(1, len(probe.samples)),
    )
