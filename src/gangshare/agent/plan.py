"""Which recorded plan, if any, should steer the kubelet's next choice of devices (pure).

The kubelet does not say which pod it is allocating for. A plan is used only when exactly one
pod bound to this node and not yet admitted by the kubelet asks for this resource in this
amount and carries planned GPUs; with two candidates the agent cannot tell them apart and
lets the core choose instead of guessing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gangshare.core.annotations import POD_PLANNED_GPUS, AnnotationError, decode_gpu_indices
from gangshare.kube.claims import container_gpus

WAITING_PHASES = ("Pending", None)


def plan_for_request(
    pods: Sequence[Mapping[str, Any]],
    admitted: set[tuple[str, str]],
    resource: str,
    size: int,
) -> tuple[int, ...] | None:
    candidates = []
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if (pod.get("status") or {}).get("phase") not in WAITING_PHASES:
            continue
        if (meta.get("namespace"), meta.get("name")) in admitted:
            continue
        containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        if not any(container_gpus(c, resource) == size for c in containers):
            continue
        candidates.append(meta)
    if len(candidates) != 1:
        return None
    raw = (candidates[0].get("annotations") or {}).get(POD_PLANNED_GPUS)
    if raw is None:
        return None
    try:
        plan = decode_gpu_indices(POD_PLANNED_GPUS, raw)
    except AnnotationError:
        return None
    return plan if len(plan) == size else None
