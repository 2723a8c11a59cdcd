"""The extender's HTTP surface: real request shapes, clear 4xx errors, Error answers, metrics."""

import json
import time
from typing import Any

from fastapi.testclient import TestClient
from helpers import FakeBinder, cache_with, gpu_pod, recorded, trainingjob, worker

from gangshare.core.clock import ManualClock
from gangshare.extender.app import VerbsApp, create_ops_app
from gangshare.extender.cache import ClusterCache
from gangshare.extender.health import Health
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


def client_for(cache, pods=None, peer="127.0.0.1"):
    """A client that calls from `peer`, as kube-scheduler beside the extender does (loopback)."""
    binder = FakeBinder(pods or {})
    app = VerbsApp(cache, binder, ExtenderMetrics())  # type: ignore[arg-type]
    return TestClient(app, client=(peer, 50000)), binder


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
    # Both fit; filter answers only the best fit (the node left with 0 free GPUs), so
    # kube-scheduler needs no prioritize call to pick it.
    assert filtered.json() == {
        "NodeNames": ["h100-0"],
        "Nodes": None,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }
    scores = {
        p["Host"]: p["Score"]
        for p in client.post("/prioritize", json=recorded("prioritize")).json()
    }
    assert scores["h100-0"] > scores["h100-1"]  # prioritize, if configured, agrees
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
    assert no_pod.status_code == 422 and no_pod.json() == {"error": "Pod: required"}
    no_containers = recorded("filter")
    no_containers["Pod"]["spec"]["containers"] = []
    answer = client.post("/filter", json=no_containers)
    assert answer.status_code == 422 and answer.json()["error"].startswith(
        "Pod.spec.containers: needs at least one container"
    )
    bind = client.post("/bind", json={"PodName": "", "PodNamespace": "default", "Node": "n"})
    assert bind.status_code == 422 and bind.json()["error"].startswith("PodName: must not be empty")
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
    metrics = ExtenderMetrics()
    client = TestClient(VerbsApp(cold, None, metrics), client=("127.0.0.1", 1))
    ops = TestClient(create_ops_app(cold, metrics, Health(cold)), client=("10.0.0.9", 1))
    assert client.get("/healthz").status_code == 200
    for surface in (client, ops):
        assert surface.get("/readyz").status_code == 503
    cold.replace_nodes([])
    cold.replace_pods([])
    assert ops.get("/readyz").status_code == 503  # TrainingJobs not synced yet
    cold.replace_jobs([])
    assert ops.get("/readyz").status_code == 200
    client.post("/filter", json=recorded("filter"))
    client.post("/filter", content=b"[", headers={"content-type": "application/json"})
    # The verbs' listener has no /metrics; the ops listener has no verbs.
    assert client.get("/metrics").status_code == 404
    assert ops.post("/filter", json=recorded("filter")).status_code in (404, 405)
    text = ops.get("/metrics").text
    assert 'gangshare_extender_requests_total{result="ok",verb="filter"} 1.0' in text
    assert 'gangshare_extender_requests_total{result="rejected",verb="filter"} 1.0' in text
    assert 'gangshare_extender_filtered_nodes_total{outcome="unresolvable"} 2.0' in text
    assert "gangshare_extender_request_duration_seconds_bucket" in text
    json.loads(ops.get("/readyz").content)


def test_verbs_refuse_callers_that_are_not_the_scheduler_on_loopback():
    cache = cache_with(H100)
    pod = recorded("filter")["Pod"]
    remote, binder = client_for(cache, {"default/recorded": pod}, peer="192.0.2.7")
    for verb, body in (
        ("filter", recorded("filter")),
        ("prioritize", recorded("prioritize")),
        ("bind", {**recorded("bind"), "Node": "h100-0"}),
    ):
        answer = remote.post(f"/{verb}", json=body)
        assert answer.status_code == 403, verb
        assert "answer only kube-scheduler on loopback" in answer.json()["error"]
    assert binder.bound == []
    ipv6, _ = client_for(cache, {"default/recorded": pod}, peer="::1")
    assert ipv6.post("/filter", json=recorded("filter")).status_code == 200


def test_bind_binds_only_pending_ungated_gpu_pods_of_gangshares_scheduler():
    cache = cache_with({"nodePools": [{"name": "n", "count": 1, "gpusPerNode": 4}]})
    foreign = gpu_pod("foreign", 1)
    foreign["spec"]["schedulerName"] = "default-scheduler"
    bound = gpu_pod("bound", 1, node="n-0")
    gated = gpu_pod("gated", 1)
    gated["spec"]["schedulingGates"] = [{"name": "gangshare.io/gang"}]
    cpu = gpu_pod("cpu", 1)
    cpu["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    pods = {f"default/{p['metadata']['name']}": p for p in (foreign, bound, gated, cpu)}
    client, binder = client_for(cache, pods)

    def bind(name):
        body = {"PodName": name, "PodNamespace": "default", "PodUID": f"uid-{name}", "Node": "n-0"}
        return client.post("/bind", json=body).json()["Error"]

    assert bind("foreign") == (
        "pod default/foreign belongs to scheduler 'default-scheduler', not gangshare's"
    )
    assert bind("bound") == "pod default/bound is already bound to n-0"
    assert bind("gated") == "pod default/gated still has scheduling gates"
    assert bind("cpu") == "pod default/cpu requests no GPUs; gangshare binds only GPU pods"
    assert binder.bound == [] and cache.assumed_count() == 0


def test_record_writes_only_its_fixed_files_inside_its_folder(tmp_path):
    folder = tmp_path / "a" / "b" / "record"
    folder.mkdir(parents=True)
    cache = cache_with(H100)
    app = VerbsApp(cache, None, ExtenderMetrics(), record=folder)
    client = TestClient(app, client=("127.0.0.1", 1))
    client.post("/filter", json=recorded("filter"))
    for path in ("/..%2fescaped", "/..%2f..%2fescaped", "/%2e%2e%2fescaped", "/x%2f..%2f..%2fy"):
        client.post(path, content=b"{}")
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert written == ["a/b/record/filter-request.json"]


def test_liveness_fails_when_a_watch_goes_silent():
    cache = cache_with(H100)
    health = Health(cache, silence_limit=60)
    ops = TestClient(create_ops_app(cache, ExtenderMetrics(), health))
    assert ops.get("/healthz").status_code == 200
    cache.heard["trainingjobs"] -= 61
    answer = ops.get("/healthz")
    assert answer.status_code == 503
    assert answer.json()["status"].startswith("trainingjobs watch has heard nothing")


def filter_body(pod, nodes):
    return {"Pod": pod, "NodeNames": nodes}


def test_a_plan_the_watch_has_not_delivered_is_read_from_the_api_server():
    cache = cache_with(H100)
    pod = worker("llm", 0, 2)
    client, binder = client_for(cache)
    # No such job (yet, or any more): the worker is refused everywhere, with the reason.
    refused = client.post("/filter", json=filter_body(pod, ["h100-0", "h100-1"])).json()
    assert refused["NodeNames"] == [] and binder.job_reads == ["default/llm"]
    assert "holds no plan for worker 0 of attempt 0 (yet)" in refused["FailedNodes"]["h100-0"]
    # Committed but not watched yet: read through, so the worker need not wait for
    # kube-scheduler's next retry of an unschedulable pod (minutes).
    binder.jobs["default/llm"] = trainingjob("llm", [("h100-1", [4, 5])])
    passed = client.post("/filter", json=filter_body(pod, ["h100-0", "h100-1"])).json()
    assert passed["NodeNames"] == ["h100-1"]
    assert cache.cluster.node("h100-1").free_guaranteed == 6
    # Known now: no further read.
    client.post("/filter", json=filter_body(pod, ["h100-0", "h100-1"]))
    assert binder.job_reads == ["default/llm", "default/llm"]


def test_a_read_through_never_overwrites_what_the_watch_delivered_meanwhile():
    cache = cache_with(H100)
    seen = cache.job_version("default/llm")
    stale = trainingjob("llm", [("h100-0", [0, 1])])
    # While the read was in flight the watch delivered the job released (Queued, no plan).
    cache.upsert_job(trainingjob("llm", [("h100-0", [0, 1])], phase="Queued"))
    assert not cache.fill_job("default/llm", stale, seen)
    assert cache.ledger.job("default/llm") is None
    assert cache.cluster.node("h100-0").free_guaranteed == 8
    # A relist counts too.
    seen = cache.job_version("default/llm")
    cache.replace_jobs([])
    assert not cache.fill_job("default/llm", stale, seen)
    assert cache.fill_job("default/llm", stale, cache.job_version("default/llm"))
    assert cache.cluster.node("h100-0").free_guaranteed == 6


def gang_of_two_with_the_second_gated() -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """An admitted two-worker gang, worker 0 in the cache; worker 1 still carries its gate."""
    cache = cache_with(H100)
    cache.upsert_job(trainingjob("llm", [("h100-0", [0, 1]), ("h100-1", [0, 1])]))
    first, second = worker("llm", 0, 2), worker("llm", 1, 2)
    second["spec"]["schedulingGates"] = [{"name": "gangshare.io/gang"}]
    cache.upsert_pod(first)
    return cache, first, second


def test_a_gang_worker_passes_filter_only_once_every_sibling_exists_ungated():
    cache, first, second = gang_of_two_with_the_second_gated()
    cache.upsert_pod(second)
    app = VerbsApp(cache, FakeBinder({}), ExtenderMetrics())  # type: ignore[arg-type]
    client = TestClient(app, client=("127.0.0.1", 50000))
    nodes = ["h100-0", "h100-1"]

    def filtered() -> tuple[dict[str, Any], float]:
        started = time.perf_counter()
        answer = client.post("/filter", json=filter_body(first, nodes)).json()
        return answer, time.perf_counter() - started

    refused, took = filtered()
    assert refused["NodeNames"] == []
    assert refused["FailedNodes"] == dict.fromkeys(
        nodes,
        "gang not wholly ungated (refusal 1): worker 1 is still gated; not placing a part of it",
    )
    # Refused at once (kube-scheduler schedules nothing else while filter is out), and each
    # refusal reads differently, so kube-scheduler records it and the operator answers it.
    assert took < 0.1
    again, _ = filtered()
    assert again["FailedNodes"]["h100-0"].startswith("gang not wholly ungated (refusal 2): ")
    del second["spec"]["schedulingGates"]
    cache.upsert_pod(second)
    passed, _ = filtered()
    assert passed["NodeNames"] == ["h100-0"]
    cache.upsert_pod(second | {"spec": {**second["spec"], "schedulingGates": [{"name": "g"}]}})
    assert "(refusal 1)" in filtered()[0]["FailedNodes"]["h100-0"]  # counted afresh


def test_a_gang_worker_binds_only_once_every_sibling_exists_ungated():
    cache, _first, second = gang_of_two_with_the_second_gated()
    binder = FakeBinder({})
    app = VerbsApp(cache, binder, ExtenderMetrics(), gang_barrier_seconds=0.05)  # type: ignore[arg-type]
    client = TestClient(app, client=("127.0.0.1", 50000))
    body = {"PodName": "llm-worker-0", "PodNamespace": "default", "PodUID": "uid-llm-worker-0"}

    def bind() -> str:
        return client.post("/bind", json={**body, "Node": "h100-0"}).json()["Error"]

    assert bind() == (
        "gang not wholly ungated: worker 1 of attempt 0 does not exist yet; "
        "not binding a part of it"
    )
    cache.upsert_pod(second)
    assert bind() == "gang not wholly ungated: worker 1 is still gated; not binding a part of it"
    assert binder.bound == []
    # A sibling of another attempt is not this gang's worker.
    cache.upsert_pod(worker("llm", 1, 2, attempt=1))
    assert "worker 1 of attempt 0 does not exist yet" in bind()
    cache.upsert_pod(worker("llm", 1, 2))
    assert bind() == ""
    assert binder.bound == [("llm-worker-0", "h100-0", (0, 1))]


def test_a_sibling_that_already_ran_to_completion_does_not_hold_its_gang_back():
    cache = cache_with(H100)
    cache.upsert_job(trainingjob("llm", [("h100-0", [0, 1]), ("h100-1", [0, 1])]))
    cache.upsert_pod(worker("llm", 0, 2))
    # Worker 1 was bound first and has finished (its GPUs are no longer held).
    done = worker("llm", 1, 2, node="h100-1")
    done["status"]["phase"] = "Succeeded"
    cache.upsert_pod(done)
    binder = FakeBinder({})
    app = VerbsApp(cache, binder, ExtenderMetrics(), gang_barrier_seconds=0.05)  # type: ignore[arg-type]
    client = TestClient(app, client=("127.0.0.1", 50000))
    body = {"PodName": "llm-worker-0", "PodNamespace": "default", "PodUID": "uid-llm-worker-0"}
    assert client.post("/bind", json={**body, "Node": "h100-0"}).json()["Error"] == ""
    assert binder.bound == [("llm-worker-0", "h100-0", (0, 1))]


def test_a_gated_copy_in_the_cache_is_read_again_before_bind_refuses():
    cache = cache_with({"nodePools": [{"name": "n", "count": 1, "gpusPerNode": 4}]})
    stale = gpu_pod("late", 1)
    stale["spec"]["schedulingGates"] = [{"name": "gangshare.io/gang"}]
    cache.upsert_pod(stale)
    client, binder = client_for(cache, {"default/late": gpu_pod("late", 1)})
    body = {"PodName": "late", "PodNamespace": "default", "PodUID": "uid-late", "Node": "n-0"}
    assert client.post("/bind", json=body).json()["Error"] == ""
    assert [name for name, _node, _gpus in binder.bound] == ["late"]


def test_filter_hands_one_node_and_holds_it_until_the_binding_comes_back():
    """Two 1-GPU pods filtered before the watch brings the first one's binding: without a
    hold both get the last GPU beside a 7-GPU plan, and kube-scheduler (which does not count
    gated gang workers) binds both, displacing the gang."""
    cache = cache_with(H100)
    cache.upsert_job(trainingjob("big", [("h100-0", [0, 1, 2, 3, 4, 5, 6])]))
    client, _ = client_for(cache)
    nodes = ["h100-0", "h100-1"]
    first, second = gpu_pod("a", 1), gpu_pod("b", 1)
    answer = client.post("/filter", json=filter_body(first, nodes)).json()
    assert answer["NodeNames"] == ["h100-0"]  # best fit: the last free GPU beside the plan
    assert client.post("/filter", json=filter_body(second, nodes)).json()["NodeNames"] == ["h100-1"]
    assert cache.ledger.displaced() == {}
    # Filtered again (kube-scheduler retries a pod it could not bind): its old hold goes first.
    assert client.post("/filter", json=filter_body(first, nodes)).json()["NodeNames"] == ["h100-0"]
    assert cache.assumed_count() == 2
    # The binding comes back: the bound pod is the fact now, and the hold is gone.
    cache.upsert_pod(gpu_pod("a", 1, node="h100-0"))
    assert cache.assumed_count() == 1 and cache.ledger.displaced() == {}
    # A hold no binding confirms is forgotten after the TTL.
    cache.clock.advance(31)  # type: ignore[attr-defined]
    assert cache.expire_assumptions() == 1
    assert cache.cluster.node("h100-1").free_guaranteed == 8


def test_a_gang_whose_lift_is_committed_passes_while_its_gates_come_off():
    """The operator writes GangScheduled before the first gate comes off: from then on the
    lift finishes whatever happens, so a worker need not wait for its siblings' gates (each
    refusal costs kube-scheduler a synchronous status write in its one loop)."""
    cache, first, second = gang_of_two_with_the_second_gated()
    cache.upsert_pod(second)
    committed = trainingjob("llm", [("h100-0", [0, 1]), ("h100-1", [0, 1])])
    committed["status"]["conditions"] = [{"type": "GangScheduled", "status": "True"}]
    cache.upsert_job(committed)
    client, _ = client_for(cache)
    answer = client.post("/filter", json=filter_body(first, ["h100-0", "h100-1"])).json()
    assert answer["NodeNames"] == ["h100-0"] and answer["FailedNodes"] == {}
