"""The cluster's index of nodes an opportunistic worker could share (Cluster.open_to_opportunistic)
is exactly the nodes with enough GPUs to share through churn, and placing against it is placing
after judging every node."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from builders import make_cluster, make_gang, make_node

from gangshare.core import GangPlan, ServiceClass, apply_plan, plan_gang
from gangshare.core.cluster import Cluster
from gangshare.core.fit import fits_opportunistic

MEMORIES = (4000, 8000, 20000, 40000, 81920)


def crowded_cluster(seed: int) -> Cluster:
    """Nodes of 8 GPUs with little to share: few slots, memory in use, unhealthy GPUs, and
    guaranteed holders that lend nothing (no memory figure)."""
    rng = random.Random(seed)
    builder = make_cluster()
    for n in range(24):
        node = make_node(f"n-{n:02d}").gpus(8, memory_mib=81920).rack(f"r-{n % 3}")
        node = node.share_slots(rng.choice([1, 2]))
        for g in rng.sample(range(8), rng.randint(0, 3)):
            node = node.memory_used(g, rng.choice([10000, 60000, 81920]))
        if rng.random() < 0.2:
            node = node.unhealthy(rng.randrange(8))
        builder = builder.node(node)
    for n in range(24):
        if rng.random() < 0.6:
            gpus = tuple(sorted(rng.sample(range(8), rng.randint(4, 8))))
            builder = builder.holding(f"g{n}", f"n-{n:02d}", gpus, ServiceClass.GUARANTEED)
    return builder.build()


def judged(cluster: Cluster, gpus: int, memory: int) -> set[str]:
    return {
        name
        for name, node in cluster.nodes.items()
        if sum(1 for g in node.gpus if fits_opportunistic(g, memory)) >= gpus
    }


def indexed(cluster: Cluster, gpus: int, memory: int) -> set[str]:
    found = {node.name for node in cluster.open_to_opportunistic(gpus, memory)}
    assert found == {n for n in cluster.nodes if cluster.may_share(n, gpus, memory)}
    return found


def churn(cluster: Cluster, rng: random.Random, step: int) -> None:
    """One change of each kind a cluster is told of: allocate, release, a measured change."""
    name = rng.choice(sorted(cluster.nodes))
    node = cluster.nodes[name]
    what = rng.random()
    if what < 0.4:
        shareable = [g.index for g in node.gpus if fits_opportunistic(g, 4000)]
        if shareable:
            cluster.allocate(f"o{step}", f"o{step}/0", name, shareable[:1], _O, 4000)
    elif what < 0.7 and cluster.owners():
        cluster.release(rng.choice(cluster.owners()))
    else:
        gpu = node.gpus[rng.randrange(8)]
        gpu.memory_used_mib = rng.choice([None, 0, 30000, 81920])
        cluster.touch(name)


_O = ServiceClass.OPPORTUNISTIC


@pytest.mark.parametrize("seed", range(8))
def test_the_index_is_the_nodes_with_enough_gpus_to_share_through_churn(seed):
    cluster, rng = crowded_cluster(seed), random.Random(seed)
    for step in range(120):
        churn(cluster, rng, step)
        if step % 10 == 0:
            removed = rng.choice(sorted(cluster.nodes))
            cluster.remove_node(removed)
            cluster.add_node(make_node(removed).gpus(8, memory_mib=81920).build())
        for gpus in (1, 2, 4, 8):
            for memory in MEMORIES:
                assert indexed(cluster, gpus, memory) == judged(cluster, gpus, memory), step
    twin = cluster.copy()
    churn(twin, rng, 999)
    assert indexed(twin, 1, 4000) == judged(twin, 1, 4000)
    assert indexed(cluster, 1, 4000) == judged(cluster, 1, 4000)


def every_node(cluster: Cluster, gpus: int, memory_mib: int) -> Iterator:
    return iter(cluster.nodes.values())


def placements(cluster: Cluster, gangs: list, rng: random.Random) -> list[object]:
    placed: list[object] = []
    for step, gang in enumerate(gangs):
        churn(cluster, rng, 1000 + step)
        plan = plan_gang(cluster, gang)
        if isinstance(plan, GangPlan):
            apply_plan(cluster, gang, plan)
            placed.append(tuple((p.rank, p.node, p.gpu_indices) for p in plan.placements))
        else:
            placed.append(plan.reason)
    return placed


@pytest.mark.parametrize("seed", range(6))
def test_placing_against_the_index_is_placing_after_judging_every_node(seed, monkeypatch):
    gang_rng = random.Random(50 + seed)
    gangs = []
    for i in range(150):
        gang = make_gang(f"ns/b{i}").workers(gang_rng.choice([1, 1, 2, 3, 6]))
        gang = gang.gpus(gang_rng.choice([1, 1, 2, 4, 8]))
        gangs.append(gang.opportunistic(memory_mib=gang_rng.choice(MEMORIES)).build())
    with_index = placements(crowded_cluster(seed), gangs, random.Random(seed))
    monkeypatch.setattr(Cluster, "open_to_opportunistic", every_node)
    monkeypatch.setattr(Cluster, "may_share", lambda self, name, gpus, memory: True)
    without = placements(crowded_cluster(seed), gangs, random.Random(seed))
    assert with_index == without
    assert sum(1 for p in with_index if isinstance(p, tuple)) > 10  # some placed
    assert any("lack spare memory or share slots" in str(p) for p in with_index)  # some not
