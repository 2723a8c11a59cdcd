"""The sharing model, the coordinator's duty cycle, and the metrics' arithmetic."""

import math
from itertools import combinations_with_replacement

import pytest
from simkit import model

from gangshare.core.coordinator import ControlParams
from gangshare.core.settle import settle
from gangshare.sim.cli import COLOCATION
from gangshare.sim.colocation import load_colocation
from gangshare.sim.metrics import TimeSeries, distribution, jain, percentile
from gangshare.sim.progress import ProgressBar
from gangshare.sim.sharing import Coordinator, share_gpu

BIG, SMALL, LONE = 0, 1, 2
LAW = ControlParams(tolerance=0.05)
measured = pytest.mark.skipif(
    not COLOCATION.is_dir(), reason=f"needs the Lucid co-location data in {COLOCATION}"
)


def test_the_duty_is_where_the_coordinators_law_settles():
    m = model()
    coordinator = Coordinator(m, LAW)
    # BIG loses 20% beside SMALL at full duty, so its step time at duty d is 1 / (1 - 0.2 d).
    alone = settle(lambda d: 1 / (1 - 0.2 * d), LAW)
    assert coordinator.settled(BIG, [SMALL]) == alone
    assert 0 < alone.duty < 1 and alone.periods > 1
    # Two neighbours: their losses add up (20% + 30%), in any order.
    both = settle(lambda d: 1 / (1 - 0.5 * d), LAW)
    assert coordinator.settled(BIG, [SMALL, BIG]) == coordinator.settled(BIG, [BIG, SMALL]) == both
    assert both.duty < alone.duty
    # No guaranteed tenant, or nobody beside it: no cap.
    assert coordinator.duty(None, [SMALL, BIG]) == 1.0
    assert coordinator.duty(BIG, []) == 1.0
    # A looser tolerance lets the neighbours run longer.
    assert Coordinator(m, ControlParams(tolerance=0.25)).duty(BIG, [SMALL]) == 1.0


def test_neighbours_that_even_the_lowest_duty_would_slow_too_much_are_paused():
    # Four LONE neighbours cost BIG 4 x 25% (BIG's mean measured speed is 0.75): at the law's
    # lowest step (5%) that is a 5.3% slowdown, over the 5% tolerance.
    coordinator = Coordinator(model(), LAW)
    assert coordinator.duty(BIG, [LONE] * 4) == 0.0
    share = share_gpu(("g", BIG), [(f"o{i}", LONE) for i in range(4)], 0.0, model())
    assert share.speeds == {"g": 1.0, "o0": 0.0, "o1": 0.0, "o2": 0.0, "o3": 0.0}


@measured
def test_beside_any_one_workload_the_guaranteed_job_stays_within_tolerance():
    m = load_colocation(COLOCATION)
    coordinator = Coordinator(m, LAW)
    duties = {}
    # Every pair of workloads: the measured ones and those that fall back to a mean.
    for g in range(len(m)):
        for o in range(len(m)):
            duty = coordinator.duty(g, [o])
            share = share_gpu(("g", g), [("o", o)], duty, m)
            assert 1 / share.speeds["g"] <= 1 + LAW.tolerance, (m.workloads[g], m.workloads[o])
            # ...and not by pausing everyone: the next step up would break the tolerance.
            if duty < 1.0:
                above = share_gpu(("g", g), [("o", o)], duty + LAW.step_up, m)
                assert 1 / above.speeds["g"] > 1 + LAW.tolerance
            duties[(g, o)] = duty
    assert 0.0 < min(duties.values()) < 0.5 and max(duties.values()) == 1.0
    # The worse a neighbour interferes with the guaranteed job, the lower its duty.
    by_loss = sorted(duties, key=lambda pair: 1 - m.speed(*pair))
    ordered = [duties[pair] for pair in by_loss]
    assert ordered == sorted(ordered, reverse=True)


@measured
def test_with_several_neighbours_the_guaranteed_job_stays_within_tolerance():
    m = load_colocation(COLOCATION)
    coordinator = Coordinator(m, LAW)
    # Three neighbours drawn from every 7th workload: all their combinations beside each.
    some = range(0, len(m), 7)
    for g in some:
        for trio in combinations_with_replacement(some, 3):
            duty = coordinator.duty(g, list(trio))
            share = share_gpu(("g", g), [(f"o{i}", o) for i, o in enumerate(trio)], duty, m)
            assert 1 / share.speeds["g"] <= 1 + LAW.tolerance


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
    series.add(5.0, 25.0, (2.0, 0.0, 1.0, 1.0, 0.0, 1.0, 2.0, 0.0, 0.0, 0.0, 0.0))
    assert series.totals["util"] == 40.0
    assert series.averages("util", 1.0) == [1.0, 2.0, 1.0]
    series.add(25.0, 25.0, (9.0,) * 11)  # an empty interval adds nothing
    assert series.totals["util"] == 40.0


def test_the_progress_bar_renders_a_fraction_of_jobs():
    bar = ProgressBar(200, "fifo", width=10)
    assert bar.render(50, 3.0) == "fifo [##........]  25% 50/200 jobs   3.0s"
