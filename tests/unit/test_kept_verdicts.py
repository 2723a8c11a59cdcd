"""A cycle's kept verdicts place every gang exactly where judging afresh would."""

import random

from builders import make_cluster, make_gang, make_node

from gangshare.core import GangPlan, ServiceClass, apply_plan, plan_gang
from gangshare.core.score import opportunistic_bound
from gangshare.core.verdicts import by_opportunistic_bound, stale_bounds


def busy_cluster(seed: int):
    rng = random.Random(seed)
    builder = make_cluster()
    for n in range(40):
        load = {f"gpu{g}": round(rng.random(), 2) for g in range(8) if rng.random() < 0.5}
        builder = builder.node(
            make_node(f"n-{n:02d}").gpus(8, memory_mib=81920).rack(f"r-{n % 4}").utilization(**load)
        )
    for n in range(0, 40, 3):
        gpus = tuple(sorted(rng.sample(range(8), rng.randint(1, 8))))
        builder = builder.holding(f"g{n}", f"n-{n:02d}", gpus, ServiceClass.GUARANTEED, 30000)
    return builder.build()


def where(plan):
    if not isinstance(plan, GangPlan):
        return ("refused", plan.reason)
    return tuple((p.rank, p.node, p.gpu_indices) for p in plan.placements)


def place_all(cluster, gangs, releases):
    """Plans of each gang in turn, applied as a cycle applies them, guaranteed holders leaving
    part way (a node that changes must be judged again)."""
    placed = []
    for i, gang in enumerate(gangs):
        if i in releases:
            cluster.release(releases[i])
        plan = plan_gang(cluster, gang)
        placed.append(where(plan))
        if isinstance(plan, GangPlan):
            apply_plan(cluster, gang, plan)
    return placed


def test_kept_verdicts_change_no_placement_through_a_cycle_of_gangs():
    for seed in range(5):
        rng = random.Random(100 + seed)
        gangs = []
        for i in range(400):
            gang = make_gang(f"ns/b{i}").workers(rng.choice([1, 1, 1, 2, 3, 12]))
            gang = gang.gpus(rng.choice([1, 1, 2, 4]))
            if rng.random() < 0.7:  # borrowers, and guaranteed gangs among them
                gang = gang.opportunistic(memory_mib=rng.choice([8000, 20000, 40000]))
            gangs.append(gang.build())
        releases = {30: "g0", 150: "g9", 300: "g21"}
        fresh = place_all(busy_cluster(seed), gangs, releases)
        kept_cluster = busy_cluster(seed)
        with kept_cluster.verdicts_kept():
            kept = place_all(kept_cluster, gangs, releases)
        assert kept == fresh, f"seed {seed}"
        assert sum(1 for p in fresh if p[0] != "refused") > 20  # most placed, some refused
        assert any(p[0] == "refused" for p in fresh)


def test_verdicts_are_kept_only_inside_the_block():
    cluster = busy_cluster(0)
    assert cluster.kept_verdicts("any") is None
    with cluster.verdicts_kept():
        assert cluster.kept_verdicts("any") == {}
    assert cluster.kept_verdicts("any") is None


def fresh_order(cluster):
    return sorted((-opportunistic_bound(n), name) for name, n in cluster.nodes.items())


def test_bounds_kept_across_cycles_are_judged_again_after_every_change_they_are_told_of():
    """The placement bounds outlive a cycle (core/verdicts.py): after allocate, release and
    a measured change told by touch, the kept order is the fresh one; a change made in place
    and not told is what stale_bounds (the simulator's invariant check) reports."""
    cluster = busy_cluster(3)
    rng = random.Random(7)
    gangs = [make_gang(f"ns/o{i}").opportunistic(memory_mib=8000).build() for i in range(30)]
    assert by_opportunistic_bound(cluster) == fresh_order(cluster)
    for i, gang in enumerate(gangs):
        plan = plan_gang(cluster, gang)
        assert isinstance(plan, GangPlan)
        apply_plan(cluster, gang, plan)
        if i % 3 == 0:
            node = cluster.nodes[rng.choice(sorted(cluster.nodes))]
            node.gpus[rng.randrange(8)].utilization = round(rng.random(), 2)
            cluster.touch(node.name)
        if i == 15:
            cluster.release("g3")
        assert by_opportunistic_bound(cluster) == fresh_order(cluster), i
        assert stale_bounds(cluster) == []
    idlest = max(cluster.nodes.values(), key=opportunistic_bound)
    for gpu in idlest.gpus:
        gpu.utilization = 1.0  # in place, untold
    assert stale_bounds(cluster) == [idlest.name]
    cluster.touch(idlest.name)
    assert by_opportunistic_bound(cluster) == fresh_order(cluster)
    assert stale_bounds(cluster) == []
