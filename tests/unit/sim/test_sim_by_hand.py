"""Small traces whose answers are worked out by hand in the comments."""

import pytest
from simkit import OPP, by_key, job, setup, simulate

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


def test_sharing_with_the_coordinator_cap_by_hand():
    # One GPU. G (workload 0) runs 1000 s solo; O (workload 1, opportunistic) 300 s solo.
    # Beside each other G runs at 0.8 and O at 0.6 of solo speed (simkit.model).
    # t=0: G is admitted; its memory is published and a second cycle places O beside it.
    # 0..60: no cap yet (the coordinator acts at control ticks): G 0.8, O 0.6.
    # t=60 tick: duty d = 0.05 / (1 - 0.8) = 0.25 -> G 1 - 0.25 * 0.2 = 0.95, O 0.25 * 0.6.
    # G ends at 60 + (1000 - 48) / 0.95. O then runs alone at duty 0.25 until the next tick
    # (t=1080), then at full speed.
    sim = simulate([job("G", 0, 1000), job("O", 0, 300, cls=OPP, workload=1)], setup(gpus=1))
    g_end = 60 + (1000 - 0.8 * 60) / 0.95
    o_done = 0.6 * 60 + 0.15 * (g_end - 60) + 0.25 * (1080 - g_end)
    o_end = 1080 + (300 - o_done)
    got = by_key(sim)
    assert got["G"] == (0, pytest.approx(g_end), 0)
    assert got["O"] == (0, pytest.approx(o_end), 0)
    summary = summarize(sim.records, sim.series, 1, 16384, 0.0, o_end)
    # 6.2% slowdown: the 5% cap holds after the first tick; the first 60 s ran uncapped.
    assert summary["guaranteed_slowdown"]["max"] == pytest.approx(g_end / 1000 - 1)
    # O held its share slot for o_end seconds, g_end of them beside G.
    assert summary["opportunistic_beside_guaranteed"] == pytest.approx(g_end / o_end)
    assert sim.counters.ticks == 2


def test_an_opportunistic_job_is_evicted_when_memory_runs_out_and_keeps_its_work():
    # One GPU of 5,000 MiB. O (2,000 MiB) takes it at t=0. G (4,000 MiB) arrives at t=10 and
    # owns the GPU (guaranteed), so O is evicted after 10 s of work and requeued; beside G
    # only 5000 - 4000 - 500 (10% headroom) = 500 MiB is lent, so O waits for G (10-60),
    # then finishes its last 90 s: 60-150.
    jobs = [job("O", 0, 100, cls=OPP, workload=1), job("G", 10, 50)]
    sim = simulate(jobs, setup(gpus=1, memory_mib=5000))
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


def test_control_period_changes_only_how_long_interference_goes_uncapped():
    fast = simulate(
        [job("G", 0, 1000), job("O", 0, 300, cls=OPP, workload=1)],
        setup(gpus=1),
        config=SimConfig(control_period=1.0),
    )
    g_end = 1 + (1000 - 0.8) / 0.95
    assert by_key(fast)["G"][1] == pytest.approx(g_end)
