"""Small traces whose answers are worked out by hand in the comments."""

import pytest
from simkit import FREE_EVICTIONS, OPP, by_key, job, setup, simulate

from gangshare.core.coordinator import ControlParams
from gangshare.core.settle import settle
from gangshare.sim.engine import SimConfig
from gangshare.sim.metrics import summarize

# One node with 4 GPUs. At the same instant completions are handled before arrivals.
#   A: t=0,  2 GPUs, 100 s     B: t=10, 4 GPUs, 50 s
#   C: t=20, 1 GPU,  30 s      D: t=30, 2 GPUs, 10 s
TRACE = [job("A", 0, 100, 2), job("B", 10, 50, 4), job("C", 20, 30, 1), job("D", 30, 10, 2)]


def test_exclusive_fifo_by_hand():
    # A runs 0-100. B needs all 4 GPUs and waits for A: 100-150. C and D wait behind B in
    # the one strict lane although GPUs are free; both start at 150: C 150-180, D 150-160.
    sim = simulate(TRACE, setup(gpus=4), "fifo")
    assert by_key(sim) == {
        "A": (0, 100, 0),
        "B": (100, 150, 90),
        "C": (150, 180, 130),
        "D": (150, 160, 120),
    }
    records = sim.records
    summary = summarize(records, sim.series, 4, 4 * 16384, 0.0, 180.0)
    # JCTs 100, 140, 160, 130; queueing 0, 90, 130, 120.
    assert summary["jct"]["mean"] == pytest.approx(132.5)
    assert summary["jct"]["median"] == pytest.approx(135.0)
    assert summary["queueing"]["mean"] == pytest.approx(85.0)
    assert summary["makespan_seconds"] == 180
    # GPU-seconds held: 2*100 + 4*50 + 1*30 + 2*10 = 450 over 4 GPUs x 180 s.
    assert summary["gpu_allocation_rate"] == pytest.approx(450 / 720)
    # Something waits from t=10 to t=150. Workload 0 keeps a GPU 50% busy: A's 2 GPUs
    # (10-100) then B's 4 (100-150), over 4 GPUs x 140 s.
    assert summary["backlog_share"] == pytest.approx(140 / 180)
    assert summary["sm_util_backlog"] == pytest.approx((100 * 90 + 200 * 50) / 100 / (4 * 140))


def test_multi_queue_by_hand():
    # Small jobs (<= 2 GPUs) wait in their own lane. C starts on arrival (20-50); D needs 2
    # GPUs but only 1 is free until C ends: 50-60. B still waits for A: 100-150.
    sim = simulate(TRACE, setup(gpus=4), "multi-queue")
    assert by_key(sim) == {
        "A": (0, 100, 0),
        "B": (100, 150, 90),
        "C": (20, 50, 0),
        "D": (50, 60, 20),
    }


def test_backfill_with_predicted_and_with_true_run_times_by_hand():
    # Nothing has finished yet, so every prediction is the one-hour default: A is expected
    # to run until 3600, B reserves all 4 GPUs from then, and C (ending 3620) or D may not
    # start before it. Backfill gains nothing: the FIFO answer.
    sim = simulate(TRACE, setup(gpus=4), "fifo,backfill")
    assert by_key(sim) == by_key(simulate(TRACE, setup(gpus=4), "fifo"))
    # With true run times B's reservation starts at 100: C (20-50) and then D (50-60) end
    # before it, and B still starts at 100.
    sim = simulate(TRACE, setup(gpus=4), "fifo,backfill,oracle-runtimes")
    assert by_key(sim) == {
        "A": (0, 100, 0),
        "B": (100, 150, 90),
        "C": (20, 50, 0),
        "D": (50, 60, 20),
    }


def test_sharing_with_the_coordinators_duty_by_hand():
    # One GPU. G (workload 0) runs 1000 s solo; O (workload 1, opportunistic) 300 s solo.
    # Beside each other at full duty G runs at 0.8 and O at 0.6 of solo speed (simkit.model).
    # t=0: G is admitted; its memory is published and a second cycle places O beside it.
    # The coordinator's law pauses O while it measures G's solo step time and grows O's duty
    # while G stays within 5%: it settles at duty d after k decisions of 2 s. So O is paused
    # until t = 2k, then G runs at 1 - 0.2 d and O at 0.6 d. Once G ends, O is alone: uncapped.
    law = settle(lambda d: 1 / (1 - 0.2 * d), ControlParams(tolerance=0.05))
    d, t = law.duty, 2.0 * law.periods
    assert d == 0.2  # 0.05, 0.1, 0.2 hold; 0.4 (8.7% slower) and 0.25 (5.3%) do not
    sim = simulate([job("G", 0, 1000), job("O", 0, 300, cls=OPP, workload=1)], setup(gpus=1))
    g_end = t + (1000 - t) / (1 - 0.2 * d)
    o_end = g_end + 300 - 0.6 * d * (g_end - t)
    got = by_key(sim)
    assert got["G"] == (0, pytest.approx(g_end), 0)
    assert got["O"] == (0, pytest.approx(o_end), 0)
    summary = summarize(sim.records, sim.series, 1, 16384, 0.0, o_end)
    # About 4% slower: within the 5% tolerance, and nothing ran uncapped.
    assert summary["guaranteed_slowdown"]["max"] == pytest.approx(g_end / 1000 - 1)
    assert summary["guaranteed_slowdown"]["max"] < 0.05
    # O held its share slot for o_end seconds, g_end of them beside G.
    assert summary["opportunistic_beside_guaranteed"] == pytest.approx(g_end / o_end)
    # Its progress: 300 s of work in o_end s; beside G, 0.6 d on average after the pause.
    assert summary["opportunistic_progress"] == pytest.approx(300 / o_end)
    assert summary["opportunistic_progress_beside"] == pytest.approx(0.6 * d * (g_end - t) / g_end)
    assert sim.counters.ticks == 1  # when the law has settled; O alone needs no decision


def test_an_opportunistic_job_is_paused_beside_a_guaranteed_job_it_would_slow_too_much():
    # Four LONE neighbours together cost G (workload 0) 5.3% even at the law's lowest duty:
    # they are paused until G ends at 1000 s (at its solo speed), then run alone.
    jobs = [job("G", 0, 1000)] + [job(f"O{i}", 0, 100, cls=OPP, workload=2) for i in range(4)]
    sim = simulate(jobs, setup(gpus=1))
    got = by_key(sim)
    assert got["G"] == (0, pytest.approx(1000), 0)
    assert all(got[f"O{i}"] == (0, pytest.approx(1100), 0) for i in range(4))


def test_an_opportunistic_job_is_evicted_when_memory_runs_out_and_keeps_its_work():
    # One GPU of 5,000 MiB. O (2,000 MiB) takes it at t=0. G (4,000 MiB) arrives at t=10 and
    # owns the GPU (guaranteed), so O is evicted after 10 s of work and requeued; beside G
    # only 5000 - 4000 - 500 (10% headroom) = 500 MiB is lent, so O waits for G (10-60),
    # then finishes its last 90 s: 60-150. (Free evictions: test_sim_eviction_cost.py
    # has the same replay with its cost.)
    jobs = [job("O", 0, 100, cls=OPP, workload=1), job("G", 10, 50)]
    sim = simulate(jobs, setup(gpus=1, memory_mib=5000), config=FREE_EVICTIONS)
    assert by_key(sim) == {"G": (10, 60, 0), "O": (0, 150, 50)}
    assert sim.counters.evictions == 1
    (record,) = [r for r in sim.records if r.key == "O"]
    assert record.evictions == 1
    # Held share slots: 10 s before the eviction and 90 s after.
    assert record.held == pytest.approx(100)


def test_a_job_that_can_never_fit_is_rejected_instead_of_blocking_its_lane():
    jobs = [job("huge", 0, 10, 8), job("greedy", 0, 10, 4, queue="q"), job("ok", 1, 10, 1)]
    sim = simulate(jobs, setup(gpus=4, quotas={"q": 2}))
    assert sim.rejected == ["huge", "greedy"]
    assert sim.unfinished == []
    assert by_key(sim) == {"ok": (1, 11, 0)}


def test_the_control_period_sets_how_long_the_coordinator_takes_to_settle():
    jobs = [job("G", 0, 1000), job("O", 0, 300, cls=OPP, workload=1)]
    fast = simulate(jobs, setup(gpus=1), config=SimConfig(control_period=0.5))
    # The same duty (0.2) after as many decisions, each 0.5 s instead of 2 s.
    law = settle(lambda d: 1 / (1 - 0.2 * d), ControlParams(tolerance=0.05, period_seconds=0.5))
    t = 0.5 * law.periods
    assert by_key(fast)["G"][1] == pytest.approx(t + (1000 - t) / 0.96)
