"""The per-node filter: whether one worker fits, and the reason a user reads when it does not."""

import pytest
from builders import make_cluster, make_node

from gangshare.core import (
    ServiceClass,
    TopologyPolicy,
    WorkerRequest,
    filter_worker,
    worker_capacity,
)

G = ServiceClass.GUARANTEED
OPP = ServiceClass.OPPORTUNISTIC
REQUIRED = TopologyPolicy.REQUIRED


@pytest.mark.parametrize(
    ("node", "held", "request_", "reason", "resolvable"),
    [
        (make_node().gpus(8), (), WorkerRequest(8), None, True),
        (
            make_node().gpus(8).cordoned("node is cordoned"),
            (),
            WorkerRequest(1),
            "node is cordoned",
            False,
        ),
        (make_node().gpus(4), (), WorkerRequest(8), "node has 4 GPUs, worker needs 8", False),
        (
            make_node().gpus(8, model="A100"),
            (),
            WorkerRequest(1, gpu_model="H100"),
            "GPU model A100, job requires H100",
            False,
        ),
        (
            make_node().gpus(8),
            (0, 1, 2, 3, 4, 5),
            WorkerRequest(4),
            "2 of 8 GPUs free, worker needs 4",
            True,
        ),
        (
            make_node().gpus(8).nvlink([0, 1, 2, 3], [4, 5, 6, 7]),
            (),
            WorkerRequest(8, island_policy=REQUIRED),
            "largest NVLink island has 4 GPUs, worker needs 8 in one island",
            False,
        ),
        (
            make_node().gpus(8).nvlink([0, 1, 2, 3], [4, 5, 6, 7]),
            (0, 1, 4, 5),
            WorkerRequest(4, island_policy=REQUIRED),
            "4 GPUs fit but at most 2 in one NVLink island, worker needs 4 in one island",
            True,
        ),
        (
            make_node().gpus(8).unhealthy(0, 1, 2, 3, 4),
            (),
            WorkerRequest(4),
            "3 of 8 GPUs free, worker needs 4",
            True,
        ),
        (
            make_node().gpus(2, memory_mib=16384),
            (0, 1),
            WorkerRequest(1, OPP, gpu_memory_mib=4096),
            "0 GPUs with 4096 MiB spare and a free share slot, worker needs 1",
            True,
        ),
    ],
)
def test_filter_reasons(node, held, request_, reason, resolvable):
    cluster = make_cluster().node(node).holding("other", "node-0", held).build() if held else None
    state = cluster.node("node-0") if cluster else node.build()
    rejection = filter_worker(state, request_)
    if reason is None:
        assert rejection is None
    else:
        assert rejection is not None
        assert rejection.reason == reason
        assert rejection.node == "node-0"
        assert rejection.resolvable is resolvable


def test_opportunistic_fits_beside_guaranteed_when_its_memory_is_known():
    cluster = (
        make_cluster()
        .node(make_node().gpus(1, memory_mib=80000))
        .holding("g", "node-0", (0,), G, memory_mib=30000)
        .build()
    )
    node = cluster.node("node-0")
    assert filter_worker(node, WorkerRequest(1, OPP, gpu_memory_mib=40000)) is None
    rejected = filter_worker(node, WorkerRequest(1, OPP, gpu_memory_mib=60000))
    assert rejected is not None and "60000 MiB spare" in rejected.reason


def test_guaranteed_tenant_of_unknown_footprint_lends_nothing():
    cluster = make_cluster().node(make_node().gpus(1)).holding("g", "node-0", (0,)).build()
    assert (
        filter_worker(cluster.node("node-0"), WorkerRequest(1, OPP, gpu_memory_mib=1)) is not None
    )


def test_published_memory_use_opens_the_rest_of_the_gpu_with_headroom():
    cluster = (
        make_cluster()
        .node(make_node().gpus(1, memory_mib=80000).memory_used(0, 20000))
        .holding("g", "node-0", (0,))
        .build()
    )
    gpu = cluster.node("node-0").gpus[0]
    # 20000 observed + 10% of 80000 headroom stays with the guaranteed job.
    assert gpu.spare_memory_mib() == 80000 - 28000


def test_share_slots_bound_opportunistic_tenants():
    builder = make_cluster().node(make_node().gpus(1).share_slots(2))
    cluster = (
        builder.holding("a", "node-0", (0,), OPP, 1000)
        .holding("b", "node-0", (0,), OPP, 1000)
        .build()
    )
    assert worker_capacity(cluster.node("node-0"), WorkerRequest(1, OPP, gpu_memory_mib=1000)) == 0


@pytest.mark.parametrize(
    ("islands", "held", "gpus", "policy", "capacity"),
    [
        ([[0, 1, 2, 3], [4, 5, 6, 7]], (), 4, REQUIRED, 2),
        ([[0, 1, 2, 3], [4, 5, 6, 7]], (0,), 4, REQUIRED, 1),
        ([[0, 1, 2, 3], [4, 5, 6, 7]], (0, 4), 2, REQUIRED, 2),
        ([[0, 1, 2, 3], [4, 5, 6, 7]], (0, 4), 2, TopologyPolicy.NONE, 3),
        ([], (), 1, REQUIRED, 8),
    ],
)
def test_worker_capacity_counts_island_local_workers(islands, held, gpus, policy, capacity):
    builder = make_cluster().node(make_node().gpus(8).nvlink(*islands))
    cluster = (builder.holding("x", "node-0", held) if held else builder).build()
    assert (
        worker_capacity(cluster.node("node-0"), WorkerRequest(gpus, island_policy=policy))
        == capacity
    )
