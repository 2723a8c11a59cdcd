"""Property-based invariants of placement and gang planning (hypothesis)."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gangshare.core import (
    Cluster,
    GangPlan,
    GangRequest,
    Gpu,
    NodeState,
    ServiceClass,
    Topology,
    TopologyPolicy,
    TopologyScope,
    apply_plan,
    plan_gang,
)
from gangshare.core.fit import worker_capacity
from gangshare.core.score import opportunistic_bound, score_worker

EXAMPLES = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ISLAND_LAYOUTS = {
    1: [[]],
    2: [[], [[0, 1]]],
    4: [[], [[0, 1], [2, 3]], [[0, 1, 2, 3]]],
    8: [[], [[0, 1, 2, 3], [4, 5, 6, 7]], [list(range(8))]],
}


@st.composite
def clusters(draw, empty: bool = False) -> Cluster:
    node_count = draw(st.integers(1, 8))
    racks = draw(st.integers(1, 3))
    nodes = []
    for i in range(node_count):
        gpus = draw(st.sampled_from([1, 2, 4, 8]))
        islands = draw(st.sampled_from(ISLAND_LAYOUTS[gpus]))
        nodes.append(
            NodeState.build(
                f"n{i}",
                [Gpu(g, f"u{i}-{g}", "H100", 81920) for g in range(gpus)],
                islands,
                rack=f"r{draw(st.integers(0, racks - 1))}",
            )
        )
    cluster = Cluster(nodes)
    if not empty:
        for i, node in enumerate(nodes):
            for g in range(node.gpu_count):
                kind = draw(st.sampled_from(["free", "free", "guaranteed", "opportunistic"]))
                if kind == "guaranteed":
                    cluster.allocate(
                        f"pre{i}-{g}", "w", node.name, (g,), ServiceClass.GUARANTEED, 40000
                    )
                elif kind == "opportunistic":
                    cluster.allocate(
                        f"opp{i}-{g}", "w", node.name, (g,), ServiceClass.OPPORTUNISTIC, 8000
                    )
    return cluster


topologies = st.builds(
    Topology,
    st.sampled_from(list(TopologyPolicy)),
    st.sampled_from(list(TopologyScope)),
)


@st.composite
def gangs(draw, owner: str = "job") -> GangRequest:
    service_class = draw(st.sampled_from(list(ServiceClass)))
    return GangRequest(
        owner,
        workers=draw(st.integers(1, 6)),
        gpus_per_worker=draw(st.sampled_from([1, 2, 4, 8])),
        service_class=service_class,
        topology=draw(topologies),
        gpu_memory_mib=draw(st.sampled_from([1000, 16000, 40000]))
        if service_class is ServiceClass.OPPORTUNISTIC
        else None,
    )


def assert_invariants(cluster: Cluster) -> None:
    for node in cluster.nodes.values():
        for gpu in node.gpus:
            assert len(gpu.opportunistic) <= gpu.share_slots
            assert gpu.guaranteed is None or gpu.guaranteed.service_class is ServiceClass.GUARANTEED
        assert node.free_guaranteed == sum(1 for g in node.gpus if g.guaranteed is None)


@EXAMPLES
@given(clusters(), st.lists(gangs(), min_size=1, max_size=5))
def test_no_gpu_is_ever_over_allocated(cluster, requests):
    for n, gang in enumerate(requests):
        gang = GangRequest(
            f"job{n}",
            gang.workers,
            gang.gpus_per_worker,
            gang.service_class,
            gang.topology,
            gang.gpu_memory_mib,
        )
        plan = plan_gang(cluster, gang)
        if isinstance(plan, GangPlan):
            spare_before = {
                (p.node, i): cluster.node(p.node).gpus[i].spare_memory_mib()
                for p in plan.placements
                for i in p.gpu_indices
            }
            apply_plan(cluster, gang, plan)
            if gang.service_class is ServiceClass.OPPORTUNISTIC:
                # Opportunistic work only ever takes memory that was spare when it was placed;
                # guaranteed work may land beside it (AntMan squeezes the opportunistic tenant).
                wanted = gang.worker().opportunistic_memory_mib
                assert all(spare >= wanted for spare in spare_before.values())
        assert_invariants(cluster)


@EXAMPLES
@given(clusters(), gangs())
def test_a_plan_places_every_worker_or_none(cluster, gang):
    plan = plan_gang(cluster, gang)
    if not isinstance(plan, GangPlan):
        assert plan.reason
        return
    assert [p.rank for p in plan.placements] == list(range(gang.workers))
    assert all(len(p.gpu_indices) == gang.gpus_per_worker for p in plan.placements)
    per_node: dict[str, list[int]] = {}
    for p in plan.placements:
        per_node.setdefault(p.node, []).extend(p.gpu_indices)
    assert all(len(set(v)) == len(v) for v in per_node.values()), "a GPU given to two workers"
    apply_plan(cluster, gang, plan)
    assert len(cluster.allocations_of(gang.owner)) == gang.workers


@EXAMPLES
@given(clusters(), st.lists(gangs(), min_size=1, max_size=5))
def test_guaranteed_work_never_shares_a_gpu_with_guaranteed_work(cluster, requests):
    holders: dict[tuple[str, int], str] = {}
    for node in cluster.nodes.values():
        for gpu in node.gpus:
            if gpu.guaranteed:
                holders[(node.name, gpu.index)] = gpu.guaranteed.owner
    for n, gang in enumerate(requests):
        owner = f"job{n}"
        gang = GangRequest(
            owner, gang.workers, gang.gpus_per_worker, ServiceClass.GUARANTEED, gang.topology
        )
        plan = plan_gang(cluster, gang)
        if not isinstance(plan, GangPlan):
            continue
        for p in plan.placements:
            for index in p.gpu_indices:
                assert (p.node, index) not in holders, (
                    "planned onto a GPU another guaranteed job holds"
                )
                holders[(p.node, index)] = owner
        apply_plan(cluster, gang, plan)


def _feasible_on_empty(cluster: Cluster, gang: GangRequest) -> bool:
    """Brute force: is there any placement satisfying the gang's required constraints?"""
    topology = gang.topology
    island = topology.island_policy
    req = gang.worker(
        TopologyPolicy.REQUIRED if island is TopologyPolicy.REQUIRED else TopologyPolicy.NONE
    )
    capacity = {n.name: worker_capacity(n, req) for n in cluster.nodes.values()}
    required = topology.policy is TopologyPolicy.REQUIRED
    if required and topology.scope is TopologyScope.NODE:
        return max(capacity.values()) >= gang.workers
    if required and topology.scope is TopologyScope.RACK:
        per_rack: dict[str, int] = {}
        for node in cluster.nodes.values():
            per_rack[node.rack] = per_rack.get(node.rack, 0) + capacity[node.name]
        return max(per_rack.values()) >= gang.workers
    return sum(capacity.values()) >= gang.workers


@EXAMPLES
@given(clusters(empty=True), gangs())
def test_a_feasible_gang_on_an_empty_cluster_is_always_placed(cluster, gang):
    plan = plan_gang(cluster, gang)
    assert isinstance(plan, GangPlan) == _feasible_on_empty(cluster, gang)


@EXAMPLES
@given(
    clusters(),
    st.sampled_from([1000, 16000, 40000]),
    st.lists(st.floats(0, 1), min_size=1, max_size=8),
)
def test_opportunistic_placement_equals_the_brute_force_best_node(cluster, memory, loads):
    for node in cluster.nodes.values():
        for gpu, load in zip(node.gpus, loads * 8, strict=False):
            gpu.utilization = load
        node.recount()
    gang = GangRequest("opp", 1, 1, ServiceClass.OPPORTUNISTIC, Topology(), memory)
    req = gang.worker()
    fitting = [n for n in cluster.nodes.values() if worker_capacity(n, req) >= 1]
    for node in fitting:
        assert opportunistic_bound(node) >= score_worker(node, req)
    plan = plan_gang(cluster, gang)
    if not fitting:
        assert not isinstance(plan, GangPlan)
        return
    best = min(fitting, key=lambda n: (-score_worker(n, req), n.name))
    assert isinstance(plan, GangPlan) and plan.nodes == [best.name]
