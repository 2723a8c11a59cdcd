"""What kube-scheduler checks besides GPUs, in the planner: taints, selectors, affinity, resources.

A plan that ignored these would hold GPUs for a worker kube-scheduler never binds."""

import pytest
from builders import make_cluster, make_gang, make_node

from gangshare.core.constraints import (
    PodConstraints,
    Requirement,
    SelectorOperator,
    SelectorTerm,
    Taint,
    Toleration,
    untolerated_taint,
)
from gangshare.core.fit import filter_worker
from gangshare.core.gang import GangPlan, Unschedulable, never_fits, plan_gang

GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        (Toleration("nvidia.com/gpu", "Exists"), True),
        (Toleration("nvidia.com/gpu", "Equal", "present"), True),
        (Toleration("nvidia.com/gpu", "Equal", "absent"), False),
        (Toleration("nvidia.com/gpu", "Exists", effect="NoExecute"), False),
        (Toleration("nvidia.com/gpu", "Exists", effect="NoSchedule"), True),
        (Toleration("", "Exists"), True),  # tolerates everything
        (Toleration("other", "Exists"), False),
    ],
)
def test_tolerations_match_taints_as_kubernetes_does(toleration, tolerated):
    assert (untolerated_taint((GPU_TAINT,), (toleration,)) is None) is tolerated


def test_prefer_no_schedule_taints_do_not_keep_pods_off():
    assert untolerated_taint((Taint("soft", "", "PreferNoSchedule"),), ()) is None


def test_a_tainted_gpu_node_takes_only_gangs_that_tolerate_its_taint():
    cluster = make_cluster().node(make_node("gpu-0").gpus(8).taint("nvidia.com/gpu", "present"))
    built = cluster.build()
    plain = make_gang("ns/plain").gpus(8).build()
    tolerant = (
        make_gang("ns/tolerant")
        .gpus(8)
        .constrained(PodConstraints(tolerations=(Toleration("nvidia.com/gpu", "Exists"),)))
        .build()
    )
    refused = plan_gang(built, plain)
    assert isinstance(refused, Unschedulable)
    assert never_fits(built, plain) == (
        "can never fit: 1 worker(s) x 8 GPU(s), the whole cluster holds at most 0 even when "
        "empty; 1 of 1 node(s) cannot take one (1: node has taint "
        "nvidia.com/gpu=present:NoSchedule the worker does not tolerate)"
    )
    assert isinstance(plan_gang(built, tolerant), GangPlan)


def test_node_selector_and_required_affinity_limit_the_nodes():
    cluster = (
        make_cluster()
        .node(make_node("a").gpus(4).label("zone", "east").label("tier", "2"))
        .node(make_node("b").gpus(4).label("zone", "west").label("tier", "5"))
        .build()
    )
    east = PodConstraints(node_selector=(("zone", "east"),))
    high_tier = PodConstraints(
        affinity=(SelectorTerm((Requirement("tier", SelectorOperator.GT, ("3",)),)),)
    )
    by_name = PodConstraints(
        affinity=(
            SelectorTerm(fields=(Requirement("metadata.name", SelectorOperator.IN, ("a",)),)),
        )
    )
    for constraints, node in ((east, "a"), (high_tier, "b"), (by_name, "a")):
        plan = plan_gang(cluster, make_gang("ns/x").gpus(4).constrained(constraints).build())
        assert isinstance(plan, GangPlan) and plan.nodes == [node]
    rejection = filter_worker(
        cluster.node("b"), make_gang().gpus(1).constrained(east).build().worker()
    )
    assert rejection is not None and not rejection.resolvable
    assert rejection.reason == "node does not match nodeSelector zone=east"


def test_cpu_and_memory_left_on_a_node_bound_how_many_workers_it_takes():
    # 8 free GPUs, but CPU for only two 16-core workers after what is already running there.
    node = make_node("n").gpus(8).allocatable(64_000, 512).requested(cpu=30_000, pods=3)
    cluster = make_cluster().node(node).node(make_node("m").gpus(8).allocatable(128_000, 512))
    built = cluster.build()
    needs = PodConstraints(resources=(("cpu", 16_000), ("memory", 64 * 2**30), ("pods", 1)))
    gang = make_gang("ns/g").workers(2).gpus(2).constrained(needs).build()
    plan = plan_gang(built, gang)
    assert isinstance(plan, GangPlan)
    # CPU for exactly two workers is left on "n": the pair fits there.
    assert plan.nodes == ["n"]
    bigger = make_gang("ns/h").workers(3).gpus(2).constrained(needs).build()
    plan = plan_gang(built, bigger)
    assert isinstance(plan, GangPlan) and plan.nodes == ["m"]  # n lacks CPU for a third
    rejection = filter_worker(
        built.node("n"),
        make_gang()
        .gpus(1)
        .constrained(PodConstraints(resources=(("cpu", 40_000),)))
        .build()
        .worker(),
    )
    assert rejection is not None and rejection.resolvable
    assert rejection.reason == "insufficient cpu: 34000m left, worker needs 40000m"


def test_an_applied_plan_takes_its_cpu_so_the_next_job_sees_it():
    from gangshare.core.gang import apply_plan

    built = make_cluster().node(make_node("n").gpus(8).allocatable(32_000, 256)).build()
    needs = PodConstraints(resources=(("cpu", 16_000), ("pods", 1)))
    first = make_gang("ns/a").workers(2).gpus(1).constrained(needs).build()
    plan = plan_gang(built, first)
    assert isinstance(plan, GangPlan)
    apply_plan(built, first, plan)
    assert built.node("n").requested == {"cpu": 32_000, "pods": 2}
    second = make_gang("ns/b").gpus(1).constrained(needs).build()
    assert isinstance(plan_gang(built, second), Unschedulable)  # GPUs left, CPU not
    built.release("ns/a")
    assert built.node("n").requested == {"cpu": 0, "pods": 0}
    assert isinstance(plan_gang(built, second), GangPlan)


def test_a_resource_the_node_does_not_have_can_never_fit():
    built = make_cluster().node(make_node("n").gpus(8).allocatable(64_000, 256)).build()
    needs = PodConstraints(resources=(("rdma/hca", 1), ("pods", 1)))
    reason = never_fits(built, make_gang("ns/ib").gpus(1).constrained(needs).build())
    assert reason is not None and reason.startswith("can never fit")


def test_a_pod_level_request_bigger_than_the_node_is_refused_as_kube_scheduler_refuses_it():
    from gangshare.kube.scheduling import pod_constraints

    # 32 CPUs and 256Gi asked at pod level (spec.resources); the containers ask nearly nothing.
    template = {
        "resources": {"requests": {"cpu": "32", "memory": "256Gi"}},
        "containers": [{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
    }
    built = make_cluster().node(make_node("n").gpus(8).allocatable(16_000, 512)).build()
    gang = make_gang("ns/big").gpus(1).constrained(pod_constraints(template)).build()
    rejection = filter_worker(built.node("n"), gang.worker())
    assert rejection is not None
    assert rejection.reason == "insufficient cpu: 16000m left, worker needs 32000m"
    assert isinstance(plan_gang(built, gang), Unschedulable)
