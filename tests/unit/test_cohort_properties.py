"""Property-based invariants of quotas, cohort borrowing and reclaim (hypothesis)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from builders import make_cluster, make_gang
from cohort_world import World, cohort_violations
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gangshare.core import ServiceClass
from gangshare.core import cycle as cycle_module
from gangshare.core.cycle import CycleResult, PendingKind, schedule_cycle
from gangshare.core.queueing import Ordering, QueuedJob, QueuePolicy
from gangshare.core.queues import QueueSpec, by_name

EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
limits = st.sampled_from([None, None, None, 0, 2, 4, 8])


@st.composite
def queue_specs(draw) -> list[QueueSpec]:
    """Two to four queues; the first two always share cohort c1, so borrowing happens."""
    return [
        QueueSpec(
            f"q{i}",
            nominal_gpus=draw(
                st.integers(1, 8) if i < 2 else st.sampled_from([None, 0, 1, 2, 4, 8])
            ),
            borrowing_limit=draw(limits),
            lending_limit=draw(limits),
            weight=draw(st.sampled_from([1.0, 2.0, 3.0])),
            cohort="c1" if i < 2 else draw(st.sampled_from([None, "c1", "c2"])),
        )
        for i in range(draw(st.integers(2, 4)))
    ]


@st.composite
def workloads(draw, queues: int) -> list[tuple[QueuedJob, float]]:
    jobs = []
    for n in range(draw(st.integers(1, 16))):
        builder = make_gang(f"j{n}").workers(draw(st.sampled_from([1, 1, 2, 3])))
        builder.gpus(draw(st.sampled_from([1, 1, 2, 2, 4])))
        if draw(st.integers(0, 9)) == 0:
            builder.opportunistic(2048)
        jobs.append(queued(draw, n, builder, queues, latest=60))
    return jobs


def queued(
    draw: Any, n: int, builder: Any, queues: int, latest: int, runtime: float | None = None
) -> tuple[QueuedJob, float]:
    """The n-th job of a workload, submitted by `latest`, and how long it runs."""
    job = QueuedJob(
        f"j{n}",
        builder.build(),
        float(draw(st.integers(0, latest))),
        f"q{draw(st.integers(0, queues - 1))}",
        draw(st.integers(0, 2)),
        runtime_estimate=runtime,
    )
    return job, float(draw(st.integers(5, 120)))


def describe(result: CycleResult) -> list[str]:
    """The cycle's decisions in one line each, for a readable counterexample."""
    lines = [
        f"admit {a.job.key} q={a.job.queue} gpus={a.job.gpus} borrowed={a.borrowed}"
        for a in result.admitted
    ]
    lines += [f"evict {p.job.key} q={p.job.queue} gpus={p.job.gpus}" for p in result.preemptions]
    return lines


def run(world: World, cycles: int = 60) -> None:
    """Cycle at every event until nothing is left to happen, checking the invariants each time."""
    start = world.next_event()
    assert start is not None
    world.advance(start)
    for _ in range(cycles):
        result = world.cycle()
        assert all(p.job.borrowed for p in result.preemptions), "preempted guaranteed work"
        assert cohort_violations(world) == [], describe(result)
        later = world.next_event()
        if later is None:
            return
        world.advance(later)


def drawn_policy(data: Any, specs: list[QueueSpec]) -> QueuePolicy:
    return QueuePolicy(
        ordering=data.draw(st.sampled_from(list(Ordering))),
        small_job_max_gpus=data.draw(st.sampled_from([None, 2])),
        fair_share=data.draw(st.booleans()),
        backfill=data.draw(st.booleans()),
        queues=by_name(specs),
    )


@EXAMPLES
@given(data=st.data())
def test_quota_is_never_exceeded_and_borrowing_never_exceeds_lending(data):
    specs = data.draw(queue_specs())
    nodes, gpus = data.draw(st.integers(1, 3)), data.draw(st.sampled_from([4, 8]))
    policy = drawn_policy(data, specs)
    world = World(make_cluster().nodes(nodes, gpus=gpus).build(), policy)
    for job, duration in data.draw(workloads(len(specs))):
        world.submit(job, duration)
    run(world)


@st.composite
def lending_cohorts(draw) -> tuple[list[QueueSpec], int]:
    """A lender and one to three borrowers in one cohort, and a cluster size: mostly one that
    holds every queue's nominal quota, sometimes a few GPUs short of it."""
    lender = QueueSpec(
        "lender",
        nominal_gpus=draw(st.integers(1, 12)),
        lending_limit=draw(st.one_of(st.none(), st.integers(0, 12))),
        cohort="c",
    )
    borrowers = [
        QueueSpec(
            f"b{i}",
            nominal_gpus=draw(st.integers(0, 4)),
            borrowing_limit=draw(st.one_of(st.none(), st.integers(1, 12))),
            weight=draw(st.sampled_from([1.0, 2.0])),
            cohort="c",
        )
        for i in range(draw(st.integers(1, 3)))
    ]
    specs = [lender, *borrowers]
    total = sum(s.nominal_gpus or 0 for s in specs)
    return specs, max(1, total + draw(st.sampled_from([0, 0, 1, 4, -1, -3])))


@EXAMPLES
@given(cohort_and_size=lending_cohorts(), data=st.data())
def test_a_lender_gets_its_quota_back_within_one_cycle_plus_eviction(cohort_and_size, data):
    specs, gpus = cohort_and_size
    policy = QueuePolicy(fair_share=data.draw(st.booleans()), queues=by_name(specs))
    # One GPU per node: no topology, so "enough free GPUs" means "it fits".
    world = World(make_cluster().nodes(gpus, gpus=1).build(), policy)
    n = 0
    for spec in specs[1:]:
        for _ in range(data.draw(st.integers(1, 8))):
            gang = make_gang(f"{spec.name}-{n}").workers(data.draw(st.integers(1, 3))).build()
            world.submit(QueuedJob(gang.owner, gang, float(n), spec.name), 10_000.0)
            n += 1
    world.advance(float(n))
    # The borrowers fill what they can (they run long, so nothing finishes meanwhile).
    while world.pending and world.cycle().admitted:
        pass
    lender = specs[0]
    assert lender.nominal_gpus is not None
    size = data.draw(st.integers(1, lender.nominal_gpus))
    gang = make_gang("mine").workers(size).build()
    world.submit(QueuedJob("mine", gang, world.now + 1, "lender"), 10_000.0)
    world.advance(world.now + 1)
    before = world.book()
    free = sum(node.free_guaranteed for node in world.cluster.nodes.values())
    result = world.cycle()
    admitted = {a.job.key: a for a in result.admitted}
    if free >= size:
        # Borrowers never stand in a lender's way: they are opportunistic tenants.
        assert "mine" in admitted, [p.reason for p in result.pending if p.job.key == "mine"]
        assert admitted["mine"].service_class is ServiceClass.GUARANTEED
        assert not admitted["mine"].borrowed
    else:
        # Only guaranteed work within the other queues' quotas can fill the cluster.
        assert gpus < sum(s.nominal_gpus or 0 for s in specs)
        [waits] = [p for p in result.pending if p.job.key == "mine"]
        never = size > gpus
        assert waits.kind is (PendingKind.INADMISSIBLE if never else PendingKind.UNSCHEDULABLE)
    assert all(p.job.borrowed for p in result.preemptions)
    # Whole gangs are evicted, only as many as needed, and only when the cohort was over-lent.
    if result.preemptions:
        reclaimed = sum(p.job.gpus for p in result.preemptions)
        over = before.borrowed_in("c") - world.book().lent("c")
        assert over > 0
        assert reclaimed - max(p.job.gpus for p in result.preemptions) < over
    # After evicting (done by `cycle`), the cohort lends at least what is borrowed...
    assert cohort_violations(world) == []
    # ...and the next cycle borrows nothing beyond it either.
    world.cycle()
    assert cohort_violations(world) == []
    assert ("mine" in world.running) == (free >= size)


@st.composite
def backlogs_alike(draw, queues: int) -> list[tuple[QueuedJob, float]]:
    """Many jobs of a few shapes, each with its own run time: borrowers refused alike (#39)."""
    shapes = [
        (draw(st.sampled_from([1, 1, 2])), draw(st.sampled_from([1, 2, 4])), draw(st.booleans()))
        for _ in range(draw(st.integers(1, 3)))
    ]
    jobs = []
    for n in range(draw(st.integers(4, 30))):
        workers, gpus, opportunistic = draw(st.sampled_from(shapes))
        builder = make_gang(f"j{n}").workers(workers)
        builder.gpus(gpus)
        if opportunistic:
            builder.opportunistic(2048)
        runtime = draw(st.sampled_from([None, 10.0, 100.0, 1000.0, 5000.0]))
        jobs.append(queued(draw, n, builder, queues, latest=30, runtime=runtime))
    return jobs


def outcome(result: CycleResult) -> tuple[object, ...]:
    return (
        [(a.job.key, a.borrowed, a.plan) for a in result.admitted],
        [(p.job.key, p.kind, p.reason) for p in result.pending],
        result.reservations,
        [p.job.key for p in result.preemptions],
    )


@EXAMPLES
@given(data=st.data())
def test_refusing_borrowers_alike_at_once_decides_as_judging_each(data):
    """A refusal that never read the run time holds for jobs alike of any run time: a cycle
    refusing them at once decides, cycle after cycle, as one that judges each."""
    specs = data.draw(queue_specs())
    policy = drawn_policy(data, specs)
    world = World(make_cluster().nodes(data.draw(st.integers(1, 4)), gpus=4).build(), policy)
    for job, duration in data.draw(backlogs_alike(len(specs))):
        world.submit(job, duration)
    start = world.next_event()
    assert start is not None
    world.advance(start)
    for _ in range(40):
        pending = sorted(world.pending.values(), key=lambda j: j.key)
        running = list(world.running.values())
        at_once = schedule_cycle(copy.deepcopy(world.cluster), pending, running, policy, world.now)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(cycle_module._Cycle, "_kind_of", lambda self, job: None)
            each = schedule_cycle(copy.deepcopy(world.cluster), pending, running, policy, world.now)
        assert outcome(at_once) == outcome(each)
        world.cycle()
        later = world.next_event()
        if later is None:
            return
        world.advance(later)
