"""The gang barrier: a worker passes only once every worker of its gang exists ungated.

The operator lifts a gang's scheduling gates in one pass, but that is one API call per pod:
without the barrier the first worker could be bound while a sibling is still gated, a gang
partly placed for a moment (and for longer if the operator stops between two calls). Like
the coscheduling plugin's Permit stage, the extender waits a short while for the siblings, a
coroutine on its loop that holds no thread:
- in filter (the shipped configuration, where kube-scheduler binds), for at most
  FILTER_BARRIER_SECONDS. The wait holds kube-scheduler's scheduling loop, but the operator
  lifts a gang's gates milliseconds apart, so in practice it lasts that long; a gang still
  gated after it is refused with the reason, and kube-scheduler retries the worker on the next
  cluster event (a sibling's bind is one);
- in bind (under extender.bind), for at most BARRIER_SECONDS: kube-scheduler binds
  asynchronously, so there the wait blocks no other pod's scheduling.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gangshare.extender.cache import ClusterCache
from gangshare.kube.claims import worker_identity
from gangshare.kube.trainingjob import worker_pod_name

# Well inside kube-scheduler's extender httpTimeout (5 s by default).
BARRIER_SECONDS = 2.0
# Short: kube-scheduler schedules nothing else while a filter call is out.
FILTER_BARRIER_SECONDS = 0.5
POLL_SECONDS = 0.01


def gang_not_ready(cache: ClusterCache, pod: dict[str, Any]) -> str | None:
    """Why the pod's gang is not wholly ungated yet; None when it is (or it is no gang)."""
    who = worker_identity(pod)
    if who is None:
        return None
    with cache.lock:
        hold = cache.ledger.current_hold(who)
        if hold is None:
            return f"TrainingJob {who.job} holds no plan"
        namespace, _, job = who.job.partition("/")
        for rank, _node, _gpus in hold.placement:
            if rank == who.rank:
                continue
            # The pod as last watched, finished or not: a sibling that already ran counts.
            sibling = cache.pod(namespace, worker_pod_name(job, rank))
            same = worker_identity(sibling) if sibling is not None else None
            if sibling is None or same is None or cache.ledger.current_hold(same) is not hold:
                return f"worker {rank} of attempt {who.attempt} does not exist yet"
            if (sibling.get("spec") or {}).get("schedulingGates"):
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
