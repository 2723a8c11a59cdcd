"""Extender decisions on its cache: gang plans, best-fit, least-loaded, assume/forget."""

import re

import pytest
from helpers import cache_with, gpu_pod, node_objects, trainingjob, worker

from gangshare.core.annotations import NODE_UTILIZATION, POD_ASSIGNED_GPUS, encode_utilization
from gangshare.extender.decisions import (
    MAX_BEST_NODES,
    BadPod,
    best_nodes,
    filter_nodes,
    gpus_for_bind,
    pod_ask,
    prioritize_nodes,
)

FOUR = {"nodePools": [{"name": "n", "count": 3, "gpusPerNode": 4}]}
ISLANDS = {
    "nodePools": [
        {"name": "x", "count": 2, "gpusPerNode": 8, "nvlinkIslands": [[0, 1, 2, 3], [4, 5, 6, 7]]}
    ]
}


def planned(node: str, gpus: str) -> dict[str, str]:
    return {"gangshare.io/planned-node": node, "gangshare.io/planned-gpus": gpus}


def ask_for(cache, pod):
    with cache.lock:
        return pod_ask(pod, cache.ledger)


def test_gang_pod_passes_only_its_planned_node_while_its_gpus_are_free():
    cache = cache_with(
        FOUR, [gpu_pod("other", 1, node="n-1", annotations={"gangshare.io/planned-gpus": "1"})]
    )
    cache.upsert_job(trainingjob("llm", [("n-1", [0, 1])]))
    ask = ask_for(cache, worker("llm", 0, 2))
    assert ask is not None and ask.gang
    passed, failed, unresolvable = filter_nodes(cache.cluster, ask, ["n-0", "n-1", "n-2"])
    assert passed == []
    assert failed == {"n-1": "planned GPU 1 on n-1 is held by pod:default/other"}
    assert unresolvable == {
        "n-0": "gang plan places this worker on n-1",
        "n-2": "gang plan places this worker on n-1",
    }
    cache.delete_pod("default", "other")
    assert filter_nodes(cache.cluster, ask, ["n-1"])[0] == ["n-1"]
    assert gpus_for_bind(cache.cluster, ask, "n-1") == (0, 1)
    assert (
        gpus_for_bind(cache.cluster, ask, "n-0") == "gang plan places this worker on n-1, not n-0"
    )


def test_an_admitted_plan_holds_its_gpus_before_its_pods_exist():
    cache = cache_with(FOUR)
    stranger = ask_for(cache, gpu_pod("stranger", 1))
    assert filter_nodes(cache.cluster, stranger, ["n-0"])[0] == ["n-0"]
    # The operator commits the admission: the plan is in the ledger at once.
    cache.upsert_job(trainingjob("llm", [("n-0", [0, 1, 2, 3])]))
    assert cache.cluster.node("n-0").free_guaranteed == 0
    assert filter_nodes(cache.cluster, stranger, ["n-0"])[1] == {
        "n-0": "0 of 4 GPUs free, worker needs 1"
    }
    assert gpus_for_bind(cache.cluster, stranger, "n-0") == "0 of 4 GPUs free, worker needs 1"
    # Its own worker, once created, passes on its planned node (the GPUs are its own).
    mine = ask_for(cache, worker("llm", 0, 4))
    assert filter_nodes(cache.cluster, mine, ["n-0"])[0] == ["n-0"]
    # Bound, the worker is the same claim: nothing is counted twice.
    cache.upsert_pod(worker("llm", 0, 4, node="n-0"))
    assert cache.cluster.node("n-0").free_guaranteed == 0
    assert [a.node for a in cache.cluster.allocations_of("default/llm/0")] == ["n-0"]
    # The job finished: its GPUs are free again (the succeeded pod holds nothing).
    cache.upsert_job(trainingjob("llm", [("n-0", [0, 1, 2, 3])], phase="Succeeded"))
    done = worker("llm", 0, 4, node="n-0")
    done["status"]["phase"] = "Succeeded"
    cache.upsert_pod(done)
    assert cache.cluster.node("n-0").free_guaranteed == 4


def test_forged_gang_annotations_and_labels_reserve_nothing():
    cache = cache_with(FOUR)
    cache.upsert_job(trainingjob("llm", [("n-0", [0, 1])]))
    # A pending pod that writes a plan into its own annotations holds nothing and plans nothing.
    forged = gpu_pod(
        "squatter", 2, annotations=planned("n-1", "0,1"), labels={"gangshare.io/job": "x"}
    )
    cache.upsert_pod(forged)
    assert cache.cluster.node("n-1").free_guaranteed == 4
    ask = ask_for(cache, forged)
    assert not ask.gang and ask.planned_node is None
    # A pod that names itself a worker of a real job but is not the job's (wrong uid, wrong
    # attempt) is never placed: it has no plan behind it.
    for fake in (worker("llm", 0, 2, uid="someone-else"), worker("llm", 0, 2, attempt=3)):
        ask = ask_for(cache, fake)
        passed, failed, _ = filter_nodes(cache.cluster, ask, ["n-0", "n-1"])
        assert passed == [] and set(failed) == {"n-0", "n-1"}
        assert "holds no plan for worker 0" in failed["n-0"]
        assert gpus_for_bind(cache.cluster, ask, "n-0").startswith("TrainingJob default/llm")
    # Bound anyway (another scheduler, nodeName), such a pod is a plain fact, never the job's
    # claim: counted on the GPUs the plan leaves while nobody has recorded its own...
    bound = worker("llm", 0, 2, node="n-0", uid="someone-else")
    cache.upsert_pod(bound)
    assert cache.cluster.node("n-0").free_guaranteed == 0
    assert cache.ledger.displaced() == {}
    # ...and once the node's agent records the kubelet's choice, on those: it displaces the plan
    # it collides with rather than hiding behind the job's claim.
    bound["metadata"]["annotations"][POD_ASSIGNED_GPUS] = "0,1"
    cache.upsert_pod(bound)
    assert cache.cluster.node("n-0").free_guaranteed == 2
    assert cache.ledger.displaced() == {
        "default/llm": "planned GPU 0 on n-0 is taken by pod:default/llm-worker-0"
    }


def test_other_pods_are_filtered_and_scored_best_fit():
    cache = cache_with(FOUR, [gpu_pod("a", 3, node="n-0"), gpu_pod("b", 1, node="n-1")])
    ask = ask_for(cache, gpu_pod("new", 2))
    passed, failed, unresolvable = filter_nodes(
        cache.cluster, ask, ["n-0", "n-1", "n-2", "cpu-node"]
    )
    assert passed == ["n-1", "n-2"]
    assert failed == {"n-0": "1 of 4 GPUs free, worker needs 2"}
    assert unresolvable == {"cpu-node": "no GPUs known to gangshare on this node"}
    scores = dict(prioritize_nodes(cache.cluster, ask, passed))
    assert scores["n-1"] > scores["n-2"]
    # Filter's answer is the best fit alone: no prioritize round trip is needed to pick it.
    assert best_nodes(cache.cluster, ask, passed) == ["n-1"]


def test_filter_keeps_every_node_tied_at_the_best_score_up_to_a_bound():
    many = {"nodePools": [{"name": "t", "count": MAX_BEST_NODES + 4, "gpusPerNode": 4}]}
    cache = cache_with(many, [gpu_pod("a", 1, node="t-3")])
    ask = ask_for(cache, gpu_pod("new", 1))
    names = [f"t-{i}" for i in range(MAX_BEST_NODES + 4)]
    passed, _, _ = filter_nodes(cache.cluster, ask, names)
    assert best_nodes(cache.cluster, ask, passed) == ["t-3"]
    cache.delete_pod("default", "a")
    tied = best_nodes(cache.cluster, ask, passed)
    assert tied == names[:MAX_BEST_NODES]


def test_bind_takes_one_whole_nvlink_island():
    cache = cache_with(
        ISLANDS, [gpu_pod("a", 1, node="x-0", annotations={"gangshare.io/planned-gpus": "0"})]
    )
    ask = ask_for(cache, gpu_pod("four", 4))
    assert gpus_for_bind(cache.cluster, ask, "x-0") == (4, 5, 6, 7)
    assert gpus_for_bind(cache.cluster, ask, "x-1") == (0, 1, 2, 3)


def test_opportunistic_pods_follow_published_utilization():
    nodes = node_objects({"nodePools": [{"name": "u", "count": 2, "gpusPerNode": 2}]})
    nodes[0]["metadata"]["annotations"][NODE_UTILIZATION] = encode_utilization(
        {0: (0.9, 1000), 1: (0.8, 1000)}, 1
    )
    nodes[1]["metadata"]["annotations"][NODE_UTILIZATION] = encode_utilization(
        {0: (0.1, 1000), 1: (0.7, 1000)}, 1
    )
    cache = cache_with({"nodePools": [{"name": "u", "count": 2, "gpusPerNode": 2}]})
    cache.replace_nodes(nodes)
    ask = ask_for(
        cache,
        gpu_pod(
            "opp",
            1,
            resource="gangshare.io/gpu-share",
            annotations={"gangshare.io/gpu-memory-mib": "4096"},
        ),
    )
    scores = dict(prioritize_nodes(cache.cluster, ask, ["u-0", "u-1"]))
    assert scores["u-1"] > scores["u-0"]
    assert best_nodes(cache.cluster, ask, ["u-0", "u-1"]) == ["u-1"]
    assert gpus_for_bind(cache.cluster, ask, "u-1") == (0,)
    # A new report moves the least-loaded GPU; the cache refreshes in place.
    nodes[1]["metadata"]["annotations"][NODE_UTILIZATION] = encode_utilization(
        {0: (0.95, 1), 1: (0.05, 1)}, 2
    )
    cache.upsert_node(nodes[1])
    assert gpus_for_bind(cache.cluster, ask, "u-1") == (1,)


def test_bad_input_is_named():
    cache = cache_with(FOUR)
    bad_memory = gpu_pod("p", 2, annotations={"gangshare.io/gpu-memory-mib": "lots"})
    with pytest.raises(BadPod, match=re.escape("gangshare.io/gpu-memory-mib: expected MiB")):
        ask_for(cache, bad_memory)
    cache.upsert_job(trainingjob("llm", [("n-0", [0, 1, 2])]))
    message = "planned 3 GPU(s) for worker 0, the pod requests 2"
    with pytest.raises(BadPod, match=re.escape(message)):
        ask_for(cache, worker("llm", 0, 2))


def test_pods_without_gpus_ask_nothing():
    pod = gpu_pod("cpu", 1)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "2"}}
    assert ask_for(cache_with(FOUR), pod) is None


def test_assumed_gpus_are_held_until_confirmed_forgotten_or_expired():
    cache = cache_with(FOUR)
    ask = ask_for(cache, gpu_pod("p", 2))
    with cache.lock:
        cache.assume(ask.owner, "n-0", (0, 1), ask.request)
    assert cache.cluster.node("n-0").free_guaranteed == 2
    # A stale event (the pod before its bind) must not release the assumption.
    cache.upsert_pod(gpu_pod("p", 2))
    assert cache.cluster.node("n-0").free_guaranteed == 2
    # The pod's bound update replaces the assumption with the real claim.
    cache.upsert_pod(gpu_pod("p", 2, node="n-0", annotations={"gangshare.io/planned-gpus": "0,1"}))
    assert cache.assumed_count() == 0 and cache.cluster.node("n-0").free_guaranteed == 2
    other = ask_for(cache, gpu_pod("q", 1))
    with cache.lock:
        cache.assume(other.owner, "n-1", (0,), other.request)
    cache.forget(other.owner)
    assert cache.cluster.node("n-1").free_guaranteed == 4
    with cache.lock:
        cache.assume(other.owner, "n-2", (3,), other.request)
    cache.clock.advance(31)
    assert cache.expire_assumptions() == 1
    assert cache.cluster.node("n-2").free_guaranteed == 4


def test_node_relabel_keeps_allocations_and_topology_change_rebuilds():
    cache = cache_with(
        FOUR, [gpu_pod("a", 2, node="n-0", annotations={"gangshare.io/planned-gpus": "2,3"})]
    )
    nodes = node_objects(FOUR)
    nodes[0]["spec"]["unschedulable"] = True
    cache.upsert_node(nodes[0])
    assert cache.cluster.node("n-0").unschedulable_reason == "node is cordoned"
    assert cache.cluster.node("n-0").free_guaranteed == 2
    grown = node_objects({"nodePools": [{"name": "n", "count": 1, "gpusPerNode": 8}]})[0]
    cache.upsert_node(grown)
    assert (
        cache.cluster.node("n-0").gpu_count == 8 and cache.cluster.node("n-0").free_guaranteed == 6
    )
    cache.delete_node("n-0")
    assert "n-0" not in cache.cluster.nodes
