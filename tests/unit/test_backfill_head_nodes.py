"""A blocked head reserves only GPUs on nodes it can run on (GPU model, selectors, taints):
jobs placed where the head can never run do not delay it, so backfill never refuses them."""

from __future__ import annotations

from builders import make_cluster, make_gang, make_node
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gangshare.core import Cluster, ServiceClass, TopologyPolicy, TopologyScope
from gangshare.core.constraints import PodConstraints, Toleration
from gangshare.core.cycle import CycleResult, schedule_cycle
from gangshare.core.fit import static_rejection
from gangshare.core.gang import Unschedulable, plan_gang
from gangshare.core.queueing import QueuedJob, QueuePolicy, RunningJob

A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
HOUR = 3600.0
WOULD_DELAY = "backfill: would delay"


def _job(key: str, gpus: int, at: float, runtime: float, model: str | None = None) -> QueuedJob:
    builder = make_gang(key).gpus(gpus)
    if model is not None:
        builder.model(model)
    return QueuedJob(key, builder.build(), at, runtime_estimate=runtime)


def _a100_busy_for_ten_hours(held: int = 8) -> tuple[Cluster, list[RunningJob]]:
    """One 8-GPU A100 node, `held` of its GPUs busy for 10 hours; two idle 8-GPU H100 nodes."""
    cluster = (
        make_cluster()
        .node(make_node("a100").gpus(8, model=A100))
        .node(make_node("h100-0").gpus(8, model=H100))
        .node(make_node("h100-1").gpus(8, model=H100))
        .holding("busy", "a100", tuple(range(held)))
        .build()
    )
    running = [RunningJob("busy", "default", held, ServiceClass.GUARANTEED, 10 * HOUR)]
    return cluster, running


def _refused(result: CycleResult) -> dict[str, str]:
    return {p.job.key: p.reason for p in result.pending if p.reason.startswith(WOULD_DELAY)}


def test_idle_h100s_are_not_reserved_for_a_head_that_needs_a100s():
    cluster, running = _a100_busy_for_ten_hours()
    pending = [
        _job("head", 8, at=1, runtime=HOUR, model=A100),
        _job("b", 8, at=2, runtime=20 * HOUR),
        _job("c", 8, at=3, runtime=20 * HOUR),
    ]
    result = schedule_cycle(cluster, pending, running, QueuePolicy(backfill=True), 10)
    # The head can start only when the A100 node frees, at 10 h; both H100 jobs run now.
    assert sorted(a.job.key for a in result.admitted) == ["b", "c"]
    assert _refused(result) == {}
    assert [(r.head, r.start, r.extra) for r in result.reservations] == [("head", 10 * HOUR, 0)]
    assert sum(n.free_guaranteed for n in cluster.nodes.values()) == 0


def test_a_job_that_competes_for_the_heads_nodes_is_still_refused():
    # Half the A100 node is free: best fit would put an unconstrained 4-GPU job there, in the
    # head's way; it goes to an H100 node instead. A job that needs A100s must wait.
    cluster, running = _a100_busy_for_ten_hours(held=4)
    pending = [
        _job("head", 8, at=1, runtime=HOUR, model=A100),
        _job("needs-a100", 4, at=2, runtime=20 * HOUR, model=A100),
        _job("anywhere", 4, at=3, runtime=20 * HOUR),
    ]
    result = schedule_cycle(cluster, pending, running, QueuePolicy(backfill=True), 10)
    assert [a.job.key for a in result.admitted] == ["anywhere"]
    assert [cluster.node(n).gpu_model for n in result.admitted[0].plan.nodes] == [H100]
    assert list(_refused(result)) == ["needs-a100"]
    assert cluster.node("a100").free_guaranteed == 4


def test_a_backlog_pinned_to_a_busy_model_holds_one_reservation_not_one_a_job():
    # Short A100 jobs end before the head's reservation, so each passes backfill, finds no
    # A100 free and reserves: the same GPUs at the same time, already refused by the first.
    cluster, running = _a100_busy_for_ten_hours()
    pinned = [_job(f"a{i}", 8, at=1 + i, runtime=60.0, model=A100) for i in range(50)]
    result = schedule_cycle(
        cluster, [*pinned, _job("any", 8, 99, HOUR)], running, QueuePolicy(backfill=True), 10
    )
    assert [(r.head, r.start, r.extra) for r in result.reservations] == [("a0", 10 * HOUR, 0)]
    assert [a.job.key for a in result.admitted] == ["any"]
    assert len(result.pending) == 50


# ----- property: mixed-model clusters -----------------------------------------------------------

MODELS = (A100, H100)
TOLERATE_ALL = (Toleration(operator="Exists"),)


@st.composite
def mixed_clusters(draw) -> tuple[Cluster, list[RunningJob]]:
    """2-5 nodes of either model, some in pool b, some tainted; some GPUs held until later."""
    builder = make_cluster()
    holds = []
    for i in range(draw(st.integers(2, 5))):
        name, gpus = f"n{i}", draw(st.sampled_from([2, 4, 8]))
        node = make_node(name).gpus(gpus, model=draw(st.sampled_from(MODELS)))
        node.label("pool", draw(st.sampled_from(["a", "b"])))
        if draw(st.booleans()) and draw(st.booleans()):
            node.taint("dedicated", "x")
        builder.node(node)
        held = draw(st.integers(0, gpus))
        if held:
            builder.holding(f"run-{name}", name, tuple(range(held)))
            end = float(draw(st.integers(101, 20_000)))
            holds.append(RunningJob(f"run-{name}", "a", held, ServiceClass.GUARANTEED, end))
    return builder.build(), holds


@st.composite
def mixed_jobs(draw) -> list[QueuedJob]:
    jobs = []
    for n in range(draw(st.integers(1, 8))):
        gang = (
            make_gang(f"j{n}")
            .workers(draw(st.integers(1, 2)))
            .gpus(draw(st.sampled_from([1, 2, 4, 8])))
            .topology(TopologyPolicy.NONE, TopologyScope.NVLINK)
        )
        model = draw(st.sampled_from([None, *MODELS]))
        if model is not None:
            gang.model(model)
        selector = draw(st.sampled_from([(), (("pool", "a"),), (("pool", "b"),)]))
        tolerations = TOLERATE_ALL if draw(st.booleans()) else ()
        gang.constrained(PodConstraints(selector, (), tolerations, ()))
        at = float(draw(st.integers(0, 99)))
        queue = draw(st.sampled_from(["a", "b"]))
        runtime = float(draw(st.integers(10, 20_000)))
        jobs.append(QueuedJob(f"j{n}", gang.build(), at, queue, runtime_estimate=runtime))
    return jobs


def _head_nodes(cluster: Cluster, job: QueuedJob) -> set[str]:
    """The nodes the head could ever run on, by the placement's own node filter."""
    worker = job.gang.worker()
    return {n.name for n in cluster.nodes.values() if static_rejection(n, worker) is None}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    world=mixed_clusters(),
    jobs=mixed_jobs(),
    quota=st.sampled_from([None, 4, 8, 16]),
    small=st.sampled_from([None, 2]),
)
def test_reservations_hold_only_gpus_their_head_can_use(world, jobs, quota, small):
    cluster, running = world
    quotas = {} if quota is None else {"a": quota}
    policy = QueuePolicy(small_job_max_gpus=small, backfill=True, quotas=quotas)
    by_key = {j.key: j for j in jobs}
    result = schedule_cycle(cluster, jobs, running, policy, 100.0)
    held_by_heads: set[str] = set()
    for r in result.reservations:
        usable = _head_nodes(cluster, by_key[r.head])
        held_by_heads |= usable
        room = sum(cluster.node(n).gpu_count for n in usable)
        assert r.gpus + r.extra <= room, (r, sorted(usable))
        held = set(cluster.nodes) if r.nodes is None else set(r.nodes)
        assert held <= usable, (r.head, sorted(held - usable))
    # A job refused for a head must have had no placement away from every head's nodes: the
    # cycle only fills the cluster, so one that exists now existed when it was refused.
    elsewhere = Cluster(n for name, n in cluster.nodes.items() if name not in held_by_heads)
    for key in _refused(result):
        job = by_key[key]
        plan = plan_gang(elsewhere, job.gang, 100.0 - job.submitted_at)
        assert isinstance(plan, Unschedulable), (key, plan)
