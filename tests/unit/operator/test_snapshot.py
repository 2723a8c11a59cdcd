"""The operator's cluster snapshot from API objects: who holds which GPUs."""

from jobs import make_job, nodes, pod

from gangshare.kube.snapshot import build_snapshot, node_unschedulable_reason

SPEC = {
    "nodePools": [{"name": "n", "count": 2, "gpusPerNode": 4, "nvlinkIslands": [[0, 1], [2, 3]]}]
}


def test_admitted_jobs_hold_their_placement_before_their_pods_exist():
    job = (
        make_job("a")
        .spec(workers=2, gpusPerWorker=2)
        .status(
            phase="Admitted",
            placement=[
                {"rank": 0, "node": "n-0", "gpus": [0, 1]},
                {"rank": 1, "node": "n-0", "gpus": [2, 3]},
            ],
            admittedAt="2026-01-01T00:00:00Z",
        )
    )
    snapshot = build_snapshot(nodes(SPEC), [], [job.build()])
    assert snapshot.cluster.node("n-0").free_guaranteed == 0
    assert snapshot.cluster.node("n-1").free_guaranteed == 4
    assert [(r.key, r.gpus) for r in snapshot.running] == [("team/a", 4)]


def test_queued_and_finished_jobs_hold_nothing():
    jobs = [
        make_job("q").status(phase="Queued").build(),
        make_job("done")
        .status(phase="Succeeded", placement=[{"rank": 0, "node": "n-0", "gpus": [0]}])
        .build(),
    ]
    snapshot = build_snapshot(nodes(SPEC), [], jobs)
    assert snapshot.cluster.count_with_free_at_least(4) == 2


def test_foreign_gpu_pods_hold_gpus_on_their_node():
    foreign = pod("other", 0, phase="Running", node="n-1", gpus=3)
    foreign["metadata"]["labels"] = {}
    snapshot = build_snapshot(nodes(SPEC), [foreign], [])
    assert snapshot.cluster.node("n-1").free_guaranteed == 1


def test_pods_of_an_admitted_job_are_not_counted_twice():
    job = (
        make_job("a")
        .status(phase="Running", placement=[{"rank": 0, "node": "n-0", "gpus": [0]}])
        .build()
    )
    snapshot = build_snapshot(nodes(SPEC), [pod("a", 0, phase="Running", node="n-0")], [job])
    assert snapshot.cluster.node("n-0").free_guaranteed == 3


def test_terminating_pods_of_a_restarted_gang_still_hold_gpus():
    job = make_job("a").status(phase="Restarting").build()
    old = pod("a", 0, phase="Running", node="n-0", gpus=2)
    old["metadata"]["annotations"]["gangshare.io/planned-gpus"] = "2,3"
    snapshot = build_snapshot(nodes(SPEC), [old], [job])
    assert [g.free_for_guaranteed for g in snapshot.cluster.node("n-0").gpus] == [
        True,
        True,
        False,
        False,
    ]


def test_node_reasons():
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert node_unschedulable_reason(ready) is None
    assert (
        node_unschedulable_reason({**ready, "spec": {"unschedulable": True}}) == "node is cordoned"
    )
    assert node_unschedulable_reason({"status": {"conditions": []}}) == "node is not Ready"
    tainted = {
        **ready,
        "spec": {"taints": [{"key": "gpu", "value": "broken", "effect": "NoSchedule"}]},
    }
    assert node_unschedulable_reason(tainted) == "node has taint gpu=broken:NoSchedule"
    cordoned = nodes(SPEC)
    cordoned[0]["spec"]["unschedulable"] = True
    assert (
        build_snapshot(cordoned, [], []).cluster.node("n-0").unschedulable_reason
        == "node is cordoned"
    )


def test_running_jobs_are_expected_to_end_by_the_prediction_they_were_admitted_with():
    placement = [{"rank": 0, "node": "n-0", "gpus": [0]}]
    started = "2026-01-01T00:00:00Z"
    declared = (
        make_job("a")
        .spec(runtimeEstimateSeconds=100)
        .status(phase="Running", placement=placement, startedAt=started)
    )
    predicted = make_job("b").status(
        phase="Running",
        placement=[{"rank": 0, "node": "n-1", "gpus": [0]}],
        startedAt=started,
        predictedRuntimeSeconds=250.0,
    )
    snapshot = build_snapshot(
        nodes(SPEC), [], [declared.build(), predicted.build()], default_runtime_seconds=60
    )
    ends = {r.key: r.expected_end for r in snapshot.running}
    start = 1767225600.0
    assert ends == {"team/a": start + 100, "team/b": start + 250}
