"""Which recorded plans should steer the kubelet's next choice of devices (pure).

The kubelet does not say which pod it is allocating for. The candidates are the pods bound
to this node, not yet admitted by the kubelet, with a container that asks for this resource
in this amount. Their plans are followed when that tells the pods apart or does not need to:
- one candidate: its plan;
- several, all workers of the same gang and attempt: they are interchangeable (the same
  template, the same size, one job's plan across them), so whichever of their plans the
  kubelet can still give whole is served. The PodResources read that says who was admitted
  may predate a sibling's Allocate; the kubelet's own list of available devices does not, so
  a plan already handed to a sibling is simply no longer available;
- anything else (a bare pod beside a worker of the same size): no plan; the core chooses.
Either way, the GPUs planned for the node's other waiting pods (an admitted gang's workers,
bound or not yet) are taken last: kube-scheduler binds a bare pod beside a gang whose GPUs
are promised, and the bare pod must not take them.
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
from gangshare.kube.claims import worker_identity
from gangshare.kube.scheduling import container_gpus

WAITING_PHASES = ("Pending", None)


@dataclass(frozen=True)
class Steering:
    """The plans this allocation may serve (first available wins), and the GPUs the node's
    other waiting pods are planned on (taken last)."""

    plans: tuple[tuple[int, ...], ...] = ()
    avoid: frozenset[int] = frozenset()

    @property
    def plan(self) -> tuple[int, ...] | None:
        """The one plan, when exactly one pod's is followed."""
        return self.plans[0] if len(self.plans) == 1 else None


def steering_for_request(
    pods: Sequence[Mapping[str, Any]],
    admitted: set[tuple[str, str]],
    resource: str,
    size: int,
    node: str,
) -> Steering:
    """`pods`: those bound to `node` and any not bound yet (only the ones planned here count)."""
    here = [p for p in pods if (p.get("spec") or {}).get("nodeName") == node]
    candidates = [
        p for p in here if _waiting(p, admitted) and _asks(p.get("spec") or {}, resource, size)
    ]
    served = _interchangeable(candidates)
    plans = tuple(
        plan
        for plan in (_plan(p.get("metadata") or {}, size) for p in _by_rank(served))
        if plan is not None
    )
    if not plans:
        served = []
    avoid: set[int] = set()
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if any(pod is s for s in served) or not _waiting(pod, admitted):
            continue
        where = spec.get("nodeName") or (meta.get("annotations") or {}).get(POD_PLANNED_NODE)
        if where != node or not _asks(spec, resource, None):
            continue
        avoid.update(_plan(meta, None) or ())
    return Steering(plans, frozenset(avoid))


def _interchangeable(candidates: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The candidates whose plans may be served: the one candidate, or siblings of one gang."""
    if len(candidates) <= 1:
        return candidates
    gangs = set()
    for pod in candidates:
        who = worker_identity(dict(pod))
        if who is None:
            return []
        gangs.add((who.job, who.uid, who.attempt))
    return candidates if len(gangs) == 1 else []


def _by_rank(pods: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    def rank(pod: Mapping[str, Any]) -> int:
        who = worker_identity(dict(pod))
        return who.rank if who is not None else 0

    return sorted(pods, key=rank)


def _waiting(pod: Mapping[str, Any], admitted: set[tuple[str, str]]) -> bool:
    meta = pod.get("metadata") or {}
    if (pod.get("status") or {}).get("phase") not in WAITING_PHASES:
        return False
    return (meta.get("namespace"), meta.get("name")) not in admitted


def _asks(spec: Mapping[str, Any], resource: str, size: int | None) -> bool:
    # Per container: the kubelet asks for each container's devices apart.
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    counts = [container_gpus(c, resource) for c in containers]
    return any(n == size for n in counts) if size is not None else any(counts)


def _plan(meta: Mapping[str, Any], size: int | None) -> tuple[int, ...] | None:
    raw = (meta.get("annotations") or {}).get(POD_PLANNED_GPUS)
    if raw is None:
        return None
    try:
        plan = decode_gpu_indices(POD_PLANNED_GPUS, raw)
    except AnnotationError:
        return None
    return plan if size is None or len(plan) == size else None
