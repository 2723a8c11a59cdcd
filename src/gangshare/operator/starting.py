"""An admitted gang whose workers are not all bound yet: nudge it on, or give its GPUs back (pure).

- **Nudges.** The extender refuses a worker whose sibling is still gated (extender/barrier.py)
  and kube-scheduler retries such a pod only when the pod itself changes. Once every gate is
  lifted, each worker still carrying that refusal gets `gangshare.io/gang-ready` set to the
  refusal's fingerprint, once per refusal: kube-scheduler tries it again after its back-off.
- **Releases.** The plan checks what kube-scheduler checks of resources, taints and node
  affinity, but not everything (pod affinity, topology spread, volumes, host ports). A worker
  kube-scheduler refuses for such a reason while a sibling is already bound is a partial gang:
  released `unschedulable_seconds` after its first worker was bound, not at the start
  deadline (by then the bound part could have run for minutes). A plan that broke
  (`displaced`) goes at once; a gang that is simply slow goes at the start deadline.
  These rules (`release_broken`) are every kind's: a TrainingJob's gang before it starts, and
  a queued Job's or JobSet's before it starts and whenever its controller replaces a pod.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from gangshare.core.annotations import GANG_BARRIER_REFUSAL, POD_GANG_READY
from gangshare.kube.scheduling import GANG_GATE
from gangshare.kube.snapshot import parse_time
from gangshare.operator.actions import Observation
from gangshare.operator.conditions import condition
from gangshare.operator.requeue import Release, start_timeout_delay

Pods = Mapping[int, dict[str, Any]]


def gated(pod: Mapping[str, Any]) -> bool:
    return any(
        g.get("name") == GANG_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or []
    )


def bound(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def _refusal(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """kube-scheduler's latest verdict on an unbound pod, if it found no node for it."""
    found = condition((pod.get("status") or {}).get("conditions"), "PodScheduled")
    if found is None or found.get("status") != "False" or found.get("reason") != "Unschedulable":
        return None
    return found


def fingerprint(message: str) -> str:
    return hashlib.sha256(message.encode()).hexdigest()[:12]


def gang_nudges(current: Pods, workers: int) -> list[tuple[str, str]]:
    """(pod, fingerprint) for each worker refused by the gang barrier and not nudged since,
    once the whole gang exists ungated; nothing while any gate is still on."""
    if len(current) < workers or any(gated(p) for p in current.values()):
        return []
    nudges = []
    for pod in current.values():
        refusal = None if bound(pod) else _refusal(pod)
        message = str((refusal or {}).get("message", ""))
        if GANG_BARRIER_REFUSAL not in message:
            continue
        mark = fingerprint(message)
        if ((pod.get("metadata") or {}).get("annotations") or {}).get(POD_GANG_READY) != mark:
            nudges.append((str(pod["metadata"]["name"]), mark))
    return nudges


def first_bound_at(current: Pods) -> float | None:
    """When the first worker of the gang was bound (its PodScheduled turned True)."""
    times = []
    for pod in current.values():
        if not bound(pod):
            continue
        found = condition((pod.get("status") or {}).get("conditions"), "PodScheduled")
        at = parse_time((found or {}).get("lastTransitionTime"))
        if at is not None:
            times.append(at)
    return min(times, default=None)


def unplaceable_worker(current: Pods, workers: int) -> tuple[int, str] | None:
    """A worker kube-scheduler refused for a reason of its own (not the gang barrier)."""
    for rank in range(workers):
        pod = current.get(rank)
        refusal = None if pod is None or bound(pod) else _refusal(pod)
        message = str((refusal or {}).get("message", ""))
        if refusal is not None and GANG_BARRIER_REFUSAL not in message:
            return rank, message
    return None


def release_broken(
    status: Mapping[str, Any],
    current: Pods,
    workers: int,
    seen: Observation,
    unschedulable_seconds: float,
    backoff_base_seconds: float,
    running: bool = False,
) -> tuple[Release | None, float | None]:
    """The rules that release a broken gang, whatever kind of workload it is: its plan broke
    (`displaced`), or kube-scheduler refuses a worker while a sibling is bound. (why it gives
    its GPUs back now, or None; seconds until it should be looked at again, or None.)

    `running`: the gang ran already (a controller replaced one of its pods). Then a worker
    refused counts from its refusal, not from the first bind, and a broken plan releases the
    gang only once a worker of it is waiting to be placed: a rank that finished may leave its
    planned GPUs to others without breaking the ranks still running."""
    displaced = seen.displaced_now(status)
    waiting = any(not bound(p) for p in current.values())
    if displaced is not None and (not running or waiting):
        when = "while it ran" if running else "before it started"
        return (
            Release(
                "GangDisplaced",
                f"the gang's plan broke {when} ({displaced.reason}); "
                "requeued, keeping its place in the queue",
            ),
            None,
        )
    refused = unplaceable_worker(current, workers)
    started = first_bound_at(current)
    if started is None or refused is None:
        return None, None
    rank, why = refused
    if running:
        started = max(started, refused_at(current[rank]) or seen.now)
    due = started + unschedulable_seconds
    if seen.now < due:
        return None, due - seen.now
    delay = start_timeout_delay(status, backoff_base_seconds)
    return (
        Release(
            "GangUnschedulable",
            f"worker {rank} cannot be placed on its planned node ({why}) while "
            f"{sum(bound(p) for p in current.values())} of {workers} workers are "
            f"bound; GPUs released, requeued in {delay:.0f}s",
            delay,
            timed_out=True,
        ),
        None,
    )


def refused_at(pod: Mapping[str, Any]) -> float | None:
    """Since when kube-scheduler has refused the pod (its PodScheduled turned False)."""
    found = _refusal(pod)
    return None if found is None else parse_time(found.get("lastTransitionTime"))


def release_before_start(
    status: Mapping[str, Any],
    current: Pods,
    workers: int,
    seen: Observation,
    start_timeout_seconds: float,
    unschedulable_seconds: float,
    backoff_base_seconds: float,
) -> tuple[Release | None, float | None]:
    """(why the gang gives its GPUs back now, or None; seconds until it should be looked at
    again, or None): broken (`release_broken`), or not all bound by the start deadline."""
    release, wake = release_broken(
        status, current, workers, seen, unschedulable_seconds, backoff_base_seconds
    )
    if release is not None:
        return release, None
    admitted = parse_time(status.get("admittedAt"))
    if admitted is None:
        return None, wake
    deadline = admitted + start_timeout_seconds
    if seen.now < deadline:
        left = deadline - seen.now
        return None, left if wake is None else min(wake, left)
    delay = start_timeout_delay(status, backoff_base_seconds)
    return (
        Release(
            "GangStartTimeout",
            f"workers not all bound {start_timeout_seconds:.0f}s after admission "
            f"({unbound_reason(current, workers)}); GPUs released, requeued in {delay:.0f}s",
            delay,
            timed_out=True,
        ),
        None,
    )


def unbound_reason(current: Pods, workers: int) -> str:
    """What kube-scheduler said about the first worker that is not bound."""
    for rank in range(workers):
        pod = current.get(rank)
        if pod is None:
            return f"worker {rank} was never created"
        if bound(pod):
            continue
        if gated(pod):
            return f"worker {rank} is still gated"
        scheduled = condition((pod.get("status") or {}).get("conditions"), "PodScheduled")
        if scheduled and scheduled.get("message"):
            return f"worker {rank}: {scheduled['message']}"
        return f"worker {rank} is not bound yet"
    return "every worker is bound"
