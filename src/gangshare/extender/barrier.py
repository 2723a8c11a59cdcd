"""The gang barrier: a worker passes only once its whole gang is committed to starting.

The operator lifts a gang's scheduling gates in one pass, but that is one API call per pod:
without a barrier the first worker could be bound while a sibling is still gated, a gang
partly placed for a moment (and for longer if the operator stopped between two calls). The
gang passes once either
- its TrainingJob says the lift is committed (the GangScheduled condition of the current
  attempt, which the operator writes before the first gate comes off and which makes any
  operator that comes next lift whatever gate is left), or
- every worker of the attempt exists ungated (a job whose commitment the watch has not
  brought yet, or an operator that lifts before it commits).
Neither waits. In filter (the shipped configuration, where kube-scheduler binds) a worker that
passes neither is refused at once, with the reason and a count that makes each refusal's
message new (`refusal_reason`): kube-scheduler schedules one pod at a time, and a wait there
stalled every tenant's pods for as long as a large gang's gates took to lift. A refusal is not
cheap either: kube-scheduler 1.35 writes the pod's PodScheduled condition synchronously in its
one loop (SchedulerAsyncAPICalls is off by default), which on a busy API server took 50 to
150 ms a refusal in bench/gang_scale.py, so the commitment, not the refusal, is the common
path. kube-scheduler retries an extender-refused pod on a change to the pod itself, not on its
siblings' (`SchedulingQueue.Update`; an assigned pod's arrival moves only pods with affinity
terms), so the operator nudges each refused worker once every gate is off
(`gangshare.io/gang-ready`). In bind (under extender.bind) the barrier waits for at most
BARRIER_SECONDS, a coroutine on the extender's loop: kube-scheduler binds asynchronously, so
there the wait blocks no other pod's scheduling.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gangshare.core.annotations import GANG_BARRIER_REFUSAL
from gangshare.extender.cache import ClusterCache
from gangshare.kube.claims import worker_identity

# Well inside kube-scheduler's extender httpTimeout (5 s by default).
BARRIER_SECONDS = 2.0
POLL_SECONDS = 0.01
# Refusals counted per pod, for distinct messages; forgotten wholesale past this many pods.
MAX_COUNTED = 50_000


def gang_not_ready(cache: ClusterCache, pod: dict[str, Any]) -> str | None:
    """Why the pod's gang is not wholly ungated yet; None when it is (or it is no gang)."""
    who = worker_identity(pod)
    if who is None:
        return None
    with cache.lock:
        hold = cache.ledger.current_hold(who)
        if hold is None:
            return f"TrainingJob {who.job} holds no plan"
        if hold.lift_committed:
            return None  # every gate of this attempt comes off, whatever happens to the operator
        # The workers as last watched, finished or not: a sibling that already ran counts.
        members = cache.gang_members(who)
        for rank, _node, _gpus in hold.placement:
            if rank == who.rank:
                continue
            gated = members.get(rank)
            if gated is None:
                return f"worker {rank} of attempt {who.attempt} does not exist yet"
            if gated:
                return f"worker {rank} is still gated"
    return None


async def wait_for_gang(
    cache: ClusterCache, pod: dict[str, Any], seconds: float = BARRIER_SECONDS
) -> str | None:
    """None once the whole gang is ungated; the last reason if `seconds` pass first."""
    deadline = time.monotonic() + seconds
    while True:
        waiting = gang_not_ready(cache, pod)
        if waiting is None or time.monotonic() >= deadline:
            return waiting
        await asyncio.sleep(POLL_SECONDS)


class RefusalCounter:
    """How often the barrier refused each worker: kube-scheduler writes a PodScheduled
    condition only when its message changes, and the operator nudges a worker once per
    message, so each refusal must read differently or a second one would go unanswered."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def refusal_reason(self, owner: str, waiting: str, doing: str) -> str:
        if len(self._counts) >= MAX_COUNTED:
            self._counts.clear()
        count = self._counts[owner] = self._counts.get(owner, 0) + 1
        return f"{GANG_BARRIER_REFUSAL} (refusal {count}): {waiting}; not {doing} a part of it"

    def forget(self, owner: str) -> None:
        self._counts.pop(owner, None)
