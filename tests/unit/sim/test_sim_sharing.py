"""The sharing model, the coordinator's cap, and the metrics' arithmetic."""

import math

import pytest
from simkit import model

from gangshare.sim.metrics import TimeSeries, distribution, jain, percentile
from gangshare.sim.progress import ProgressBar
from gangshare.sim.sharing import coordinator_duty, share_gpu

BIG, SMALL, LONE = 0, 1, 2


def test_the_coordinator_caps_opportunistic_duty_to_keep_the_guaranteed_job_within_tolerance():
    m = model()
    # BIG loses 20% beside SMALL at full duty; a 5% budget allows a quarter of the time.
    assert coordinator_duty(BIG, [SMALL], 0.05, m) == pytest.approx(0.25)
    # Two neighbours lose 20% + 30%: the budget is shared, d = 0.05 / 0.5.
    assert coordinator_duty(BIG, [SMALL, BIG], 0.05, m) == pytest.approx(0.1)
    # Within tolerance (or no guaranteed tenant): no cap.
    assert coordinator_duty(BIG, [SMALL], 0.25, m) == 1.0
    assert coordinator_duty(None, [SMALL, BIG], 0.05, m) == 1.0


def test_speeds_interpolate_linearly_between_alone_and_the_measured_pair():
    m = model()
    full = share_gpu(("g", BIG), [("o", SMALL)], 1.0, m)
    assert full.speeds == {"g": pytest.approx(0.8), "o": pytest.approx(0.6)}
    capped = share_gpu(("g", BIG), [("o", SMALL)], 0.25, m)
    assert capped.speeds == {"g": pytest.approx(0.95), "o": pytest.approx(0.25 * 0.6)}
    # Utilization: BIG's 50% plus d x (pair 70% - 50%); memory: the footprints add up.
    assert capped.util == pytest.approx(50 + 0.25 * 20)
    assert capped.memory_mib == 4000 + 2000


def test_interference_from_several_neighbours_adds_up():
    m = model()
    share = share_gpu(None, [("a", SMALL), ("b", SMALL), ("c", BIG)], 1.0, m)
    # a beside b (0.9) and beside c (0.6): 1 - 0.1 - 0.4.
    assert share.speeds["a"] == pytest.approx(0.5)
    # c beside two SMALLs (0.8 each): 1 - 0.2 - 0.2.
    assert share.speeds["c"] == pytest.approx(0.6)
    # LONE was never measured: its pairs use its mean measured speed, 1.0 (none measured).
    assert share_gpu(None, [("x", LONE), ("y", BIG)], 1.0, m).speeds["x"] == 1.0


def test_a_guaranteed_job_alone_runs_at_solo_speed_and_an_idle_gpu_is_idle():
    m = model()
    assert share_gpu(("g", BIG), [], 0.3, m).speeds == {"g": 1.0}
    idle = share_gpu(None, [], 1.0, m)
    assert (idle.speeds, idle.util, idle.memory_mib) == ({}, 0.0, 0)


def test_percentiles_and_fairness():
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert percentile([10.0], 0.99) == 10.0
    assert math.isnan(percentile([], 0.5))
    stats = distribution([4.0, 1.0, 3.0, 2.0])
    assert (stats["mean"], stats["median"], stats["max"]) == (2.5, 2.5, 4.0)
    assert stats["p95"] == pytest.approx(3.85)
    assert jain([1.0, 1.0, 1.0]) == 1.0
    assert jain([1.0, 0.0, 0.0, 0.0]) == 0.25


def test_time_series_integrals_split_across_bins():
    series = TimeSeries(bin_seconds=10.0)
    series.add(5.0, 25.0, (2.0, 0.0, 1.0, 1.0, 0.0, 1.0, 2.0, 0.0, 0.0))
    assert series.totals["util"] == 40.0
    assert series.averages("util", 1.0) == [1.0, 2.0, 1.0]
    series.add(25.0, 25.0, (9.0,) * 9)  # an empty interval adds nothing
    assert series.totals["util"] == 40.0


def test_the_progress_bar_renders_a_fraction_of_jobs():
    bar = ProgressBar(200, "fifo", width=10)
    assert bar.render(50, 3.0) == "fifo [##........]  25% 50/200 jobs   3.0s"
