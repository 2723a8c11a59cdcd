"""spec.shapes and spec.reshape of a TrainingJob, and the shape it runs in.

The shape is the spec's own unless spec.reshape is Admit and status.reshapedTo (written only
by the operator, when the forecast's shape advice said so) names one of spec.shapes: a forged
or stale status.reshapedTo names no other GPUs (every allowed shape holds the spec's total,
the CRD's rule and this parse both check it), and one that left spec.shapes is ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

Shape = tuple[int, int]


class ShapeError(ValueError):
    """A spec.shapes entry the CRD's schema would refuse, named by its field."""


@dataclass(frozen=True)
class Shapes:
    # The shape it runs in: the spec's own, or status.reshapedTo.
    workers: int
    gpus_per_worker: int
    # Other shapes still open to advice (none once reshaped: a job changes shape once).
    alternatives: tuple[Shape, ...] = ()
    admit: bool = False
    reshaped: bool = False


def parse_shapes(
    spec: Mapping[str, Any], status: Mapping[str, Any], workers: int, gpus_per_worker: int
) -> Shapes:
    raw = spec.get("shapes")
    if raw is None:
        return Shapes(workers, gpus_per_worker)
    if not isinstance(raw, list) or len(raw) > 8:
        raise ShapeError("spec.shapes: a list of at most 8 shapes")
    if spec.get("replicaGroups") or spec.get("jobRef"):
        raise ShapeError(
            "spec.shapes: only a TrainingJob with one worker shape and its own pods allows "
            "other shapes (no replicaGroups, no jobRef)"
        )
    total = workers * gpus_per_worker
    allowed: list[Shape] = []
    for i, item in enumerate(raw):
        shape = _shape(item)
        if shape is None or shape[0] * shape[1] != total:
            raise ShapeError(
                f"spec.shapes[{i}]: workers and gpusPerWorker holding the same {total} GPUs "
                f"as spec.workers x spec.gpusPerWorker, got {item!r}"
            )
        if shape != (workers, gpus_per_worker) and shape not in allowed:
            allowed.append(shape)
    admit = spec.get("reshape", "Advise") == "Admit"
    taken = _shape(status.get("reshapedTo"))
    if admit and taken is not None and taken in allowed:
        return Shapes(taken[0], taken[1], (), admit, reshaped=True)
    return Shapes(workers, gpus_per_worker, tuple(allowed), admit)


def _shape(raw: Any) -> Shape | None:
    if not isinstance(raw, Mapping):
        return None
    workers, gpus = raw.get("workers"), raw.get("gpusPerWorker")
    for value, high in ((workers, 1024), (gpus, 64)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
            return None
    return int(workers), int(gpus)  # type: ignore[arg-type]
