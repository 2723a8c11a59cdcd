"""Carry out what `batch_lifecycle` decided for a queued Job or JobSet, and adopt new ones.

Order matters as in reconcile.py: the TrainingJob's status is written first (conditional on
the version decided from), so GangScheduled commits the lift before any gate comes off and a
release is recorded before the Job is suspended; a crash anywhere leaves a state the next
reconcile finishes from. Adoption turns each labelled Job into its TrainingJob; a labelled Job
that is no gang gets the reason on itself (event and annotation) and stays suspended.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gangshare.core.clock import Clock
from gangshare.kube import podgroup
from gangshare.kube.queued import (
    CHILD_KEY,
    STATUS_ANNOTATION,
    WorkloadKind,
    is_queued,
    scheduler_refusal,
    workload,
)
from gangshare.kube.queued_kinds import kind_of
from gangshare.kube.queued_writes import (
    at_version,
    status_annotation_patch,
)
from gangshare.kube.trainingjob import InvalidSpec
from gangshare.operator.actions import Displacement
from gangshare.operator.batch_lifecycle import (
    BatchActions,
    BatchObservation,
    detect_batch_actions,
)
from gangshare.operator.batchapi import BatchApi
from gangshare.operator.gate_refusals import GATE_LIFT_REFUSED, gate_lift_refusal
from gangshare.operator.kubeapi import Conflict, Forbidden, Invalid, KubeApi
from gangshare.operator.lifecycle import Limits
from gangshare.operator.metrics import OperatorMetrics

log = logging.getLogger("gangshare.operator")
MAX_PASSES = 4
ADOPT_WORKERS = 4
# What a queued Job may change while it waits: its place in line (the TrainingJob's CRD
# allows these only while it is Queued).
MOVABLE = ("queue", "priority")


class BatchReconciler:
    def __init__(
        self,
        api: KubeApi,
        batch: BatchApi,
        clock: Clock,
        limits: Limits | None = None,
        backoff_base_seconds: float = 10.0,
        scheduler_name: str = "gangshare-scheduler",
        metrics: OperatorMetrics | None = None,
    ) -> None:
        self.api = api
        self.batch = batch
        # Requeues, preemptions and failures of queued objects, counted under their kind.
        self.metrics = metrics
        self.scheduler_name = scheduler_name
        self.clock = clock
        self.limits = limits or Limits()
        self.backoff_base_seconds = backoff_base_seconds
        self._adopting = ThreadPoolExecutor(ADOPT_WORKERS, thread_name_prefix="batch-adopt")
        # Adoptions by name queued and not started yet (adopt_by_name_later).
        self._pending: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()

    # ----- the TrainingJob's reconcile -------------------------------------------------------

    def reconcile(self, workload: dict[str, Any], displaced: Displacement | None) -> float | None:
        """One step for a Job's TrainingJob (read afresh from the API server by the caller)."""
        meta = workload["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        ref = (workload.get("spec") or {}).get("jobRef") or {}
        kind = kind_of(workload)
        if kind is None:
            return None
        for _ in range(MAX_PASSES):
            job = self.batch.get(kind, namespace, str(ref.get("name", "")))
            if job is not None and job["metadata"].get("uid") != ref.get("uid"):
                job = None  # a new Job of the same name: this TrainingJob's owner is gone
            job = self._with_child(kind, job)
            pods = self.api.list_job_pods(namespace, name)
            seen = BatchObservation(workload, job, pods, self.clock.now(), displaced)
            actions = detect_batch_actions(seen, self.limits, self.backoff_base_seconds)
            if actions.empty:
                return actions.requeue_after
            try:
                self.process(kind, workload, job, actions)
            except Conflict:
                fresh = self.api.get_job(namespace, name)
                if fresh is None:
                    return None
                workload = fresh
                continue
            return actions.requeue_after
        return None

    def process(
        self,
        kind: WorkloadKind,
        workload: dict[str, Any],
        job: dict[str, Any] | None,
        actions: BatchActions,
    ) -> None:
        namespace = workload["metadata"]["namespace"]
        if actions.status:
            self.api.patch_job_status(workload, actions.status)
            if self.metrics is not None:
                self.metrics.applied(workload, actions)
        for event in actions.events:
            self.api.post_event(workload, event.type, event.reason, event.message, "Reconcile")
        if actions.delete_workload:
            self.api.delete_job(namespace, workload["metadata"]["name"])
        if job is None:
            return
        job_name = job["metadata"]["name"]
        child = job.get(CHILD_KEY)
        if actions.child_patch is not None and kind.child_kind is not None and child:
            # The child (a TrainJob's JobSet) prepared first, conditional on its version too.
            patch = at_version(actions.child_patch, child)
            self.batch.patch(kind.child_kind, namespace, child["metadata"]["name"], patch)
        if actions.job_patch is not None:
            # Conditional on the version decided from: a write delayed past a takeover (a
            # deposed leader's resume) cannot undo what the new leader wrote since (#36).
            patch = at_version(actions.job_patch, job)
            self.batch.patch(kind, namespace, job_name, patch)
        failed, refused = [], []
        for pod, patch in actions.ungate:
            try:
                self.batch.patch_pod(namespace, pod, patch)
            except Invalid as err:
                failed.append(f"{pod}: {err}")
            except Forbidden as err:
                refused.append(f"{pod}: {err}")
        if refused:
            message = gate_lift_refusal(refused)
            self.batch.post_event(job, "Warning", GATE_LIFT_REFUSED, message, "Schedule")
            log.warning("%s/%s: %s", namespace, job_name, message)
        if failed:
            # The API server refused to pin a gated pod to its place: the start deadline
            # releases the gang; the reason goes where its author looks.
            message = "pods refused their planned places: " + "; ".join(failed)
            self.batch.post_event(job, "Warning", "PlacementRefused", message, "Schedule")
            log.warning("%s/%s: %s", namespace, job_name, message)
        for event in actions.job_events:
            self.batch.post_event(job, event.type, event.reason, event.message, "Reconcile")
            log.info("%s/%s %s: %s", namespace, job_name, event.reason, event.message)
        if actions.note is not None:
            self.batch.patch(kind, namespace, job_name, status_annotation_patch(actions.note))

    # ----- adoption (the Job's own watch events) ---------------------------------------------

    def adopt_later(self, kind: WorkloadKind, job: dict[str, Any], then: Any) -> None:
        """adopt() on the adoption workers (a watch thread must not wait on API calls); `then`
        is told the TrainingJob's name when there is one to reconcile."""

        def run() -> None:
            try:
                name = self.adopt(kind, job)
            except Exception:  # the Job's next event or the resync tries again
                log.exception("adoption of Job %s failed", _key(job))
                return
            if name is not None:
                then(job["metadata"]["namespace"], name)

        self._adopting.submit(run)

    def adopt_by_name_later(self, kind: WorkloadKind, name: str, namespace: str, then: Any) -> None:
        """adopt_later() for an object known by name (a TrainJob whose JobSet just came, a pod
        group's member); one at a time per object: a group's N pods made at once are N
        events, and each adoption lists the whole group."""
        key = (kind.kind, namespace, name)
        with self._lock:
            if key in self._pending:
                return
            self._pending.add(key)

        def run() -> None:
            with self._lock:
                self._pending.discard(key)
            try:
                found = self.batch.get(kind, namespace, name)
                adopted = self.adopt(kind, found) if found is not None else None
            except Exception:  # the object's next event or the resync tries again
                log.exception("adoption of %s %s/%s failed", kind.kind, namespace, name)
                return
            if adopted is not None:
                then(namespace, adopted)

        self._adopting.submit(run)

    def _with_child(self, kind: WorkloadKind, job: dict[str, Any] | None) -> dict[str, Any] | None:
        """The object with its child attached (a TrainJob with its JobSet), for kinds run so."""
        if job is None or kind.attach_child is None or kind.child_kind is None:
            return job
        meta = job["metadata"]
        found = self.batch.get(kind.child_kind, meta["namespace"], meta["name"])
        return kind.attach_child(job, found)

    def adopt(self, kind: WorkloadKind, job: dict[str, Any]) -> str | None:
        """The labelled object's TrainingJob, created or brought up to date; its name, or None
        when the object is no gang (then it says why and stays suspended), or when the child
        it runs through is not there yet (its creation event adopts it then)."""
        meta = job["metadata"]
        if meta.get("deletionTimestamp") or not is_queued(job):
            return None
        namespace = meta["namespace"]
        typed = {"apiVersion": kind.api_version, "kind": kind.kind, **job}
        job = self._with_child(kind, typed) or typed
        if kind.attach_child is not None and not job.get(CHILD_KEY):
            return None
        if kind.virtual and not podgroup.complete(job):
            return None  # a pod group is queued once all its pods exist
        try:
            spec = kind.parse(job)
        except InvalidSpec as err:
            self._refuse(kind, job, str(err))
            return None
        wanted = workload(spec)
        name = str(wanted["metadata"]["name"])
        existing = self.api.get_job(namespace, name)
        if existing is None:
            refusal = scheduler_refusal(kind, job, self.scheduler_name)
            if refusal is not None:
                self._refuse(kind, job, refusal)
                return None
            if not kind.suspended(job) and kind.finished(job) is None:
                # Only reachable without the admission policy: stop it before it runs on.
                self.batch.patch(kind, namespace, meta["name"], kind.suspend_patch())
                self.batch.post_event(
                    job,
                    "Warning",
                    "Suspended",
                    f"spec.suspend: a {kind.kind} queued by gangshare is created suspended; "
                    "suspended until its queue admits it",
                    "Adopt",
                )
            try:
                self.batch.create_workload(wanted)
            except Invalid as err:
                self._refuse(kind, job, f"its TrainingJob was refused: {err}")
                return None
            log.info("%s %s/%s queued as TrainingJob %s", kind.kind, namespace, meta["name"], name)
            return name
        ref = (existing.get("spec") or {}).get("jobRef") or {}
        if ref.get("uid") != meta.get("uid"):
            return None  # the TrainingJob of a deleted Job of that name, not yet collected
        asked = wanted["spec"]
        moved = {k: asked[k] for k in MOVABLE if existing["spec"].get(k) != asked[k]}
        phase = (existing.get("status") or {}).get("phase")
        if moved and phase in (None, "Queued"):
            try:
                self.batch.patch_workload_spec(namespace, name, moved)
            except Invalid as err:
                self.batch.post_event(job, "Warning", "NotMoved", str(err), "Adopt")
        return name

    def _refuse(self, kind: WorkloadKind, job: dict[str, Any], message: str) -> None:
        meta = job["metadata"]
        note = f"Invalid: {message}"
        if ((meta.get("annotations") or {}).get(STATUS_ANNOTATION)) == note:
            return  # said already
        if not kind.suspended(job) and kind.finished(job) is None:
            self.batch.patch(kind, meta["namespace"], meta["name"], kind.suspend_patch())
        self.batch.patch(kind, meta["namespace"], meta["name"], status_annotation_patch(note))
        self.batch.post_event(job, "Warning", "InvalidSpec", message, "Adopt")
        log.warning("%s %s not queued: %s", kind.kind, _key(job), message)


def _key(job: dict[str, Any]) -> str:
    meta = job.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"
