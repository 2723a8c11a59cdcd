"""Shape advice: whether a waiting gang would start much sooner in another shape its author
allows (the same GPUs as fewer, wider workers or the reverse).

Each allowed shape is tried by replaying the same forecast (core/forecast.py) with only that
job reshaped, so the advice follows every rule the queue follows: a 1x8 gang that waits for
a whole free node may start at once as 2x4 on two half-free ones, and a quota or a queue
ahead of it is not dodged by any shape. Samsung SDS recommended resources from its run-time
model the same way; here the run time is the job's own estimate in every shape (a wider
worker is not assumed faster).

Each trial is a replay of its own, so a round runs at most `trials` of them, taking the jobs
in the cycle's order and going on where the last round stopped; advice is a report until the
author's opt-in lets admission take it (spec.reshape: Admit on a TrainingJob).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from gangshare.core.cluster import Cluster
from gangshare.core.cycle import schedule_cycle
from gangshare.core.forecast import Cycle, Forecast, ForecastSettings, forecast_starts
from gangshare.core.queueing import QueuedJob, QueuePolicy, RunningJob

__all__ = [
    "AdviceRound",
    "ShapeAdvice",
    "advise_shapes",
    "much_sooner",
    "reshaped",
    "wait_in_words",
]

# Advice is given when the other shape saves at least half the wait and at least this long.
SOONER_SHARE = 0.5
MIN_GAIN_SECONDS = 600.0
# Replays a round may run: at 5,000 queued jobs one costs about a cycle or more
# (bench/forecast.py), and a round runs with each forecast.
DEFAULT_TRIALS = 8


@dataclass(frozen=True)
class ShapeAdvice:
    key: str
    workers: int
    gpus_per_worker: int
    # Forecast starts (absolute): in the advised shape, and in its own (None: not within the
    # forecast's horizon).
    start: float
    instead: float | None

    @property
    def shape(self) -> str:
        return f"{self.workers}x{self.gpus_per_worker}"

    def message(self, now: float) -> str:
        own = (
            "not within a week"
            if self.instead is None
            else wait_in_words(max(0.0, self.instead - now))
        )
        sooner = wait_in_words(max(0.0, self.start - now))
        return f"as {self.shape} it would start {sooner} instead of {own}"


def wait_in_words(seconds: float) -> str:
    if seconds < 60:
        return "now"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"in about {round(seconds / size)} {unit}"
    return "now"


def least_gain(own_wait: float) -> float:
    """The least a shape must save of a wait of `own_wait` to be advised."""
    return max(MIN_GAIN_SECONDS, SOONER_SHARE * own_wait)


def much_sooner(own_wait: float | None, other_wait: float) -> bool:
    """Whether a shape's wait is worth telling the author about next to its own."""
    return own_wait is None or own_wait - other_wait >= least_gain(own_wait)


def reshaped(job: QueuedJob, workers: int, gpus_per_worker: int) -> QueuedJob:
    gang = replace(
        job.gang, workers=workers, gpus_per_worker=gpus_per_worker, alternative_shapes=()
    )
    return replace(job, gang=gang)


@dataclass(frozen=True)
class AdviceRound:
    # The advice found, by job; the jobs whose shapes were tried (advised or not), in order.
    advice: dict[str, ShapeAdvice]
    tried: list[str]


def advise_shapes(
    cluster: Cluster,
    pending: Sequence[QueuedJob],
    running: Sequence[RunningJob],
    policy: QueuePolicy,
    now: float,
    forecasts: Mapping[str, Forecast],
    settings: ForecastSettings | None = None,
    cycle: Cycle = schedule_cycle,
    trials: int = DEFAULT_TRIALS,
    after: str | None = None,
) -> AdviceRound:
    """For jobs of `pending` that allow other shapes and wait long enough to gain from one,
    in the cycle's order from the one after `after` (round the queue, so every such job gets
    its turn across rounds), while `trials` replays last (a job's shapes are tried together):
    the soonest allowed shape that starts `much_sooner` than its own forecast (`forecasts`,
    made on the same snapshot)."""
    candidates = [
        job
        for job in pending
        if job.gang.alternative_shapes and _may_gain(forecasts.get(job.key), now)
    ]
    keys = [job.key for job in candidates]
    if after in keys:
        turn = keys.index(after) + 1
        candidates = candidates[turn:] + candidates[:turn]
    settings = settings or ForecastSettings()
    found = AdviceRound({}, [])
    left = trials
    for job in candidates:
        if left < len(job.gang.alternative_shapes) and found.tried:
            break
        left -= len(job.gang.alternative_shapes)
        found.tried.append(job.key)
        advice = _advise_job(
            cluster, job, pending, running, policy, now, forecasts, settings, cycle
        )
        if advice is not None:
            found.advice[job.key] = advice
    return found


def _advise_job(
    cluster: Cluster,
    job: QueuedJob,
    pending: Sequence[QueuedJob],
    running: Sequence[RunningJob],
    policy: QueuePolicy,
    now: float,
    forecasts: Mapping[str, Forecast],
    settings: ForecastSettings,
    cycle: Cycle,
) -> ShapeAdvice | None:
    own = forecasts[job.key]
    # A trial stops where a start would no longer be much sooner.
    wait = own.wait(now)
    cutoff = settings.horizon_seconds if wait is None else wait - least_gain(wait)
    trial_settings = replace(settings, horizon_seconds=cutoff)
    best: ShapeAdvice | None = None
    for workers, gpus in job.gang.alternative_shapes:
        trial_job = reshaped(job, workers, gpus)
        trial = [trial_job if other.key == job.key else other for other in pending]
        start = forecast_starts(
            cluster, trial, running, policy, now, trial_settings, {job.key}, cycle
        )[job.key].start
        if start is None or not much_sooner(wait, max(0.0, start - now)):
            continue
        if best is None or start < best.start:
            best = ShapeAdvice(job.key, workers, gpus, start, own.start)
    return best


def _may_gain(forecast: Forecast | None, now: float) -> bool:
    if forecast is None:
        return False
    wait = forecast.wait(now)
    return wait is None or wait >= MIN_GAIN_SECONDS
