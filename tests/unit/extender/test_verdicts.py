"""The kept verdicts (verdicts.py) answer what judging every named node afresh answers,
and never an answer from before a change to the ledger."""

import copy
import random

from helpers import cache_with, gpu_pod, node_objects

from gangshare.core.annotations import NODE_UTILIZATION, encode_utilization
from gangshare.core.job import ServiceClass, TopologyPolicy, WorkerRequest
from gangshare.extender.decisions import (
    NOT_A_GPU_NODE,
    PodAsk,
    best_nodes,
    filter_nodes,
    prioritize_nodes,
)
from gangshare.extender.verdicts import FAILED, UNKNOWN, UNRESOLVABLE, Verdicts
from gangshare.extender.wire import priority_json

SPEC = {
    "nodePools": [
        {"name": "a", "count": 6, "gpusPerNode": 8, "nvlinkIslands": [[0, 1, 2, 3], [4, 5, 6, 7]]},
        {"name": "b", "count": 4, "gpusPerNode": 4},
    ]
}
FOUR = {"nodePools": [{"name": "n", "count": 3, "gpusPerNode": 4}]}
REQUESTS = [
    WorkerRequest(1, ServiceClass.GUARANTEED, island_policy=TopologyPolicy.PREFERRED),
    WorkerRequest(2, ServiceClass.GUARANTEED, island_policy=TopologyPolicy.PREFERRED),
    WorkerRequest(4, ServiceClass.GUARANTEED, island_policy=TopologyPolicy.PREFERRED),
    WorkerRequest(
        1, ServiceClass.OPPORTUNISTIC, gpu_memory_mib=4096, island_policy=TopologyPolicy.PREFERRED
    ),
]


def filtered(cache, request, names):
    with cache.lock:
        return cache.verdicts.current(cache.cluster, request).filter(names)


def assert_matches_judging_afresh(cache, request, names):
    """The kept answer is the name-by-name one: best (in order), failed (in order),
    unresolvable, the passed count, and prioritize's bytes."""
    ask = PodAsk("default/probe", request)
    with cache.lock:
        shape = cache.verdicts.current(cache.cluster, request)
        answer = shape.filter(names)
        passed, failed, unresolvable = filter_nodes(cache.cluster, ask, names)
        assert answer.best == best_nodes(cache.cluster, ask, passed)
        assert list(answer.failed.items()) == list(failed.items())
        assert answer.unresolvable == unresolvable
        assert answer.passed == len(passed)
        reference = priority_json(prioritize_nodes(cache.cluster, ask, names))
        assert shape.priorities(names) == reference


def test_the_marks_of_a_node_that_did_not_pass_are_told_apart():
    assert len({id(FAILED), id(UNRESOLVABLE), id(UNKNOWN)}) == 3


def test_a_verdict_is_never_served_after_the_ledger_changes():
    cache = cache_with(FOUR)
    four = WorkerRequest(4, ServiceClass.GUARANTEED, island_policy=TopologyPolicy.PREFERRED)
    names = ["n-0", "n-1", "n-2"]
    assert filtered(cache, four, names).failed == {}
    # A pod the watch brings bound to n-1 takes a GPU there: n-1 fails at once.
    cache.upsert_pod(gpu_pod("a", 1, node="n-1"))
    assert filtered(cache, four, names).failed == {"n-1": "3 of 4 GPUs free, worker needs 4"}
    cache.delete_pod("default", "a")
    assert filtered(cache, four, names).failed == {}
    # A bind in flight (assumed) holds its GPUs until forgotten.
    with cache.lock:
        cache.assume("default/b", "n-2", (0,), four)
    assert set(filtered(cache, four, names).failed) == {"n-2"}
    cache.forget("default/b")
    assert filtered(cache, four, names).failed == {}
    # Cordoned in place (the same NodeState refreshed), then deleted, then back.
    nodes = node_objects(FOUR)
    cordoned = copy.deepcopy(nodes[0])
    cordoned["spec"]["unschedulable"] = True
    cache.upsert_node(cordoned)
    assert filtered(cache, four, names).unresolvable == {"n-0": "node is cordoned"}
    cache.delete_node("n-0")
    assert filtered(cache, four, names).unresolvable == {"n-0": NOT_A_GPU_NODE}
    cache.upsert_node(nodes[0])
    answer = filtered(cache, four, names)
    assert answer.unresolvable == {} and answer.failed == {} and answer.passed == 3
    # A relist builds new NodeStates; a pod on the relisted n-0 still counts.
    cache.upsert_pod(gpu_pod("c", 2, node="n-0"))
    cache.replace_nodes(node_objects(FOUR))
    assert set(filtered(cache, four, names).failed) == {"n-0"}


def test_a_new_cluster_object_is_judged_afresh():
    cache = cache_with(FOUR)
    one = REQUESTS[0]
    assert filtered(cache, one, ["n-0"]).passed == 1
    other = cache_with(FOUR, [gpu_pod("x", 4, node="n-0")])
    cache.ledger.cluster = other.cluster
    assert filtered(cache, one, ["n-0"]).failed == {"n-0": "0 of 4 GPUs free, worker needs 1"}


def test_answers_match_judging_afresh_through_random_changes():
    rng = random.Random(5)
    nodes = node_objects(SPEC)
    names = [n["metadata"]["name"] for n in nodes]
    cache = cache_with(SPEC)
    pods: dict[str, str] = {}
    for step in range(300):
        action = rng.random()
        if action < 0.35:
            name, node = f"p{step}", rng.choice(names)
            pod = gpu_pod(name, rng.choice([1, 1, 2, 4]), node=node)
            cache.upsert_pod(pod)
            pods[name] = node
        elif action < 0.55 and pods:
            name = rng.choice(sorted(pods))
            cache.delete_pod("default", name)
            del pods[name]
        elif action < 0.65:
            owner, node = f"default/assumed-{step % 3}", rng.choice(names)
            with cache.lock:
                cache.forget(owner)
                state = cache.cluster.nodes.get(node)
                free = [g.index for g in state.gpus if g.free_for_guaranteed] if state else []
                if free:
                    cache.assume(owner, node, tuple(free[:1]), REQUESTS[0])
        elif action < 0.75:
            node = copy.deepcopy(rng.choice(nodes))
            node["spec"]["unschedulable"] = rng.random() < 0.5
            load = {i: (rng.random(), rng.randrange(0, 60000)) for i in range(4)}
            node["metadata"]["annotations"][NODE_UTILIZATION] = encode_utilization(load, 1)
            cache.upsert_node(node)
        elif action < 0.8:
            cache.delete_node(rng.choice(names))
        elif action < 0.85:
            cache.upsert_node(rng.choice(nodes))
        elif action < 0.87:
            cache.replace_nodes(nodes)
        asked = rng.sample(names, rng.randint(1, len(names)))
        if rng.random() < 0.3:
            asked.append("cpu-only")
        if rng.random() < 0.1:
            asked.append(asked[0])  # kube-scheduler repeats none; still the same answer
        assert_matches_judging_afresh(cache, rng.choice(REQUESTS), asked)


def test_every_shape_kept_is_current_and_old_shapes_are_let_go():
    cache = cache_with(FOUR)
    verdicts = Verdicts()
    with cache.lock:
        for gpus in range(1, Verdicts.MAX_SHAPES + 3):
            request = WorkerRequest(gpus % 4 + 1, ServiceClass.GUARANTEED, gpu_memory_mib=gpus)
            verdicts.current(cache.cluster, request)
        assert len(verdicts._shapes) == Verdicts.MAX_SHAPES
    cache.upsert_pod(gpu_pod("a", 4, node="n-1"))
    with cache.lock:
        shape = verdicts.current(cache.cluster, REQUESTS[0])
        assert shape.filter(["n-1"]).failed == {"n-1": "0 of 4 GPUs free, worker needs 1"}


def test_filter_over_http_follows_each_change_between_two_pods():
    """Through the verbs: the node filter handed out is the best fit until the watch shows it
    taken; then the next pod gets another and the full node is reported failed."""
    from fastapi.testclient import TestClient

    from gangshare.extender.app import VerbsApp
    from gangshare.extender.metrics import ExtenderMetrics

    cache = cache_with(FOUR, [gpu_pod("a", 3, node="n-1")])
    client = TestClient(VerbsApp(cache, None, ExtenderMetrics()), client=("127.0.0.1", 5))
    names = ["n-0", "n-1", "n-2"]

    def filter_(pod):
        return client.post("/filter", json={"Pod": pod, "NodeNames": names}).json()

    assert filter_(gpu_pod("b", 1))["NodeNames"] == ["n-1"]  # best fit: n-1's last GPU
    cache.upsert_pod(gpu_pod("b", 1, node="n-1"))  # its binding, as the watch brings it
    answer = filter_(gpu_pod("c", 1))
    assert answer["FailedNodes"] == {"n-1": "0 of 4 GPUs free, worker needs 1"}
    assert answer["NodeNames"] == ["n-0"]
    cache.delete_pod("default", "a")
    cache.delete_pod("default", "b")
    cache.forget("pod:default/c")
    assert filter_(gpu_pod("d", 4))["FailedNodes"] == {}
