"""Which jobs a scheduling pass hands to the reconciler for what no watch announces.

Time-driven steps (new jobs, back-off ends, TTL after finishing, wake-ups the reconciler
asked for), and a backstop for missed watch events: every unfinished job with something to
look after is reconciled again at least every FULL_RESYNC_SECONDS, at most RESYNC_PER_PASS
of them per pass, oldest first.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gangshare.core.annotations import JOB_LABEL
from gangshare.kube.claims import job_key
from gangshare.kube.snapshot import parse_time
from gangshare.operator.lifecycle import job_needs_reconcile
from gangshare.operator.reconcile import Reconciler
from gangshare.operator.worker_pods import TERMINAL

FULL_RESYNC_SECONDS = 30.0
RESYNC_PER_PASS = 32


def resync_keys(
    jobs: list[dict[str, Any]],
    live_pods: Iterable[dict[str, Any]] | None,
    reconciler: Reconciler,
    now: float,
    already: set[str],
) -> tuple[list[str], int]:
    """The keys to reconcile (none in `already`), and how many are the backstop's.
    `live_pods`: the pod store's (None without one: every unfinished job is looked at)."""
    owners = None if live_pods is None else jobs_with_live_pods(live_pods)
    due: list[str] = []
    stale: list[tuple[float, str]] = []
    present = set()
    for job in jobs:
        status = job.get("status") or {}
        phase = status.get("phase")
        key = job_key(job)
        present.add(key)
        ready = phase is None or (
            phase == "Restarting" and (parse_time(status.get("nextRetryAt")) or 0) <= now
        )
        ttl = (job.get("spec") or {}).get("ttlSecondsAfterFinished")
        if phase in TERMINAL and ttl is not None:
            ready = ready or (parse_time(status.get("completedAt")) or now) + ttl <= now
        if ready:
            due.append(key)
        elif phase not in TERMINAL and resync_worthy(job, owners):
            at = reconciler.reconciled_at(key)
            if at is None or now - at >= FULL_RESYNC_SECONDS:
                stale.append((-1e18 if at is None else at, key))
    reconciler.forget_all_but(present)
    stale.sort()
    backstop = [key for _, key in stale if key not in already][:RESYNC_PER_PASS]
    keys = dict.fromkeys([*due, *backstop, *reconciler.due(now)])
    return [key for key in keys if key not in already], len(backstop)


def jobs_with_live_pods(pods: Iterable[dict[str, Any]]) -> set[str]:
    """Keys of the jobs that own one of these pods."""
    owners = set()
    for pod in pods:
        meta = pod.get("metadata") or {}
        job = (meta.get("labels") or {}).get(JOB_LABEL)
        if job:
            owners.add(f"{meta.get('namespace')}/{job}")
    return owners


def resync_worthy(job: dict[str, Any], owners: set[str] | None) -> bool:
    """Whether the backstop resync has anything to look after in an unfinished job. A Queued
    job whose status is current and that owns no live pod has none (a pod of an earlier
    attempt announces itself); without a pod store every job is looked at."""
    return owners is None or job_needs_reconcile(job) or job_key(job) in owners
