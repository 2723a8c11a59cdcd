"""Properties over many cycles: EASY backfill never delays the head, fair share converges."""

from __future__ import annotations

from builders import make_cluster, make_gang
from cohort_world import World
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gangshare.core import TopologyPolicy, TopologyScope
from gangshare.core.queueing import QueuedJob, QueuePolicy
from gangshare.core.queues import QueueSpec, by_name

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def backfill_workloads(draw, gpus: int) -> list[tuple[QueuedJob, float]]:
    jobs = []
    for n in range(draw(st.integers(2, 14))):
        size = draw(st.integers(1, gpus))
        duration = float(draw(st.integers(1, 60)))
        gang = (
            make_gang(f"j{n:02d}")
            .gpus(size)
            .topology(TopologyPolicy.NONE, TopologyScope.NVLINK)
            .build()
        )
        at = float(draw(st.integers(0, 40)))
        # Exact estimates: what EASY backfill's guarantee assumes.
        jobs.append((QueuedJob(gang.owner, gang, at, runtime_estimate=duration), duration))
    return jobs


@SETTINGS
@given(data=st.data())
def test_backfill_never_delays_the_heads_reservation(data):
    gpus = data.draw(st.integers(2, 8))
    # One node, no NVLink islands declared, no topology asked: counting GPUs is exact here.
    world = World(make_cluster().nodes(1, gpus=gpus).build(), QueuePolicy(backfill=True))
    for job, duration in data.draw(backfill_workloads(gpus)):
        world.submit(job, duration)
    promised: dict[str, float] = {}
    event = world.next_event()
    for _ in range(200):
        if event is None:
            break
        world.advance(event)
        result = world.cycle()
        waiting = sorted(world.pending.values(), key=lambda j: (j.submitted_at, j.key))
        if waiting and waiting[0].key not in promised:
            head = waiting[0]
            reserved = [r.start for r in result.reservations if r.head == head.key]
            # Every GPU is held by a job with a known end, so the blocked head can be promised.
            assert reserved, (head.key, [(p.job.key, p.reason) for p in result.pending])
            promised[head.key] = reserved[0]
        event = world.next_event()
    assert not world.pending and not world.arrivals, "a job never started"
    late = {k: (world.started[k], at) for k, at in promised.items() if world.started[k] > at}
    assert late == {}, f"heads started after their reservation: {late}"


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    first=st.lists(st.integers(1, 100), min_size=16, max_size=16),
    length=st.integers(50, 100),
    late=st.integers(1, 300),
)
def test_fair_share_of_borrowed_capacity_converges_to_weights(first, length, late):
    """An idle lender with 16 GPUs of quota; queues of weight 1 and 3 borrow all of it with an
    endless backlog of equal 1-GPU jobs. The light queue starts holding everything."""
    specs = [
        QueueSpec("lender", nominal_gpus=16, cohort="c"),
        QueueSpec("light", nominal_gpus=0, weight=1.0, cohort="c"),
        QueueSpec("heavy", nominal_gpus=0, weight=3.0, cohort="c"),
    ]
    world = World(
        make_cluster().nodes(4, gpus=4).build(),
        QueuePolicy(fair_share=True, queues=by_name(specs)),
    )
    submitted = {"light": 0.0, "heavy": float(late)}
    counter = {"light": 0, "heavy": 0}

    def top_up(queue: str, durations: list[float]) -> None:
        # An endless backlog, all of it submitted at once (so both heads age alike).
        for duration in durations:
            key = f"{queue}-{counter[queue]:05d}"
            counter[queue] += 1
            gang = make_gang(key).build()
            world.submit(QueuedJob(key, gang, submitted[queue], queue), duration)

    top_up("light", [float(d) for d in first])
    top_up("heavy", [float(length)] * 16)
    horizon = 30.0 * length
    held = {"light": 0.0, "heavy": 0.0}
    event = world.next_event()
    while event is not None and event < horizon:
        world.advance(event)
        for queue in ("light", "heavy"):
            waiting = sum(1 for j in world.pending.values() if j.queue == queue)
            top_up(queue, [float(length)] * max(0, 16 - waiting))
        world.advance(event)
        world.cycle()
        assert world.book().borrowed_in("c") <= 16
        event = world.next_event()
        end = min(event if event is not None else horizon, horizon)
        if world.now >= horizon / 2:
            book = world.book()
            for queue in held:
                held[queue] += book.borrowed.get(queue, 0) * (end - world.now)
    assert held["light"] > 0
    ratio = held["heavy"] / held["light"]
    assert 3 * 0.85 <= ratio <= 3 * 1.15, held
