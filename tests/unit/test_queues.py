"""Queues as objects: accepted sizes, unknown queues, per-queue policy, cohort borrowing."""

from dataclasses import replace

import pytest
from builders import make_cluster, make_gang
from queue_cases import admitted, cohort, job, pending, policy

from gangshare.core import ServiceClass
from gangshare.core.cycle import PendingKind, schedule_cycle
from gangshare.core.queueing import Ordering, PodPriority, QueuedJob, RunningJob, policy_refusal
from gangshare.core.queues import QueueSpec

# ----- accepted sizes, unknown queues ---------------------------------------------------------


def test_accepts_bounds_job_sizes():
    spec = QueueSpec("small", min_job_gpus=2, max_job_gpus=4)
    assert spec.accepts(2) is None
    assert spec.accepts(4) is None
    assert spec.accepts(1) == "queue small accepts jobs of at least 2 GPUs, job has 1"
    assert spec.accepts(5) == "queue small accepts jobs of at most 4 GPUs, job has 5"
    assert QueueSpec("any").accepts(1000) is None


def test_a_refused_size_is_inadmissible_and_does_not_block_the_job_behind_it():
    cluster = make_cluster().nodes(1, gpus=8).build()
    rules = policy(QueueSpec("small", max_job_gpus=2), QueueSpec("large", min_job_gpus=4))
    refused = job("too-big", gpus=4, queue="small", at=1)
    assert policy_refusal(rules, refused) == (
        "queue small accepts jobs of at most 2 GPUs, job has 4"
    )
    result = schedule_cycle(
        cluster,
        [
            refused,
            job("fits", gpus=2, queue="small", at=2),
            job("too-small", gpus=1, queue="large", at=3),
            job("large-ok", gpus=4, queue="large", at=4),
        ],
        [],
        rules,
        10,
    )
    assert sorted(admitted(result)) == ["fits", "large-ok"]
    assert pending(result) == {
        "too-big": (
            PendingKind.INADMISSIBLE,
            "queue small accepts jobs of at most 2 GPUs, job has 4",
        ),
        "too-small": (
            PendingKind.INADMISSIBLE,
            "queue large accepts jobs of at least 4 GPUs, job has 1",
        ),
    }


def test_an_unknown_queue_is_inadmissible_only_when_queues_must_be_known():
    cluster = make_cluster().nodes(1, gpus=4).build()
    stray = job("stray", queue="nope", at=1)
    strict = policy(QueueSpec("team"), require_known_queue=True)
    result = schedule_cycle(cluster, [stray, job("ok", queue="team", at=2)], [], strict, 10)
    assert admitted(result) == ["ok"]
    kind, reason = pending(result)["stray"]
    assert kind is PendingKind.INADMISSIBLE
    assert reason == "queue nope does not exist (spec.queue)"
    assert "spec.queue" in reason
    lenient = policy(QueueSpec("team"))
    cluster = make_cluster().nodes(1, gpus=4).build()
    assert admitted(schedule_cycle(cluster, [stray], [], lenient, 10)) == ["stray"]


def test_a_templates_priority_class_is_bounded_by_its_queues_maximum_priority():
    from dataclasses import replace

    rules = policy(QueueSpec("team", max_priority=1000), QueueSpec("open"))
    plain = job("plain", queue="team", at=1)
    assert policy_refusal(rules, plain) is None
    high = replace(plain, pod_priority=PodPriority("urgent", 1_000_000))
    assert policy_refusal(rules, high) == (
        "spec.template.spec.priorityClassName: PriorityClass urgent (value 1000000) is above "
        "queue team's maximum priority of 1000"
    )
    assert policy_refusal(rules, replace(high, pod_priority=PodPriority("low", 1000))) is None
    missing = replace(plain, pod_priority=PodPriority("typo", None))
    assert policy_refusal(rules, missing) == (
        "spec.template.spec.priorityClassName: PriorityClass typo does not exist"
    )
    # A queue without a maximum bounds nothing (the system-* classes are refused at the API).
    assert policy_refusal(rules, replace(high, queue="open")) is None


# ----- per-queue ordering and backfill --------------------------------------------------------


def test_per_queue_ordering_overrides_the_global_one():
    pending_jobs = [job("low", gpus=2, at=1, priority=0), job("high", gpus=2, at=2, priority=9)]
    fifo_global = policy(QueueSpec("default", ordering=Ordering.PRIORITY))
    cluster = make_cluster().nodes(1, gpus=2).build()
    assert admitted(schedule_cycle(cluster, pending_jobs, [], fifo_global, 10)) == ["high"]
    priority_global = policy(
        QueueSpec("default", ordering=Ordering.FIFO), ordering=Ordering.PRIORITY
    )
    cluster = make_cluster().nodes(1, gpus=2).build()
    assert admitted(schedule_cycle(cluster, pending_jobs, [], priority_global, 10)) == ["low"]
    # A queue that does not say takes the global setting.
    unsaid = policy(QueueSpec("default"), ordering=Ordering.PRIORITY)
    cluster = make_cluster().nodes(1, gpus=2).build()
    assert admitted(schedule_cycle(cluster, pending_jobs, [], unsaid, 10)) == ["high"]


def _backfill_case():
    cluster = make_cluster().nodes(1, gpus=4).holding("r", "node-0", (0, 1)).build()
    running = [RunningJob("r", "default", 2, ServiceClass.GUARANTEED, expected_end=100)]
    jobs = [job("head", gpus=4, at=1, runtime=500), job("short", gpus=1, at=2, runtime=50)]
    return cluster, running, jobs


@pytest.mark.parametrize(
    ("spec_backfill", "global_backfill", "expected"),
    [(True, False, ["short"]), (False, True, []), (None, True, ["short"]), (None, False, [])],
)
def test_per_queue_backfill_overrides_the_global_one(spec_backfill, global_backfill, expected):
    cluster, running, jobs = _backfill_case()
    rules = policy(QueueSpec("default", backfill=spec_backfill), backfill=global_backfill)
    result = schedule_cycle(cluster, jobs, running, rules, 10)
    assert admitted(result) == expected
    if not expected:
        assert pending(result)["short"][0] is PendingKind.BEHIND
        assert result.reservations == []
    else:
        assert [(r.head, r.start) for r in result.reservations] == [("head", 100)]


# ----- borrowing ------------------------------------------------------------------------------


def test_a_queue_borrows_its_cohorts_idle_quota_as_opportunistic():
    cluster = make_cluster().nodes(2, gpus=8).build()
    jobs = [job(f"b{i}", gpus=8, queue="b", at=i) for i in range(3)]
    result = schedule_cycle(cluster, jobs, [], cohort(), 10)
    assert admitted(result) == ["b0", "b1"]
    first, second = result.admitted
    assert (first.service_class, first.borrowed) == (ServiceClass.GUARANTEED, False)
    assert (second.service_class, second.borrowed) == (ServiceClass.OPPORTUNISTIC, True)
    # The borrowed gang runs as opportunistic tenants; the guaranteed one owns its GPUs.
    opportunistic = [t for n in cluster.nodes.values() for g in n.gpus for t in g.opportunistic]
    assert {t.owner for t in opportunistic} == {"b1"}
    assert len(opportunistic) == 8
    kind, reason = pending(result)["b2"]
    assert kind is PendingKind.QUOTA
    assert reason == (
        "queue b guaranteed quota: 8 of 8 GPUs in use, job needs 8; "
        "cohort c has 0 idle GPU(s) of quota to lend, job needs 8"
    )
    assert result.preemptions == []


def test_a_gang_whose_gpu_resource_is_fixed_borrows_whole_idle_gpus_never_share_slots():
    # A batch/v1 Job's template asks nvidia.com/gpu and may not change: borrowed, it must get
    # GPUs of its own, so beside a full node it waits rather than being squeezed onto one.
    cluster = make_cluster().nodes(2, gpus=8).build()
    fixed = [
        QueuedJob(f"b{i}", replace(make_gang(f"b{i}").gpus(8).build(), whole_gpus=True), i, "b")
        for i in range(3)
    ]
    result = schedule_cycle(cluster, fixed, [], cohort(), 10)
    assert admitted(result) == ["b0", "b1"]
    second = result.admitted[1]
    assert (second.service_class, second.borrowed) == (ServiceClass.GUARANTEED, True)
    assert not [t for n in cluster.nodes.values() for g in n.gpus for t in g.opportunistic]
    assert pending(result)["b2"][0] is PendingKind.QUOTA
    # With b's own gang on one node and a's idle quota lent, the other node still takes it.
    full = make_cluster().nodes(1, gpus=8).holding("b-own", "node-0", tuple(range(8))).build()
    own = [RunningJob("b-own", "b", 8, ServiceClass.GUARANTEED)]
    waiting = schedule_cycle(full, fixed[1:2], own, cohort(), 10)
    assert admitted(waiting) == []
    assert "can never fit" not in pending(waiting)["b1"][1]


def test_a_lender_waiting_for_gpus_a_whole_gpu_borrower_holds_takes_its_quota_back():
    # b's Job borrowed a's idle quota on whole GPUs; a's job then waits for those GPUs. Share
    # slots would have left them free; whole GPUs do not, so the borrower goes, once.
    cluster = make_cluster().nodes(1, gpus=8).holding("b-job", "node-0", tuple(range(8))).build()
    whole = RunningJob("b-job", "b", 8, ServiceClass.GUARANTEED, borrowed=True, started_at=1)
    result = schedule_cycle(cluster, [job("a0", gpus=8, queue="a")], [whole], cohort(b=0), 10)
    assert admitted(result) == []
    assert [p.job.key for p in result.preemptions] == ["b-job"]
    assert "lenders have jobs waiting for the GPUs it borrows whole" in result.preemptions[0].reason
    # A job beyond its own queue's quota takes nothing back, and a guaranteed job is no victim.
    own = RunningJob("b-own", "b", 8, ServiceClass.GUARANTEED, started_at=1)
    beyond = schedule_cycle(
        make_cluster().nodes(1, gpus=8).holding("b-own", "node-0", tuple(range(8))).build(),
        [job("a0", gpus=8, queue="a")],
        [own],
        cohort(b=8),
        10,
    )
    assert beyond.preemptions == []
    greedy = schedule_cycle(
        make_cluster().nodes(1, gpus=8).holding("b-job", "node-0", tuple(range(8))).build(),
        [job("a0", gpus=16, queue="a")],
        [whole],
        cohort(a=8, b=0),
        10,
    )
    assert greedy.preemptions == []


def test_borrowing_stops_at_the_borrowing_limit():
    cluster = make_cluster().nodes(3, gpus=8).build()
    jobs = [job(f"b{i}", gpus=4, queue="b", at=i) for i in range(5)]
    result = schedule_cycle(cluster, jobs, [], cohort(a=16, b=8, borrowing_limit=4), 10)
    assert admitted(result) == ["b0", "b1", "b2"]
    assert [a.borrowed for a in result.admitted] == [False, False, True]
    kind, reason = pending(result)["b3"]
    assert kind is PendingKind.QUOTA
    assert "queue b borrows 4 of at most 4 GPUs, job needs 4" in reason
    assert pending(result)["b4"][0] is PendingKind.BEHIND


def test_borrowing_stops_at_the_lenders_lending_limit():
    cluster = make_cluster().nodes(3, gpus=8).build()
    rules = policy(
        QueueSpec("a", nominal_gpus=16, cohort="c", lending_limit=2),
        QueueSpec("b", nominal_gpus=0, cohort="c"),
    )
    jobs = [job(f"b{i}", gpus=1, queue="b", at=i) for i in range(4)]
    result = schedule_cycle(cluster, jobs, [], rules, 10)
    assert admitted(result) == ["b0", "b1"]
    assert all(a.borrowed for a in result.admitted)
    assert "cohort c has 0 idle GPU(s) of quota to lend, job needs 1" in pending(result)["b2"][1]


def test_lending_shrinks_as_the_lender_uses_its_quota():
    cluster = make_cluster().nodes(2, gpus=8).holding("a-run", "node-0", (0, 1, 2, 3, 4, 5)).build()
    running = [RunningJob("a-run", "a", 6, ServiceClass.GUARANTEED)]
    jobs = [job("b0", gpus=8, queue="b", at=1), job("b1", gpus=2, queue="b", at=2)]
    jobs.append(job("b2", gpus=2, queue="b", at=3))
    result = schedule_cycle(cluster, jobs, running, cohort(), 10)
    # a lends its 2 idle GPUs: one 2-GPU job borrows them, the next may not.
    assert admitted(result) == ["b0", "b1"]
    assert [a.borrowed for a in result.admitted] == [False, True]
    assert "cohort c has 0 idle GPU(s)" in pending(result)["b2"][1]


def test_a_queue_without_a_cohort_never_borrows():
    cluster = make_cluster().nodes(2, gpus=8).build()
    rules = policy(QueueSpec("a", nominal_gpus=8), QueueSpec("b", nominal_gpus=8))
    jobs = [job("b0", gpus=8, queue="b", at=1), job("b1", gpus=8, queue="b", at=2)]
    jobs.append(job("b2", gpus=1, queue="b", at=3))
    result = schedule_cycle(cluster, jobs, [], rules, 10)
    assert admitted(result) == ["b0"]
    assert pending(result) == {
        "b1": (PendingKind.QUOTA, "queue b guaranteed quota: 8 of 8 GPUs in use, job needs 8"),
        "b2": (PendingKind.BEHIND, "waiting behind b1 (strict order in its queue)"),
    }


def test_a_job_larger_than_quota_and_all_the_cohort_could_lend_is_inadmissible():
    cluster = make_cluster().nodes(4, gpus=8).build()
    result = schedule_cycle(cluster, [job("huge", gpus=8, workers=3, queue="b")], [], cohort(), 10)
    assert pending(result)["huge"] == (
        PendingKind.INADMISSIBLE,
        "needs 24 guaranteed GPUs, more than queue b's whole quota of 8 "
        "or than its cohort could ever lend (16)",
    )
    # One that the cohort could lend is admitted, borrowed.
    cluster = make_cluster().nodes(4, gpus=8).build()
    result = schedule_cycle(cluster, [job("wide", gpus=8, workers=2, queue="b")], [], cohort(), 10)
    assert [(a.job.key, a.borrowed) for a in result.admitted] == [("wide", True)]


def test_heads_within_quota_go_before_heads_that_must_borrow():
    running = [RunningJob("b-run", "b", 8, ServiceClass.GUARANTEED)]
    cluster = make_cluster().nodes(2, gpus=8).holding("b-run", "node-0", tuple(range(8))).build()
    # b's head (older) must borrow a's 8; a's own younger job is served first and takes them.
    jobs = [job("b-more", gpus=8, queue="b", at=1), job("a-own", gpus=8, queue="a", at=5)]
    result = schedule_cycle(cluster, jobs, running, cohort(), 10)
    assert admitted(result) == ["a-own"]
    assert pending(result)["b-more"][0] is PendingKind.QUOTA
