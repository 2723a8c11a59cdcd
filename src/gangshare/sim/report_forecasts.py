"""`make results`' forecast-accuracy section: start-time forecasts taken at submission on two
replays, against the starts that followed and against the naive forecast.

Each run is one replay with a `ForecastProbe` (sim/forecast_accuracy.py) asking, at every
`every`-th submission, for that job's start: the same `core.forecast.forecast_starts` the
operator calls, on the replay's live state, with run times from the same estimator.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gangshare.sim.forecast_accuracy import (
    LONG_WAIT_SECONDS,
    SLACK_SECONDS,
    Accuracy,
    ForecastProbe,
    accuracy,
)


@dataclass(frozen=True)
class ForecastRun:
    experiment: str  # an Experiment's name (sim/report.py)
    policy: str
    every: int


@dataclass(frozen=True)
class ForecastOutcome:
    run: ForecastRun
    accuracy: Accuracy
    replay_seconds: float
    forecast_seconds: float


def measure(run: ForecastRun, replay: Any) -> ForecastOutcome:
    """`replay(probe)` runs the experiment's replay with the probe and returns its records
    and wall seconds (report.py knows how to set an experiment up)."""
    probe = ForecastProbe(every=run.every)
    records, seconds = replay(probe)
    return ForecastOutcome(run, accuracy(probe, records), seconds, probe.seconds)


def _hours(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def _share(value: float) -> str:
    return "-" if math.isnan(value) else f"{value * 100:.0f} %"


def forecast_section(outcomes: Sequence[ForecastOutcome]) -> list[str]:
    if not outcomes:
        return []
    lines = [
        "## Start-time forecasts: how close they came",
        "",
        "At the submission of every N-th job the replay asks the operator's forecast",
        "(`core.forecast.forecast_starts`: the live state replayed forward through the same",
        "cycle, run times from the same estimator) when that job will start, then compares",
        "the start that followed. The naive forecast: the jobs ahead in its queue times the",
        "mean run time of the jobs finished so far, spread over the jobs running.",
        'Errors are on the wait, over the jobs given a start; "within 25 %" allows',
        f"{SLACK_SECONDS:.0f} s. A job forecast not to start within the horizon (a week) is",
        "counted apart, with how many of those did wait longer than a week.",
        "",
        "| replay | policy | jobs asked | median error: forecast / naive | p90 error: forecast /"
        " naive | within 25 %: forecast / naive | waited over"
        f" {LONG_WAIT_SECONDS / 60:.0f} min: median error forecast / naive (jobs) |"
        " not within a week (did wait longer) | actual / forecast wait, p10 - p90 |"
        " in the band | s per forecast |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for outcome in outcomes:
        a = outcome.accuracy
        f, n = a.forecast, a.naive
        lf, ln = a.long_forecast, a.long_naive
        ratio = "-" if math.isnan(a.ratio_p10) else f"{a.ratio_p10:.2f} - {a.ratio_p90:.2f}"
        lines.append(
            f"| {outcome.run.experiment} | {outcome.run.policy} | {a.started:,} |"
            f" {_hours(f.median)} / {_hours(n.median)} | {_hours(f.p90)} / {_hours(n.p90)} |"
            f" {_share(f.within)} / {_share(n.within)} |"
            f" {_hours(lf.median)} / {_hours(ln.median)} ({lf.jobs:,}) |"
            f" {a.beyond:,} ({a.beyond_right:,}) | {ratio} | {_share(a.in_band)} |"
            f" {a.seconds_per_forecast:.3f} |"
        )
    lines += [
        "",
        "The band written beside each forecast (status.forecast.earliest and latest) is the",
        "wait times 0.5 and 2; the table's p10 - p90 of actual / forecast wait is what it",
        "should be measured against. What a forecast leaves out, and why it errs: jobs that",
        "arrive after it and overtake (priority, fair share, a lane of small jobs), run times",
        "that differ from the estimator's (the largest error: with the true run times the",
        "Alibaba replay's p10 - p90 is 0.80 - 1.12, see the #38 note), Opportunistic squeezes",
        "and evictions.",
        "",
    ]
    return lines


def write_forecast_json(path: Path, outcomes: Sequence[ForecastOutcome]) -> None:
    doc = [
        {
            "experiment": o.run.experiment,
            "policy": o.run.policy,
            "every": o.run.every,
            "replay_seconds": o.replay_seconds,
            "forecast_seconds": o.forecast_seconds,
            **o.accuracy.to_json(),
        }
        for o in outcomes
    ]
    text = json.dumps(doc, indent=1, sort_keys=True, default=lambda v: None)
    path.write_text(text.replace("NaN", "null") + "\n")
