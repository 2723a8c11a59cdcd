"""How worker pods tell the operator that their gang failed, and which kind of failure."""

from __future__ import annotations

from typing import Any

from gangshare.core.failures import USER_WAITING_REASONS, Failure, FailureSignal, classify_failure
from gangshare.kube.snapshot import parse_time


def is_deleting(pod: dict[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def detect_failure(
    workers: int, current: dict[int, dict[str, Any]], created: bool, now: float
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
