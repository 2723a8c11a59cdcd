"""The wire contract on Kubernetes objects: label and annotation keys and their JSON codecs.

The node agent publishes inventory, topology and utilization on the Node; the
operator and extender record a pod's plan; the agent publishes the pod's real
GPU assignment. Decoding errors name the annotation they came from.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from gangshare.core.gpu import DEFAULT_SHARE_SLOTS, Gpu, GpuState
from gangshare.core.node import NodeState
from gangshare.core.topology import Island, normalize_islands

GROUP = "gangshare.io"
GPU_RESOURCE = "nvidia.com/gpu"
SHARE_RESOURCE = f"{GROUP}/gpu-share"

RACK_LABEL = f"{GROUP}/rack"
GPU_NODE_LABEL = f"{GROUP}/gpu-node"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"

NODE_TOPOLOGY = f"{GROUP}/gpu-topology"
NODE_UTILIZATION = f"{GROUP}/gpu-utilization"

JOB_LABEL = f"{GROUP}/job"
RANK_LABEL = f"{GROUP}/rank"
# On a TrainingJob's replica-group pod: its group (spec.replicaGroups[].name).
REPLICA_GROUP_LABEL = f"{GROUP}/replica-group"
ATTEMPT_LABEL = f"{GROUP}/attempt"
CLASS_LABEL = f"{GROUP}/service-class"
POD_PLANNED_NODE = f"{GROUP}/planned-node"
POD_PLANNED_GPUS = f"{GROUP}/planned-gpus"
POD_ASSIGNED_GPUS = f"{GROUP}/assigned-gpus"
POD_GPU_MEMORY = f"{GROUP}/gpu-memory-mib"
# The local coordinator's caps on an opportunistic pod, and why it evicted one (with the
# steps the pod had reported, which the operator keeps in the job's status).
POD_GPU_CAPS = f"{GROUP}/gpu-caps"
POD_EVICTED = f"{GROUP}/evicted"
# Which enforcement layers the node's agent found at start.
NODE_ENFORCEMENT = f"{GROUP}/gpu-enforcement"
# The operator's nudge to a gang worker the extender refused while a sibling was still gated:
# a change to the pod itself is what makes kube-scheduler try it again at once.
POD_GANG_READY = f"{GROUP}/gang-ready"
# How the extender's gang barrier words a refusal (the operator recognizes it by this).
GANG_BARRIER_REFUSAL = "gang not wholly ungated"

# Keys under gangshare.io/ a tenant may set on a TrainingJob template: markers that only the
# dev cluster's KWOK stages read. Every other gangshare.io/ key is written by gangshare alone.
TENANT_KEYS = frozenset({f"{GROUP}/kwok-exit-code", f"{GROUP}/kwok-run-for"})


def is_reserved_key(key: str) -> bool:
    """A label or annotation key only gangshare's own components may write."""
    return key.startswith(f"{GROUP}/") and key not in TENANT_KEYS


class AnnotationError(ValueError):
    """An annotation that does not decode; the message starts with its key."""


def encode_topology(gpus: list[Gpu], islands: tuple[Island, ...], share_slots: int) -> str:
    return json.dumps(
        {
            "gpus": [
                {
                    "index": g.index,
                    "uuid": g.uuid,
                    "model": g.model,
                    "memoryMiB": g.memory_mib,
                    "healthy": g.healthy,
                }
                for g in gpus
            ],
            "nvlinkIslands": [list(i) for i in islands],
            "shareSlots": share_slots,
        },
        separators=(",", ":"),
    )


def _loads(key: str, raw: str) -> Any:
    try:
        return json.loads(raw)
    except (TypeError, json.JSONDecodeError) as err:
        raise AnnotationError(f"{key}: not valid JSON ({err})") from None


@functools.lru_cache(maxsize=1 << 16)
def _topology(raw: str) -> tuple[tuple[Gpu, ...], int, tuple[Island, ...]]:
    """A topology annotation's GPUs (by index), share slots and islands. Memoized: every
    scheduling pass decodes every node, and a node's topology almost never changes (the
    parts are immutable; the per-pass GpuStates are built fresh from them)."""
    doc = _loads(NODE_TOPOLOGY, raw)
    try:
        gpus = [
            Gpu(
                int(g["index"]),
                str(g["uuid"]),
                str(g["model"]),
                int(g["memoryMiB"]),
                bool(g.get("healthy", True)),
            )
            for g in doc["gpus"]
        ]
        slots = int(doc.get("shareSlots", DEFAULT_SHARE_SLOTS))
        islands = normalize_islands((g.index for g in gpus), doc.get("nvlinkIslands", []))
    except (KeyError, TypeError, ValueError) as err:
        raise AnnotationError(f"{NODE_TOPOLOGY}: {err}") from None
    return tuple(sorted(gpus, key=lambda g: g.index)), slots, islands


def decode_node(
    name: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    unschedulable_reason: str | None = None,
) -> NodeState | None:
    """A NodeState from a Node's labels and annotations; None for a node without GPUs."""
    raw = annotations.get(NODE_TOPOLOGY)
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise AnnotationError(f"{NODE_TOPOLOGY}: not a string")
    gpus, slots, islands = _topology(raw)
    try:
        states = [GpuState(g, share_slots=slots) for g in gpus]
        node = NodeState(
            name, states, islands, labels.get(RACK_LABEL, ""), dict(labels), unschedulable_reason
        )
    except (KeyError, TypeError, ValueError) as err:
        raise AnnotationError(f"{NODE_TOPOLOGY}: {err}") from None
    utilization = annotations.get(NODE_UTILIZATION)
    if utilization is not None:
        apply_utilization(node, decode_utilization(utilization))
    return node


def encode_utilization(per_gpu: Mapping[int, tuple[float, int]], reported_at: float) -> str:
    """per_gpu: index -> (SM utilization 0..1, memory used MiB)."""
    return json.dumps(
        {
            "reportedAt": reported_at,
            "gpus": {
                str(i): {"sm": round(sm, 4), "memoryUsedMiB": mem}
                for i, (sm, mem) in per_gpu.items()
            },
        },
        separators=(",", ":"),
    )


def decode_utilization(raw: str) -> dict[int, tuple[float, int]]:
    doc = _loads(NODE_UTILIZATION, raw)
    try:
        return {int(i): (float(v["sm"]), int(v["memoryUsedMiB"])) for i, v in doc["gpus"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise AnnotationError(f"{NODE_UTILIZATION}: {err}") from None


def apply_utilization(node: NodeState, per_gpu: Mapping[int, tuple[float, int]]) -> None:
    for index, (sm, memory) in per_gpu.items():
        if 0 <= index < node.gpu_count:
            node.gpus[index].utilization = min(1.0, max(0.0, sm))
            node.gpus[index].memory_used_mib = max(0, memory)


def encode_gpu_indices(indices: tuple[int, ...] | list[int]) -> str:
    return ",".join(str(i) for i in indices)


def decode_gpu_indices(key: str, raw: str) -> tuple[int, ...]:
    try:
        indices = tuple(int(part) for part in raw.split(",") if part.strip() != "")
    except ValueError:
        raise AnnotationError(f"{key}: expected comma-separated GPU indices, got {raw!r}") from None
    if any(i < 0 for i in indices) or len(set(indices)) != len(indices):
        raise AnnotationError(f"{key}: GPU indices must be distinct and non-negative, got {raw!r}")
    return indices
