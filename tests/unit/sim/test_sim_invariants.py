"""Invariants over random traces: checked after every instant, and on the finished replay."""

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from simkit import OPP, G, job, setup, simulate

from gangshare.core import ServiceClass, Tenant
from gangshare.sim.engine import SimConfig
from gangshare.sim.invariants import InvariantError, check_gpus

POLICIES = [
    "fifo",
    "priority,multi-queue",
    "qssf,backfill",
    "sjf-oracle,fair-share,backfill",
    "antman",
    "multi-queue,fair-share,backfill,antman",
]


@st.composite
def traces(draw):
    jobs = []
    for i in range(draw(st.integers(1, 40))):
        opportunistic = draw(st.booleans())
        jobs.append(
            job(
                f"j{i:02d}",
                submit=float(draw(st.integers(0, 60)) * 5),  # coarse times: simultaneous events
                duration=float(draw(st.integers(1, 400))),
                gpus=1 if opportunistic else draw(st.sampled_from([1, 1, 2, 4, 8, 16])),
                cls=OPP if opportunistic else ServiceClass.GUARANTEED,
                workload=draw(st.integers(0, 2)),
                queue=draw(st.sampled_from(["a", "b"])),
                priority=draw(st.integers(0, 1)),
            )
        )
    return jobs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(traces(), st.sampled_from(POLICIES))
def test_replays_keep_every_invariant(jobs, policy):
    if "antman" not in policy:  # as prepare_jobs does: without antman every job is Guaranteed
        jobs = [
            replace(j, gang=replace(j.gang, service_class=G, gpu_memory_mib=None)) for j in jobs
        ]
    # 5,000 MiB GPUs with two share slots: opportunistic work gets evicted now and then.
    cluster = setup(nodes=3, gpus=8, memory_mib=5000, slots=2, quotas={"a": 12})
    sim = simulate(jobs, cluster, policy, SimConfig(bin_seconds=10.0))
    # Every job finishes exactly once (or was rejected up front: 16 GPUs in queue a's 12).
    finished = [r.key for r in sim.records]
    assert len(finished) == len(set(finished))
    assert sorted(finished + sim.rejected) == sorted(j.key for j in jobs)
    assert sim.unfinished == []
    assert all(j.trace.gpus > 12 and j.trace.queue == "a" for j in jobs if j.key in sim.rejected)
    # Work is conserved: each job did exactly its solo duration of work.
    for record in sim.records:
        assert sim.jobs[record.key].done == pytest.approx(record.duration, rel=1e-9, abs=1e-6)
        assert record.end - record.first_start >= record.duration - 1e-6
    # GPU-time is conserved: what jobs held is what the cluster had allocated over time.
    held = {"Guaranteed": 0.0, "Opportunistic": 0.0}
    for record in sim.records:
        held[record.service_class] += record.held
    totals = sim.series.totals
    # Time stops with the last event that mattered (superseded completions do not move it).
    last = max((r.end for r in sim.records), default=0.0)
    assert len(sim.series.bins) <= last // sim.series.bin_seconds + 1
    assert totals.get("guaranteed", 0.0) == pytest.approx(held["Guaranteed"])
    assert totals.get("slots", 0.0) == pytest.approx(held["Opportunistic"])
    if "antman" not in policy:  # exclusive GPUs: held GPU-time is exactly the trace's GPU-time
        assert held["Guaranteed"] == pytest.approx(sum(r.gpus * r.duration for r in sim.records))


def test_the_gpu_check_catches_an_over_committed_gpu():
    sim = simulate([job("G", 0, 100)], setup(gpus=1), checked=False)
    gid = ("n0", 0)
    tenants = [Tenant(f"x{i}", f"x{i}/0", ServiceClass.OPPORTUNISTIC, 100) for i in range(5)]
    sim.ledger.gpus[gid].opportunistic.extend(tenants)
    with pytest.raises(InvariantError, match=r"GPU \('n0', 0\): 5 tenants in 4 share slots"):
        check_gpus(sim)


def test_the_gpu_check_catches_a_duty_the_coordinator_did_not_set():
    jobs = [job("G", 0, 100), job("O", 0, 100, cls=OPP, workload=1)]
    sim = simulate(jobs, setup(gpus=1), checked=False)
    gid = ("n0", 0)
    sim.ledger.gpus[gid].guaranteed = Tenant("G", "G/0", G, 0)
    sim.ledger.gpus[gid].opportunistic.append(Tenant("O", "O/0", OPP, 2000))
    sim.ledger.duty[gid] = 1.0  # not settling, and the law's duty beside G is 0.2
    with pytest.raises(
        InvariantError, match=r"GPU \('n0', 0\): duty 1.0, the coordinator's is 0.2"
    ):
        check_gpus(sim)
