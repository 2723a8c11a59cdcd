"""All-or-nothing gang planning across nodes and racks."""

import pytest
from builders import make_cluster, make_gang, make_node

from gangshare.core import (
    AllocationError,
    GangPlan,
    ServiceClass,
    TopologyPolicy,
    TopologyScope,
    Unschedulable,
    apply_plan,
    plan_gang,
)

REQUIRED, PREFERRED = TopologyPolicy.REQUIRED, TopologyPolicy.PREFERRED
ISLANDS = ([0, 1, 2, 3], [4, 5, 6, 7])


def planned(cluster, gang) -> GangPlan:
    plan = plan_gang(cluster, gang)
    assert isinstance(plan, GangPlan), plan
    return plan


def test_single_node_best_fit_picks_the_tightest_node():
    cluster = (
        make_cluster()
        .nodes(3, gpus=8)
        .holding("a", "node-0", (0, 1, 2, 3, 4, 5))
        .holding("b", "node-1", (0, 1, 2, 3))
        .build()
    )
    plan = planned(cluster, make_gang().workers(2).gpus(2).build())
    assert plan.nodes == ["node-1"]
    assert [p.rank for p in plan.placements] == [0, 1]


def test_two_by_eight_gang_takes_two_whole_nodes_in_one_rack():
    cluster = make_cluster().nodes(4, gpus=8, racks=["r1", "r2"]).build()
    plan = planned(cluster, make_gang().workers(2).gpus(8).build())
    assert len(plan.nodes) == 2
    assert len(plan.racks(cluster)) == 1
    assert all(p.gpu_indices == tuple(range(8)) for p in plan.placements)


def test_fewest_nodes_beats_filling_fragments():
    cluster = (
        make_cluster()
        .nodes(5, gpus=4)
        .holding("a", "node-0", (0, 1, 2))
        .holding("b", "node-1", (0, 1, 2))
        .holding("c", "node-2", (0, 1, 2))
        .build()
    )
    plan = planned(cluster, make_gang().workers(8).gpus(1).build())
    assert sorted(plan.nodes) == ["node-3", "node-4"]


def test_rack_required_rejects_a_gang_that_only_fits_across_racks():
    cluster = make_cluster().nodes(4, gpus=8, racks=["r1", "r2"]).build()
    gang = make_gang().workers(3).gpus(8).topology(REQUIRED, TopologyScope.RACK).build()
    result = plan_gang(cluster, gang)
    assert isinstance(result, Unschedulable)
    assert "no single rack holds the whole gang" in result.reason
    assert result.reason.startswith("needs 3 worker(s) x 8 GPU(s) (Guaranteed)")


def test_rack_preferred_falls_back_to_fewest_racks():
    cluster = make_cluster().nodes(6, gpus=8, racks=["r1", "r2", "r3"]).build()
    gang = make_gang().workers(3).gpus(8).topology(PREFERRED, TopologyScope.RACK).build()
    plan = planned(cluster, gang)
    assert len(plan.nodes) == 3 and len(plan.racks(cluster)) == 2


def test_node_required_needs_one_node():
    cluster = make_cluster().nodes(2, gpus=4).build()
    gang = make_gang().workers(2).gpus(4).topology(REQUIRED, TopologyScope.NODE).build()
    assert isinstance(plan_gang(cluster, gang), Unschedulable)
    relaxed = make_gang().workers(2).gpus(4).topology(PREFERRED, TopologyScope.NODE).build()
    assert len(planned(cluster, relaxed).nodes) == 2


def test_required_topology_relaxes_after_waiting():
    cluster = make_cluster().nodes(2, gpus=4).build()
    gang = (
        make_gang()
        .workers(2)
        .gpus(4)
        .topology(REQUIRED, TopologyScope.NODE, relax_after=600)
        .build()
    )
    assert isinstance(plan_gang(cluster, gang, waited_seconds=599), Unschedulable)
    plan = plan_gang(cluster, gang, waited_seconds=600)
    assert isinstance(plan, GangPlan) and plan.relaxed


def test_nvlink_required_workers_each_get_one_island():
    cluster = (
        make_cluster()
        .nodes(2, gpus=8, islands=ISLANDS)
        .holding("x", "node-0", (0,))
        .holding("y", "node-1", (4,))
        .build()
    )
    gang = make_gang().workers(2).gpus(4).topology(REQUIRED, TopologyScope.NVLINK).build()
    plan = planned(cluster, gang)
    assert {(p.node, p.gpu_indices) for p in plan.placements} == {
        ("node-0", (4, 5, 6, 7)),
        ("node-1", (0, 1, 2, 3)),
    }
    assert not plan.relaxed


def test_nvlink_preferred_spans_islands_only_when_it_must():
    cluster = (
        make_cluster().nodes(1, gpus=8, islands=ISLANDS).holding("x", "node-0", (0, 4)).build()
    )
    plan = planned(cluster, make_gang().workers(1).gpus(4).build())
    assert plan.relaxed
    assert plan.placements[0].gpu_indices == (1, 2, 3, 5)


def test_not_enough_gpus_anywhere_explains_why():
    cluster = make_cluster().nodes(2, gpus=8).holding("a", "node-0", (0, 1, 2, 3, 4)).build()
    result = plan_gang(cluster, make_gang().workers(2).gpus(8).build())
    assert isinstance(result, Unschedulable)
    assert result.reason == (
        "needs 2 worker(s) x 8 GPU(s) (Guaranteed): room for 1 worker(s) on 1 node(s); "
        "1 of 2 nodes have fewer than 8 free GPU(s)"
    )


def test_opportunistic_gang_shares_gpus_held_by_guaranteed_work():
    cluster = (
        make_cluster()
        .node(make_node("a").gpus(2, memory_mib=80000).utilization(gpu0=0.7, gpu1=0.2))
        .holding("g", "a", (0, 1), ServiceClass.GUARANTEED, 30000)
        .build()
    )
    gang = make_gang("ns/opp").workers(1).gpus(1).opportunistic(memory_mib=20000).build()
    plan = planned(cluster, gang)
    assert plan.placements[0].gpu_indices == (1,)
    apply_plan(cluster, gang, plan)
    assert [t.owner for t in cluster.node("a").gpus[1].tenants()] == ["g", "ns/opp"]


def test_apply_plan_is_all_or_nothing():
    cluster = make_cluster().nodes(2, gpus=2).build()
    gang = make_gang().workers(2).gpus(2).build()
    plan = planned(cluster, gang)
    cluster.allocate(
        "intruder", "intruder/0", plan.placements[1].node, (1,), ServiceClass.GUARANTEED
    )
    with pytest.raises(AllocationError):
        apply_plan(cluster, gang, plan)
    assert cluster.allocations_of("ns/job") == []
    assert cluster.node(plan.placements[0].node).free_guaranteed == 2


def test_cordoned_and_mismatched_nodes_are_skipped():
    cluster = (
        make_cluster()
        .node(make_node("cordoned").gpus(8).cordoned())
        .node(make_node("a100").gpus(8, model="A100"))
        .node(make_node("h100").gpus(8, model="H100"))
        .build()
    )
    plan = planned(cluster, make_gang().workers(1).gpus(4).model("H100").build())
    assert plan.nodes == ["h100"]
