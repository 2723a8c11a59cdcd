"""Cohorts in the simulator: idle quota lent, borrowers reclaimed whole and requeued, none lost.

One node with 4 GPUs unless said otherwise; queues `a` and `b` hold 2 GPUs of quota each
and, under the `cohort` policy, lend each other what they leave idle.
"""

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from simkit import FREE_EVICTIONS, OPP, by_key, job, setup, simulate

import gangshare.sim.engine as engine
from gangshare.core import Cluster, GangRequest, Gpu, NodeState, ServiceClass
from gangshare.core.cycle import schedule_cycle
from gangshare.core.gang import never_fits
from gangshare.core.queueing import QueuedJob, QueuePolicy, RunningJob, policy_refusal
from gangshare.core.queues import QueueSpec
from gangshare.sim.clusters import load_sim_cluster
from gangshare.sim.decide import decide, quota_headroom
from gangshare.sim.engine import SimConfig
from gangshare.sim.pending import PendingIndex
from gangshare.sim.policy import parse_policy

QUOTAS = {"a": 2, "b": 2}
# A1 holds queue a's whole quota; A2 wants as much again while queue b is idle.
IDLE_LENDER = [job("A1", 0, 100, 2, queue="a"), job("A2", 0, 100, 2, queue="a")]


def test_without_the_cohort_policy_quotas_stay_hard_walls():
    sim = simulate(IDLE_LENDER, setup(gpus=4, quotas=QUOTAS), "fifo")
    assert by_key(sim) == {"A1": (0, 100, 0), "A2": (100, 200, 100)}
    assert sim.counters.borrowed == 0


def test_an_idle_queue_lends_its_quota():
    # b lends its 2 idle GPUs: A2 runs at once on them, as an Opportunistic tenant alone on
    # its GPUs (nothing caps it), so at full speed.
    sim = simulate(IDLE_LENDER, setup(gpus=4, quotas=QUOTAS), "fifo,cohort")
    assert by_key(sim) == {"A1": (0, 100, 0), "A2": (0, 100, 0)}
    assert sim.counters.borrowed == 1
    borrowed = {r.key: r.borrowed for r in sim.records}
    assert borrowed == {"A1": False, "A2": True}
    assert sim.queue_policy.queues["a"].cohort == "all"


def test_a_lenders_arrival_reclaims_the_borrower_which_keeps_its_progress():
    # t=50: B1 (queue b, 2 GPUs) takes b's quota back. It is admitted at once, on the GPUs A2
    # borrowed, and A2 is evicted whole with 50 s of its 100 s done. A2 waits in its lane
    # (a's quota is A1's until t=100; nothing left to borrow), then runs its last 50 s within
    # a's quota: 100-150. Its queueing delay is the 50 s it waited after the eviction.
    # (Free evictions; test_sim_eviction_cost.py prices this one.)
    jobs = [*IDLE_LENDER, job("B1", 50, 100, 2, queue="b")]
    sim = simulate(jobs, setup(gpus=4, quotas=QUOTAS), "fifo,cohort", FREE_EVICTIONS)
    assert by_key(sim) == {"A1": (0, 100, 0), "A2": (0, 150, 50), "B1": (50, 150, 0)}
    a2 = next(r for r in sim.records if r.key == "A2")
    assert (a2.evictions, a2.reclaims, a2.borrowed, a2.last_run) == (1, 1, False, 50)
    assert (sim.counters.reclaims, sim.counters.evictions) == (1, 1)


def test_the_least_progressed_borrower_is_reclaimed_first():
    # Two 1-GPU borrowers from a (A2 from t=0, A3 from t=10); B1 (1 GPU) takes back one of
    # b's GPUs at t=20, so one borrower must go: A3, the later started.
    jobs = [
        job("A1", 0, 100, 2, queue="a"),
        job("A2", 0, 100, 1, queue="a"),
        job("A3", 10, 100, 1, queue="a"),
        job("B1", 20, 10, 1, queue="b"),
    ]
    sim = simulate(jobs, setup(gpus=4, quotas=QUOTAS), "fifo,cohort", FREE_EVICTIONS)
    reclaimed = {r.key: r.reclaims for r in sim.records}
    assert reclaimed == {"A1": 0, "A2": 0, "A3": 1, "B1": 0}
    # B1 ends at 30 and lends its GPU again: A3 borrows it back at once with 10 s done
    # (evictions are free here).
    assert by_key(sim)["A3"] == (10, 120, 10)


def test_named_cohorts_only_lend_inside_themselves():
    # c is in another cohort: its idle quota is not a's to borrow, and b's is.
    quotas = {"a": 2, "b": 1, "c": 1}
    cohorts = {"a": "x", "b": "x", "c": "y"}
    jobs = [job("A1", 0, 100, 2, queue="a"), job("A2", 0, 100, 2, queue="a")]
    sim = simulate(jobs, setup(gpus=4, quotas=quotas, cohorts=cohorts), "fifo,cohort")
    assert by_key(sim)["A2"] == (100, 200, 100)  # x lends 1 GPU, A2 needs 2
    jobs = [job("A1", 0, 100, 2, queue="a"), job("A2", 0, 100, 1, queue="a")]
    sim = simulate(jobs, setup(gpus=4, quotas=quotas, cohorts=cohorts), "fifo,cohort")
    assert by_key(sim)["A2"] == (0, 100, 0)


def test_a_job_beyond_its_quota_is_rejected_only_if_its_cohort_could_never_lend_enough():
    # a's quota is 1 GPU, b lends up to 3: a 3-GPU job of a can only ever run on borrowed
    # quota, and does; a 5-GPU job never can, and is rejected on arrival (as without cohorts).
    quotas = {"a": 1, "b": 3}
    jobs = [job("A3", 0, 100, 3, queue="a"), job("A5", 0, 100, 5, queue="a")]
    sim = simulate(jobs, setup(gpus=8, quotas=quotas), "fifo,cohort")
    assert sim.rejected == ["A5"]
    assert by_key(sim) == {"A3": (0, 100, 0)}
    assert [r.borrowed for r in sim.records] == [True]
    assert simulate(jobs, setup(gpus=8, quotas=quotas), "fifo").rejected == ["A3", "A5"]


def mixed_trace(count: int, seed: int) -> list:
    """Bursts of every size in three queues, some of them Opportunistic: lots of borrowing."""
    draw = __import__("random").Random(seed)
    jobs = []
    for i in range(count):
        queue = draw.choice(["a", "a", "b", "c"])
        opportunistic = draw.random() < 0.2
        gpus = 1 if opportunistic else draw.choice([1, 1, 2, 4, 8])
        cls = OPP if opportunistic else ServiceClass.GUARANTEED
        submit = float(draw.randrange(0, 2000, 5))
        duration = float(draw.choice([20, 60, 200, 700]))
        jobs.append(job(f"j{i:03d}", submit, duration, gpus, cls, draw.randrange(3), queue))
    return jobs


# Eviction costs and reclaim limits at the scale of mixed_trace's jobs (20-700 s).
SCALED_COSTS = SimConfig(
    checkpoint_interval=50.0, restart_overhead=10.0, reclaim_min_runtime=100.0, max_evictions=3
)


@pytest.mark.parametrize("config", [FREE_EVICTIONS, SCALED_COSTS], ids=["free", "costed"])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    "policy",
    ["fifo,cohort", "multi-queue,fair-share,backfill,antman,cohort", "sjf-oracle,backfill,cohort"],
)
def test_no_job_is_lost_and_invariants_hold_throughout(policy, seed, config):
    jobs = mixed_trace(80, seed)
    quotas = {"a": 8, "b": 8, "c": 4}
    sim = simulate(jobs, setup(nodes=3, gpus=8, racks=2, quotas=quotas), policy, config)
    finished = {r.key for r in sim.records}
    assert finished | set(sim.rejected) == {j.key for j in jobs}
    assert not finished & set(sim.rejected)
    assert sim.unfinished == []
    for r in sim.records:  # progress kept across evictions: never more work than the job has
        assert r.end - r.first_start >= r.duration - 1e-6
    assert sim.counters.borrowed > 0


@pytest.mark.parametrize("config", [FREE_EVICTIONS, SCALED_COSTS], ids=["free", "costed"])
def test_every_cycle_with_cohorts_matches_the_operators_cycle(monkeypatch, config):
    """decide() prunes the pending jobs; with borrowing it must still decide what the core does."""
    seen = []

    def checked(cluster, pending, running, queue_policy, now, **counts):
        view = copy.deepcopy(cluster)
        expected = schedule_cycle(view, list(pending), list(running), queue_policy, now)
        got = decide(cluster, pending, running, queue_policy, now, **counts)
        assert [(a.job.key, a.plan, a.borrowed) for a in got.admitted] == [
            (a.job.key, a.plan, a.borrowed) for a in expected.admitted
        ], f"t={now}"
        assert [p.job.key for p in got.preemptions] == [p.job.key for p in expected.preemptions]
        seen.append(len(got.admitted))
        return got

    monkeypatch.setattr(engine, "decide", checked)
    jobs = mixed_trace(80, 7)
    sim = simulate(
        jobs,
        setup(nodes=3, gpus=8, racks=2, quotas={"a": 8, "b": 8, "c": 4}),
        "multi-queue,fair-share,backfill,antman,cohort",
        config,
    )
    assert len(sim.records) + len(sim.rejected) == 80
    assert sim.counters.reclaims > 0


QUEUES = ["a", "b", "c"]


@st.composite
def cohort_snapshots(draw):
    nodes = [
        NodeState.build(
            f"n{i}", [Gpu(g, f"u{i}-{g}", "H100", 24576) for g in range(4)], [[0, 1], [2, 3]]
        )
        for i in range(draw(st.integers(1, 3)))
    ]
    cluster = Cluster(nodes)
    running = []
    for node in nodes:
        for gpu in node.gpus:
            kind = draw(st.sampled_from(["free", "guaranteed", "borrowed", "opportunistic"]))
            owner = f"run-{node.name}-{gpu.index}"
            queue = draw(st.sampled_from(QUEUES))
            if kind == "guaranteed":
                cluster.allocate(owner, "w", node.name, (gpu.index,), ServiceClass.GUARANTEED)
                gpu.memory_used_mib = 4000
                running.append(RunningJob(owner, queue, 1, ServiceClass.GUARANTEED, 100.0))
            elif kind != "free":
                cls = ServiceClass.OPPORTUNISTIC
                cluster.allocate(owner, "w", node.name, (gpu.index,), cls, 3000)
                started = float(draw(st.integers(0, 20)))
                running.append(
                    RunningJob(
                        owner, queue, 1, cls, borrowed=kind == "borrowed", started_at=started
                    )
                )
    pending = []
    for i in range(draw(st.integers(0, 20))):
        gang = GangRequest(
            f"p{i:02d}",
            workers=draw(st.sampled_from([1, 1, 2])),
            gpus_per_worker=draw(st.sampled_from([1, 1, 2, 4])),
            gpu_memory_mib=2000,
        )
        pending.append(
            QueuedJob(
                gang.owner,
                gang,
                submitted_at=float(draw(st.integers(0, 20))),
                queue=draw(st.sampled_from(QUEUES)),
                runtime_estimate=draw(st.sampled_from([None, 10.0, 1000.0])),
            )
        )
    cohort = {q: draw(st.sampled_from(["x", "x", None])) for q in QUEUES}
    specs = {
        q: QueueSpec(
            q,
            nominal_gpus=draw(st.integers(0, 6)),
            borrowing_limit=draw(st.sampled_from([None, 2])),
            lending_limit=draw(st.sampled_from([None, 1])),
            cohort=cohort[q],
        )
        for q in QUEUES
    }
    policy = QueuePolicy(
        small_job_max_gpus=draw(st.sampled_from([None, 2])),
        fair_share=draw(st.booleans()),
        backfill=draw(st.booleans()),
        quotas={q: s.nominal_gpus for q, s in specs.items() if s.nominal_gpus is not None},
        queues=specs,
    )
    return cluster, running, pending, policy


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cohort_snapshots())
def test_decide_with_cohorts_plans_what_the_operators_cycle_plans(snapshot):
    cluster, running, drawn, policy = snapshot
    pending = [
        q
        for q in drawn
        if policy_refusal(policy, q) is None and never_fits(cluster, q.gang) is None
    ]
    operator_view, simulator_view = copy.deepcopy(cluster), copy.deepcopy(cluster)
    expected = schedule_cycle(operator_view, list(pending), list(running), policy, 25.0)
    index = PendingIndex(policy)
    for queued in pending:
        index.add(queued)
    got = decide(simulator_view, index, running, policy, 25.0)
    assert [(a.job.key, a.plan, a.borrowed) for a in got.admitted] == [
        (a.job.key, a.plan, a.borrowed) for a in expected.admitted
    ]
    assert [p.job.key for p in got.preemptions] == [p.job.key for p in expected.preemptions]


def test_a_queue_over_its_quota_may_still_borrow_for_every_job_the_cycle_would_admit():
    # Found by the property above: a queue whose guaranteed use exceeds its quota had a
    # negative headroom, which was subtracted from what it may borrow, so the simulator hid
    # the second of two jobs the operator's cycle admits on borrowed quota.
    queues = {
        "a": QueueSpec("a", nominal_gpus=0, cohort="x"),
        "b": QueueSpec("b", nominal_gpus=0, cohort="x"),
        "c": QueueSpec("c", nominal_gpus=3, cohort="x"),
    }
    policy = QueuePolicy(quotas={"a": 0, "b": 0, "c": 3}, queues=queues)
    assert quota_headroom(policy, {"b": 2, "c": 1}) == {"a": 0, "b": 0, "c": 2}
    index = PendingIndex(policy)
    two = [
        QueuedJob(f"p{i}", GangRequest(f"p{i}", 1, 1), submitted_at=0.0, queue="b")
        for i in range(2)
    ]
    for queued in two:
        index.add(queued)
    candidates = index.candidates(8, quota_headroom(policy, {"b": 2}), 8, {"b": 2})
    assert [q.key for q in candidates] == ["p0", "p1"]


SPEC = """nodePools:
  - {name: n, count: 2, gpusPerNode: 4, gpuModel: A}
queues:
  - {name: a, quota: 4, cohort: left, borrowingLimit: 2}
  - {name: b, quota: 2, cohort: left, lendingLimit: 1}
  - {name: c, quota: 2}
  - {name: d}
"""


def test_cluster_specs_name_cohorts_and_limits(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(SPEC)
    setup_ = load_sim_cluster(path)
    assert setup_.cohorts == {"a": "left", "b": "left"}
    assert (setup_.borrowing_limits, setup_.lending_limits) == ({"a": 2}, {"b": 1})
    args = (setup_.quotas, setup_.weights, setup_.cohorts)
    named = parse_policy("fifo,cohort").queue_policy(
        *args, setup_.borrowing_limits, setup_.lending_limits
    )
    assert {q: s.cohort for q, s in named.queues.items()} == {
        "a": "left",
        "b": "left",
        "c": None,
        "d": None,
    }
    assert (named.queues["a"].borrowing_limit, named.queues["b"].lending_limit) == (2, 1)
    # Named nowhere: every queue with a quota joins one cohort.
    everyone = parse_policy("fifo,cohort").queue_policy(setup_.quotas, setup_.weights)
    assert {q: s.cohort for q, s in everyone.queues.items()} == {
        "a": "all",
        "b": "all",
        "c": "all",
        "d": None,
    }
    assert parse_policy("fifo").queue_policy(*args).queues == {}


def test_bad_cohort_fields_are_named(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(SPEC.replace("borrowingLimit: 2", "borrowingLimit: -2"))
    with pytest.raises(Exception, match=r"queues\[0\]\.borrowingLimit: must be a non-negative"):
        load_sim_cluster(path)
