"""Which GPUs a worker gets on its node."""

from builders import make_cluster, make_node

from gangshare.core import ServiceClass, TopologyPolicy, WorkerRequest, choose_gpus

OPP = ServiceClass.OPPORTUNISTIC


def test_guaranteed_worker_takes_the_tightest_island_that_holds_it():
    cluster = (
        make_cluster()
        .node(make_node().gpus(8).nvlink([0, 1, 2, 3], [4, 5, 6, 7]))
        .holding("x", "node-0", (4, 5))
        .build()
    )
    # Island 4..7 has exactly 2 free: the 2-GPU worker goes there and island 0..3 stays whole.
    assert choose_gpus(cluster.node("node-0"), WorkerRequest(2)) == (6, 7)


def test_four_gpu_worker_gets_one_whole_island():
    node = make_node().gpus(8).nvlink([0, 1, 2, 3], [4, 5, 6, 7]).build()
    assert choose_gpus(node, WorkerRequest(4)) == (0, 1, 2, 3)


def test_spans_fewest_islands_when_locality_is_only_preferred():
    cluster = (
        make_cluster()
        .node(make_node().gpus(8).nvlink([0, 1, 2, 3], [4, 5, 6, 7]))
        .holding("x", "node-0", (0, 4, 5))
        .build()
    )
    assert (
        choose_gpus(cluster.node("node-0"), WorkerRequest(4, island_policy=TopologyPolicy.REQUIRED))
        is None
    )
    assert choose_gpus(cluster.node("node-0"), WorkerRequest(4)) == (1, 2, 3, 6)


def test_guaranteed_prefers_gpus_without_opportunistic_tenants():
    cluster = (
        make_cluster().node(make_node().gpus(2)).holding("o", "node-0", (0,), OPP, 1000).build()
    )
    assert choose_gpus(cluster.node("node-0"), WorkerRequest(1)) == (1,)


def test_opportunistic_goes_to_the_least_loaded_gpu():
    node = make_node().gpus(4).utilization(gpu0=0.9, gpu1=0.2, gpu2=0.5, gpu3=0.7).build()
    assert choose_gpus(node, WorkerRequest(1, OPP, gpu_memory_mib=1000)) == (1,)
    assert choose_gpus(node, WorkerRequest(2, OPP, gpu_memory_mib=1000)) == (1, 2)


def test_excluded_gpus_are_never_chosen():
    node = make_node().gpus(4).build()
    assert choose_gpus(node, WorkerRequest(2), exclude=frozenset({0, 1})) == (2, 3)
    assert choose_gpus(node, WorkerRequest(3), exclude=frozenset({0, 1})) is None
