"""How worker pods tell the operator that their gang failed, and which kind of failure.

A Guaranteed worker's GPU out-of-memory error is judged beside the opportunistic pods
(`gangshare.io/gpu-share`) on its node, which the reconciler looks up when a worker failed
(`nodes_to_look_beside`, Observation.neighbours). Their GPUs, and the worker's own, are what
the agent or the extender recorded (reserved annotations no tenant may write).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gangshare.core.failures import (
    DEFAULT_IMAGE_PULL_GRACE_SECONDS,
    IMAGE_PULL_REASONS,
    USER_WAITING_REASONS,
    Failure,
    FailureSignal,
    GpuTenant,
    classify_failure,
    classify_image_pull,
    shared_with,
)
from gangshare.core.job import ServiceClass
from gangshare.kube.claims import admitted_class, gpu_request, recorded_indices
from gangshare.kube.snapshot import parse_time

Pod = dict[str, Any]


def is_deleting(pod: dict[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def detect_failure(
    workers: int,
    current: dict[int, dict[str, Any]],
    created: bool,
    now: float,
    image_pull_grace: float = DEFAULT_IMAGE_PULL_GRACE_SECONDS,
    neighbours: Sequence[Pod] = (),
) -> Failure | None:
    """neighbours: pods on the failed workers' nodes (nodes_to_look_beside)."""
    for rank in range(workers):
        pod = current.get(rank)
        if pod is None:
            if created:
                return classify_failure(
                    FailureSignal(pod_reason="Deleted", message=f"worker {rank} disappeared")
                )
            continue
        signal = pod_failure_signal(pod, rank, now, neighbours)
        if signal is not None:
            return classify_failure(signal)
        pulling = image_pull_failure(pod, rank, now, image_pull_grace)
        if pulling is not None:
            return pulling
    return None


def pull_grace_left(current: dict[int, dict[str, Any]], now: float, grace: float) -> float | None:
    """Seconds until the first worker stuck pulling its image runs out of grace, if any is."""
    left = None
    for pod in current.values():
        status = pod.get("status") or {}
        statuses = [
            *(status.get("initContainerStatuses") or []),
            *(status.get("containerStatuses") or []),
        ]
        if any(
            ((c.get("state") or {}).get("waiting") or {}).get("reason") in IMAGE_PULL_REASONS
            for c in statuses
        ):
            since = parse_time(status.get("startTime")) or now
            remaining = since + grace - now
            left = remaining if left is None else min(left, remaining)
    return left


def image_pull_failure(pod: dict[str, Any], rank: int, now: float, grace: float) -> Failure | None:
    """A worker that cannot pull its image: user error at once, or infrastructure after grace."""
    status = pod.get("status") or {}
    if is_deleting(pod) or status.get("phase") not in (None, "Pending"):
        return None
    since = parse_time(status.get("startTime")) or parse_time(
        (pod.get("metadata") or {}).get("creationTimestamp")
    )
    waited = 0.0 if since is None else max(0.0, now - since)
    for container in [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_PULL_REASONS:
            return classify_image_pull(
                waiting["reason"], waiting.get("message", ""), waited, grace, f"worker {rank}"
            )
    return None


def nodes_to_look_beside(job: Pod, pods: Sequence[Pod]) -> list[str]:
    """The nodes whose pods a failure of the job must be judged beside: those of its failed
    workers, while it holds GPUs. Only a Guaranteed job is promised its GPUs' memory."""
    phase = (job.get("status") or {}).get("phase")
    if phase not in ("Admitted", "Running") or admitted_class(job) is not ServiceClass.GUARANTEED:
        return []
    nodes = {
        str((p.get("spec") or {}).get("nodeName"))
        for p in pods
        if (p.get("status") or {}).get("phase") == "Failed"
        and (p.get("spec") or {}).get("nodeName")
    }
    return sorted(nodes)


def recorded_gpus(pod: Pod) -> frozenset[int] | None:
    """The GPU indices recorded on a pod, read as every ledger reads them (the agent's
    assignment, else the plan); None when not recorded or not readable."""
    asked = gpu_request(pod)
    if asked is None:
        return None
    indices, _ = recorded_indices(pod, asked[1])
    return frozenset(indices) if indices else None


def gpu_tenants(worker: Pod, neighbours: Sequence[Pod]) -> list[GpuTenant]:
    """The opportunistic pods among `neighbours` on the worker's node."""
    node = (worker.get("spec") or {}).get("nodeName")
    if not node:
        return []
    tenants = []
    for other in neighbours:
        meta = other.get("metadata") or {}
        if (other.get("spec") or {}).get("nodeName") != node:
            continue
        asked = gpu_request(other)
        if asked is None or asked[0] is not ServiceClass.OPPORTUNISTIC:
            continue
        status = other.get("status") or {}
        started = parse_time(status.get("startTime")) or parse_time(meta.get("creationTimestamp"))
        name = f"{meta.get('namespace')}/{meta.get('name')}"
        tenants.append(GpuTenant(name, recorded_gpus(other), started))
    return tenants


def pod_failure_signal(
    pod: dict[str, Any], rank: int, now: float, neighbours: Sequence[Pod] = ()
) -> FailureSignal | None:
    status = pod.get("status") or {}
    if is_deleting(pod):
        return FailureSignal(pod_reason="Terminated", message=f"worker {rank} is being deleted")
    statuses = status.get("containerStatuses") or []
    if status.get("phase") == "Failed":
        if status.get("reason"):
            return FailureSignal(
                pod_reason=status["reason"], message=f"worker {rank}: {status.get('message', '')}"
            )
        for container in statuses:
            ended = (container.get("state") or {}).get("terminated")
            if ended and ended.get("exitCode", 0) != 0:
                started = parse_time(ended.get("startedAt"))
                finished = parse_time(ended.get("finishedAt")) or now
                return FailureSignal(
                    exit_code=int(ended["exitCode"]),
                    terminated_reason=ended.get("reason"),
                    seconds_since_start=None if started is None else max(0.0, finished - started),
                    message=f"worker {rank} container {container.get('name')} "
                    f"exited with code {ended['exitCode']}",
                    termination_message=str(ended.get("message") or ""),
                    shared_with=shared_with(
                        recorded_gpus(pod), finished, gpu_tenants(pod, neighbours)
                    ),
                )
        return FailureSignal(pod_reason="Failed", message=f"worker {rank} failed")
    for container in statuses:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in USER_WAITING_REASONS:
            return FailureSignal(
                waiting_reason=waiting["reason"],
                message=f"worker {rank}: {waiting['reason']}: {waiting.get('message', '')}".rstrip(
                    ": "
                ),
            )
    return None
