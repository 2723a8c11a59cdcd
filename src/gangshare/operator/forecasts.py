"""Start-time forecasts for waiting jobs: when a pass makes them, and when they are written.

A forecast (core/forecast.py) replays the pass's own snapshot forward through the cycle. It
is made every PERIOD_SECONDS, sooner (but not within MIN_GAP_SECONDS) when the backlog
changed a lot since the last one or a waiting job has none yet, so that a job's first
pending-reason write mostly carries its forecast; never sooner than COST_FACTOR times what
the last one took. The operator makes it beside the pass, in a worker process at the
lowest CPU priority (operator/forecast_worker.py), on the snapshot as the pass's admissions
left it; the first pass after it is ready writes it with its reasons.

A forecast is written into status.forecast only when it moved by more than MOVE_SHARE of
the wait (or MOVE_SLACK_SECONDS): a start three hours out that slips five minutes is not
news, and each write is an API request (`bench/scale.py` counts them). The rewrite rides on
the pending-reason write when one is due, else it is a write of its own inside the same
per-pass budget and per-job refresh limit (operator/pending.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gangshare.core.cluster import Cluster
from gangshare.core.cycle import CycleResult
from gangshare.core.forecast import Forecast, ForecastSettings
from gangshare.core.queueing import QueuedJob, QueuePolicy, RunningJob
from gangshare.core.shape_advice import ShapeAdvice
from gangshare.kube.snapshot import parse_time
from gangshare.operator.conditions import iso
from gangshare.operator.forecast_worker import (
    ForecastAsk,
    ForecastRound,
    ForecastWorker,
    forecast_round,
)

PERIOD_SECONDS = 30.0
MIN_GAP_SECONDS = 5.0
# A forecast waits at least this many times what the last one took: at 5,000 queued jobs one
# takes seconds (bench/forecast.py), and forecasting must not slow admissions down. (50 was
# tried: bench/scale.py's admissions were no faster, and py-spy found no forecast in them.)
COST_FACTOR = 20.0
# A backlog that grew or shrank by this share since the last forecast is a large change.
LARGE_CHANGE = 0.1
# A forecast yields to admissions: while passes keep admitting it waits, up to this many
# periods since the last (bench/scale.py with a standing backlog admitted 17% slower when a
# forecast was made every period through a burst of 4,000 admissions).
YIELD_PERIODS = 4.0
MOVE_SHARE = 0.25
MOVE_SLACK_SECONDS = 60.0


@dataclass
class ForecastBook:
    settings: ForecastSettings = field(default_factory=ForecastSettings)
    period_seconds: float = PERIOD_SECONDS
    current: dict[str, Forecast] = field(default_factory=dict)
    # Shape advice made with the last forecast, for the jobs whose authors allow other shapes.
    advice: dict[str, ShapeAdvice] = field(default_factory=dict)
    # When the last forecast was asked for (a worker's round is made as of that time).
    made_at: float | None = None
    # Wall seconds the last forecast took (the operator's metrics report it), and how many
    # rounds were taken (the pass observes the metric once a new one is in).
    last_seconds: float = 0.0
    rounds: int = 0
    # Where rounds are made beside the pass (the operator); None: in the pass.
    worker: ForecastWorker | None = None
    _backlog: int = 0
    _first_waiting: float | None = None
    _advised_last: str | None = None

    def due(self, now: float, waiting: Sequence[QueuedJob], admitting: bool = False) -> bool:
        """Whether a forecast is due; `admitting`: the pass admitted jobs (a forecast then
        waits, up to YIELD_PERIODS periods since the last)."""
        if not waiting or self.period_seconds <= 0:
            return False
        if self.made_at is None:
            # The first one yields too, counted from when jobs first waited.
            self._first_waiting = self._first_waiting or now
            return not admitting or now - self._first_waiting >= self._yield_seconds
        since = now - self.made_at
        if since < COST_FACTOR * self.last_seconds:
            return False
        if admitting:
            return since >= self._yield_seconds
        if since >= self.period_seconds:
            return True
        if since < MIN_GAP_SECONDS:
            return False
        moved = abs(len(waiting) - self._backlog) > LARGE_CHANGE * max(1, self._backlog)
        return moved or any(job.key not in self.current for job in waiting)

    def apply(self, made: ForecastRound) -> dict[str, Forecast]:
        """Take a finished round: its forecasts, and its advice merged with the advice still
        standing for the jobs it did not try (a round goes on where the last stopped)."""
        self.current = made.forecasts
        self.last_seconds = made.seconds
        still = made.waiting - set(made.advice.tried)
        kept = {key: told for key, told in self.advice.items() if key in still}
        self.advice = {**kept, **made.advice.advice}
        if made.advice.tried:
            self._advised_last = made.advice.tried[-1]
        self.rounds += 1
        return self.current

    @property
    def _yield_seconds(self) -> float:
        return YIELD_PERIODS * self.period_seconds

    def of(self, key: str) -> Forecast | None:
        return self.current.get(key)

    def after_cycle(
        self,
        cluster: Cluster,
        result: CycleResult,
        running: Sequence[RunningJob],
        policy: QueuePolicy,
        now: float,
    ) -> dict[str, Forecast]:
        """The forecasts of the jobs the pass's cycle left waiting, made afresh when due, on
        the cluster as the cycle left it (its admissions applied, and running from now)."""
        if self.worker is not None:
            made = self.worker.take()
            if made is not None:
                self.apply(made)
            if self.worker.busy:
                return self.current
        waiting = [p.job for p in result.pending]
        if not self.due(now, waiting, admitting=bool(result.admitted)):
            return self.current
        admitted = [
            a.running(now, now + (a.job.runtime_estimate or policy.default_runtime_seconds))
            for a in result.admitted
        ]
        self.made_at, self._backlog = now, len(waiting)
        ask = ForecastAsk(
            cluster,
            tuple(waiting),
            (*running, *admitted),
            policy,
            now,
            self.settings,
            self._advised_last,
        )
        if self.worker is None:
            return self.apply(forecast_round(ask))
        self.worker.submit(ask)
        return self.current


def forecast_status(
    forecast: Forecast, now: float, advice: ShapeAdvice | None = None
) -> dict[str, Any]:
    """status.forecast for a job (None fields kept: a merge patch writes nulls as deletions,
    which is what a start that left the horizon, or advice that no longer holds, needs)."""
    wait = forecast.wait(now)
    out: dict[str, Any] = {
        "startTime": iso(forecast.start) if forecast.start is not None else None,
        "earliest": iso(forecast.earliest) if forecast.earliest is not None else None,
        "latest": iso(forecast.latest) if forecast.latest is not None else None,
        "waitSeconds": round(wait) if wait is not None else None,
        "positionInQueue": forecast.position,
        "queueLength": forecast.queue_size,
        "cohort": forecast.cohort,
        "positionInCohort": forecast.cohort_position,
        "blockedBy": forecast.blocked_by,
        "madeAt": iso(now),
        "advice": advice_status(advice, now) if advice is not None else None,
    }
    return out


def advice_status(advice: ShapeAdvice, now: float) -> dict[str, Any]:
    return {
        "workers": advice.workers,
        "gpusPerWorker": advice.gpus_per_worker,
        "startTime": iso(advice.start),
        "message": advice.message(now),
    }


def advice_is_news(written: Mapping[str, Any] | None, advice: ShapeAdvice | None) -> bool:
    """Whether status.forecast.advice lacks this advice (or names another shape, or advice
    that no longer holds)."""
    before = (written or {}).get("advice") or None
    if advice is None:
        return before is not None
    shape = (advice.workers, advice.gpus_per_worker)
    return before is None or (before.get("workers"), before.get("gpusPerWorker")) != shape


def forecast_moved(written: Mapping[str, Any] | None, forecast: Forecast, now: float) -> bool:
    """Whether the forecast is news next to what status.forecast says."""
    if not written:
        return True
    before = parse_time(written.get("startTime"))
    if (before is None) != (forecast.start is None):
        return True
    if before is None or forecast.start is None:
        return False
    wait = max(0.0, min(before, forecast.start) - now)
    return abs(forecast.start - before) > max(MOVE_SLACK_SECONDS, MOVE_SHARE * wait)


def written_forecast_note(written: Mapping[str, Any]) -> str:
    """status.forecast in one line with no relative time in it (a queued Job's or JobSet's
    status annotation is rewritten only when it changes, not as the clock moves)."""
    where = f"{written.get('positionInQueue')} of {written.get('queueLength')} in its queue"
    start = written.get("startTime")
    if not start:
        return f"forecast: not within a week; {where}"
    return f"forecast start {start}; {where}"
