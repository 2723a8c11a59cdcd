"""The operator's global scheduling loop: snapshot, `core.schedule_cycle`, write admissions.

Each pass reads jobs, nodes and live pods from watch-fed stores (operator/informers.py; or
straight from the API server when run without them), builds the core's snapshot, and admits
gangs whole. The admission
is committed by one conditional status write (phase Admitted with the placement),
so a crash before it admits nothing and a crash after it loses nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any

from gangshare.core.clock import Clock
from gangshare.core.cluster import Cluster
from gangshare.core.cycle import Admission, CycleResult, PendingKind, schedule_cycle
from gangshare.core.forecast import Forecast
from gangshare.core.queueing import QueuedJob, QueuePolicy, RunningJob
from gangshare.core.queues import DEFAULT_QUEUE, QueueSpec
from gangshare.kube.claims import job_key
from gangshare.kube.queue import default_queue_object, parse_queue
from gangshare.kube.queued_kinds import workload_kind_name
from gangshare.kube.snapshot import Snapshot, build_snapshot
from gangshare.kube.trainingjob import InvalidSpec
from gangshare.operator.actions import Displacement
from gangshare.operator.admitting import admission_needs_event, admission_status
from gangshare.operator.forecast_worker import ForecastWorker
from gangshare.operator.forecasts import ForecastBook
from gangshare.operator.informers import Informers
from gangshare.operator.kubeapi import Conflict, KubeApi, LeadershipLost
from gangshare.operator.metrics import OperatorMetrics
from gangshare.operator.pending import PendingReasons
from gangshare.operator.queue_status import changed_fields, queue_statuses
from gangshare.operator.reconcile import Reconciler
from gangshare.operator.resync import resync_keys
from gangshare.operator.standing_view import StandingView
from gangshare.operator.waiting import WaitingJobs

log = logging.getLogger("gangshare.operator")
# Reconciles a pass runs side by side (kopf's handlers run on as many).
RECONCILE_WORKERS = 8
# The admitted gangs' first reconciles (pods, Service, gates): mostly waiting on the API server.
STARTING_WORKERS = 16
# How long a pass waits for the previous pass's admitted gangs to get their pods before it
# admits more anyway (each reconcile's API calls have their own timeouts).
STARTING_WAIT_SECONDS = 60.0
# Liveness fails when no scheduling pass has finished for this long (a hung loop).
DEFAULT_STALL_SECONDS = 120.0


# A job to reconcile (namespace/name), and why it lost its GPUs when it did.
Work = tuple[str, Displacement | None]


@dataclass
class CycleReport:
    seconds: float = 0.0  # reads, decision and status writes (not the reconciles after)
    admitted: list[str] = field(default_factory=list)
    pending: int = 0
    warnings: list[str] = field(default_factory=list)
    read_seconds: float = 0.0  # reads and the snapshot
    decision_seconds: float = 0.0  # schedule_cycle alone
    reasons_written: int = 0  # pending-reason status writes
    resynced: int = 0  # jobs reconciled as the backstop resync
    skipped: str = ""  # why the pass did nothing (stores not yet synced)


class SchedulerLoop:
    def __init__(
        self,
        api: KubeApi,
        reconciler: Reconciler,
        policy: QueuePolicy,
        clock: Clock,
        interval: float = 1.0,
        metrics: OperatorMetrics | None = None,
        leading: Callable[[], bool] = lambda: True,
        informers: Informers | None = None,
    ) -> None:
        self.api = api
        # Where a pass reads jobs, nodes and pods: the watch-fed stores, else LISTs.
        self.informers = informers
        self.reads: Informers | KubeApi = informers or api
        self.pending = PendingReasons(api)
        self.reconciler = reconciler
        self.policy = policy
        self.clock = clock
        self.interval = interval
        self.metrics = metrics or OperatorMetrics()
        # With the stores, a snapshot kept from their changes and audited (#39).
        self.view = (
            None
            if informers is None
            else StandingView(
                informers, policy.default_runtime_seconds, self.metrics, clock=clock.now
            )
        )
        # Whether this replica holds the leader Lease (operator/leader.py); a standby waits.
        self.leading = leading
        self.waiting = WaitingJobs(policy.default_runtime_seconds)
        self.forecasts = ForecastBook()
        # Queue objects as last read (None: the Queue CRD is not installed) and their statuses.
        self._queue_objects: dict[str, dict[str, Any]] | None = None
        self._default_queue_checked = False
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._workers = ThreadPoolExecutor(RECONCILE_WORKERS, thread_name_prefix="reconcile")
        self._starting_pool = ThreadPoolExecutor(STARTING_WORKERS, thread_name_prefix="starting")
        # The previous pass's admitted gangs, getting their pods (see run_once).
        self._starting: list[Future[None]] = []
        self._warned: set[str] = set()
        # Monotonic time the last pass ended (well or with an error): the loop's heartbeat.
        self.last_pass_end = time.monotonic()

    def poke(self) -> None:
        self._wake.set()

    def forecast_beside_the_pass(self) -> None:
        """Make forecasts in a worker process (operator/forecast_worker.py), a pass woken
        to write each once it is ready."""
        self.forecasts.worker = ForecastWorker(on_ready=self.poke)

    def stop(self) -> None:
        if self.forecasts.worker is not None:
            self.forecasts.worker.stop()
        self._stop.set()
        self._wake.set()

    def run_forever(self) -> None:
        while not self._stop.is_set():
            if self.leading():
                try:
                    self.run_once()
                except LeadershipLost as lost:  # not an error: this replica acts no more
                    log.warning("scheduling pass abandoned: %s", lost)
                except Exception:  # one bad pass must not stop scheduling; the next starts fresh
                    log.exception("scheduling pass failed; retrying")
            # A standby's loop beats too: liveness is about a stuck loop, not about leading.
            self.last_pass_end = time.monotonic()
            self._wake.wait(self.interval)
            self._wake.clear()

    def stalled(self, limit: float = DEFAULT_STALL_SECONDS) -> str | None:
        """Why the loop counts as stuck (for liveness), or None while it keeps passing."""
        quiet = time.monotonic() - self.last_pass_end
        if quiet > limit:
            return f"no scheduling pass has finished for {quiet:.0f}s (limit {limit:.0f}s)"
        # Passes that read from dead watches would decide from an ever older cluster.
        return self.informers.silent() if self.informers is not None else None

    # ----- one pass ------------------------------------------------------------------

    def run_once(self) -> CycleReport:
        started = time.perf_counter()
        if self.informers is not None and not self.informers.synced():
            return CycleReport(skipped="watches not yet synced")
        if self.view is not None:
            snapshot, held = self.view.snapshot()
            jobs = [j for j in held if not j["metadata"].get("deletionTimestamp")]
        else:
            jobs = [j for j in self.reads.list_jobs() if not j["metadata"].get("deletionTimestamp")]
            snapshot = build_snapshot(
                self.reads.list_nodes(),
                self.reads.list_live_pods(),
                jobs,
                self.policy.default_runtime_seconds,
            )
        if self.view is not None:
            self.metrics.set_trainingjob_counts(self.view.job_counts.counts())
        else:
            self.metrics.set_trainingjobs(jobs)
        self._log_new_warnings(snapshot.warnings)
        now = self.clock.now()
        policy = self._policy_of_the_pass(snapshot.warnings)
        self.waiting.learn(jobs, policy)
        pending = self.waiting.queued(jobs, now, self.api.list_priority_classes())
        # A standing snapshot's cluster is the ledger's: what the cycle plans on it is undone
        # once the pass has written and forecast (its admissions come back as plans).
        with snapshot.cluster.undone_after():
            return self._decide_and_write(snapshot, jobs, pending, policy, now, started)

    def _decide_and_write(
        self,
        snapshot: Snapshot,
        jobs: list[dict[str, Any]],
        pending: list[QueuedJob],
        policy: QueuePolicy,
        now: float,
        started: float,
    ) -> CycleReport:
        by_key = {job_key(j): j for j in jobs}
        deciding = time.perf_counter()
        result = schedule_cycle(snapshot.cluster, pending, snapshot.running, policy, now)
        decided = time.perf_counter()
        self.metrics.decision.observe(decided - deciding)
        report = CycleReport(
            pending=len(result.pending),
            warnings=snapshot.warnings,
            read_seconds=deciding - started,
            decision_seconds=decided - deciding,
        )
        self._wait_for_starting_gangs()
        # Stamped when written, not when the pass began: the gang start timeout counts from
        # admittedAt, and a pass that waited or decided long would start it early.
        admitted_at = self.clock.now()
        # Each admission is its own conditional write: side by side, committed in any order.
        admitted = self._workers.map(
            lambda a: self._admit(by_key[a.job.key], a, admitted_at), result.admitted
        )
        for admission, done in zip(result.admitted, list(admitted), strict=True):
            if done:
                report.admitted.append(admission.job.key)
        forecasts = self._forecast(snapshot.cluster, result, snapshot.running, policy, now)
        if self.leading():
            report.reasons_written = self.pending.explain(
                result.pending,
                by_key,
                policy,
                now,
                self._workers,
                forecasts,
                self.forecasts.advice,
                admitting=bool(result.admitted),
            )
        preempted = self._preempted(result, by_key)
        self._publish_queue_statuses(policy, snapshot.running, result)
        report.seconds = time.perf_counter() - started
        urgent: list[Work] = [*preempted]
        urgent += self._displaced(snapshot.displaced, by_key)
        urgent += self._off_island(snapshot.off_island, by_key)
        already = {key for key, _ in urgent} | set(report.admitted)
        pods = self.informers.list_live_pods() if self.informers is not None else None
        resync, report.resynced = resync_keys(jobs, pods, self.reconciler, now, already)
        # Evictions and releases are carried out before the next pass, which would otherwise
        # see the victims still holding their GPUs and reclaim again. The admitted gangs' pods
        # are made while the next pass reads and decides (it counts an admission from its
        # committed status), and that pass admits more only once they are made: see
        # _wait_for_starting_gangs. The resync's looks are not waited for.
        self._reconcile_all(urgent)
        self._starting = [
            self._starting_pool.submit(self._reconcile_quietly, key) for key in report.admitted
        ]
        for key in resync:
            namespace, name = key.split("/", 1)
            self.reconciler.reconcile_later(namespace, name)
        self.metrics.cycle.observe(time.perf_counter() - started)
        return report

    def _forecast(
        self,
        cluster: Cluster,
        result: CycleResult,
        running: list[RunningJob],
        policy: QueuePolicy,
        now: float,
    ) -> dict[str, Forecast]:
        """Start-time forecasts of the jobs left waiting (operator/forecasts.py); a forecast
        that fails leaves the last one standing: it is a report, not a decision."""
        rounds = self.forecasts.rounds
        try:
            forecasts = self.forecasts.after_cycle(cluster, result, running, policy, now)
        except Exception:
            log.exception("start-time forecast failed; keeping the last one")
            return self.forecasts.current
        if self.forecasts.rounds != rounds:
            self.metrics.forecast.observe(self.forecasts.last_seconds)
            log.debug(
                "forecast of %d waiting jobs in %.3fs: %d start within the horizon",
                len(forecasts),
                self.forecasts.last_seconds,
                len([f for f in forecasts.values() if f.start is not None]),
            )
        # Of the jobs still waiting: the last forecast may name some admitted since.
        if forecasts:
            waiting = {p.job.key for p in result.pending if p.kind is not PendingKind.INADMISSIBLE}
            self.metrics.set_forecasts([f for k, f in forecasts.items() if k in waiting], now)
        else:
            self.metrics.set_forecasts([], now)
        return forecasts

    # ----- queues --------------------------------------------------------------------

    def _policy_of_the_pass(self, warnings: list[str]) -> QueuePolicy:
        """The flags' policy, with this pass's Queue objects when the Queue CRD is installed."""
        objects = self.api.list_queues()
        if objects is None:
            self._queue_objects = None
            return self.policy
        if not self._default_queue_checked:
            self._default_queue_checked = True
            if not any(q["metadata"]["name"] == DEFAULT_QUEUE for q in objects):
                self.api.create_queue(default_queue_object())
                objects = self.api.list_queues() or objects
        specs: dict[str, QueueSpec] = {}
        for obj in objects:
            try:
                spec = parse_queue(obj)
            except InvalidSpec as err:
                warnings.append(f"queue {obj['metadata']['name']}: {err}")
                continue
            specs[spec.name] = spec
        self._queue_objects = {q["metadata"]["name"]: q for q in objects}
        return replace(self.policy, queues=specs, require_known_queue=True)

    def _publish_queue_statuses(
        self, policy: QueuePolicy, running: list[RunningJob], result: CycleResult
    ) -> None:
        if self._queue_objects is None:
            self.metrics.set_queues({}, {})
            return
        statuses = queue_statuses(policy.queues, policy, running, result)
        self.metrics.set_queues(statuses, policy.queues)
        for name, wanted in statuses.items():
            obj = self._queue_objects.get(name) or {}
            wanted["observedGeneration"] = int((obj.get("metadata") or {}).get("generation", 0))
            patch = changed_fields(obj.get("status"), wanted)
            if patch:
                try:
                    self.api.patch_queue_status(name, patch)
                except LeadershipLost:
                    raise
                except Exception:  # a status is a report: the next pass writes it again
                    log.exception("status of queue %s not written; will retry", name)

    def _preempted(self, result: CycleResult, by_key: dict[str, Any]) -> list[Work]:
        """Reclaimed borrowers are evicted whole and requeued (the reconciler does it)."""
        work: list[Work] = []
        for preemption in result.preemptions:
            job = by_key.get(preemption.job.key)
            if job is None:
                continue
            attempt = int((job.get("status") or {}).get("attempt", 0))
            log.info("%s preempted: %s", preemption.job.key, preemption.reason)
            displaced = Displacement(attempt, preemption.reason, preempted=True)
            work.append((preemption.job.key, displaced))
        return work

    def _displaced(self, displaced: dict[str, str], by_key: dict[str, Any]) -> list[Work]:
        """Gangs whose plan broke give their GPUs back and requeue: before they start, and a
        running one whose controller replaced a pod onto a place that is gone (a TrainingJob's
        own lost worker is a failure its lifecycle handles)."""
        work: list[Work] = []
        for key, reason in displaced.items():
            job = by_key.get(key)
            if job is None or (job.get("status") or {}).get("phase") not in ("Admitted", "Running"):
                continue
            attempt = int((job.get("status") or {}).get("attempt", 0))
            work.append((key, Displacement(attempt, reason)))
        return work

    def _off_island(self, broken: dict[str, str], by_key: dict[str, Any]) -> list[Work]:
        """Gangs whose node did not keep a Required island give their GPUs back and requeue."""
        work: list[Work] = []
        for key, reason in broken.items():
            job = by_key.get(key)
            if job is None or (job.get("status") or {}).get("phase") not in ("Admitted", "Running"):
                continue
            attempt = int((job.get("status") or {}).get("attempt", 0))
            log.warning("%s: %s", key, reason)
            work.append((key, Displacement(attempt, reason, off_island=True)))
        return work

    def _wait_for_starting_gangs(self) -> None:
        """Admissions wait for the previous pass's admitted gangs to have their pods. Without
        this, passes admitted faster than pods were made: at 4,000 one-GPU jobs the backlog of
        admitted gangs without pods passed the gang start timeout (120 s), their GPUs were
        released and they were admitted again, 7,649 admissions for 4,000 jobs
        (bench/scale.py). Waiting here, not at the end of the pass, lets the pods of one pass
        be made while the next one reads and decides."""
        if not self._starting:
            return
        _, late = wait(self._starting, timeout=STARTING_WAIT_SECONDS)
        if late:
            log.warning(
                "%d admitted gangs still without their pods after %.0fs; admitting more anyway",
                len(late),
                STARTING_WAIT_SECONDS,
            )
        self._starting = []

    def _reconcile_all(self, work: list[Work]) -> None:
        """Reconciles side by side (each job's own lock keeps one at a time per job): each is
        a few API round trips, and one after another they were most of a busy pass."""
        list(self._workers.map(lambda w: self._reconcile_quietly(*w), work))

    def _reconcile_quietly(self, key: str, displaced: Displacement | None = None) -> None:
        # The admission is already committed; its pods follow on the next event or resync.
        namespace, name = key.split("/", 1)
        try:
            self.reconciler.reconcile(namespace, name, displaced)
        except Exception:
            log.exception("reconcile of %s failed; will retry", key)

    def _log_new_warnings(self, warnings: list[str]) -> None:
        """What the snapshot had to skip, logged once per appearance rather than every pass."""
        current = set(warnings)
        for warning in sorted(current - self._warned):
            log.warning("snapshot: %s", warning)
        self._warned = current

    def _admit(self, job: dict[str, Any], admission: Admission, now: float) -> bool:
        status = job.get("status") or {}
        patch = admission_status(job, admission, now)
        message, wait = patch["message"], patch["queueWaitSeconds"]
        if not self.leading():
            return False  # the Lease was lost during this pass: the new leader decides
        try:
            self.api.patch_job_status(job, patch)
        except Conflict:
            return False  # the job changed under us; the next pass plans it again
        self.metrics.admitted(
            admission.job.queue,
            admission.service_class.value,
            admission.borrowed,
            wait,
            workload_kind_name(job),
        )
        if admission_needs_event(status, admission):
            reason = "AdmittedBorrowing" if admission.borrowed else "Admitted"
            self.api.post_event(job, "Normal", reason, message, action="Schedule")
        log.info("%s %s", admission.job.key, message)
        return True
