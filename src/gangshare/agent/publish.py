"""What the agent writes on its Node: GPU labels, the topology annotation, utilization.

The topology (inventory, NVLink islands, health, share slots) is written when it differs from
what the Node carries. Utilization is rate-limited: at most once per interval, and only when a
GPU moved by more than the noise or the last report is getting old, so a busy node does not
turn every NVML sample into an API write.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gangshare.agent.backend import GpuSample, Inventory
from gangshare.core.annotations import (
    GPU_COUNT_LABEL,
    GPU_NODE_LABEL,
    GPU_PRODUCT_LABEL,
    NODE_TOPOLOGY,
    NODE_UTILIZATION,
    encode_topology,
    encode_utilization,
)

SM_NOISE = 0.05
MEMORY_NOISE_MIB = 256
# Even a steady node reports this often (in intervals), so readers can tell it is alive.
REFRESH_INTERVALS = 6


def topology_patch(
    inventory: Inventory,
    unhealthy: frozenset[int],
    share_slots: int,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
) -> dict[str, Any] | None:
    """A merge patch for the Node's GPU labels and topology; None when it already says so."""
    gpus = [g.as_gpu(g.index not in unhealthy) for g in inventory.gpus]
    want_labels = {
        GPU_NODE_LABEL: "true",
        GPU_PRODUCT_LABEL: gpus[0].model if gpus else "",
        GPU_COUNT_LABEL: str(len(gpus)),
    }
    want_annotations = {NODE_TOPOLOGY: encode_topology(gpus, inventory.islands(), share_slots)}
    changed_labels = {k: v for k, v in want_labels.items() if labels.get(k) != v}
    changed_annotations = {k: v for k, v in want_annotations.items() if annotations.get(k) != v}
    if not changed_labels and not changed_annotations:
        return None
    metadata: dict[str, Any] = {}
    if changed_labels:
        metadata["labels"] = changed_labels
    if changed_annotations:
        metadata["annotations"] = changed_annotations
    return {"metadata": metadata}


@dataclass
class UtilizationGate:
    interval: float
    last_at: float | None = None
    last: dict[int, tuple[float, int]] = field(default_factory=dict)

    def patch_if_due(self, now: float, samples: Sequence[GpuSample]) -> dict[str, Any] | None:
        current = {s.index: (s.sm, s.memory_used_mib) for s in samples}
        if self.last_at is not None:
            if now - self.last_at < self.interval:
                return None
            stale = now - self.last_at >= self.interval * REFRESH_INTERVALS
            if not stale and not _moved(self.last, current):
                return None
        self.last_at, self.last = now, current
        return {"metadata": {"annotations": {NODE_UTILIZATION: encode_utilization(current, now)}}}


def _moved(before: Mapping[int, tuple[float, int]], after: Mapping[int, tuple[float, int]]) -> bool:
    if before.keys() != after.keys():
        return True
    return any(
        abs(after[i][0] - before[i][0]) > SM_NOISE
        or abs(after[i][1] - before[i][1]) > MEMORY_NOISE_MIB
        for i in after
    )
