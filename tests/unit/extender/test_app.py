"""The extender's HTTP surface: real request shapes, clear 4xx errors, Error answers, metrics."""

import json

from fastapi.testclient import TestClient
from helpers import FakeBinder, cache_with, gpu_pod, recorded

from gangshare.core.clock import ManualClock
from gangshare.extender.app import create_app
from gangshare.extender.cache import ClusterCache
from gangshare.extender.metrics import ExtenderMetrics
from gangshare.extender.wire import MAX_BODY_BYTES

H100 = {
    "nodePools": [
        {
            "name": "h100",
            "count": 2,
            "gpusPerNode": 8,
            "nvlinkIslands": [[0, 1, 2, 3], [4, 5, 6, 7]],
        }
    ]
}


def client_for(cache, pods=None):
    binder = FakeBinder(pods or {})
    return TestClient(create_app(cache, binder, ExtenderMetrics())), binder  # type: ignore[arg-type]


def test_recorded_filter_prioritize_and_bind_round_trip():
    cache = cache_with(
        H100,
        [
            gpu_pod(
                "busy", 6, node="h100-0", annotations={"gangshare.io/planned-gpus": "0,1,2,3,4,5"}
            )
        ],
    )
    pod = recorded("filter")["Pod"]
    client, binder = client_for(cache, {"default/recorded": pod})
    filtered = client.post("/filter", json=recorded("filter"))
    assert filtered.status_code == 200
    assert filtered.json() == {
        "NodeNames": ["h100-0", "h100-1"],
        "Nodes": None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
    scores = {
        p["Host"]: p["Score"]
        for p in client.post("/prioritize", json=recorded("prioritize")).json()
    }
    assert scores["h100-0"] > scores["h100-1"]  # best fit: the node left with 0 free GPUs
    bound = client.post("/bind", json={**recorded("bind"), "Node": "h100-0"})
    assert bound.json() == {"Error": ""}
    assert binder.bound == [("recorded", "h100-0", (6, 7))]


def test_back_to_back_binds_never_share_a_gpu():
    cache = cache_with({"nodePools": [{"name": "n", "count": 1, "gpusPerNode": 4}]})
    pods = {f"default/p{i}": gpu_pod(f"p{i}", 1) for i in range(5)}
    client, binder = client_for(cache, pods)
    answers = [
        client.post(
            "/bind",
            json={
                "PodName": f"p{i}",
                "PodNamespace": "default",
                "PodUID": f"uid-p{i}",
                "Node": "n-0",
            },
        ).json()
        for i in range(5)
    ]
    assert [a["Error"] for a in answers[:4]] == ["", "", "", ""]
    assert answers[4]["Error"] == "0 of 4 GPUs free, worker needs 1"
    assert sorted(g for _, _, gpus in binder.bound for g in gpus) == [0, 1, 2, 3]
    assert cache.assumed_count() == 4


def test_a_failed_bind_forgets_its_assumption():
    cache = cache_with({"nodePools": [{"name": "n", "count": 1, "gpusPerNode": 1}]})
    client, binder = client_for(cache, {"default/p": gpu_pod("p", 1)})
    binder.fail = True
    answer = client.post(
        "/bind", json={"PodName": "p", "PodNamespace": "default", "Node": "n-0"}
    ).json()
    assert answer["Error"] == "binding refused by the test"
    assert cache.assumed_count() == 0 and cache.cluster.node("n-0").free_guaranteed == 1


def test_a_replaced_pod_is_not_bound():
    cache = cache_with({"nodePools": [{"name": "n", "count": 1, "gpusPerNode": 1}]})
    client, binder = client_for(cache, {"default/p": gpu_pod("p", 1)})
    answer = client.post(
        "/bind", json={"PodName": "p", "PodNamespace": "default", "PodUID": "old", "Node": "n-0"}
    )
    assert answer.json()["Error"] == "pod default/p was replaced (uid changed); not binding"
    assert binder.bound == []


def test_malformed_requests_get_a_4xx_naming_the_problem():
    client, _ = client_for(cache_with(H100))
    bad_json = client.post(
        "/filter", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert bad_json.status_code == 400 and bad_json.json()["error"].startswith(
        "body: not valid JSON"
    )
    no_pod = client.post("/filter", json={"NodeNames": ["a"]})
    assert no_pod.status_code == 422 and no_pod.json() == {"error": "Pod: Field required"}
    no_containers = recorded("filter")
    no_containers["Pod"]["spec"]["containers"] = []
    answer = client.post("/filter", json=no_containers)
    assert answer.status_code == 422 and answer.json()["error"].startswith(
        "Pod.spec.containers: List should have"
    )
    bind = client.post("/bind", json={"PodName": "", "PodNamespace": "default", "Node": "n"})
    assert bind.status_code == 422 and bind.json()["error"].startswith(
        "PodName: String should have at least 1"
    )
    huge = client.post(
        "/filter", content=b" " * (MAX_BODY_BYTES + 1), headers={"content-type": "application/json"}
    )
    assert huge.status_code == 413 and "byte limit" in huge.json()["error"]


def test_a_pod_with_a_broken_annotation_is_answered_with_error_not_a_crash():
    body = recorded("filter")
    body["Pod"]["metadata"]["annotations"]["gangshare.io/gpu-memory-mib"] = "lots"
    client, _ = client_for(cache_with(H100))
    answer = client.post("/filter", json=body)
    assert answer.status_code == 200
    assert answer.json()["Error"].startswith(
        "pod annotation gangshare.io/gpu-memory-mib: expected MiB"
    )
    assert answer.json()["NodeNames"] == []


def test_readiness_waits_for_the_cache_and_metrics_are_exported():
    cold = ClusterCache(ManualClock())
    client, _ = client_for(cold)
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 503
    cold.replace_nodes([])
    cold.replace_pods([])
    assert client.get("/readyz").status_code == 200
    client.post("/filter", json=recorded("filter"))
    client.post("/filter", content=b"[", headers={"content-type": "application/json"})
    text = client.get("/metrics").text
    assert 'gangshare_extender_requests_total{result="ok",verb="filter"} 1.0' in text
    assert 'gangshare_extender_requests_total{result="rejected",verb="filter"} 1.0' in text
    assert 'gangshare_extender_filtered_nodes_total{outcome="unresolvable"} 2.0' in text
    assert "gangshare_extender_request_duration_seconds_bucket" in text
    json.loads(client.get("/readyz").content)
