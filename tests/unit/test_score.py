"""Node scores: best-fit for guaranteed work, least-loaded for opportunistic work."""

from builders import make_cluster, make_node

from gangshare.core import ServiceClass, WorkerRequest, score_worker, to_extender_score


def test_best_fit_prefers_the_node_left_with_fewest_free_gpus():
    cluster = (
        make_cluster()
        .node(make_node("empty").gpus(4))
        .node(make_node("three-used").gpus(4))
        .node(make_node("two-used").gpus(4))
        .holding("a", "three-used", (0, 1, 2))
        .holding("b", "two-used", (0, 1))
        .build()
    )
    req = WorkerRequest(1)
    scores = {name: score_worker(cluster.node(name), req) for name in cluster.nodes}
    assert scores["three-used"] > scores["two-used"] > scores["empty"]


def test_island_local_placement_outscores_a_split_one():
    cluster = (
        make_cluster()
        .node(make_node("split").gpus(8).nvlink([0, 1, 2, 3], [4, 5, 6, 7]))
        .node(make_node("whole").gpus(8).nvlink([0, 1, 2, 3], [4, 5, 6, 7]))
        .holding("a", "split", (0, 1, 4, 5))
        .holding("b", "whole", (4, 5, 6, 7))
        .build()
    )
    req = WorkerRequest(4)
    assert score_worker(cluster.node("whole"), req) > score_worker(cluster.node("split"), req)


def test_opportunistic_scores_follow_published_utilization():
    busy = make_node("busy").gpus(1).utilization(gpu0=0.9).build()
    idle = make_node("idle").gpus(1).utilization(gpu0=0.1).build()
    req = WorkerRequest(1, ServiceClass.OPPORTUNISTIC, gpu_memory_mib=1000)
    assert score_worker(idle, req) > score_worker(busy, req)


def test_a_node_that_does_not_fit_scores_zero():
    cluster = make_cluster().node(make_node().gpus(1)).holding("a", "node-0", (0,)).build()
    assert score_worker(cluster.node("node-0"), WorkerRequest(1)) == 0.0


def test_extender_scores_are_integers_in_range():
    assert [to_extender_score(s) for s in (-1.0, 0.0, 0.44, 0.46, 1.0, 3.0)] == [0, 0, 4, 5, 10, 10]
