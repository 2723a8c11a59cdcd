"""Pending reasons: written on transitions at once, text-only changes throttled, a budget per
pass; and what the operator's watch-fed stores and backstop resync decide."""

from __future__ import annotations

import threading
from typing import Any

from jobs import make_job

from gangshare.core.cycle import Pending, PendingKind
from gangshare.core.queueing import QueuePolicy
from gangshare.core.queues import QueueSpec
from gangshare.kube.trainingjob import parse_trainingjob
from gangshare.operator.informers import Store, newer
from gangshare.operator.lifecycle import job_needs_reconcile
from gangshare.operator.pending import PendingReasons, detect_pending_write
from gangshare.operator.resync import resync_worthy

POLICY = QueuePolicy()


class RecordingApi:
    """Records status writes and events (the KubeApi calls PendingReasons makes)."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, dict[str, Any]]] = []
        self.events: list[tuple[str, str]] = []

    def patch_job_status(self, job: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        self.writes.append((job["metadata"]["name"], status))
        job["status"] = {**(job.get("status") or {}), **status}
        return job

    def post_event(self, job: dict[str, Any], kind: str, reason: str, message: str, action: str):
        self.events.append((job["metadata"]["name"], reason))


def queued(name: str) -> dict[str, Any]:
    return make_job(name).status(phase="Queued", observedGeneration=1).build()


def waiting(job: dict[str, Any], reason: str, kind: PendingKind) -> Pending:
    return Pending(parse_trainingjob(job).queued(0.0), reason, kind)


def test_a_new_kind_of_wait_is_a_transition_and_the_same_text_is_no_write():
    job = queued("a")
    first = detect_pending_write(job, waiting(job, "quota: 8 of 8", PendingKind.QUOTA), POLICY, 0)
    assert first is not None and first.transition
    assert first.status["message"] == "quota: 8 of 8"
    admitted = first.status["conditions"][0]
    assert (admitted["type"], admitted["status"], admitted["reason"]) == (
        "Admitted",
        "False",
        "QuotaExceeded",
    )
    job["status"].update(first.status)
    same = detect_pending_write(job, waiting(job, "quota: 8 of 8", PendingKind.QUOTA), POLICY, 1)
    assert same is None
    moved = detect_pending_write(job, waiting(job, "quota: 4 of 8", PendingKind.QUOTA), POLICY, 2)
    assert moved is not None and not moved.transition


def test_inadmissible_names_why_and_a_change_of_why_is_a_transition():
    policy = QueuePolicy(require_known_queue=True)
    job = queued("a")
    pending = waiting(job, "queue default does not exist", PendingKind.INADMISSIBLE)
    write = detect_pending_write(job, pending, policy, 0)
    assert write is not None and write.transition
    blocked = [c for c in write.status["conditions"] if c["type"] == "Inadmissible"]
    assert blocked[0]["status"] == "True" and blocked[0]["reason"] == "QueueNotFound"
    job["status"].update(write.status)
    known = QueuePolicy(require_known_queue=True, queues={"default": QueueSpec("default")})
    fits_nowhere = waiting(job, "fits on no node", PendingKind.INADMISSIBLE)
    again = detect_pending_write(job, fits_nowhere, known, 1)
    assert again is not None and again.transition  # QueueNotFound -> CannotFit


def test_text_only_changes_wait_for_the_refresh_and_post_no_event():
    api = RecordingApi()
    reasons = PendingReasons(api, writes_per_pass=10, refresh_seconds=60)  # type: ignore[arg-type]
    job = queued("a")
    by_key = {"team/a": job}
    assert reasons.explain([waiting(job, "used 1", PendingKind.QUOTA)], by_key, POLICY, 0) == 1
    assert reasons.explain([waiting(job, "used 2", PendingKind.QUOTA)], by_key, POLICY, 30) == 0
    assert job["status"]["message"] == "used 1"
    assert reasons.explain([waiting(job, "used 3", PendingKind.QUOTA)], by_key, POLICY, 61) == 1
    assert job["status"]["message"] == "used 3"
    # A transition does not wait for the refresh.
    behind = waiting(job, "waiting behind team/x", PendingKind.BEHIND)
    assert reasons.explain([behind], by_key, POLICY, 62) == 1
    assert api.events == [
        ("a", "QuotaExceeded")
    ]  # one event: the first transition (BEHIND posts none)


def test_a_pass_writes_at_most_its_budget_in_queue_order_and_the_rest_follow():
    api = RecordingApi()
    reasons = PendingReasons(api, writes_per_pass=3)  # type: ignore[arg-type]
    jobs = [queued(f"j{i}") for i in range(7)]
    by_key = {f"team/{j['metadata']['name']}": j for j in jobs}
    pending = [waiting(j, "no room", PendingKind.UNSCHEDULABLE) for j in jobs]
    assert reasons.explain(pending, by_key, POLICY, 0) == 3
    assert [name for name, _ in api.writes] == ["j0", "j1", "j2"]
    assert reasons.explain(pending, by_key, POLICY, 1) == 3
    assert reasons.explain(pending, by_key, POLICY, 2) == 1
    assert reasons.explain(pending, by_key, POLICY, 3) == 0
    assert all(j["status"]["message"] == "no room" for j in jobs)


def test_a_store_keeps_an_assumed_write_over_an_older_watch_event():
    store = Store("trainingjobs")
    store.replace([make_job("a").build()])
    written = make_job("a").status(phase="Admitted").build()
    written["metadata"]["resourceVersion"] = "7"
    store.assume(written)
    older = make_job("a").status(phase="Queued").build()
    older["metadata"]["resourceVersion"] = "5"
    store.apply("MODIFIED", older)
    assert store.items()[0]["status"]["phase"] == "Admitted"
    later = make_job("a").status(phase="Running").build()
    later["metadata"]["resourceVersion"] = "9"
    store.apply("MODIFIED", later)
    assert store.items()[0]["status"]["phase"] == "Running"
    store.apply("DELETED", later)
    assert store.items() == []


def test_resource_versions_compare_as_numbers_and_anything_else_counts_as_newer():
    def at(version: str) -> dict[str, Any]:
        return {"metadata": {"resourceVersion": version}}

    assert newer(at("10"), at("9")) and not newer(at("9"), at("10"))
    assert newer(at("9"), at("9")) and newer(at("x1"), at("9")) and newer(at("1"), None)


def test_the_backstop_resync_skips_queued_jobs_with_nothing_to_look_after():
    current = queued("a")
    assert not resync_worthy(current, owners=set())
    assert resync_worthy(current, owners={"team/a"})  # a live pod of an earlier attempt
    assert resync_worthy(current, owners=None)  # no pod store: look at everything
    stale = make_job("a").status(phase="Queued", observedGeneration=0).build()
    assert resync_worthy(stale, owners=set())
    assert resync_worthy(make_job("a").status(phase="Running").build(), owners=set())


def test_only_job_events_with_work_reach_the_reconciler():
    assert not job_needs_reconcile(queued("a"))
    assert job_needs_reconcile(make_job("a").build())  # new: to be enqueued
    assert job_needs_reconcile(make_job("a").status(phase="Admitted").build())
    edited = make_job("a").status(phase="Queued", observedGeneration=0).build()
    assert job_needs_reconcile(edited)
    deleting = queued("a")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert job_needs_reconcile(deleting)


def test_queued_jobs_are_parsed_once_per_resource_version(monkeypatch):
    from gangshare.operator import waiting as module

    parses: list[str] = []
    real = module.parse_trainingjob

    def counting(job: dict[str, Any]):
        parses.append(job["metadata"]["name"])
        return real(job)

    monkeypatch.setattr(module, "parse_trainingjob", counting)
    jobs = module.WaitingJobs(default_runtime_seconds=3600)
    a = make_job("a").status(phase="Queued", queuedAt="2026-11-24T00:00:00Z").build()
    later = "2099-01-01T00:00:00Z"
    backing_off = make_job("b").status(phase="Queued", nextRetryAt=later).build()
    invalid = make_job("c").spec(workers=0).status(phase="Queued").build()
    first = jobs.queued([a, backing_off, invalid], 1.0)
    assert [q.key for q in first] == ["team/a"]
    # A job backing off is read (when it may retry) once per version too.
    assert jobs.queued([a, backing_off, invalid], 2.0)[0] is first[0]  # same version: same
    assert parses == ["a", "b", "c"]
    a["metadata"]["resourceVersion"] = "2"
    a["spec"]["workers"] = 2
    again = jobs.queued([a], 3.0)
    assert parses == ["a", "b", "c", "a"] and again[0].gpus == 2


def test_stores_that_hear_nothing_make_the_operator_stalled():
    from gangshare.core.clock import ManualClock
    from gangshare.operator.informers import Informers
    from gangshare.operator.scheduler import SchedulerLoop

    informers = Informers()
    loop = SchedulerLoop(None, None, POLICY, ManualClock(), informers=informers)  # type: ignore[arg-type]
    assert loop.stalled() is None
    informers.pods.heard -= 301
    assert loop.stalled() == "pods watch has heard nothing from the API server for 301s"
    informers.pods.heard_from()
    assert loop.stalled() is None


class StoreFedApi(RecordingApi):
    """A KubeApi stand-in whose status writes answer as the API server does (a new
    resourceVersion); no watch ever delivers them, so the stores know a write only if the
    loop assumes it."""

    def __init__(self) -> None:
        super().__init__()
        self.on_job_written: Any = None
        self.version = 100

    def patch_job_status(self, job: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        self.writes.append((job["metadata"]["name"], status))
        self.version += 1
        written = {**job, "status": {**(job.get("status") or {}), **status}}
        written["metadata"] = {**job["metadata"], "resourceVersion": str(self.version)}
        if self.on_job_written is not None:
            self.on_job_written(written)
        return written

    def list_queues(self) -> None:
        return None

    def list_priority_classes(self) -> dict[str, int]:
        return {}


class IdleReconciler:
    def reconcile(self, namespace: str, name: str, displaced: Any = None) -> None:
        return None

    def reconcile_later(self, namespace: str, name: str) -> None:
        return None

    def due(self, now: float) -> list[str]:
        return []

    def reconciled_at(self, key: str) -> float:
        return now_of_test

    def forget_all_but(self, keys: set[str]) -> None:
        return None


now_of_test = 1_800_000_000.0


def test_a_pass_after_an_admission_sees_its_gpus_taken_before_any_watch_delivers_it():
    from jobs import nodes

    from gangshare.core.clock import ManualClock
    from gangshare.operator.informers import Informers
    from gangshare.operator.scheduler import SchedulerLoop

    informers = Informers()
    informers.nodes.replace(nodes({"nodePools": [{"name": "n", "count": 1, "gpusPerNode": 2}]}))
    informers.pods.replace([])
    first = make_job("first").spec(gpusPerWorker=2).status(phase="Queued").build()
    second = make_job("second").spec(gpusPerWorker=2).status(phase="Queued").build()
    second["status"]["queuedAt"] = "2026-11-24T00:00:01Z"
    first["status"]["queuedAt"] = "2026-11-24T00:00:00Z"
    informers.jobs.replace([first, second])
    api = StoreFedApi()
    api.on_job_written = informers.jobs.assume
    loop = SchedulerLoop(
        api,  # type: ignore[arg-type]
        IdleReconciler(),  # type: ignore[arg-type]
        POLICY,
        ManualClock(now_of_test),
        informers=informers,
    )
    assert loop.run_once().admitted == ["team/first"]
    # The watch has delivered nothing; without the assumed write the store would still say
    # Queued and the node empty, and this pass would plan "first" onto it again.
    assert loop.run_once().admitted == []
    held = {j["metadata"]["name"]: j["status"]["phase"] for j in informers.list_jobs()}
    assert held == {"first": "Admitted", "second": "Queued"}


class SlowStartingReconciler(IdleReconciler):
    """Its reconciles (the admitted gangs' pod creations) hold until `made` is set."""

    def __init__(self) -> None:
        self.made = threading.Event()
        self.started: list[str] = []

    def reconcile(self, namespace: str, name: str, displaced: Any = None) -> None:
        self.started.append(name)
        self.made.wait(10)


def test_a_pass_admits_more_only_once_the_last_passs_admitted_gangs_have_their_pods():
    from jobs import nodes

    from gangshare.core.clock import ManualClock
    from gangshare.operator.informers import Informers
    from gangshare.operator.scheduler import SchedulerLoop

    informers = Informers()
    informers.nodes.replace(nodes({"nodePools": [{"name": "n", "count": 1, "gpusPerNode": 4}]}))
    informers.pods.replace([])
    first = make_job("first").spec(gpusPerWorker=2).status(phase="Queued").build()
    informers.jobs.replace([first])
    api = StoreFedApi()
    api.on_job_written = informers.jobs.assume
    reconciler = SlowStartingReconciler()
    loop = SchedulerLoop(
        api,  # type: ignore[arg-type]
        reconciler,  # type: ignore[arg-type]
        POLICY,
        ManualClock(now_of_test),
        informers=informers,
    )
    assert loop.run_once().admitted == ["team/first"]
    # The pass returned without waiting for first's pods: they are made beside the next pass.
    informers.jobs.apply(
        "ADDED", make_job("second").spec(gpusPerWorker=2).status(phase="Queued").build()
    )
    reports: list[Any] = []
    second_pass = threading.Thread(target=lambda: reports.append(loop.run_once()))
    second_pass.start()
    second_pass.join(0.5)
    assert second_pass.is_alive() and reports == []
    assert [name for name, status in api.writes if status.get("phase") == "Admitted"] == ["first"]
    reconciler.made.set()
    second_pass.join(10)
    assert reports[0].admitted == ["team/second"]
    assert reconciler.started[0] == "first"


def test_a_kept_prediction_stands_until_a_run_is_learnt_or_the_queue_defaults_change():
    from gangshare.core.queues import by_name
    from gangshare.operator import waiting as module

    jobs = module.WaitingJobs(default_runtime_seconds=3600)
    queued = make_job("a").spec(queue="q").status(phase="Queued", queuedAt="2026-11-24T00:00:00Z")
    a = queued.build()
    plain = QueuePolicy()
    jobs.learn([], plain)
    assert jobs.queued([a], 1.0)[0].runtime_estimate == 3600
    assert jobs.queued([a], 2.0)[0].runtime_estimate == 3600
    done = make_job("done").spec(queue="q").build()
    done["status"] = {
        "phase": "Succeeded",
        "startedAt": "2026-11-24T00:00:00Z",
        "completedAt": "2026-11-24T00:10:00Z",
    }
    jobs.learn([done], plain)
    assert jobs.queued([a], 3.0)[0].runtime_estimate == 600  # its one run of that shape
    predicted: list[str] = []
    real_predict = jobs.estimator.predict

    def counting(queue: str, *rest: Any, **named: Any) -> float:
        predicted.append(queue)
        return real_predict(queue, *rest, **named)

    jobs.estimator.predict = counting  # type: ignore[method-assign]
    other_done = make_job("done2").spec(queue="s").build()
    other_done["status"] = {**done["status"], "completedAt": "2026-11-24T00:20:00Z"}
    jobs.learn([other_done], plain)  # a run of another queue: a's prediction stays 600
    for at in (3.5, 3.6, 3.7):
        assert jobs.queued([a], at)[0].runtime_estimate == 600
    assert predicted == ["q"]  # predicted again once after the run was learnt, then kept
    other = make_job("b").spec(queue="r").status(phase="Queued").build()
    assert jobs.queued([other], 4.0)[0].runtime_estimate == 3600
    jobs.learn([done], QueuePolicy(queues=by_name([QueueSpec("r", default_runtime_seconds=60)])))
    assert jobs.queued([other], 5.0)[0].runtime_estimate == 60
