"""Which recorded plans should steer the kubelet's next choice of devices (pure).

The kubelet does not say which pod it is allocating for. A plan is used only when exactly one
pod bound to this node and not yet admitted by the kubelet asks for this resource in this
amount and carries planned GPUs; with two candidates the agent cannot tell them apart and
lets the core choose instead of guessing. Either way, the GPUs planned for the node's other
waiting pods (an admitted gang's workers, bound or not yet) are taken last: kube-scheduler
binds a bare pod beside a gang whose GPUs are promised, and the bare pod must not take them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gangshare.core.annotations import (
    POD_PLANNED_GPUS,
    POD_PLANNED_NODE,
    AnnotationError,
    decode_gpu_indices,
)
from gangshare.kube.claims import container_gpus

WAITING_PHASES = ("Pending", None)


@dataclass(frozen=True)
class Steering:
    """The one waiting pod's plan to follow, and the GPUs others wait for (taken last)."""

    plan: tuple[int, ...] | None = None
    avoid: frozenset[int] = frozenset()


def steering_for_request(
    pods: Sequence[Mapping[str, Any]],
    admitted: set[tuple[str, str]],
    resource: str,
    size: int,
    node: str,
) -> Steering:
    """`pods`: those bound to `node` and any not bound yet (only the ones planned here count)."""
    here = [p for p in pods if (p.get("spec") or {}).get("nodeName") == node]
    candidate = _candidate(here, admitted, resource, size)
    plan = _plan(candidate, size) if candidate is not None else None
    avoid: set[int] = set()
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if meta is candidate or not _waiting(pod, admitted):
            continue
        where = spec.get("nodeName") or (meta.get("annotations") or {}).get(POD_PLANNED_NODE)
        if where != node or not _asks(spec, resource, None):
            continue
        avoid.update(_plan(meta, None) or ())
    return Steering(plan, frozenset(avoid))


def _waiting(pod: Mapping[str, Any], admitted: set[tuple[str, str]]) -> bool:
    meta = pod.get("metadata") or {}
    if (pod.get("status") or {}).get("phase") not in WAITING_PHASES:
        return False
    return (meta.get("namespace"), meta.get("name")) not in admitted


def _asks(spec: Mapping[str, Any], resource: str, size: int | None) -> bool:
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    counts = [container_gpus(c, resource) for c in containers]
    return any(n == size for n in counts) if size is not None else any(counts)


def _candidate(
    pods: Sequence[Mapping[str, Any]], admitted: set[tuple[str, str]], resource: str, size: int
) -> Mapping[str, Any] | None:
    """The metadata of the one waiting pod that asks for exactly this, else None."""
    candidates = [
        pod.get("metadata") or {}
        for pod in pods
        if _waiting(pod, admitted) and _asks(pod.get("spec") or {}, resource, size)
    ]
    return candidates[0] if len(candidates) == 1 else None


def _plan(meta: Mapping[str, Any], size: int | None) -> tuple[int, ...] | None:
    raw = (meta.get("annotations") or {}).get(POD_PLANNED_GPUS)
    if raw is None:
        return None
    try:
        plan = decode_gpu_indices(POD_PLANNED_GPUS, raw)
    except AnnotationError:
        return None
    return plan if size is None or len(plan) == size else None
