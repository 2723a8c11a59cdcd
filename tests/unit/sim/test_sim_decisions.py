"""Same decisions as production: the simulator's decision step plans exactly what the operator's
scheduling cycle (`schedule_cycle` on every pending job) plans, on the same snapshot."""

import copy
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from simkit import OPP, job, setup, simulate

import gangshare.core.cycle as cycle_module
import gangshare.sim.decide as decide_module
import gangshare.sim.engine as engine
from gangshare.core import Cluster, GangRequest, Gpu, NodeState, ServiceClass
from gangshare.core.cycle import PendingKind, schedule_cycle
from gangshare.core.gang import never_fits
from gangshare.core.job import Topology, TopologyPolicy, TopologyScope
from gangshare.core.queueing import Ordering, QueuedJob, QueuePolicy, RunningJob, policy_refusal
from gangshare.sim.decide import decide
from gangshare.sim.pending import PendingIndex
from gangshare.sim.policy import parse_policy

QUEUES = ["a", "b", "c"]
LAYOUTS = {1: [[]], 2: [[], [[0, 1]]], 4: [[], [[0, 1], [2, 3]]], 8: [[[0, 1, 2, 3], [4, 5, 6, 7]]]}


def allocations(cluster: Cluster) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
    return {
        owner: sorted((a.node, a.gpu_indices) for a in cluster.allocations_of(owner))
        for owner in sorted(cluster.owners())
    }


def plans(result):
    return [(a.job.key, a.plan) for a in result.admitted]


def assert_decide_is_the_cycle(cluster, running, pending, policy, predict):
    """decide, on the index, plans and reserves what the operator's cycle does on every job."""
    operator_view, simulator_view = copy.deepcopy(cluster), copy.deepcopy(cluster)
    seen = [
        q if predict is None else replace(q, runtime_estimate=predict(q.queue, q.gpus))
        for q in pending
    ]
    expected = schedule_cycle(operator_view, seen, list(running), policy, 25.0)
    index = PendingIndex(policy, predict)
    for queued in pending:
        index.add(queued)
    got = decide(simulator_view, index, running, policy, 25.0)
    assert plans(got) == plans(expected)
    assert allocations(simulator_view) == allocations(operator_view)
    assert got.reservations == expected.reservations


@st.composite
def snapshots(draw):
    nodes = []
    for i in range(draw(st.integers(1, 6))):
        gpus = draw(st.sampled_from([1, 2, 4, 8]))
        # A rarer model too: jobs pinned to it pile up on full nodes (#39).
        model = draw(st.sampled_from(["H100", "H100", "A10"]))
        nodes.append(
            NodeState.build(
                f"n{i}",
                [Gpu(g, f"u{i}-{g}", model, 24576) for g in range(gpus)],
                draw(st.sampled_from(LAYOUTS[gpus])),
                rack=f"r{draw(st.integers(0, 1))}",
            )
        )
    cluster = Cluster(nodes)
    running = []
    for node in nodes:
        for gpu in node.gpus:
            kind = draw(st.sampled_from(["free", "free", "guaranteed", "opportunistic"]))
            owner = f"run-{node.name}-{gpu.index}"
            queue = draw(st.sampled_from(QUEUES))
            if kind == "guaranteed":
                cluster.allocate(owner, "w", node.name, (gpu.index,), ServiceClass.GUARANTEED)
                gpu.memory_used_mib = draw(st.sampled_from([None, 4000, 20000]))
                end = draw(st.sampled_from([None, 50.0, 500.0, 5000.0]))
                running.append(RunningJob(owner, queue, 1, ServiceClass.GUARANTEED, end))
            elif kind == "opportunistic":
                cls = ServiceClass.OPPORTUNISTIC
                cluster.allocate(owner, "w", node.name, (gpu.index,), cls, 3000)
                running.append(RunningJob(owner, queue, 1, cls))
            gpu.utilization = draw(st.sampled_from([None, 0.0, 0.3, 0.9]))
    pending = []
    for i in range(draw(st.integers(0, 40))):
        opportunistic = draw(st.booleans())
        gang = GangRequest(
            f"p{i:02d}",
            workers=draw(st.sampled_from([1, 1, 1, 2, 3])),
            gpus_per_worker=draw(st.sampled_from([1, 1, 2, 4, 8])),
            service_class=ServiceClass.OPPORTUNISTIC if opportunistic else ServiceClass.GUARANTEED,
            gpu_memory_mib=draw(st.sampled_from([2000, 9000])) if opportunistic else None,
            gpu_model=draw(st.sampled_from([None, None, "A10"])),
        )
        pending.append(
            QueuedJob(
                gang.owner,
                gang,
                submitted_at=float(draw(st.integers(0, 20))),
                queue=draw(st.sampled_from(QUEUES)),
                priority=draw(st.integers(0, 2)),
                runtime_estimate=draw(st.sampled_from([None, 10.0, 100.0, 1000.0])),
            )
        )
    quotas = {q: draw(st.integers(0, 12)) for q in QUEUES if draw(st.booleans())}
    policy = QueuePolicy(
        ordering=draw(st.sampled_from(list(Ordering))),
        small_job_max_gpus=draw(st.sampled_from([None, 2])),
        fair_share=draw(st.booleans()),
        backfill=draw(st.booleans()),
        quotas=quotas,
        weights={q: float(draw(st.integers(1, 3))) for q in QUEUES},
    )
    # Estimates of the moment (the operator predicts each pass), or the ones the jobs carry.
    table = {(q, g): float(draw(st.sampled_from([5, 50, 500]))) for q in QUEUES for g in GPUS}
    predict = draw(st.sampled_from([None, lambda queue, gpus: table[(queue, gpus)]]))
    return cluster, running, pending, policy, predict


GPUS = sorted({w * g for w in (1, 2, 3) for g in (1, 2, 4, 8)})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_decide_plans_what_the_operators_cycle_plans(snapshot):
    cluster, running, drawn, policy, predict = snapshot
    # The engine never lets an inadmissible job wait (decide's precondition); the cycle
    # marks the very same jobs Inadmissible, which the second check below holds it to.
    pending = [
        q
        for q in drawn
        if policy_refusal(policy, q) is None and never_fits(cluster, q.gang) is None
    ]
    everything = schedule_cycle(copy.deepcopy(cluster), list(drawn), list(running), policy, 25.0)
    inadmissible = {p.job.key for p in everything.pending if p.kind is PendingKind.INADMISSIBLE}
    assert inadmissible == {q.key for q in drawn} - {q.key for q in pending}
    assert_decide_is_the_cycle(cluster, running, pending, policy, predict)


@pytest.mark.parametrize(
    "policy",
    ["fifo", "qssf,multi-queue", "fair-share,backfill", "multi-queue,fair-share,backfill,antman"],
)
def test_every_cycle_of_a_replay_matches_the_operators_cycle(monkeypatch, policy):
    """Snapshots taken from a replay: before each decision, the operator's cycle on a copy."""
    seen = []

    def checked(cluster, pending, running, queue_policy, now, **counts):
        view = copy.deepcopy(cluster)
        expected = schedule_cycle(view, list(pending), list(running), queue_policy, now)
        got = decide(cluster, pending, running, queue_policy, now, **counts)
        assert plans(got) == plans(expected), f"t={now}"
        assert allocations(cluster) == allocations(view)
        seen.append(len(got.admitted))
        return got

    monkeypatch.setattr(engine, "decide", checked)
    jobs = []
    for i in range(60):
        cls = OPP if policy.endswith("antman") and i % 3 == 0 else ServiceClass.GUARANTEED
        gpus = 1 if cls is OPP else [1, 2, 4, 8, 1, 16][i % 6]
        jobs.append(job(f"j{i:02d}", i * 7.0, 50.0 + 37 * (i % 5), gpus, cls, i % 2, QUEUES[i % 3]))
    sim = simulate(jobs, setup(nodes=3, gpus=8, racks=2, quotas={"a": 12}), policy)
    assert len(sim.records) == 60
    assert sum(seen) >= 60  # every job was admitted through a checked decision
    assert parse_policy(policy).name == policy


def test_a_job_its_quota_blocks_behind_the_head_is_handed_to_the_cycle_for_its_reservation():
    """Under backfill the first job of a lane its queue's quota blocks reserves that quota; the
    index used to leave every job beyond the quota's headroom out, so the small jobs behind it
    spent the quota the cycle had promised it (found by the property above)."""
    nodes = [
        NodeState.build(f"n{i}", [Gpu(g, f"u{i}-{g}", "H100", 24576) for g in range(8)], [])
        for i in range(2)
    ]
    cluster = Cluster(nodes)
    cluster.allocate("run-a", "w", "n0", (0, 1, 2, 3, 4), ServiceClass.GUARANTEED)
    running = [RunningJob("run-a", "a", 5, ServiceClass.GUARANTEED, expected_end=50.0)]

    def queued(key: str, at: float, gpus: int) -> QueuedJob:
        gang = GangRequest(key, workers=1, gpus_per_worker=gpus)
        return QueuedJob(key, gang, submitted_at=at, queue="a", runtime_estimate=1000.0)

    pending = [queued("p00", 0.0, 1), queued("p01", 1.0, 8)]
    pending += [queued(f"p{i:02d}", float(i), 1) for i in range(2, 6)]
    policy = QueuePolicy(backfill=True, quotas={"a": 9})
    expected = schedule_cycle(copy.deepcopy(cluster), list(pending), list(running), policy, 25.0)
    index = PendingIndex(policy)
    for job_ in pending:
        index.add(job_)
    got = decide(copy.deepcopy(cluster), index, running, policy, 25.0)
    assert [a.job.key for a in expected.admitted] == ["p00"]
    assert plans(got) == plans(expected)


# Whole gangs on one node: GPUs free on several nodes may not hold one; and such a gang that
# holds out for its node only a while (the jobs alike then differ by how long they waited).
TOPOLOGIES = [
    Topology(),
    Topology(TopologyPolicy.REQUIRED, TopologyScope.NODE),
    Topology(TopologyPolicy.PREFERRED, TopologyScope.NODE, relax_after_seconds=12.0),
]


@st.composite
def rare_model_backlogs(draw):
    """A backfill cluster whose rarer model is mostly held by guaranteed work, and a backlog
    in which many jobs alike are pinned to it (#39): its nodes have a few GPUs free, or
    none."""
    nodes = [
        NodeState.build(
            f"{model}{i}", [Gpu(g, f"u{model}{i}-{g}", model, 24576) for g in range(4)], []
        )
        for model, count in (("H100", draw(st.integers(1, 3))), ("A10", draw(st.integers(1, 2))))
        for i in range(count)
    ]
    cluster = Cluster(nodes)
    running = []
    for node in nodes:
        for gpu in node.gpus:
            full = node.name.startswith("A10") and draw(st.integers(0, 5)) > 0
            if full or draw(st.booleans()):
                owner = f"run-{node.name}-{gpu.index}"
                cluster.allocate(owner, "w", node.name, (gpu.index,), ServiceClass.GUARANTEED)
                end = draw(st.sampled_from([None, 50.0, 500.0]))
                running.append(RunningJob(owner, "a", 1, ServiceClass.GUARANTEED, end))
    pending = []
    for i in range(draw(st.integers(1, 40))):
        gang = GangRequest(
            f"p{i:02d}",
            workers=draw(st.sampled_from([1, 1, 2])),
            gpus_per_worker=draw(st.sampled_from([1, 1, 2])),
            gpu_model=draw(st.sampled_from(["A10", "A10", None])),
            topology=draw(st.sampled_from(TOPOLOGIES)),
        )
        pending.append(
            QueuedJob(
                gang.owner,
                gang,
                submitted_at=float(draw(st.integers(0, 20))),
                queue=draw(st.sampled_from(QUEUES)),
                priority=draw(st.integers(0, 1)),
                runtime_estimate=draw(st.sampled_from([100.0, 1000.0])),
            )
        )
    policy = QueuePolicy(
        ordering=draw(st.sampled_from(list(Ordering))),
        small_job_max_gpus=draw(st.sampled_from([None, 2])),
        backfill=True,
        quotas={"c": draw(st.integers(0, 6))} if draw(st.booleans()) else {},
    )
    predict = draw(st.sampled_from([None, lambda queue, gpus: 30.0 * gpus]))
    return cluster, running, pending, policy, predict


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rare_model_backlogs())
def test_a_cycle_handed_of_jobs_alike_pinned_to_some_nodes_one_more_than_fit_decides_the_same(
    snapshot,
):
    cluster, running, pending, policy, predict = snapshot
    pending = [q for q in pending if never_fits(cluster, q.gang) is None]
    assert_decide_is_the_cycle(cluster, running, pending, policy, predict)


def rare_model_held(gpus: tuple[int, ...]) -> tuple[Cluster, list[RunningJob]]:
    """A node of four common GPUs, free, and one of four rare ones whose `gpus` a job holds."""
    nodes = [
        NodeState.build(name, [Gpu(g, f"u{name}-{g}", model, 24576) for g in range(4)], [])
        for name, model in (("common", "H100"), ("rare", "A10"))
    ]
    cluster = Cluster(nodes)
    cluster.allocate("run", "w", "rare", gpus, ServiceClass.GUARANTEED)
    return cluster, [RunningJob("run", "a", len(gpus), ServiceClass.GUARANTEED, 500.0)]


def decided_on(monkeypatch, cluster, index, running, policy):
    """decide's result, and the keys of the jobs it handed the cycle."""
    handed = []

    def cycle(cluster, pending, running, policy, now):
        handed.extend(job.key for job in pending)
        return schedule_cycle(cluster, pending, running, policy, now)

    monkeypatch.setattr(decide_module, "schedule_cycle", cycle)
    return decide(copy.deepcopy(cluster), index, running, policy, 25.0), handed


def test_of_jobs_alike_pinned_to_full_nodes_a_cycle_is_handed_the_first(monkeypatch):
    cluster, running = rare_model_held((0, 1, 2, 3))
    policy = QueuePolicy(backfill=True)
    index = PendingIndex(policy)
    for i in range(10):
        gang = GangRequest(f"p{i}", workers=1, gpus_per_worker=1, gpu_model="A10" if i else None)
        index.add(QueuedJob(gang.owner, gang, submitted_at=float(i), runtime_estimate=100.0))
    got, handed = decided_on(monkeypatch, cluster, index, running, policy)
    assert handed == ["p0", "p1"]  # the free one, and the first of the nine pinned alike
    assert [a.job.key for a in got.admitted] == ["p0"]
    [reserved] = got.reservations
    assert reserved.head == "p1" and reserved.nodes == frozenset({"rare"})


def test_of_jobs_alike_pinned_to_nodes_with_room_a_cycle_is_handed_one_more_than_fit(monkeypatch):
    cluster, running = rare_model_held((0,))
    policy = QueuePolicy(backfill=True)
    index = PendingIndex(policy)
    for i in range(10):  # three GPUs free: ones of one GPU and ones of two, alternating
        gang = GangRequest(f"p{i}", workers=1, gpus_per_worker=1 + i % 2, gpu_model="A10")
        index.add(QueuedJob(gang.owner, gang, submitted_at=float(i), runtime_estimate=100.0))
    got, handed = decided_on(monkeypatch, cluster, index, running, policy)
    # Three GPUs hold three jobs of one GPU or one of two: four and two of them are handed.
    assert handed == ["p0", "p1", "p2", "p3", "p4", "p6"]
    assert [a.job.key for a in got.admitted] == ["p0", "p1"]


def outcome(result):
    return (
        plans(result),
        [(p.job.key, p.kind, p.reason) for p in result.pending],
        result.reservations,
        result.preemptions,
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(snapshots(), rare_model_backlogs()))
def test_a_cycle_that_refuses_jobs_alike_at_once_decides_as_one_that_judges_each(snapshot):
    cluster, running, pending, policy, _ = snapshot
    at_once = schedule_cycle(copy.deepcopy(cluster), list(pending), list(running), policy, 25.0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cycle_module._Cycle, "_kind_of", lambda self, job: None)
        each = schedule_cycle(copy.deepcopy(cluster), list(pending), list(running), policy, 25.0)
    for part, (got, expected) in enumerate(zip(outcome(at_once), outcome(each), strict=True)):
        if got != expected and part == 1:
            differ = [(g, e) for g, e in zip(got, expected, strict=True) if g != e]
            raise AssertionError(f"{policy}: first reasons that differ: {differ[:2]}")
        assert got == expected, f"part {part}"


def test_a_job_alike_to_one_refused_is_told_what_a_smaller_gang_of_its_shape_changed(monkeypatch):
    """Found by the property above: between two gangs alike, a smaller one of their shape
    failed, and what the second is told (the shape's reason) moved with it."""
    cluster = Cluster(
        [NodeState.build("n0", [Gpu(g, f"u{g}", "H100", 24576) for g in range(2)], [])]
    )
    cluster.allocate("run", "w", "n0", (0, 1), ServiceClass.GUARANTEED)

    def queued(key: str, workers: int, at: float) -> QueuedJob:
        return QueuedJob(key, GangRequest(key, workers=workers, gpus_per_worker=1), submitted_at=at)

    pending = [queued("a", 2, 0.0), queued("b", 1, 1.0), queued("c", 2, 2.0)]
    policy = QueuePolicy(backfill=True)
    at_once = schedule_cycle(copy.deepcopy(cluster), list(pending), [], policy, 5.0)
    monkeypatch.setattr(cycle_module._Cycle, "_kind_of", lambda self, job: None)
    each = schedule_cycle(copy.deepcopy(cluster), list(pending), [], policy, 5.0)
    assert [p.reason for p in at_once.pending] == [p.reason for p in each.pending]
