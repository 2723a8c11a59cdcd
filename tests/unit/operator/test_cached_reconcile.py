"""A reconcile decides first from the watch-fed stores and reads the API server only when they
show work to do; the pod store's indexes stay true as pods come, move and go."""

from __future__ import annotations

from typing import Any

from fake_apiserver import FakeApiServer
from jobs import make_job, pod

from gangshare.core.clock import ManualClock
from gangshare.operator.informers import Informers, Store, pod_job, pod_node
from gangshare.operator.reconcile import OperatorOptions, Reconciler
from gangshare.operator.store_steps import CachedReads

PLACEMENT = [{"rank": 0, "node": "n-0", "gpus": [0]}, {"rank": 1, "node": "n-1", "gpus": [0]}]
READS = {"get_namespaced_custom_object", "list_namespaced_pod"}


def placed_gang(phase: str, **status: Any) -> dict[str, Any]:
    """A 2-worker gang admitted with PLACEMENT, in `phase`."""
    return (
        make_job("j")
        .spec(workers=2)
        .status(
            phase=phase,
            attempt=0,
            restarts=0,
            placement=PLACEMENT,
            observedGeneration=1,
            admittedAt="2027-01-15T08:00:00Z",
        )
        .status(**status)
        .build()
    )


def running_gang() -> dict[str, Any]:
    return placed_gang("Running", startedAt="2027-01-15T08:00:05Z")


def workers(*phases: str) -> list[dict[str, Any]]:
    return [pod("j", r, phase=ph, node=f"n-{r}") for r, ph in enumerate(phases)]


def reconciler_over(
    server: FakeApiServer, job: dict[str, Any], pods: list[dict[str, Any]]
) -> Reconciler:
    informers = Informers()
    informers.jobs.replace([job])
    informers.pods.replace(pods)
    api = server.kube_api()
    api.on_job_written = informers.jobs.assume
    api.on_pod_written = informers.pods.assume
    reconciler = Reconciler(api, ManualClock(1_800_000_000.0), OperatorOptions())
    reconciler.pods_on_node = informers.live_pods_on_node
    reconciler.cached = CachedReads(informers.jobs.get, informers.live_pods_of_job)
    return reconciler


def reads(server: FakeApiServer) -> list[str]:
    return [name for name, _ in server.calls if name in READS]


def settled(job: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, Any]:
    """The job as reconciles leave it once they have nothing more to write."""
    server = FakeApiServer(job, pods)
    plain = Reconciler(server.kube_api(), ManualClock(1_800_000_000.0), OperatorOptions())
    for _ in range(3):
        plain.reconcile("team", "j")
    before = len(server.writes())
    plain.reconcile("team", "j")
    assert len(server.writes()) == before
    return server.job


def test_a_running_gang_the_stores_show_unchanged_costs_no_request() -> None:
    pods = workers("Running", "Running")
    job = settled(running_gang(), pods)
    server = FakeApiServer(job, pods)
    reconciler = reconciler_over(server, job, pods)
    reconciler.reconcile("team", "j")
    reconciler.reconcile_soon("team", "j")
    assert server.calls == []
    sample = reconciler.metrics.reconciles.labels("cache")._value.get()  # type: ignore[attr-defined]
    assert sample == 2


def test_a_worker_that_left_the_live_pod_store_is_read_afresh_and_acted_on() -> None:
    # The worker failed: it left the live-pod store (its watch selects live pods), so the
    # stores show a gang short of a worker, and the API server is asked.
    job = running_gang()
    failed = pod("j", 0, phase="Failed", node="n-0", reason="Evicted", message="node drained")
    running = pod("j", 1, phase="Running", node="n-1")
    server = FakeApiServer(job, [failed, running])
    reconciler = reconciler_over(server, job, [running])
    reconciler.reconcile("team", "j")
    assert set(reads(server)) == READS
    assert ("patch_namespaced_custom_object_status", "j") in server.writes()
    assert server.job["status"]["phase"] == "Restarting"


def test_the_events_copy_of_the_job_wins_over_an_older_store_copy() -> None:
    # The store still holds the job as Running; the watch event carries a newer version that
    # asks for deletion of its workers (a spec change bumps the generation): the reconcile
    # must not decide from the older copy.
    stale = settled(running_gang(), workers("Running", "Running"))
    newer = settled(running_gang(), workers("Running", "Running"))
    newer["metadata"].update(resourceVersion="7", generation=2)
    pods = workers("Running", "Running")
    server = FakeApiServer(newer, pods)
    reconciler = reconciler_over(server, stale, pods)
    reconciler.reconcile_soon("team", "j", newer)
    assert set(reads(server)) == READS  # the new generation needs work: read afresh


def test_without_stores_every_reconcile_reads_the_api_server() -> None:
    job, pods = running_gang(), workers("Running", "Running")
    server = FakeApiServer(job, pods)
    reconciler = Reconciler(server.kube_api(), ManualClock(1_800_000_000.0), OperatorOptions())
    reconciler.reconcile("team", "j")
    assert set(reads(server)) == READS


def test_pod_indexes_follow_adds_moves_deletions_and_relists() -> None:
    store = Store("pods", {"job": pod_job, "node": pod_node})
    a0, a1 = pod("a", 0, node="n-0"), pod("a", 1)
    b0 = pod("b", 0, node="n-0", namespace="other")
    store.replace([a0, a1, b0])
    assert sorted(p["metadata"]["name"] for p in store.by("job", "team/a")) == [
        "a-worker-0",
        "a-worker-1",
    ]
    assert [p["metadata"]["name"] for p in store.by("job", "other/b")] == ["b-worker-0"]
    assert store.by("job", "other/a") == []
    assert len(store.by("node", "n-0")) == 2
    # a-worker-1 is bound (a newer version), a-worker-0 goes away
    bound = pod("a", 1, node="n-1")
    bound["metadata"]["resourceVersion"] = "5"
    store.apply("MODIFIED", bound)
    store.apply("DELETED", a0)
    assert [p["metadata"]["name"] for p in store.by("node", "n-1")] == ["a-worker-1"]
    assert [p["metadata"]["name"] for p in store.by("node", "n-0")] == ["b-worker-0"]
    assert [p["metadata"]["name"] for p in store.by("job", "team/a")] == ["a-worker-1"]
    # an older version never replaces a newer one, in the object or in an index
    older = pod("a", 1, node="n-9")
    older["metadata"]["resourceVersion"] = "4"
    store.apply("MODIFIED", older)
    assert store.by("node", "n-9") == [] and len(store.by("node", "n-1")) == 1
    store.replace([b0])
    assert store.by("job", "team/a") == [] and store.by("node", "n-1") == []
    assert store.by("node", "n-0") == [b0]


def test_a_new_job_is_queued_from_the_stores_alone() -> None:
    job = make_job("j").spec(workers=2).build()
    server = FakeApiServer(job, [])
    reconciler = reconciler_over(server, job, [])
    reconciler.reconcile_soon("team", "j", job)
    assert reads(server) == []
    assert server.job["status"]["phase"] == "Queued"
    # One write: a first queueing posts no event (the status says it).
    assert [name for name, _ in server.writes()] == ["patch_namespaced_custom_object_status"]


def test_a_gang_whose_workers_all_run_is_running_from_the_stores_alone() -> None:
    gated = [pod("j", r, gated=True) for r in (0, 1)]
    admitted = settled(placed_gang("Admitted"), gated)
    assert admitted["status"]["phase"] == "Admitted"
    pods = workers("Running", "Running")
    server = FakeApiServer(admitted, pods)
    reconciler = reconciler_over(server, admitted, pods)
    reconciler.reconcile_soon("team", "j")
    assert reads(server) == []
    assert server.job["status"]["phase"] == "Running"


def test_a_store_step_refused_for_a_changed_job_is_decided_again_from_the_api_server() -> None:
    job = make_job("j").spec(workers=2).build()
    server = FakeApiServer(job, [])
    moved = make_job("j").spec(workers=2).build()
    moved["metadata"]["resourceVersion"] = "9"
    server.job = moved
    server.conflict_on_stale = True
    reconciler = reconciler_over(server, job, [])
    reconciler.reconcile_soon("team", "j", job)
    statuses = [n for n, _ in server.calls if n == "patch_namespaced_custom_object_status"]
    assert len(statuses) == 2  # refused from the stores' copy, then written from a fresh read
    assert set(reads(server)) == READS
    assert server.job["status"]["phase"] == "Queued"


def test_an_admitted_gang_gets_its_service_and_pods_from_the_stores_with_no_read() -> None:
    admitted = placed_gang("Admitted")
    server = FakeApiServer(admitted, [])
    reconciler = reconciler_over(server, admitted, [])
    reconciler.reconcile("team", "j")
    names = [name for name, _ in server.calls]
    # A first attempt's first workers: the stores hold every pod the leader made, so neither
    # the job nor its pods are read; what it wrote is assumed, and the commit follows.
    assert reads(server) == [] and "read_namespaced_service" not in names
    assert names.count("create_namespaced_service") == 1
    assert names.count("create_namespaced_pod") == 2
    scheduled = [c for c in server.job["status"]["conditions"] if c["type"] == "GangScheduled"]
    assert scheduled and scheduled[0]["status"] == "True"
    assert not any(p["spec"].get("schedulingGates") for p in server.pods.values())


def test_a_worker_the_stores_did_not_show_sends_the_first_creation_to_a_fresh_read() -> None:
    # A worker of this attempt ended before the stores saw it (ended pods leave the live-pod
    # store): its create answers 409, and the reconcile decides again from the API server,
    # which shows the failed worker, instead of committing a gang around it.
    admitted = placed_gang("Admitted")
    failed = pod("j", 0, phase="Failed", node="n-0", reason="Evicted", message="node drained")
    server = FakeApiServer(admitted, [failed])
    reconciler = reconciler_over(server, admitted, [])
    reconciler.reconcile("team", "j")
    assert set(reads(server)) == READS
    conditions = {c["type"]: c["status"] for c in server.job["status"].get("conditions") or []}
    assert conditions.get("GangScheduled") != "True"
    assert server.job["status"]["phase"] == "Restarting"


def test_a_later_attempts_workers_are_made_from_a_fresh_read() -> None:
    requeued = placed_gang("Admitted", attempt=1)
    server = FakeApiServer(requeued, [])
    reconciler = reconciler_over(server, requeued, [])
    reconciler.reconcile("team", "j")
    assert set(reads(server)) == READS  # an earlier attempt's ended pods may still exist
    assert [n for n, _ in server.calls].count("create_namespaced_pod") == 2
