"""The `pool` policy (one pool, no quotas, lanes per queue) and the per-size-class metrics."""

from __future__ import annotations

import pytest
from simkit import by_key, job, setup, simulate

from gangshare.core import ServiceClass
from gangshare.sim.metrics import JobRecord, by_size, eviction_cost, size_class
from gangshare.sim.policy import PolicyError, parse_policy

QUOTAS = {"a": 2, "b": 2}


def test_pool_parses_combines_and_excludes_cohort():
    policy = parse_policy("fair-share,pool,multi-queue")
    assert (policy.name, policy.pool, policy.cohort) == ("multi-queue,fair-share,pool", True, False)
    assert not parse_policy("fifo").pool
    with pytest.raises(PolicyError, match="--policy: pool has no quotas and cohort lends"):
        parse_policy("pool,cohort")


def test_pool_ignores_quotas_and_keeps_weights():
    queue_policy = parse_policy("fair-share,pool").queue_policy(QUOTAS, {"a": 3.0, "b": 1.0})
    assert queue_policy.quota_map() == {}
    assert queue_policy.queues == {}
    assert queue_policy.weight("a") == 3.0
    assert parse_policy("fair-share").queue_policy(QUOTAS, {}).quota_map() == QUOTAS


def test_under_pool_a_queue_runs_beyond_its_quota_without_borrowing():
    # Hard quotas make A2 wait for A1; under pool it runs at once, Guaranteed, borrowing
    # nothing; and a job bigger than its queue's quota is not rejected.
    jobs = [job("A1", 0, 100, 2, queue="a"), job("A2", 0, 100, 2, queue="a")]
    walls = simulate(jobs, setup(gpus=4, quotas=QUOTAS), "fifo")
    assert by_key(walls)["A2"] == (100, 200, 100)
    pooled = simulate(jobs, setup(gpus=4, quotas=QUOTAS), "fifo,pool")
    assert by_key(pooled) == {"A1": (0, 100, 0), "A2": (0, 100, 0)}
    assert pooled.counters.borrowed == 0
    assert {r.service_class for r in pooled.records} == {ServiceClass.GUARANTEED.value}
    big = [job("A3", 0, 10, 3, queue="a")]
    assert simulate(big, setup(gpus=4, quotas=QUOTAS), "fifo").rejected == ["A3"]
    assert by_key(simulate(big, setup(gpus=4, quotas=QUOTAS), "fifo,pool")) == {"A3": (0, 10, 0)}


def test_under_pool_each_queue_keeps_its_own_lane():
    # Two GPUs, A1 holds one until 100. a's 2-GPU A2 cannot start and blocks a's lane (no
    # backfill); b's B1 waits in b's own lane, so it starts at once, as it would not in a's.
    jobs = [
        job("A1", 0, 100, 1, queue="a"),
        job("A2", 1, 10, 2, queue="a"),
        job("B1", 2, 10, 1, queue="b"),
    ]
    sim = simulate(jobs, setup(gpus=2, quotas=QUOTAS), "pool")
    assert by_key(sim) == {"A1": (0, 100, 0), "B1": (2, 12, 0), "A2": (100, 110, 99)}
    one_queue = [*jobs[:2], job("B1", 2, 10, 1, queue="a")]
    assert by_key(simulate(one_queue, setup(gpus=2, quotas=QUOTAS), "pool"))["B1"] == (
        110,
        120,
        108,
    )


def rec(key: str, gpus: int, queued: float, jct: float, **extra: float) -> JobRecord:
    """A job submitted at 0 that waited `queued` seconds and ended at `jct`, never evicted."""
    held = extra.pop("held", gpus * (jct - queued))
    run = jct - queued
    return JobRecord(
        key, "q", "Guaranteed", gpus, 0.0, queued, jct, run, queued, run, 0, held, **extra
    )


def test_size_classes_put_5_to_7_gpus_with_the_8_gpu_jobs():
    assert [size_class(g) for g in (1, 2, 3, 4, 5, 7, 8, 9, 16, 128)] == [
        "1", "2-4", "2-4", "2-4", "5-8", "5-8", "5-8", ">8", ">8", ">8",
    ]  # fmt: skip
    with pytest.raises(ValueError):
        size_class(0)


def test_by_size_gives_mean_and_p99_queueing_and_mean_jct_per_class():
    records = [
        rec("s1", 1, 0, 10),
        rec("s2", 1, 100, 200),
        rec("m1", 2, 10, 50),
        rec("m2", 4, 30, 70),
        rec("l1", 6, 0, 100),
        rec("l2", 8, 200, 300),
    ]
    sizes = by_size(records)
    assert list(sizes) == ["1", "2-4", "5-8", ">8"]
    assert sizes[">8"] == {"jct": {"count": 0}, "queueing": {"count": 0}}
    one = sizes["1"]
    assert (one["queueing"]["count"], one["queueing"]["mean"], one["jct"]["mean"]) == (2, 50, 105)
    # p99 interpolates between the closest ranks: 0 + 0.99 x (100 - 0).
    assert one["queueing"]["p99"] == pytest.approx(99)
    assert sizes["2-4"]["queueing"]["mean"] == 20 and sizes["2-4"]["jct"]["mean"] == 60
    assert sizes["5-8"]["queueing"]["mean"] == 100 and sizes["5-8"]["jct"]["mean"] == 200


def test_eviction_cost_sums_the_jobs_lost_gpu_time_over_what_they_held():
    records = [
        rec("a", 2, 0, 100, held=400.0, lost_gpu_seconds=180.0, restart_gpu_seconds=80.0),
        rec("b", 1, 0, 3700, held=3200.0),
    ]
    cost = eviction_cost(records)
    assert cost["gpu_hours_held"] == pytest.approx(1.0)
    assert cost["eviction_gpu_hours_lost"] == pytest.approx(180 / 3600)
    assert cost["eviction_lost_work_gpu_hours"] == pytest.approx(100 / 3600)
    assert cost["eviction_restart_gpu_hours"] == pytest.approx(80 / 3600)
    assert cost["eviction_lost_share"] == pytest.approx(180 / 3600)
    assert cost["max_evictions_per_job"] == 0
    assert eviction_cost([])["eviction_lost_share"] == 0.0
