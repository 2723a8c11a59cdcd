"""Which pods are a queued object's gang for an attempt (pure; batch_lifecycle.py reads them).

Labels alone prove nothing (anyone may write them): a pod is the object's only when its
controllers made it (`WorkloadKind.owns`), and of an attempt when gangshare gave it that
attempt, or it still waits gated without one (the object is resumed only once its controller
has no pod of the last run active, so a gated pod is always of the running attempt).
"""

from __future__ import annotations

from typing import Any

from gangshare.core.annotations import ATTEMPT_LABEL, RANK_LABEL
from gangshare.kube.queued import WorkloadKind
from gangshare.operator.starting import bound, gated
from gangshare.operator.worker_pods import TERMINAL


def labels(pod: dict[str, Any]) -> dict[str, Any]:
    return (pod.get("metadata") or {}).get("labels") or {}


def phase(pod: dict[str, Any]) -> str | None:
    return (pod.get("status") or {}).get("phase")


def created(pod: dict[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return str(meta.get("creationTimestamp", "")), str(meta.get("name", ""))


def of_attempt(
    kind: WorkloadKind, pods: list[dict[str, Any]], obj: dict[str, Any], attempt: int
) -> list[Any]:
    """The object's own pods (its controllers': labels alone prove nothing) of this attempt:
    those given it, and those still gated without one. The object is resumed only once its
    controller has no pod of the last run active, so a gated pod is always of the running
    attempt."""
    return [
        p
        for p in pods
        if (
            labels(p).get(ATTEMPT_LABEL) == str(attempt)
            or (gated(p) and ATTEMPT_LABEL not in labels(p))
        )
        and kind.owns(p, obj)
    ]


def current_pods(
    kind: WorkloadKind, pods: list[dict[str, Any]], obj: dict[str, Any], attempt: int
) -> list[Any]:
    return [
        p
        for p in of_attempt(kind, pods, obj, attempt)
        if phase(p) not in TERMINAL and not (p.get("metadata") or {}).get("deletionTimestamp")
    ]


def by_rank(
    kind: WorkloadKind, pods: list[dict[str, Any]], obj: dict[str, Any], attempt: int
) -> dict[int, dict[str, Any]]:
    """The attempt's live pods by the rank gangshare gave them (a gated pod by the rank its
    controller's labels give it, until one of the rank is placed)."""
    out: dict[int, dict[str, Any]] = {}
    live = current_pods(kind, pods, obj, attempt)
    for pod in sorted(live, key=lambda p: (gated(p), not bound(p), created(p))):
        raw = str(labels(pod).get(RANK_LABEL, ""))
        rank = int(raw) if raw.isdigit() and not gated(pod) else kind.pod_rank(pod, obj)
        if rank is not None:
            out.setdefault(rank, pod)
    return out
