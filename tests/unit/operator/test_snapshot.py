"""The operator's cluster snapshot from API objects: who holds which GPUs."""

import pytest
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


def test_a_sidecars_gpus_are_held_like_any_containers():
    foreign = pod("other", 0, phase="Running", node="n-1", gpus=0)
    foreign["metadata"]["labels"] = {}
    foreign["spec"]["initContainers"] = [
        {
            "name": "side",
            "restartPolicy": "Always",
            "resources": {"limits": {"nvidia.com/gpu": "3"}},
        }
    ]
    snapshot = build_snapshot(nodes(SPEC), [foreign], [])
    assert snapshot.cluster.node("n-1").free_guaranteed == 1


def test_the_kubelets_assignment_is_the_truth_and_the_plan_only_a_plan():
    moved = pod("other", 0, phase="Running", node="n-1", gpus=2)
    moved["metadata"]["labels"] = {}
    moved["metadata"]["annotations"] = {
        "gangshare.io/planned-gpus": "0,1",
        "gangshare.io/assigned-gpus": "2,3",  # what the node agent read from PodResources
    }
    node = build_snapshot(nodes(SPEC), [moved], []).cluster.node("n-1")
    assert [g.index for g in node.gpus if g.guaranteed is not None] == [2, 3]


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
    # A taint keeps off only the pods that do not tolerate it: the node stays schedulable, and
    # its taints go with it for the planner to check against each job's tolerations.
    tainted = {
        **ready,
        "spec": {"taints": [{"key": "gpu", "value": "broken", "effect": "NoSchedule"}]},
    }
    assert node_unschedulable_reason(tainted) is None
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


# ----- one ledger: facts first, plans last, and what breaks a plan ---------------------------


def admitted_job(name="a", placement=None, attempt=0, **spec):
    placement = placement or [{"rank": 0, "node": "n-0", "gpus": [0, 1]}]
    job = make_job(name).spec(workers=len(placement), gpusPerWorker=2, **spec)
    return job.status(phase="Admitted", attempt=attempt, placement=placement)


def test_a_bound_pod_on_a_planned_gpu_displaces_the_gang_and_keeps_its_gpu():
    intruder = pod("bare", 0, phase="Running", node="n-0", gpus=1)
    intruder["metadata"].update(labels={}, ownerReferences=[])
    intruder["metadata"]["annotations"]["gangshare.io/planned-gpus"] = "1"
    snapshot = build_snapshot(nodes(SPEC), [intruder], [admitted_job().build()])
    assert snapshot.displaced == {
        "team/a": "planned GPU 1 on n-0 is taken by pod:team/bare-worker-0"
    }
    # The GPU the pod really uses is counted for it; the broken plan holds nothing more.
    assert [g.free_for_guaranteed for g in snapshot.cluster.node("n-0").gpus] == [
        True,
        False,
        True,
        True,
    ]


def bare_pod(name: str, node: str, gpus: int) -> dict:
    """A GPU pod kube-scheduler bound, with no GPUs recorded on it (no agent on the node)."""
    bare = pod(name, 0, phase="Running", node=node, gpus=gpus)
    bare["metadata"].update(labels={}, ownerReferences=[])
    return bare


def held_gpus(snapshot, node: str) -> dict[str, list[int]]:
    holders: dict[str, list[int]] = {}
    for gpu in snapshot.cluster.node(node).gpus:
        if gpu.guaranteed is not None:
            holders.setdefault(gpu.guaranteed.owner, []).append(gpu.gpu.index)
    return holders


def test_an_unrecorded_pod_beside_a_plan_is_counted_on_the_gpus_the_plan_leaves():
    # Held first, the best-fit choice for 2 GPUs on an empty node was the plan's own island.
    snapshot = build_snapshot(nodes(SPEC), [bare_pod("bare", "n-0", 2)], [admitted_job().build()])
    assert snapshot.displaced == {}
    assert held_gpus(snapshot, "n-0") == {"team/a/0": [0, 1], "pod:team/bare-worker-0": [2, 3]}


def test_an_unrecorded_pod_with_no_room_left_beside_a_plan_still_wins_by_count():
    snapshot = build_snapshot(nodes(SPEC), [bare_pod("bare", "n-0", 3)], [admitted_job().build()])
    [reason] = snapshot.displaced.values()
    assert reason.startswith("planned GPU ") and reason.endswith("taken by pod:team/bare-worker-0")
    assert len(held_gpus(snapshot, "n-0")["pod:team/bare-worker-0"]) == 3


def test_unrecorded_pods_are_held_the_same_whatever_order_they_are_seen_in():
    pods = [bare_pod(f"b{i}", "n-1", 1) for i in range(3)] + [bare_pod("c", "n-0", 1)]
    jobs = [admitted_job().build()]

    def holders(listed):
        snapshot = build_snapshot(nodes(SPEC), listed, jobs)
        return held_gpus(snapshot, "n-0"), held_gpus(snapshot, "n-1")

    on_n0, on_n1 = holders(pods)
    assert (on_n0, on_n1) == holders(pods[::-1])
    assert on_n0["team/a/0"] == [0, 1] and len(on_n0) == 2
    assert sorted(g for gpus in on_n1.values() for g in gpus) == [0, 1, 2]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda n: n.pop(0), "planned node n-0 no longer exists"),
        (
            lambda n: n[0]["spec"].update(unschedulable=True),
            "planned node n-0: node is cordoned",
        ),
        (
            lambda n: n[0]["spec"].update(taints=[{"key": "maint", "effect": "NoSchedule"}]),
            "planned node n-0: node has taint maint:NoSchedule the worker does not tolerate",
        ),
    ],
)
def test_a_planned_node_that_goes_away_or_turns_unusable_displaces_the_gang(change, reason):
    objects = nodes(SPEC)
    change(objects)
    snapshot = build_snapshot(objects, [], [admitted_job().build()])
    assert snapshot.displaced == {"team/a": reason}


def test_a_tolerated_taint_or_a_bound_worker_keeps_the_plan():
    objects = nodes(SPEC)
    objects[0]["spec"]["taints"] = [{"key": "maint", "effect": "NoSchedule"}]
    template = {
        "spec": {
            "tolerations": [{"key": "maint", "operator": "Exists"}],
            "containers": [{"name": "t", "image": "i"}],
        }
    }
    tolerant = admitted_job(template=template).build()
    assert build_snapshot(objects, [], [tolerant]).displaced == {}
    # Already bound, a worker is a fact: cordoning its node later breaks nothing.
    objects[0]["spec"] = {"unschedulable": True}
    bound = pod("a", 0, phase="Running", node="n-0", gpus=2)
    snapshot = build_snapshot(objects, [bound], [admitted_job().build()])
    assert snapshot.displaced == {} and snapshot.cluster.node("n-0").free_guaranteed == 2


def test_only_the_jobs_own_current_workers_count_as_its_plan():
    job = admitted_job(attempt=1).build()
    # A worker of the previous attempt, still bound while it shuts down: a fact of its own.
    old = pod("a", 0, attempt=0, phase="Running", node="n-0", gpus=2)
    old["metadata"]["annotations"]["gangshare.io/planned-gpus"] = "2,3"
    # A pending pod claiming a plan in its own annotations reserves nothing.
    forged = pod("x", 0, phase="Pending", gpus=2)
    forged["metadata"]["annotations"].update(
        {"gangshare.io/planned-node": "n-1", "gangshare.io/planned-gpus": "0,1"}
    )
    snapshot = build_snapshot(nodes(SPEC), [old, forged], [job])
    assert snapshot.cluster.node("n-0").free_guaranteed == 0  # plan 0,1 + old pod 2,3
    assert snapshot.cluster.node("n-1").free_guaranteed == 4
    assert snapshot.displaced == {}


def test_a_plan_takes_its_workers_cpu_until_they_are_bound():
    objects = nodes(SPEC)
    objects[0]["status"]["allocatable"]["cpu"] = "32"
    template = {
        "spec": {
            "containers": [{"name": "t", "image": "i", "resources": {"requests": {"cpu": "12"}}}]
        }
    }
    job = admitted_job(template=template).build()
    snapshot = build_snapshot(objects, [], [job])
    assert snapshot.cluster.node("n-0").requested == {"cpu": 12_000, "pods": 1}
    # Bound, the worker's requests come from the pod list instead: never counted twice.
    bound = pod("a", 0, phase="Running", node="n-0", gpus=2)
    bound["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "12"}
    snapshot = build_snapshot(objects, [bound], [job])
    assert snapshot.cluster.node("n-0").requested == {"cpu": 12_000, "pods": 1}


ISLANDS = {
    "nodePools": [
        {"name": "i", "count": 1, "gpusPerNode": 8, "nvlinkIslands": [[0, 1, 2, 3], [4, 5, 6, 7]]}
    ]
}


@pytest.mark.parametrize(
    ("policy", "assigned", "broken"),
    [
        ("Required", "0,1,2,4", True),  # the kubelet spread the worker over both islands
        ("Required", "4,5,6,7", False),  # another island, but one island: kept
        ("Preferred", "0,1,2,4", False),  # a preference may be missed
    ],
)
def test_a_worker_given_gpus_across_islands_breaks_a_required_topology(policy, assigned, broken):
    placement = [{"rank": 0, "node": "i-0", "gpus": [0, 1, 2, 3]}]
    job = (
        make_job("w")
        .spec(workers=1, gpusPerWorker=4, topology={"policy": policy, "scope": "NVLink"})
        .status(phase="Running", attempt=0, placement=placement)
        .build()
    )
    worker = pod("w", 0, phase="Running", node="i-0", gpus=4)
    worker["metadata"]["annotations"] = {"gangshare.io/assigned-gpus": assigned}
    found = build_snapshot(nodes(ISLANDS), [worker], [job]).off_island
    if broken:
        assert found == {
            "team/w": "worker 0 was given GPUs [0, 1, 2, 4] on i-0, across NVLink islands; "
            "spec.topology requires one island per worker"
        }
    else:
        assert found == {}
