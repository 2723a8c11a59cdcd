"""Cluster.undone_after: a cycle's allocates and releases leave the cluster as it was."""

from __future__ import annotations

import pickle
import random
from typing import Any

import pytest
from builders import make_node

from gangshare.core.cluster import Cluster
from gangshare.core.job import GangRequest, ServiceClass


def fingerprint(cluster: Cluster) -> dict[str, Any]:
    """What a cluster holds, order aside: each GPU's tenants, each node's requests and free
    count, the free-GPU index, each owner's allocations."""
    nodes = {}
    for name, node in cluster.nodes.items():
        nodes[name] = (
            [(g.guaranteed, sorted(map(repr, g.opportunistic))) for g in node.gpus],
            {k: v for k, v in node.requested.items() if v},
            node.free_guaranteed,
        )
    # In the index's own order: ties between equally free nodes must go as they went.
    by_free = [(n.name, n.free_guaranteed) for n in cluster.nodes_with_free_at_least(0)]
    owners = {o: sorted(map(repr, cluster.allocations_of(o))) for o in cluster.owners()}
    return {"nodes": nodes, "by_free": by_free, "owners": owners}


def random_step(cluster: Cluster, rng: random.Random, serial: int) -> None:
    owners = cluster.owners()
    roll = rng.random()
    if owners and roll < 0.25:
        cluster.release(rng.choice(owners))
        return
    if owners and roll < 0.4:
        owner = rng.choice(owners)
        held = cluster.allocations_of(owner)
        cluster.release_worker(owner, rng.choice(held).tenant.worker)
        return
    node = rng.choice(list(cluster.nodes.values()))
    opportunistic = rng.random() < 0.3
    if opportunistic:
        free = [g.index for g in node.gpus if g.free_share_slots() >= 1]
    else:
        free = [g.index for g in node.gpus if g.guaranteed is None]
    if not free:
        return
    gpus = rng.sample(free, rng.randint(1, len(free)))
    owner = rng.choice([*owners, f"job-{serial}"]) if owners else f"job-{serial}"
    cluster.allocate(
        owner,
        f"{owner}/{serial}",
        node.name,
        gpus,
        ServiceClass.OPPORTUNISTIC if opportunistic else ServiceClass.GUARANTEED,
        resources={"cpu": 1000 * len(gpus), "pods": 1},
    )


@pytest.mark.parametrize("seed", range(30))
def test_every_allocate_and_release_within_the_block_is_undone(seed: int):
    rng = random.Random(seed)
    cluster = Cluster([make_node(f"n{i}").gpus(8).requested(cpu=500).build() for i in range(4)])
    for serial in range(rng.randint(0, 30)):
        random_step(cluster, rng, serial)
    before = fingerprint(cluster)
    with cluster.undone_after():
        for serial in range(100, 100 + rng.randint(1, 40)):
            random_step(cluster, rng, serial)
        changed = fingerprint(cluster) != before
    assert fingerprint(cluster) == before
    # Most blocks change something, so the undo had work to do.
    if seed < 5:
        assert changed


def test_the_block_undoes_even_when_it_raises_and_does_not_nest():
    cluster = Cluster([make_node("n").gpus(2).build()])
    with pytest.raises(ValueError), cluster.undone_after():
        cluster.allocate("a", "a/0", "n", [0], ServiceClass.GUARANTEED)
        raise ValueError("a cycle that failed")
    assert cluster.owners() == [] and cluster.node("n").free_guaranteed == 2
    with pytest.raises(RuntimeError), cluster.undone_after(), cluster.undone_after():
        pass


def test_a_pickled_cluster_leaves_what_it_keeps_for_its_own_process_behind():
    cluster, gang = Cluster([make_node("n").gpus(2).build()]), GangRequest("g", 1, 1)
    cluster.kept_for("usable", gang, lambda: 1)
    twin, its_gang = pickle.loads(pickle.dumps((cluster, gang)))
    assert twin._static == {} and twin.node("n").gpu_count == 2
    # The gang came along with what it kept, which holds for the living cluster only.
    assert twin.kept_for("usable", its_gang, lambda: 2) == 2
    assert cluster.kept_for("usable", gang, lambda: 3) == 1


def test_what_a_gang_keeps_lasts_while_the_nodes_stand_however_many_gangs_there_are():
    cluster = Cluster([make_node("n").gpus(2).build()])
    gangs = [GangRequest(f"g{i}", 1, 1) for i in range(3)]
    for i, gang in enumerate(gangs):
        assert cluster.kept_for("usable", gang, lambda i=i: i) == i
    assert [cluster.kept_for("usable", g, lambda: -1) for g in gangs] == [0, 1, 2]
    other = Cluster([make_node("n").gpus(2).build()])
    assert other.kept_for("usable", gangs[0], lambda: 7) == 7  # another cluster's, its own
    cluster.nodes_edited()
    assert cluster.kept_for("usable", gangs[1], lambda: 9) == 9
