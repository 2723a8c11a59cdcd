"""A TrainingJob's worker pods as the lifecycle reads them (pure): which are this attempt's,
which are bound, finished or stuck deleting, and when to look again."""

from __future__ import annotations

from typing import Any

from gangshare.core.annotations import ATTEMPT_LABEL, RANK_LABEL
from gangshare.kube.snapshot import parse_time
from gangshare.operator.actions import Actions
from gangshare.operator.conditions import condition

TERMINAL = ("Succeeded", "Failed")
# Worker names are the same in every attempt. A pod of an earlier attempt whose phase is final
# has left the operator's pod watch (informers.LIVE_PODS): when its kubelet completes its
# deletion, no event says so. While such a pod holds the name of a worker to create, the job
# looks again this often; less often the longer the pod outlives its deletion deadline (a
# dead node's pods wait for the force-delete).
NAME_POLL_SECONDS = 0.5
NAME_POLL_MAX_SECONDS = 5.0


def pod_name(pod: dict[str, Any]) -> str:
    return str(pod["metadata"]["name"])


def is_terminal(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL


def is_true(status: dict[str, Any], kind: str) -> bool:
    found = condition(status.get("conditions"), kind)
    return bool(found and found.get("status") == "True")


def all_bound(current: dict[int, dict[str, Any]], workers: int) -> bool:
    return len(current) == workers and all(
        (p.get("spec") or {}).get("nodeName") for p in current.values()
    )


def until_stuck(pod: dict[str, Any], now: float, stuck_pod_seconds: float) -> float | None:
    """Seconds until a deleting pod counts as stuck (<= 0: it is); None if not deleting."""
    deadline = parse_time((pod.get("metadata") or {}).get("deletionTimestamp"))
    return None if deadline is None else deadline + stuck_pod_seconds - now


def wait_for_name(holder: dict[str, Any], now: float, actions: Actions) -> None:
    """A worker whose name a pod of an earlier attempt still holds is created once that pod is
    gone (a create now is refused: the name is taken). A live holder's own watch events (its
    final phase, its deletion) wake the job; one whose phase is final sends none, so the job
    looks again shortly."""
    if not is_terminal(holder):
        return
    deadline = parse_time((holder.get("metadata") or {}).get("deletionTimestamp"))
    overdue = 0.0 if deadline is None else max(0.0, now - deadline)
    wake(actions, min(NAME_POLL_MAX_SECONDS, max(NAME_POLL_SECONDS, overdue / 4)))


def wake(actions: Actions, seconds: float) -> None:
    """Ask for another look in `seconds` (the earliest of all such asks wins)."""
    if actions.requeue_after is None or seconds < actions.requeue_after:
        actions.requeue_after = max(0.0, seconds)


def owned_by(pod: dict[str, Any], uid: str) -> bool:
    return any(
        ref.get("controller") and ref.get("uid") == uid
        for ref in (pod.get("metadata") or {}).get("ownerReferences") or []
    )


def split_pods(
    pods: list[dict[str, Any]], attempt: int, uid: str
) -> tuple[dict[int, dict[str, Any]], list[dict[str, Any]]]:
    """This attempt's workers by rank, and the job's older pods; pods the job does not control
    (whatever their labels say) are neither: the operator never acts on them."""
    current: dict[int, dict[str, Any]] = {}
    stale: list[dict[str, Any]] = []
    for pod in pods:
        if not owned_by(pod, uid):
            continue
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get(ATTEMPT_LABEL) == str(attempt) and str(labels.get(RANK_LABEL, "")).isdigit():
            current[int(labels[RANK_LABEL])] = pod
        else:
            stale.append(pod)
    return current, stale
