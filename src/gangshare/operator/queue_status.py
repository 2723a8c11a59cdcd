"""What each Queue's status says after a scheduling pass (pure: dicts in, dicts out).

Counts come from the pass's own view: jobs holding GPUs before it (the snapshot's
running jobs) plus what it admitted, minus what it preempted. The head is the first
waiting job in the queue's order that is not merely behind another, with its reason:
`kubectl get queues` and `kubectl describe queue` then say why a queue does not move.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gangshare.core.cycle import CycleResult, PendingKind
from gangshare.core.job import ServiceClass
from gangshare.core.queueing import QueuePolicy, RunningJob
from gangshare.core.queues import QueueSpec


def queue_statuses(
    queues: Mapping[str, QueueSpec],
    policy: QueuePolicy,
    running: Iterable[RunningJob],
    result: CycleResult,
) -> dict[str, dict[str, Any]]:
    statuses: dict[str, dict[str, Any]] = {
        name: {
            "pendingJobs": 0,
            "admittedJobs": 0,
            "guaranteedGPUs": 0,
            "borrowedGPUs": 0,
            "headJob": None,
            "headReason": None,
        }
        for name in queues
    }
    preempted = {p.job.key for p in result.preemptions}
    holders = [
        (r.queue, r.gpus, r.service_class, r.borrowed) for r in running if r.key not in preempted
    ]
    holders += [(a.job.queue, a.job.gpus, a.service_class, a.borrowed) for a in result.admitted]
    for queue, gpus, service_class, borrowed in holders:
        status = statuses.get(queue)
        if status is None:
            continue
        status["admittedJobs"] += 1
        if borrowed:
            status["borrowedGPUs"] += gpus
        elif service_class is ServiceClass.GUARANTEED:
            status["guaranteedGPUs"] += gpus
    heads: dict[str, tuple[tuple[float, float, str], str, str]] = {}
    for waiting in result.pending:
        status = statuses.get(waiting.job.queue)
        if status is None:
            continue
        status["pendingJobs"] += 1
        if waiting.kind is PendingKind.BEHIND:
            continue
        order = policy.order_key(waiting.job)
        known = heads.get(waiting.job.queue)
        if known is None or order < known[0]:
            heads[waiting.job.queue] = (order, waiting.job.key, waiting.reason)
    for queue, (_, key, reason) in heads.items():
        statuses[queue]["headJob"] = key
        statuses[queue]["headReason"] = reason
    return statuses


def changed_fields(current: dict[str, Any] | None, wanted: dict[str, Any]) -> dict[str, Any]:
    """The part of `wanted` that differs from the Queue's current status (no write if empty)."""
    current = current or {}
    return {key: value for key, value in wanted.items() if current.get(key) != value}
