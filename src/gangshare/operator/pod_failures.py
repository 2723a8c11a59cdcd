"""How worker pods tell the operator that their gang failed, and which kind of failure."""

from __future__ import annotations

from typing import Any

from gangshare.core.failures import (
    DEFAULT_IMAGE_PULL_GRACE_SECONDS,
    IMAGE_PULL_REASONS,
    USER_WAITING_REASONS,
    Failure,
    FailureSignal,
    classify_failure,
    classify_image_pull,
)
from gangshare.kube.snapshot import parse_time


def is_deleting(pod: dict[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def detect_failure(
    workers: int,
    current: dict[int, dict[str, Any]],
    created: bool,
    now: float,
    image_pull_grace: float = DEFAULT_IMAGE_PULL_GRACE_SECONDS,
) -> Failure | None:
    for rank in range(workers):
        pod = current.get(rank)
        if pod is None:
            if created:
                return classify_failure(
                    FailureSignal(pod_reason="Deleted", message=f"worker {rank} disappeared")
                )
            continue
        signal = pod_failure_signal(pod, rank, now)
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


def pod_failure_signal(pod: dict[str, Any], rank: int, now: float) -> FailureSignal | None:
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
