"""Carry out what `lifecycle.detect_actions` decided (the side-effecting `process_*` half).

Order matters for crash safety: pods are created before the status says GangScheduled, and
the gates are lifted after it (GangScheduled commits the lift: any reconcile that finds it with
a gate still on lifts the rest, and the extender's gang barrier passes on it);
a restart or failure is written to status before its pods are deleted (else a
crash would make the deletion look like a second, infrastructure failure).
Anything the API server refuses for good (422 on the Service or a pod built from
the user's template, a worker name taken by a pod the job does not own) ends the
job with the reason; it never becomes a reconcile that fails forever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from gangshare.core.clock import Clock
from gangshare.operator.actions import Actions, Displacement, Observation
from gangshare.operator.batch_reconcile import BatchReconciler
from gangshare.operator.conditions import iso, set_condition
from gangshare.operator.gate_refusals import GATE_LIFT_REFUSED, gate_lift_refusal
from gangshare.operator.informers import newer
from gangshare.operator.kubeapi import Conflict, Forbidden, Invalid, KubeApi, LeadershipLost
from gangshare.operator.lifecycle import Limits, detect_actions
from gangshare.operator.metrics import OperatorMetrics
from gangshare.operator.pod_failures import nodes_to_look_beside
from gangshare.operator.store_steps import (
    CachedReads,
    creates_nothing,
    first_workers,
    forward_status_step,
)

T = TypeVar("T")
log = logging.getLogger("gangshare.operator")
MAX_PASSES = 4
# Reconciles for pod watch events and the pass's admissions run on these; most wait on the
# API server, not the CPU.
EVENT_WORKERS = 16
EVENT_GATHER_SECONDS = 0.05
# Per-pod calls of one reconcile (gate lifts, nudges) made side by side.
POD_CALL_WORKERS = 16
_pod_calls = ThreadPoolExecutor(POD_CALL_WORKERS, thread_name_prefix="pod-calls")


def _side_by_side(call: Callable[[T], None], items: Sequence[T]) -> None:
    """Every call made, side by side; the first error is raised once all have ended."""
    if len(items) <= 1:
        for item in items:
            call(item)
        return
    for future in [_pod_calls.submit(call, item) for item in items]:
        future.result()


@dataclass(frozen=True)
class OperatorOptions:
    scheduler_name: str = "gangshare-scheduler"
    user_error_retries: int = 0
    backoff_base_seconds: float = 10.0
    limits: Limits = field(default_factory=Limits)


class Refused(Exception):
    """Something the job asks for can never be created; the job ends with this reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def abandoned(key: str, lost: LeadershipLost) -> None:
    """A reconcile cut short by the loss of the lead: neither an error (no traceback) nor a
    reason to look again (no wake-up): this replica acts on nothing more."""
    log.warning("reconcile of %s abandoned: %s", key, lost)


def _queues_a_job(job: dict[str, Any]) -> bool:
    """A TrainingJob that only holds a batch/v1 Job's place (batch_reconcile.py acts for it)."""
    return bool((job.get("spec") or {}).get("jobRef"))


class Reconciler:
    def __init__(
        self,
        api: KubeApi,
        clock: Clock,
        options: OperatorOptions,
        metrics: OperatorMetrics | None = None,
    ) -> None:
        self.api = api
        self.clock = clock
        self.options = options
        self.metrics = metrics or OperatorMetrics()
        self._locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)
        # job key -> when it asked to be looked at again (time-driven steps no event announces)
        self._wake_at: dict[str, float] = {}
        # job key -> when it was last reconciled, for whatever reason (the backstop resync
        # looks only at jobs nobody has looked at for a while)
        self._reconciled_at: dict[str, float] = {}
        self._wake_lock = threading.Lock()
        # Jobs with a watch event's reconcile waiting to start (reconcile_soon, _later).
        self._waiting: set[str] = set()
        # The newest copy of each waiting job its watch events carried (kopf's job watch can be
        # ahead of the store's).
        self._seen: dict[str, dict[str, Any]] = {}
        self._events = ThreadPoolExecutor(EVENT_WORKERS, thread_name_prefix="reconcile-event")
        # The live pods bound to a node (the operator's pod store, when it watches pods).
        self.pods_on_node: Callable[[str], list[dict[str, Any]]] = lambda node: (
            self.api.list_node_pods(node)
        )
        # With watch-fed stores, a reconcile first decides from them and reads the API server
        # (a job GET, a pod LIST, a Service GET) only when they show work to do: most watch
        # events and backstop visits find none, and at 4,000 jobs those reads were most of the
        # API server's load (bench/scale.py: 26 of 47 requests per job).
        self.cached: CachedReads | None = None
        # Reconciles the TrainingJobs that queue batch/v1 Jobs (spec.jobRef); None: such
        # TrainingJobs are left alone (the operator runs without Job support).
        self.batch: BatchReconciler | None = None

    def due(self, now: float) -> list[str]:
        """Jobs whose requested wake-up time has come."""
        with self._wake_lock:
            return [key for key, at in self._wake_at.items() if at <= now]

    def reconciled_at(self, key: str) -> float | None:
        with self._wake_lock:
            return self._reconciled_at.get(key)

    def forget_all_but(self, keys: set[str]) -> None:
        """Drops the reconcile times of jobs outside `keys` (ended or deleted)."""
        with self._wake_lock:
            for key in self._reconciled_at.keys() - keys:
                del self._reconciled_at[key]

    def reconcile(
        self, namespace: str, name: str, displaced: Displacement | None = None
    ) -> float | None:
        """Bring one job a step closer to done; returns seconds until it wants another look."""
        key = f"{namespace}/{name}"
        try:
            with self._locks[key]:
                requeue = self._reconcile(namespace, name, displaced, None)
        except LeadershipLost as lost:
            abandoned(key, lost)
            return None
        return self._reconciled(key, requeue)

    def reconcile_soon(self, namespace: str, name: str, seen: dict[str, Any] | None = None) -> None:
        """A reconcile for a watch event, coalesced: when one for the job is already waiting
        to start, this event adds nothing (that one reads everything afresh once it starts).
        A 512-worker gang sends thousands of pod events, each of which used to cost a
        reconcile that lists all 512 pods. `seen`: the job as the event carried it (its
        watch may be ahead of the store's)."""
        if self._claim_wait(namespace, name):
            self._reconcile_waiting(namespace, name, seen)

    def reconcile_later(
        self, namespace: str, name: str, seen: dict[str, Any] | None = None
    ) -> None:
        """reconcile_soon on the reconciler's own workers (for a watch thread, which must not
        wait for a reconcile); an event for a job already waiting costs nothing but leaves
        its copy of the job (`seen`), when newer, for the waiting one."""
        key = f"{namespace}/{name}"
        if seen is not None:
            with self._wake_lock:
                if newer(seen, self._seen.get(key)):
                    self._seen[key] = seen
        if self._claim_wait(namespace, name):
            self._events.submit(self._reconcile_quietly, namespace, name)

    def _claim_wait(self, namespace: str, name: str) -> bool:
        key = f"{namespace}/{name}"
        with self._wake_lock:
            if key in self._waiting:
                return False
            self._waiting.add(key)
            return True

    def _reconcile_quietly(self, namespace: str, name: str) -> None:
        # A gang's pods change in bursts (hundreds of events a second for a large one): a
        # moment's wait lets one reconcile, and one listing of the gang's pods, answer them.
        time.sleep(EVENT_GATHER_SECONDS)
        try:
            self._reconcile_waiting(namespace, name)
        except Exception:  # the backstop resync retries; a watch event must never be fatal
            log.exception("reconcile of %s/%s failed; will retry", namespace, name)

    def _reconcile_waiting(
        self, namespace: str, name: str, seen: dict[str, Any] | None = None
    ) -> None:
        key = f"{namespace}/{name}"
        try:
            with self._locks[key]:
                with self._wake_lock:
                    self._waiting.discard(key)
                    left = self._seen.pop(key, None)
                if left is not None and newer(left, seen):
                    seen = left
                requeue = self._reconcile(namespace, name, None, seen)
        except LeadershipLost as lost:
            abandoned(key, lost)
            return
        finally:
            with self._wake_lock:
                self._waiting.discard(key)
        self._reconciled(key, requeue)

    def _reconciled(self, key: str, requeue: float | None) -> float | None:
        with self._wake_lock:
            self._reconciled_at[key] = self.clock.now()
            if requeue is None:
                self._wake_at.pop(key, None)
            else:
                self._wake_at[key] = self.clock.now() + requeue
        return requeue

    def _from_stores(
        self,
        namespace: str,
        name: str,
        seen: dict[str, Any] | None,
        trusted: Callable[[dict[str, Any], Actions], bool] | None = None,
    ) -> tuple[bool, float | None]:
        """(True, requeue) when the stores alone settle this reconcile: they show nothing to
        do, or only a forward status step (a new job Queued, a started gang Running) that the
        status write's resourceVersion precondition keeps from landing on a changed job. A
        store that lags only ever shows more to do (a pod that ended has left the live-pod
        store; one just created is not there yet), and anything else (pods, a Service, a
        restart) is decided again from the API server; the Service is taken as present here
        (it is created with the pods, which always go that way)."""
        cached = self.cached
        if cached is None:
            return False, None
        job = cached.job(f"{namespace}/{name}")
        if seen is not None and newer(seen, job):
            job = seen
        if job is None or job["metadata"].get("deletionTimestamp") or _queues_a_job(job):
            return False, None
        pods = cached.pods(namespace, name)
        observed = Observation(
            job,
            pods,
            True,
            self.clock.now(),
            None,
            tuple(p for n in nodes_to_look_beside(job, pods) for p in self.pods_on_node(n)),
        )
        actions = self._decide(observed)
        if actions.empty:
            return True, actions.requeue_after
        first = trusted is None and first_workers(job, pods, actions)
        if first:
            # The Service goes with the pods, as on the API path.
            actions = self._decide(replace(observed, has_service=False))
        elif not (trusted or forward_status_step)(job, actions):
            return False, None
        try:
            existed = self.process(job, actions)
        except Conflict:
            return False, None  # the job changed under the stores: read it afresh
        if not first:
            return True, actions.requeue_after
        if existed:
            return False, None  # a worker the stores did not show: decide from a fresh read
        # The next step (commit, lift the gates) from the stores, as the API path takes it.
        return self._from_stores(namespace, name, None, creates_nothing)

    def _reconcile(
        self,
        namespace: str,
        name: str,
        displaced: Displacement | None,
        event_job: dict[str, Any] | None,
    ) -> float | None:
        if displaced is None:
            settled, requeue_after = self._from_stores(namespace, name, event_job)
            if settled:
                self.metrics.reconciles.labels("cache").inc()
                return requeue_after
        self.metrics.reconciles.labels("api").inc()
        requeue: float | None = None
        for _ in range(MAX_PASSES):
            job = self.api.get_job(namespace, name)
            if job is None or job["metadata"].get("deletionTimestamp"):
                return None
            if _queues_a_job(job):
                return None if self.batch is None else self.batch.reconcile(job, displaced)
            pods = self.api.list_job_pods(namespace, name)
            beside = tuple(p for n in nodes_to_look_beside(job, pods) for p in self.pods_on_node(n))
            actions = self._decide(
                Observation(job, pods, True, self.clock.now(), displaced, beside)
            )
            if actions.create_pods:
                # The Service goes with the pods: creating one that exists is a harmless 409,
                # cheaper than a GET on every reconcile that creates nothing.
                seen = Observation(job, pods, False, self.clock.now(), displaced, beside)
                actions = self._decide(seen)
            if actions.empty:
                return actions.requeue_after
            try:
                self.process(job, actions)
            except Conflict:
                continue  # someone wrote the job meanwhile: decide again from a fresh read
            requeue = actions.requeue_after
            if not (actions.create_pods or actions.create_service or actions.lift_gates):
                return requeue
            # The stores now hold this round's fresh reads plus what it wrote (assumed from the
            # answers): the next step (commit and lift the gates of the pods just created) is
            # taken from them, and only a step that creates or deletes reads afresh.
            settled, after = self._from_stores(namespace, name, None, creates_nothing)
            if settled:
                return after
        return requeue

    def _decide(self, seen: Observation) -> Actions:
        return detect_actions(
            seen,
            self.options.scheduler_name,
            self.options.user_error_retries,
            self.options.backoff_base_seconds,
            self.options.limits,
        )

    def process(self, job: dict[str, Any], actions: Actions) -> int:
        """Carry the actions out; returns how many of its pods already existed."""
        meta = job["metadata"]
        namespace = meta["namespace"]
        try:
            existed = self._create(job, actions)
        except Refused as refused:
            self._fail_refused(job, refused, [p["metadata"]["name"] for p in actions.create_pods])
            return 0
        if actions.status:
            # Before the gates: GangScheduled commits the lift (extender/barrier.py), and any
            # operator that comes next lifts whatever gate is left.
            self.api.patch_job_status(job, actions.status)
            # Counted at the commit: a Conflict above counts nothing, and once the status is
            # written the next reconcile will not decide (or count) the same step again.
            self.metrics.applied(job, actions)
        # One call per pod, side by side: a large gang's gates come off in a fraction of the
        # time one after another took.
        self._lift_gates(job, actions.lift_gates)
        _side_by_side(lambda nudge: self.api.nudge_pod(namespace, *nudge), actions.nudge_pods)
        if actions.nudge_pods:
            log.info(
                "%s/%s: %d worker(s) the gang barrier refused nudged (every gate is off)",
                namespace,
                meta["name"],
                len(actions.nudge_pods),
            )
        # The events tell what the committed status decided, so they go out before the
        # deletions that carry it out: a reader who sees the status sees its reason soon after.
        for event in actions.events:
            self.api.post_event(job, event.type, event.reason, event.message, action="Reconcile")
            log.info("%s/%s %s: %s", namespace, meta["name"], event.reason, event.message)
        for pod_name in actions.delete_pods:
            self.api.delete_pod(namespace, pod_name)
        for pod_name in actions.force_delete_pods:
            self.api.delete_pod(namespace, pod_name, force=True)
            log.warning(
                "%s/%s: pod %s was stuck terminating past its deadline; force-deleted",
                namespace,
                meta["name"],
                pod_name,
            )
        if actions.delete_job:
            self.api.delete_job(namespace, meta["name"])
            log.info("%s/%s deleted: ttlSecondsAfterFinished elapsed", namespace, meta["name"])
        return existed

    def _lift_gates(self, job: dict[str, Any], pods: list[str]) -> None:
        """Every gate lifted side by side; one that is forbidden leaves its gang gated and says
        why on the job (gate_refusals.py)."""
        namespace, refused = job["metadata"]["namespace"], []

        def lift(pod: str) -> None:
            try:
                self.api.lift_gate(namespace, pod)
            except Forbidden as err:
                refused.append(f"{pod}: {err}")

        _side_by_side(lift, pods)
        if refused:
            message = gate_lift_refusal(sorted(refused))
            self.api.post_event(job, "Warning", GATE_LIFT_REFUSED, message, action="Schedule")
            log.warning("%s/%s: %s", namespace, job["metadata"]["name"], message)

    def _create(self, job: dict[str, Any], actions: Actions) -> int:
        """Create the Service and pods the actions ask for; returns how many pods existed."""
        namespace, uid = job["metadata"]["namespace"], job["metadata"].get("uid")
        existed: list[str] = []
        if actions.create_service is not None:
            try:
                self.api.create("Service", namespace, actions.create_service)
            except Invalid as err:
                raise Refused(
                    "InvalidSpec", f"metadata.name: the workers' Service was refused: {err}"
                ) from None

        def create_worker(pod: dict[str, Any]) -> None:
            name = pod["metadata"]["name"]
            try:
                created = self.api.create("Pod", namespace, pod)
            except Invalid as err:
                raise Refused(
                    "InvalidPodTemplate", f"spec.template: the worker pod was refused: {err}"
                ) from None
            if not created:
                existed.append(name)
            if not created and self.api.pod_controller_uid(namespace, name) not in (uid, None):
                raise Refused(
                    "WorkerNameTaken",
                    f"pod {name} already exists and is not this job's: a worker's name "
                    "must be free (delete that pod, or rename the job)",
                )

        # Side by side: a 512-worker gang's pods one by one took seconds before its gates.
        _side_by_side(create_worker, actions.create_pods)
        return len(existed)

    def _fail_refused(self, job: dict[str, Any], refused: Refused, pods: list[str]) -> None:
        now = self.clock.now()
        status = job.get("status") or {}
        gen = int(job["metadata"].get("generation", 0))
        self.api.patch_job_status(
            job,
            {
                "phase": "Failed",
                "completedAt": iso(now),
                "placement": None,
                "message": refused.message,
                "lastFailure": {
                    "reason": refused.reason,
                    "class": "User",
                    "message": refused.message,
                    "time": iso(now),
                },
                "conditions": set_condition(
                    status.get("conditions"),
                    "Failed",
                    True,
                    refused.reason,
                    refused.message,
                    now,
                    gen,
                ),
            },
        )
        uid = job["metadata"].get("uid")
        for pod in pods:
            if self.api.pod_controller_uid(job["metadata"]["namespace"], pod) == uid:
                self.api.delete_pod(job["metadata"]["namespace"], pod)
        self.api.post_event(job, "Warning", refused.reason, refused.message, action="CreateWorkers")
