"""The Queue resource as the operator reads it: a cluster-scoped object into a core QueueSpec.

crds/queue.yaml rejects bad queues at the API server; this repeats its checks because a Queue
may reach the operator without them (applied before the CRD had its schema, or edited in etcd
by an older version) and one bad queue must become a condition naming the field, not a crash
of the scheduling pass that reads every queue.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from gangshare.core.queues import DEFAULT_QUEUE, Ordering, QueueSpec
from gangshare.kube.trainingjob import API_VERSION, GROUP, VERSION, InvalidSpec

__all__ = [
    "API_VERSION",
    "GROUP",
    "QUEUE_KIND",
    "QUEUE_PLURAL",
    "VERSION",
    "InvalidSpec",
    "default_queue_object",
    "parse_queue",
]

QUEUE_PLURAL = "queues"
QUEUE_KIND = "Queue"

# The CRD's bounds, so a queue the parser accepts is one the API server would have accepted.
MAX_GPUS = 1_000_000
MAX_WEIGHT = 1_000_000.0
MAX_PRIORITY = 1_000_000
MAX_RUNTIME_SECONDS = 31_536_000
LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
LABEL_MAX = 63


def default_queue_object() -> dict[str, Any]:
    """The Queue that jobs naming no queue land in: no quota, no cohort, global settings."""
    return {
        "apiVersion": API_VERSION,
        "kind": QUEUE_KIND,
        "metadata": {"name": DEFAULT_QUEUE},
        "spec": {},
    }


def parse_queue(obj: Mapping[str, Any]) -> QueueSpec:
    meta = obj.get("metadata") or {}
    name = meta.get("name") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not _is_label(name):
        raise InvalidSpec(
            "metadata.name: must be a DNS-1123 label (at most 63 lowercase letters, digits and "
            f"'-', starting and ending with a letter or digit), got {name!r}"
        )
    spec = _section(obj, "spec", "spec")

    nominal = _integer(spec, "nominalGPUs", "spec.nominalGPUs", 0, MAX_GPUS)
    borrowing = _integer(spec, "borrowingLimitGPUs", "spec.borrowingLimitGPUs", 0, MAX_GPUS)
    lending = _integer(spec, "lendingLimitGPUs", "spec.lendingLimitGPUs", 0, MAX_GPUS)
    cohort = _cohort(spec.get("cohort"))
    if borrowing is not None and cohort is None:
        raise InvalidSpec(
            "spec.borrowingLimitGPUs: only a queue in a cohort borrows (set spec.cohort)"
        )
    if lending is not None and cohort is None:
        raise InvalidSpec("spec.lendingLimitGPUs: only a queue in a cohort lends (set spec.cohort)")
    if lending is not None and (nominal is None or lending > nominal):
        raise InvalidSpec(
            "spec.lendingLimitGPUs: must not exceed spec.nominalGPUs (a queue lends only its own "
            f"idle quota), got {lending} with nominalGPUs {nominal}"
        )

    sizes = _section(spec, "jobSizes", "spec.jobSizes")
    min_gpus = _integer(sizes, "minGPUs", "spec.jobSizes.minGPUs", 1, MAX_GPUS)
    min_gpus = 1 if min_gpus is None else min_gpus
    max_gpus = _integer(sizes, "maxGPUs", "spec.jobSizes.maxGPUs", 1, MAX_GPUS)
    if max_gpus is not None and max_gpus < min_gpus:
        raise InvalidSpec(
            "spec.jobSizes.maxGPUs: must be at least spec.jobSizes.minGPUs "
            f"({min_gpus}), got {max_gpus}"
        )

    runtime = _integer(
        spec, "defaultRuntimeSeconds", "spec.defaultRuntimeSeconds", 1, MAX_RUNTIME_SECONDS
    )
    return QueueSpec(
        name=name,
        nominal_gpus=nominal,
        borrowing_limit=borrowing,
        lending_limit=lending,
        weight=_weight(spec.get("weight")),
        cohort=cohort,
        min_job_gpus=min_gpus,
        max_job_gpus=max_gpus,
        ordering=_ordering(spec.get("ordering")),
        backfill=_boolean(spec.get("backfill"), "spec.backfill"),
        max_priority=_integer(spec, "maxPriority", "spec.maxPriority", -MAX_PRIORITY, MAX_PRIORITY),
        default_runtime_seconds=float(runtime) if runtime is not None else None,
    )


def _section(fields: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
    """An optional object field: {} when absent."""
    value = fields.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidSpec(f"{path}: must be an object, got {value!r}")
    return value


def _is_label(value: str) -> bool:
    return len(value) <= LABEL_MAX and LABEL.match(value) is not None


def _integer(fields: Mapping[str, Any], key: str, path: str, low: int, high: int) -> int | None:
    value = fields.get(key)
    if value is None:
        return None
    # YAML and JSON give 8.0 for "8.0"; a whole float is what the user meant, 8.5 is not.
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSpec(f"{path}: must be an integer, got {value!r}")
    if not low <= value <= high:
        raise InvalidSpec(f"{path}: must be between {low} and {high}, got {value}")
    return value


def _weight(value: Any) -> float:
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidSpec(f"spec.weight: must be a number, got {value!r}")
    if not 0 < value <= MAX_WEIGHT:
        raise InvalidSpec(f"spec.weight: must be above 0 and at most {MAX_WEIGHT:g}, got {value}")
    return float(value)


def _cohort(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _is_label(value):
        raise InvalidSpec(
            "spec.cohort: must be a DNS-1123 label (at most 63 lowercase letters, digits and "
            f"'-', starting and ending with a letter or digit), got {value!r}"
        )
    return value


def _ordering(value: Any) -> Ordering | None:
    if value is None:
        return None
    try:
        return Ordering(value)
    except ValueError:
        allowed = ", ".join(m.value for m in Ordering)
        raise InvalidSpec(f"spec.ordering: must be one of {allowed}, got {value!r}") from None


def _boolean(value: Any, path: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise InvalidSpec(f"{path}: must be true or false, got {value!r}")
