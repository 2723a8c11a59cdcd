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
from dataclasses import dataclass, field
from typing import Any

from gangshare.core.clock import Clock
from gangshare.core.cycle import Admission, Pending, PendingKind, schedule_cycle
from gangshare.core.estimate import RuntimeEstimator
from gangshare.core.queueing import QueuedJob, QueuePolicy
from gangshare.kube.snapshot import build_snapshot, parse_time
from gangshare.kube.trainingjob import InvalidSpec, parse_trainingjob
from gangshare.operator.actions import Displacement
from gangshare.operator.conditions import condition, iso, set_condition
from gangshare.operator.kubeapi import Conflict, KubeApi
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
    ) -> None:
        self.api = api
        self.reconciler = reconciler
        self.policy = policy
        self.clock = clock
        self.interval = interval
        self.estimator = RuntimeEstimator(policy.default_runtime_seconds)
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
            try:
                self.run_once()
            except Exception:  # one bad pass must not stop scheduling; the next pass starts fresh
                log.exception("scheduling pass failed; retrying")
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
        snapshot = build_snapshot(
            self.api.list_nodes(),
            self.api.list_live_pods(),
            jobs,
            self.policy.default_runtime_seconds,
        )
        self._log_new_warnings(snapshot.warnings)
        now = self.clock.now()
        self._learn_run_times(jobs)
        by_key = {f"{j['metadata']['namespace']}/{j['metadata']['name']}": j for j in jobs}
        pending = [q for q in (self._queued(j) for j in jobs) if q is not None]
        result = schedule_cycle(snapshot.cluster, pending, snapshot.running, self.policy, now)
        report = CycleReport(pending=len(result.pending), warnings=snapshot.warnings)
        for admission in result.admitted:
            if self._admit(by_key[admission.job.key], admission, now):
                report.admitted.append(admission.job.key)
        for waiting in result.pending:
            self._explain(by_key[waiting.job.key], waiting, now)
        report.seconds = time.perf_counter() - started
        for key in report.admitted:
            namespace, name = key.split("/", 1)
            self._reconcile_quietly(namespace, name)
        self._release_displaced(snapshot.displaced, by_key)
        self._resync(jobs, now)
        return report

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

    def _queued(self, job: dict[str, Any]) -> QueuedJob | None:
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
            spec.queue, spec.total_gpus, spec.runtime_estimate_seconds
        )
        return spec.queued(submitted, estimate)

    def _admit(self, job: dict[str, Any], admission: Admission, now: float) -> bool:
        plan = admission.plan
        status = job.get("status") or {}
        gen = int(job["metadata"].get("generation", 0))
        nodes = ", ".join(plan.nodes)
        relaxed = " (topology preference relaxed)" if plan.relaxed else ""
        message = f"admitted: {len(plan.placements)} worker(s) on {nodes}{relaxed}"
        queued_at = parse_time(status.get("queuedAt")) or now
        patch = {
            "phase": "Admitted",
            "admittedAt": iso(now),
            "queueWaitSeconds": round(max(0.0, now - queued_at), 3),
            # The run time backfill assumed at admission; running jobs' expected ends use it too.
            "predictedRuntimeSeconds": admission.job.runtime_estimate,
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
        try:
            self.api.patch_job_status(job, patch)
        except Conflict:
            return False  # the job changed under us; the next pass plans it again
        self.api.post_event(job, "Normal", "Admitted", message, action="Schedule")
        log.info("%s %s", admission.job.key, message)
        return True

    def _explain(self, job: dict[str, Any], waiting: Pending, now: float) -> None:
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
            conditions = set_condition(
                conditions, "Inadmissible", True, "CannotFit", waiting.reason, now, gen
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
                self.estimator.observe(str(spec.get("queue", "default")), gpus, end - start)

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
