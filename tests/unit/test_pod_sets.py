"""Gangs of unlike pod sets: a CPU-only launcher or driver, or GPU pods of another shape,
planned with the workers all or nothing (core/podsets.py)."""

from __future__ import annotations

from builders import make_cluster, make_gang, make_node

from gangshare.core import Cluster, GangPlan, TopologyPolicy, TopologyScope, Unschedulable
from gangshare.core.constraints import PodConstraints
from gangshare.core.gang import apply_plan, never_fits, plan_gang

CPU_4 = PodConstraints(resources=(("cpu", 4000), ("memory", 8 * 2**30), ("pods", 1)))
CPU_1 = PodConstraints(resources=(("cpu", 1000), ("memory", 2**30), ("pods", 1)))


def _plan(cluster: Cluster, gang: object) -> GangPlan:
    plan = plan_gang(cluster, gang)  # type: ignore[arg-type]
    assert isinstance(plan, GangPlan), plan
    return plan


def test_a_cpu_launcher_is_placed_with_the_workers_after_their_ranks() -> None:
    cluster = (
        make_cluster()
        .node(make_node("gpu-0").gpus(8).allocatable(cpu_milli=64000, memory_gib=512))
        .node(make_node("cpu-0").gpus(0).allocatable(cpu_milli=64000, memory_gib=512))
        .build()
    )
    gang = make_gang("ns/mpi").workers(2).gpus(4).with_pod_set("launcher", 1, 0, CPU_4).build()
    plan = _plan(cluster, gang)
    assert [p.rank for p in plan.placements] == [0, 1, 2]
    launcher = plan.placements[2]
    assert launcher.gpu_indices == ()
    # The gang's own node first: the launcher talks to its workers.
    assert launcher.node == "gpu-0"
    assert gang.total_gpus == 8 and gang.pod_count == 3
    assert gang.pod_set_of(2).name == "launcher"


def test_a_launcher_that_fits_nowhere_keeps_the_whole_gang_waiting() -> None:
    cluster = (
        make_cluster()
        .node(make_node("gpu-0").gpus(8).allocatable(cpu_milli=2000, memory_gib=64))
        .build()
    )
    gang = make_gang("ns/mpi").workers(2).gpus(4).with_pod_set("launcher", 1, 0, CPU_4).build()
    plan = plan_gang(cluster, gang)
    assert isinstance(plan, Unschedulable)
    assert "pod set launcher needs 1 CPU-only pod(s)" in plan.reason
    # Planning held nothing: the cluster is as it was.
    assert cluster.owners() == []
    assert cluster.node("gpu-0").free_guaranteed == 8
    assert cluster.node("gpu-0").requested == {}
    assert never_fits(cluster, gang) is not None


def test_cpu_pods_spill_to_other_nodes_by_their_cpu_room() -> None:
    cluster = (
        make_cluster()
        .node(make_node("gpu-0").gpus(8).allocatable(cpu_milli=6000, memory_gib=64))
        .node(make_node("cpu-0").gpus(0).allocatable(cpu_milli=64000, memory_gib=512))
        .build()
    )
    gang = make_gang("ns/ps").workers(1).gpus(8).with_pod_set("ps", 3, 0, CPU_4).build()
    plan = _plan(cluster, gang)
    ps_nodes = [p.node for p in plan.placements[1:]]
    assert ps_nodes == ["gpu-0", "cpu-0", "cpu-0"]
    apply_plan(cluster, gang, plan)
    assert cluster.node("gpu-0").requested["cpu"] == 4000
    assert cluster.node("cpu-0").requested["cpu"] == 8000


def test_a_node_scoped_gang_keeps_its_driver_on_the_workers_node() -> None:
    cluster = (
        make_cluster()
        .node(make_node("gpu-0").gpus(8).allocatable(cpu_milli=3000, memory_gib=64))
        .node(make_node("cpu-0").gpus(0).allocatable(cpu_milli=64000, memory_gib=512))
        .build()
    )
    gang = (
        make_gang("ns/js")
        .workers(2)
        .gpus(4)
        .topology(TopologyPolicy.REQUIRED, TopologyScope.NODE)
        .with_pod_set("driver", 1, 0, CPU_4)
        .build()
    )
    plan = plan_gang(cluster, gang)
    assert isinstance(plan, Unschedulable)
    assert "in the gang's node (topology Required)" in plan.reason
    loose = make_gang("ns/js").workers(2).gpus(4).with_pod_set("driver", 1, 0, CPU_4).build()
    assert _plan(cluster, loose).placements[2].node == "cpu-0"


def test_a_gpu_pod_set_of_another_shape_gets_distinct_gpus() -> None:
    cluster = make_cluster().nodes(2, gpus=8).build()
    gang = make_gang("ns/mixed").workers(1).gpus(6).with_pod_set("eval", 2, 1).build()
    plan = _plan(cluster, gang)
    workers, evals = plan.placements[0], plan.placements[1:]
    assert len(workers.gpu_indices) == 6
    assert all(len(p.gpu_indices) == 1 for p in evals)
    taken = [(p.node, g) for p in plan.placements for g in p.gpu_indices]
    assert len(taken) == len(set(taken)) == 8
    # Beside the workers on their node while it has room.
    assert {p.node for p in plan.placements} == {workers.node}


def test_a_gpu_pod_set_that_finds_no_gpus_fails_the_gang_whole() -> None:
    cluster = make_cluster().nodes(1, gpus=8).build()
    gang = make_gang("ns/mixed").workers(1).gpus(8).with_pod_set("eval", 1, 1).build()
    plan = plan_gang(cluster, gang)
    assert isinstance(plan, Unschedulable)
    assert "pod set eval needs 1 pod(s) x 1 GPU(s)" in plan.reason
    assert cluster.node("node-0").free_guaranteed == 8


def test_cpu_pods_respect_taints_and_selectors() -> None:
    cluster = (
        make_cluster()
        .node(make_node("gpu-0").gpus(8).taint("nvidia.com/gpu", "", "NoSchedule"))
        .node(make_node("cpu-0").gpus(0).label("pool", "cpu"))
        .node(make_node("cpu-1").gpus(0))
        .build()
    )
    picky = PodConstraints(node_selector=(("pool", "cpu"),), resources=(("pods", 1),))
    gang = make_gang("ns/g").workers(1).gpus(1).with_pod_set("driver", 2, 0, picky).build()
    # The workers tolerate nothing either: no GPU node for them.
    assert isinstance(plan_gang(cluster, gang), Unschedulable)
    cluster = (
        make_cluster()
        .node(make_node("gpu-0").gpus(8))
        .node(make_node("cpu-0").gpus(0).label("pool", "cpu"))
        .node(make_node("cpu-1").gpus(0))
        .build()
    )
    plan = _plan(cluster, gang)
    assert [p.node for p in plan.placements[1:]] == ["cpu-0", "cpu-0"]


def test_a_cpu_set_larger_than_the_cluster_never_fits() -> None:
    cluster = (
        make_cluster().node(make_node("gpu-0").gpus(8).allocatable(cpu_milli=8000, memory_gib=64))
    ).build()
    gang = make_gang("ns/g").workers(1).gpus(1).with_pod_set("ps", 3, 0, CPU_4).build()
    reason = never_fits(cluster, gang)
    assert reason is not None and "pod set ps needs 3 CPU-only pod(s)" in reason
    small = make_gang("ns/g").workers(1).gpus(1).with_pod_set("ps", 1, 0, CPU_1).build()
    assert never_fits(cluster, small) is None
