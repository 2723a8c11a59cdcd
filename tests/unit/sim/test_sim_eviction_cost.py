"""What an eviction costs in the simulator: work since the last checkpoint, a restart overhead;
and the limits on reclaim (a borrower's minimum run time, a cap on evictions per job).

One node with 4 GPUs unless said otherwise; queues `a` and `b` hold 2 GPUs of quota each and,
under the `cohort` policy, lend each other what they leave idle.
"""

from __future__ import annotations

import csv
import dataclasses
import json

import pytest
from simkit import FREE_EVICTIONS, OPP, by_key, job, model, setup, simulate

from gangshare.cli import main
from gangshare.core.queueing import QueuedJob
from gangshare.sim.engine import JobState, SimConfig, Simulation
from gangshare.sim.invariants import check_state
from gangshare.sim.policy import parse_policy
from gangshare.sim.trace import load_trace
from gangshare.sim.workload import JobSpec, prepare_jobs
from lucid_inputs import write_lucid

QUOTAS = {"a": 2, "b": 2}
# A1 holds a's quota from 0 to 100; A2 borrows b's idle quota at 0; B1 takes it back at 50.
RECLAIMED = [
    job("A1", 0, 100, 2, queue="a"),
    job("A2", 0, 100, 2, queue="a"),
    job("B1", 50, 100, 2, queue="b"),
]


def record(sim: Simulation, key: str):
    (found,) = [r for r in sim.records if r.key == key]
    return found


def test_a_reclaimed_borrower_loses_the_work_since_its_checkpoint_and_restarts():
    # Checkpoints every 20 s of the run, 30 s to restart. A2 runs alone on its 2 GPUs at full
    # speed from 0; reclaimed at 50, its last checkpoint is at 40: it keeps 40 s of work and
    # loses 10. It waits for a's quota (A1 ends at 100), restarts 100-130 without progress,
    # then does its last 60 s: 130-190. Lost: (10 s of work + 30 s of restart) x 2 GPUs.
    config = SimConfig(checkpoint_interval=20.0, restart_overhead=30.0, reclaim_min_runtime=0.0)
    sim = simulate(RECLAIMED, setup(gpus=4, quotas=QUOTAS), "fifo,cohort", config)
    assert by_key(sim) == {"A1": (0, 100, 0), "A2": (0, 190, 50), "B1": (50, 150, 0)}
    a2 = record(sim, "A2")
    assert (a2.evictions, a2.reclaims, a2.last_run) == (1, 1, 90)
    assert a2.lost_work == pytest.approx(10)
    assert a2.restart_gpu_seconds == pytest.approx(60)
    assert a2.lost_gpu_seconds == pytest.approx(80)
    assert a2.held == pytest.approx(2 * 50 + 2 * 90)
    assert sim.counters.lost_work_gpu_seconds == pytest.approx(20)
    assert sim.counters.restart_gpu_seconds == pytest.approx(60)
    for other in ("A1", "B1"):
        assert record(sim, other).lost_gpu_seconds == 0


def test_free_evictions_lose_nothing():
    sim = simulate(RECLAIMED, setup(gpus=4, quotas=QUOTAS), "fifo,cohort", FREE_EVICTIONS)
    assert by_key(sim)["A2"] == (0, 150, 50)
    assert record(sim, "A2").lost_gpu_seconds == 0


def test_a_memory_eviction_costs_the_same_way():
    # One GPU of 5,000 MiB (test_sim_by_hand.py has the free replay): O (opportunistic) runs
    # alone from 0; G arrives at 10 and O is evicted for memory with 10 s done. Checkpoints
    # every 4 s: it keeps 8 s. It waits for G (10-60), restarts 60-65, does its last 92 s.
    jobs = [job("O", 0, 100, cls=OPP, workload=1), job("G", 10, 50)]
    config = SimConfig(checkpoint_interval=4.0, restart_overhead=5.0)
    sim = simulate(jobs, setup(gpus=1, memory_mib=5000), config=config)
    assert by_key(sim) == {"G": (10, 60, 0), "O": (0, 157, 50)}
    o = record(sim, "O")
    assert (o.evictions, o.reclaims) == (1, 0)
    assert o.lost_work == pytest.approx(2)
    assert o.lost_gpu_seconds == pytest.approx(2 + 5)


def test_the_defaults_checkpoint_every_half_hour_and_restart_in_two_minutes():
    # Evicted 10 s into its run, O keeps nothing; it restarts 60-180 and runs 100 s. (A
    # memory eviction: the minimum run time before reclaim, 1800 s by default, is not
    # for it.)
    jobs = [job("O", 0, 100, cls=OPP, workload=1), job("G", 10, 50)]
    sim = simulate(jobs, setup(gpus=1, memory_mib=5000))
    assert by_key(sim)["O"] == (0, 280, 50)
    assert record(sim, "O").lost_gpu_seconds == pytest.approx(10 + 120)


def test_a_job_checkpoint_interval_from_the_trace_overrides_the_flag():
    with_interval = [dataclasses.replace(j, checkpoint_interval=20.0) for j in RECLAIMED]
    config = SimConfig(checkpoint_interval=1800.0, restart_overhead=30.0, reclaim_min_runtime=0)
    sim = simulate(with_interval, setup(gpus=4, quotas=QUOTAS), "fifo,cohort", config)
    assert record(sim, "A2").lost_work == pytest.approx(10)


def test_the_generic_csv_carries_a_checkpoint_interval_onto_the_job(tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_text("submit_time,duration,num_gpus,checkpoint_interval\n0,10,1,600\n5,10,1,\n")
    trace = load_trace(path)
    assert [j.checkpoint_interval for j in trace.jobs] == [600.0, None]
    specs = prepare_jobs(trace, model(), 0, False, 0.0)
    assert [s.checkpoint_interval for s in specs] == [600.0, None]


def test_progress_counts_the_last_checkpoint_at_any_speed_and_none_while_restarting():
    spec: JobSpec = job("J", 0, 1000)
    state = JobState(spec, QueuedJob("J", spec.gang, 0.0), checkpoint=20.0)
    # A restart: the run starts at 0 and progresses from 30, at half speed.
    state.start, state.resume_at, state.speed = 0.0, 30.0, 0.5
    Simulation._credit(state, 50.0)
    assert (state.done, state.saved) == (pytest.approx(10), pytest.approx(5))  # checkpoint 40
    state.speed = 1.0
    Simulation._credit(state, 65.0)
    assert (state.done, state.saved) == (pytest.approx(25), pytest.approx(20))  # checkpoint 60
    Simulation._credit(state, 79.0)  # no checkpoint passed
    assert (state.done, state.saved) == (pytest.approx(39), pytest.approx(20))


class Logged(Simulation):
    """Records every eviction: (job, when, when its run started)."""

    log: list[tuple[str, float, float]]

    def _evict(self, job: JobState, now: float) -> None:
        self.log.append((job.spec.key, now, self.running[job.spec.key].started_at))
        super()._evict(job, now)


def logged(specs: list[JobSpec], policy: str, config: SimConfig) -> Logged:
    sim = Logged(specs, setup(gpus=4, quotas=QUOTAS)(), parse_policy(policy), model(), config)
    sim.log = []
    sim.check = check_state  # an over-lent cohort only while no borrower may be reclaimed
    sim.run()
    return sim


def test_a_borrower_is_not_reclaimed_before_its_minimum_run_time():
    # B1 takes b's quota back at 50, but A2 has run only 50 of its 80 s minimum: it stays,
    # beside B1, and is reclaimed the moment it has run 80 s (a wake-up event, not a later
    # arrival or completion, runs that cycle).
    config = dataclasses.replace(FREE_EVICTIONS, reclaim_min_runtime=80.0)
    sim = logged(RECLAIMED, "fifo,cohort", config)
    assert sim.log == [("A2", 80.0, 0.0)]
    assert record(sim, "A2").reclaims == 1
    # Without a minimum it goes at 50.
    assert logged(RECLAIMED, "fifo,cohort", FREE_EVICTIONS).log == [("A2", 50.0, 0.0)]


# A1 holds a's quota throughout; A2 borrows b's; b's short jobs take it back again and again.
REPEATED = [
    job("A1", 0, 1000, 2, queue="a"),
    job("A2", 0, 200, 2, queue="a"),
    *(job(f"B{i}", 20 + 30 * i, 5, 2, queue="b") for i in range(4)),
]


@pytest.mark.parametrize(("cap", "evictions"), [(None, 4), (2, 2), (0, 0)])
def test_a_job_is_evicted_at_most_the_capped_number_of_times(cap, evictions):
    config = dataclasses.replace(FREE_EVICTIONS, max_evictions=cap)
    sim = logged(REPEATED, "fifo,cohort", config)
    assert len(sim.log) == evictions
    assert record(sim, "A2").evictions == evictions
    assert sim.queue_policy.max_evictions_per_job == cap


def test_the_sim_config_refuses_negative_costs_and_caps():
    with pytest.raises(ValueError, match="restart_overhead"):
        SimConfig(restart_overhead=-1.0)
    with pytest.raises(ValueError, match="max_evictions"):
        SimConfig(max_evictions=-1)


CLUSTER = """nodePools:
  - {name: n, count: 1, gpusPerNode: 4, gpuMemoryMiB: 16384, nvlinkIslands: [[0, 1, 2, 3]]}
queues:
  - {name: a, quota: 2}
  - {name: b, quota: 2}
"""
# RECLAIMED as a generic CSV; A2 checkpoints every 20 s (the others use the flag).
TRACE = """job_id,submit_time,duration,num_gpus,queue,checkpoint_interval
A1,0,100,2,a,
A2,0,100,2,a,20
B1,50,100,2,b,
"""


@pytest.fixture
def files(tmp_path):
    write_lucid(tmp_path)
    (tmp_path / "cluster.yaml").write_text(CLUSTER)
    (tmp_path / "jobs.csv").write_text(TRACE)
    return tmp_path


def run_cli(files, *extra: str) -> int:
    argv = [
        "simulate",
        "--trace",
        str(files / "jobs.csv"),
        "--cluster",
        str(files / "cluster.yaml"),
    ]
    argv += ["--colocation", str(files / "lucid"), "--out", str(files / "out"), "--no-progress"]
    return main([*argv, "--no-plots", *extra])


def test_simulate_reports_the_gpu_time_evictions_lost(files, capsys):
    flags = ["--policy", "fifo,cohort", "--restart-overhead", "30", "--reclaim-min-runtime", "0"]
    flags.append("--jobs-csv")
    assert run_cli(files, *flags, "--max-evictions", "none", "--check-invariants") == 0
    (result,) = json.loads((files / "out" / "summary.json").read_text())["results"]
    # As by hand above: (10 s of work + 30 s of restart) x 2 GPUs.
    assert result["eviction_gpu_hours_lost"] == pytest.approx(80 / 3600)
    assert result["eviction_restart_gpu_hours"] == pytest.approx(60 / 3600)
    assert result["eviction_lost_share"] == pytest.approx(80 / (200 + 280 + 200))
    assert (result["evictions"], result["max_evictions_per_job"]) == (1, 1)
    assert result["replay"]["eviction_lost_work_gpu_hours"] == pytest.approx(20 / 3600)
    assert result["by_size"]["2-4"]["jct"]["count"] == 3
    with (files / "out" / "jobs-fifo+cohort.csv").open() as handle:
        rows = {row["key"]: row for row in csv.DictReader(handle)}
    assert float(rows["A2"]["lost_gpu_seconds"]) == pytest.approx(80)
    assert float(rows["A2"]["lost_work"]) == pytest.approx(10)
    out = capsys.readouterr().out
    assert "GPU-time lost to them 0.0 GPU-h = 11.76% of GPU-time held" in out
    # A cap of 0: the borrower is never reclaimed.
    assert run_cli(files, *flags, "--max-evictions", "0") == 0
    (result,) = json.loads((files / "out" / "summary.json").read_text())["results"]
    assert (result["evictions"], result["eviction_gpu_hours_lost"]) == (0, 0)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-evictions", "-1"], "error: --max-evictions: must be a count >= 0 or 'none'"),
        (["--max-evictions", "x"], "error: --max-evictions: must be a count >= 0 or 'none'"),
        (["--restart-overhead", "-5"], "error: --restart-overhead: must be a non-negative"),
        (["--checkpoint-interval", "inf"], "error: --checkpoint-interval: must be a non-negative"),
        (["--reclaim-min-runtime", "-1"], "error: --reclaim-min-runtime: must be a non-negative"),
    ],
)
def test_bad_eviction_flags_end_with_one_line_naming_the_flag(files, capsys, args, message):
    assert run_cli(files, *args) == 2
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert err.count("\n") == 1
