"""The operator's global scheduling loop: snapshot, `core.schedule_cycle`, write admissions.

Each pass reads jobs, nodes and live pods straight from the API server (no cache
to go stale), builds the core's snapshot, and admits gangs whole. The admission
is committed by one conditional status write (phase Admitted with the placement),
so a crash before it admits nothing and a crash after it loses nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gangshare.core.clock import Clock
from gangshare.core.cycle import Admission, CycleResult, Pending, PendingKind, schedule_cycle
from gangshare.core.estimate import RuntimeEstimator, name_group
from gangshare.core.queueing import QueuedJob, QueuePolicy, RunningJob
from gangshare.core.queues import DEFAULT_QUEUE, QueueSpec
from gangshare.kube.queue import default_queue_object, parse_queue
from gangshare.kube.snapshot import build_snapshot, parse_time
from gangshare.kube.trainingjob import InvalidSpec, parse_trainingjob
from gangshare.operator.actions import Displacement
from gangshare.operator.conditions import condition, iso, set_condition
from gangshare.operator.kubeapi import Conflict, KubeApi
from gangshare.operator.metrics import OperatorMetrics
from gangshare.operator.queue_status import changed_fields, queue_statuses
from gangshare.operator.reconcile import Reconciler

log = logging.getLogger("gangshare.operator")
FULL_RESYNC_SECONDS = 30.0
# Liveness fails when no scheduling pass has finished for this long (a hung loop).
DEFAULT_STALL_SECONDS = 120.0


@dataclass
class CycleReport:
    seconds: float = 0.0
    admitted: list[str] = field(default_factory=list)
    pending: int = 0
    warnings: list[str] = field(default_factory=list)


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
    ) -> None:
        self.api = api
        self.reconciler = reconciler
        self.policy = policy
        self.clock = clock
        self.interval = interval
        self.metrics = metrics or OperatorMetrics()
        # Whether this replica holds the leader Lease (operator/leader.py); a standby waits.
        self.leading = leading
        self.estimator = RuntimeEstimator(policy.default_runtime_seconds)
        # Queue objects as last read (None: the Queue CRD is not installed) and their statuses.
        self._queue_objects: dict[str, dict[str, Any]] | None = None
        self._default_queue_checked = False
        self._observed: set[str] = set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._last_full_resync = 0.0
        self._warned: set[str] = set()
        # Monotonic time the last pass ended (well or with an error): the loop's heartbeat.
        self.last_pass_end = time.monotonic()

    def poke(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def run_forever(self) -> None:
        while not self._stop.is_set():
            if self.leading():
                try:
                    self.run_once()
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
        return None

    # ----- one pass ------------------------------------------------------------------

    def run_once(self) -> CycleReport:
        started = time.perf_counter()
        jobs = [j for j in self.api.list_jobs() if not j["metadata"].get("deletionTimestamp")]
        self.metrics.set_trainingjobs(jobs)
        snapshot = build_snapshot(
            self.api.list_nodes(),
            self.api.list_live_pods(),
            jobs,
            self.policy.default_runtime_seconds,
        )
        self._log_new_warnings(snapshot.warnings)
        now = self.clock.now()
        policy = self._policy_of_the_pass(snapshot.warnings)
        self.estimator.queue_defaults = {
            name: spec.default_runtime_seconds
            for name, spec in policy.queues.items()
            if spec.default_runtime_seconds is not None
        }
        self._learn_run_times(jobs)
        by_key = {f"{j['metadata']['namespace']}/{j['metadata']['name']}": j for j in jobs}
        pending = [q for q in (self._queued(j, policy) for j in jobs) if q is not None]
        deciding = time.perf_counter()
        result = schedule_cycle(snapshot.cluster, pending, snapshot.running, policy, now)
        self.metrics.decision.observe(time.perf_counter() - deciding)
        report = CycleReport(pending=len(result.pending), warnings=snapshot.warnings)
        for admission in result.admitted:
            if self._admit(by_key[admission.job.key], admission, now):
                report.admitted.append(admission.job.key)
        for waiting in result.pending:
            self._explain(by_key[waiting.job.key], waiting, now, policy)
        self._preempt(result, by_key)
        self._publish_queue_statuses(policy, snapshot.running, result)
        report.seconds = time.perf_counter() - started
        for key in report.admitted:
            namespace, name = key.split("/", 1)
            self._reconcile_quietly(namespace, name)
        self._release_displaced(snapshot.displaced, by_key)
        self._resync(jobs, now)
        self.metrics.cycle.observe(time.perf_counter() - started)
        return report

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
                except Exception:  # a status is a report: the next pass writes it again
                    log.exception("status of queue %s not written; will retry", name)

    def _preempt(self, result: CycleResult, by_key: dict[str, Any]) -> None:
        """Reclaimed borrowers are evicted whole and requeued (the reconciler does it)."""
        for preemption in result.preemptions:
            job = by_key.get(preemption.job.key)
            if job is None:
                continue
            attempt = int((job.get("status") or {}).get("attempt", 0))
            namespace, name = preemption.job.key.split("/", 1)
            log.info("%s preempted: %s", preemption.job.key, preemption.reason)
            self._reconcile_quietly(
                namespace, name, Displacement(attempt, preemption.reason, preempted=True)
            )

    def _release_displaced(self, displaced: dict[str, str], by_key: dict[str, Any]) -> None:
        """Gangs whose plan broke before they started give their GPUs back and requeue."""
        for key, reason in displaced.items():
            job = by_key.get(key)
            if job is None or (job.get("status") or {}).get("phase") != "Admitted":
                continue
            attempt = int((job.get("status") or {}).get("attempt", 0))
            namespace, name = key.split("/", 1)
            self._reconcile_quietly(namespace, name, Displacement(attempt, reason))

    def _reconcile_quietly(
        self, namespace: str, name: str, displaced: Displacement | None = None
    ) -> None:
        # The admission is already committed; its pods follow on the next event or resync.
        try:
            self.reconciler.reconcile(namespace, name, displaced)
        except Exception:
            log.exception("reconcile of %s/%s failed; will retry", namespace, name)

    def _log_new_warnings(self, warnings: list[str]) -> None:
        """What the snapshot had to skip, logged once per appearance rather than every pass."""
        current = set(warnings)
        for warning in sorted(current - self._warned):
            log.warning("snapshot: %s", warning)
        self._warned = current

    def _queued(self, job: dict[str, Any], policy: QueuePolicy) -> QueuedJob | None:
        status = job.get("status") or {}
        if status.get("phase") != "Queued":
            return None
        if (parse_time(status.get("nextRetryAt")) or 0.0) > self.clock.now():
            return None  # backing off after a release; it rejoins the queue when due
        try:
            spec = parse_trainingjob(job)
        except InvalidSpec:
            return None  # the reconciler fails it with the reason
        submitted = parse_time(status.get("queuedAt")) or self.clock.now()
        estimate = self.estimator.predict(
            spec.queue, spec.total_gpus, spec.runtime_estimate_seconds, group=name_group(spec.name)
        )
        return spec.queued(submitted, estimate)

    def _admit(self, job: dict[str, Any], admission: Admission, now: float) -> bool:
        plan = admission.plan
        status = job.get("status") or {}
        gen = int(job["metadata"].get("generation", 0))
        nodes = ", ".join(plan.nodes)
        relaxed = " (topology preference relaxed)" if plan.relaxed else ""
        message = f"admitted: {len(plan.placements)} worker(s) on {nodes}{relaxed}"
        if admission.borrowed:
            message = (
                f"admitted as Opportunistic on borrowed quota ({admission.job.gpus} GPUs beyond "
                f"queue {admission.job.queue}'s quota; reclaimed first when lenders return): "
                f"{len(plan.placements)} worker(s) on {nodes}{relaxed}"
            )
        queued_at = parse_time(status.get("queuedAt")) or now
        wait = round(max(0.0, now - queued_at), 3)
        patch = {
            "phase": "Admitted",
            "admittedAt": iso(now),
            "queueWaitSeconds": wait,
            # The run time backfill assumed at admission; running jobs' expected ends use it too.
            "predictedRuntimeSeconds": admission.job.runtime_estimate,
            "serviceClass": admission.service_class.value,
            "borrowed": admission.borrowed,
            "placement": [
                {"rank": p.rank, "node": p.node, "gpus": list(p.gpu_indices)}
                for p in plan.placements
            ],
            "message": message,
            "observedGeneration": gen,
            "conditions": _clear_inadmissible(
                set_condition(
                    status.get("conditions"), "Admitted", True, "GangAdmitted", message, now, gen
                ),
                now,
                gen,
            ),
        }
        if not self.leading():
            return False  # the Lease was lost during this pass: the new leader decides
        try:
            self.api.patch_job_status(job, patch)
        except Conflict:
            return False  # the job changed under us; the next pass plans it again
        self.metrics.admitted(
            admission.job.queue, admission.service_class.value, admission.borrowed, wait
        )
        reason = "AdmittedBorrowing" if admission.borrowed else "Admitted"
        self.api.post_event(job, "Normal", reason, message, action="Schedule")
        log.info("%s %s", admission.job.key, message)
        return True

    def _explain(
        self, job: dict[str, Any], waiting: Pending, now: float, policy: QueuePolicy
    ) -> None:
        status = job.get("status") or {}
        if status.get("message") == waiting.reason:
            return  # unchanged: no write, no event
        gen = int(job["metadata"].get("generation", 0))
        conditions = set_condition(
            status.get("conditions"),
            "Admitted",
            False,
            waiting.kind.value,
            waiting.reason,
            now,
            gen,
        )
        if waiting.kind is PendingKind.INADMISSIBLE:
            # Waiting cannot help: said once, re-judged every pass as nodes and policy change.
            why = "QueueNotFound" if waiting.job.queue not in policy.queues else "CannotFit"
            if not policy.require_known_queue:
                why = "CannotFit"
            conditions = set_condition(
                conditions, "Inadmissible", True, why, waiting.reason, now, gen
            )
        else:
            conditions = _clear_inadmissible(conditions, now, gen)
        try:
            self.api.patch_job_status(job, {"message": waiting.reason, "conditions": conditions})
        except Conflict:
            return
        if waiting.kind is not PendingKind.BEHIND:
            kind = "Warning" if waiting.kind is PendingKind.INADMISSIBLE else "Normal"
            self.api.post_event(job, kind, waiting.kind.value, waiting.reason, action="Schedule")

    def _learn_run_times(self, jobs: list[dict[str, Any]]) -> None:
        for job in jobs:
            status = job.get("status") or {}
            uid = job["metadata"].get("uid", "")
            if status.get("phase") != "Succeeded" or uid in self._observed:
                continue
            self._observed.add(uid)
            start, end = parse_time(status.get("startedAt")), parse_time(status.get("completedAt"))
            spec = job.get("spec") or {}
            if start is not None and end is not None:
                gpus = int(spec.get("workers", 1)) * int(spec.get("gpusPerWorker", 1))
                group = name_group(str(job["metadata"].get("name", "")))
                queue = str(spec.get("queue", "default"))
                self.estimator.observe(queue, gpus, end - start, group=group)

    def _resync(self, jobs: list[dict[str, Any]], now: float) -> None:
        """Time-driven steps no watch announces (new jobs, back-off, TTL), and a slow full pass."""
        full = now - self._last_full_resync >= FULL_RESYNC_SECONDS
        if full:
            self._last_full_resync = now
        for job in jobs:
            status = job.get("status") or {}
            phase = status.get("phase")
            due = phase is None or (
                phase == "Restarting" and (parse_time(status.get("nextRetryAt")) or 0) <= now
            )
            ttl = (job.get("spec") or {}).get("ttlSecondsAfterFinished")
            if phase in ("Succeeded", "Failed") and ttl is not None:
                due = due or (parse_time(status.get("completedAt")) or now) + ttl <= now
            if due or (full and phase not in ("Succeeded", "Failed")):
                self._reconcile_quietly(job["metadata"]["namespace"], job["metadata"]["name"])
        for key in self.reconciler.due(now):
            namespace, name = key.split("/", 1)
            self._reconcile_quietly(namespace, name)


def _clear_inadmissible(
    conditions: list[dict[str, Any]], now: float, gen: int
) -> list[dict[str, Any]]:
    found = condition(conditions, "Inadmissible")
    if found is None or found.get("status") != "True":
        return conditions
    return set_condition(
        conditions, "Inadmissible", False, "CanFit", "the job can fit the cluster", now, gen
    )
