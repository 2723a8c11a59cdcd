"""The cluster snapshot: allocation invariants and the best-fit index."""

import pytest
from builders import make_cluster

from gangshare.core import AllocationError, ServiceClass

G, OPP = ServiceClass.GUARANTEED, ServiceClass.OPPORTUNISTIC


def test_two_guaranteed_tenants_never_share_a_gpu():
    cluster = make_cluster().nodes(1, gpus=2).holding("a", "node-0", (0,)).build()
    with pytest.raises(AllocationError, match="GPU 0 on node-0 is held by a/0"):
        cluster.allocate("b", "b/0", "node-0", (0,), G)


def test_release_frees_every_worker_of_the_owner():
    cluster = make_cluster().nodes(2, gpus=2).build()
    cluster.allocate("job", "job/0", "node-0", (0, 1), G)
    cluster.allocate("job", "job/1", "node-1", (0,), G)
    assert [n.free_guaranteed for n in cluster.nodes.values()] == [0, 1]
    released = cluster.release("job")
    assert len(released) == 2
    assert [n.free_guaranteed for n in cluster.nodes.values()] == [2, 2]
    assert list(cluster.nodes_with_free_at_least(2)) == list(cluster.nodes.values())


def test_index_orders_nodes_tightest_first():
    cluster = make_cluster().nodes(3, gpus=4).holding("a", "node-2", (0, 1, 2)).build()
    cluster.allocate("b", "b/0", "node-0", (0,), G)
    assert [n.name for n in cluster.nodes_with_free_at_least(1)] == ["node-2", "node-0", "node-1"]
    assert cluster.count_with_free_at_least(4) == 1


def test_release_worker_keeps_the_rest_of_the_gang():
    cluster = make_cluster().nodes(1, gpus=2).build()
    cluster.allocate("job", "job/0", "node-0", (0,), G)
    cluster.allocate("job", "job/1", "node-0", (1,), G)
    cluster.release_worker("job", "job/0")
    assert [a.tenant.worker for a in cluster.allocations_of("job")] == ["job/1"]
    assert cluster.node("node-0").free_guaranteed == 1


def test_remove_node_drops_its_allocations():
    cluster = make_cluster().nodes(2, gpus=1).holding("a", "node-0", (0,)).build()
    cluster.remove_node("node-0")
    assert cluster.allocations_of("a") == []
    assert list(cluster.nodes) == ["node-1"]


@pytest.mark.parametrize(
    ("gpus", "message"),
    [((5,), "node-0 has no GPU 5"), ((0, 0), "GPU listed twice")],
)
def test_bad_allocations_are_refused(gpus, message):
    cluster = make_cluster().nodes(1, gpus=2).build()
    with pytest.raises(AllocationError, match=message):
        cluster.allocate("a", "a/0", "node-0", gpus, G)


def test_opportunistic_tenants_are_bounded_by_share_slots():
    cluster = make_cluster().nodes(1, gpus=1).build()
    for i in range(4):
        cluster.allocate(f"o{i}", f"o{i}/0", "node-0", (0,), OPP, 100)
    with pytest.raises(AllocationError, match="no free share slot"):
        cluster.allocate("o5", "o5/0", "node-0", (0,), OPP, 100)
