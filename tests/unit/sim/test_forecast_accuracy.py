"""Forecast accuracy in the simulator: the probe asks the operator's forecast at submission,
changes nothing in the replay, and its errors are told side by side with the naive forecast."""

from __future__ import annotations

import math

from simkit import model, setup
from test_sim_report import NAMED, tiny_trace

from gangshare.core.forecast import ForecastSettings
from gangshare.sim.forecast_accuracy import ForecastProbe, Sample, accuracy
from gangshare.sim.metrics import JobRecord
from gangshare.sim.outcome import Outcome
from gangshare.sim.policy import parse_policy
from gangshare.sim.report_forecasts import ForecastOutcome, ForecastRun, forecast_section
from gangshare.sim.report_md import results_markdown
from gangshare.sim.run import simulate


def record(key: str, submit: float, start: float) -> JobRecord:
    return JobRecord(key, "q", "Guaranteed", 1, submit, start, start + 10, 10, start - submit,
                     10, 0, 10)  # fmt: skip


def test_the_probe_changes_nothing_and_with_true_run_times_fifo_starts_are_forecast_closely():
    trace = tiny_trace()
    policy = parse_policy("oracle-runtimes")  # FIFO with the true run times
    plain = simulate(trace, setup(nodes=2, gpus=4), policy, model(), seed=1)
    probe = ForecastProbe(every=3, settings=ForecastSettings(min_step_seconds=1, step_share=0))
    probed = simulate(trace, setup(nodes=2, gpus=4), policy, model(), seed=1, probe=probe)
    assert [(r.key, r.first_start, r.end) for r in probed.records] == [
        (r.key, r.first_start, r.end) for r in plain.records
    ]
    assert len(probe.samples) == len(trace.jobs) // 3
    measured = accuracy(probe, probed.records)
    assert measured.started == len(probe.samples) and measured.beyond == 0
    # With the true run times only a later arrival in the other queue's lane, which may take
    # GPUs first, makes a forecast miss: every start within 25 % (or a minute), the median
    # exact, where the naive forecast is off by more than half an hour.
    assert measured.forecast.jobs == len(probe.samples)
    assert measured.forecast.median == 0.0 and measured.forecast.within == 1.0
    assert measured.naive.median > 1800 and measured.naive.within < 0.1


def test_errors_shares_band_and_beyond_the_horizon_are_counted_as_stated():
    probe = ForecastProbe(every=1)
    probe.samples = [
        Sample("a", 0.0, 100.0, 0.0),  # started at 100: exact; naive 100 off
        Sample("b", 0.0, 1000.0, 1000.0),  # started at 1400: 400 s off, outside 25 % of 1400
        Sample("c", 0.0, None, 50.0),  # not within a week, and it waited 8 days: right
        Sample("d", 0.0, None, 50.0),  # not within a week, but it started at once: wrong
        Sample("e", 0.0, 10.0, 10.0),  # never started in the replay: left out
    ]
    records = [record("a", 0, 100), record("b", 0, 1400), record("c", 0, 8 * 86400),
               record("d", 0, 5)]  # fmt: skip
    measured = accuracy(probe, records)
    assert (measured.samples, measured.started) == (5, 4)
    assert (measured.beyond, measured.beyond_right) == (2, 1)
    assert measured.forecast.jobs == measured.naive.jobs == 2
    assert measured.forecast.median == 200.0 and measured.naive.median == 250.0
    assert measured.forecast.within == 0.5 and measured.naive.within == 0.0
    assert measured.in_band == 1.0  # 1400 is within 0.5x - 2x of 1000
    assert math.isclose(measured.ratio_p10, 1.04) and math.isclose(measured.ratio_p90, 1.36)
    assert measured.long_forecast.jobs == 1 and measured.long_forecast.median == 400.0


def test_make_results_has_the_forecast_table():
    trace = tiny_trace()
    probe = ForecastProbe(every=4)
    result = simulate(trace, setup(nodes=2, gpus=4), parse_policy("fifo"), model(), 1, probe=probe)
    run = ForecastRun("alibaba", "fifo", 4)
    outcome = ForecastOutcome(run, accuracy(probe, result.records), result.wall_seconds, 0.1)
    lines = forecast_section([outcome])
    assert lines[0] == "## Start-time forecasts: how close they came"
    row = next(line for line in lines if line.startswith("| alibaba | fifo |"))
    assert f"| {len(trace.jobs) // 4:,} |" in row
    page = results_markdown(
        [Outcome(NAMED["alibaba"], trace, "2 nodes", [result])], 10.0, 1, "here", [outcome]
    )
    assert "## Start-time forecasts: how close they came" in page
    assert forecast_section([]) == []
