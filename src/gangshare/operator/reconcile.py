"""Carry out what `lifecycle.detect_actions` decided (the side-effecting `process_*` half).

Order matters for crash safety: pods are created and their gates lifted before
the status says GangScheduled (else a crash could leave a gang gated forever);
a restart or failure is written to status before its pods are deleted (else a
crash would make the deletion look like a second, infrastructure failure).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from gangshare.core.clock import Clock
from gangshare.operator.conditions import iso, set_condition
from gangshare.operator.kubeapi import Conflict, Invalid, KubeApi
from gangshare.operator.lifecycle import Actions, Observation, detect_actions

log = logging.getLogger("gangshare.operator")
MAX_PASSES = 4


@dataclass(frozen=True)
class OperatorOptions:
    scheduler_name: str = "gangshare-scheduler"
    user_error_retries: int = 0
    backoff_base_seconds: float = 10.0
    # Fault injection for crash tests: seconds to sleep after each pod creation.
    pod_create_delay: float = 0.0


class Reconciler:
    def __init__(self, api: KubeApi, clock: Clock, options: OperatorOptions) -> None:
        self.api = api
        self.clock = clock
        self.options = options
        self._locks: defaultdict[str, threading.Lock] = defaultdict(threading.Lock)

    def reconcile(self, namespace: str, name: str) -> float | None:
        """Bring one job a step closer to done; returns seconds until it wants another look."""
        with self._locks[f"{namespace}/{name}"]:
            requeue: float | None = None
            for _ in range(MAX_PASSES):
                job = self.api.get_job(namespace, name)
                if job is None or job["metadata"].get("deletionTimestamp"):
                    return None
                seen = Observation(
                    job,
                    self.api.list_job_pods(namespace, name),
                    self.api.has_service(namespace, name),
                    self.clock.now(),
                )
                actions = detect_actions(
                    seen, self.options.scheduler_name, self.options.user_error_retries
                )
                if actions.empty:
                    return actions.requeue_after
                try:
                    self.process(job, actions)
                except Conflict:
                    continue  # someone wrote the job meanwhile: decide again from a fresh read
                requeue = actions.requeue_after
                if not (actions.create_pods or actions.create_service or actions.lift_gates):
                    return requeue
            return requeue

    def process(self, job: dict[str, Any], actions: Actions) -> None:
        meta = job["metadata"]
        namespace = meta["namespace"]
        if actions.create_service is not None:
            self.api.create("Service", namespace, actions.create_service)
        for pod in actions.create_pods:
            try:
                self.api.create("Pod", namespace, pod)
            except Invalid as err:
                self._fail_invalid_template(
                    job, str(err), [p["metadata"]["name"] for p in actions.create_pods]
                )
                return
            if self.options.pod_create_delay:
                time.sleep(self.options.pod_create_delay)
        for pod_name in actions.lift_gates:
            self.api.lift_gate(namespace, pod_name)
        if actions.status:
            self.api.patch_job_status(job, actions.status)
        for pod_name in actions.delete_pods:
            self.api.delete_pod(namespace, pod_name)
        for event in actions.events:
            self.api.post_event(job, event.type, event.reason, event.message, action="Reconcile")
            log.info("%s/%s %s: %s", namespace, meta["name"], event.reason, event.message)
        if actions.delete_job:
            self.api.delete_job(namespace, meta["name"])
            log.info("%s/%s deleted: ttlSecondsAfterFinished elapsed", namespace, meta["name"])

    def _fail_invalid_template(self, job: dict[str, Any], message: str, pods: list[str]) -> None:
        now = self.clock.now()
        status = job.get("status") or {}
        gen = int(job["metadata"].get("generation", 0))
        text = f"spec.template: the worker pod was refused: {message}"
        self.api.patch_job_status(
            job,
            {
                "phase": "Failed",
                "completedAt": iso(now),
                "placement": None,
                "message": text,
                "lastFailure": {
                    "reason": "InvalidPodTemplate",
                    "class": "User",
                    "message": text,
                    "time": iso(now),
                },
                "conditions": set_condition(
                    status.get("conditions"), "Failed", True, "InvalidPodTemplate", text, now, gen
                ),
            },
        )
        for pod in pods:
            self.api.delete_pod(job["metadata"]["namespace"], pod)
        self.api.post_event(job, "Warning", "InvalidPodTemplate", text, action="CreateWorkers")
