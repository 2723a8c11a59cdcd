"""The queued TrainingJobs of a pass as the core sees them, with predicted run times.

Parsing every queued job's spec on every pass was a fifth of a pass at 10,000 jobs; a job's
spec changes only with its resourceVersion, so each is parsed once per version. The run-time
estimator learns from jobs that succeeded, each once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gangshare.core.estimate import RuntimeEstimator, name_group
from gangshare.core.queueing import QueuedJob, QueuePolicy
from gangshare.kube.snapshot import parse_time
from gangshare.kube.trainingjob import InvalidSpec, TrainingJobSpec, parse_trainingjob
from gangshare.operator.first_queue import is_new, place_in_line


@dataclass(frozen=True)
class _Parsed:
    version: str
    spec: TrainingJobSpec | None  # None: invalid (the reconciler fails it with the reason)
    # The last QueuedJob built from it, and what it was built with (queuedAt, the predicted
    # run time, the value of the template's PriorityClass).
    built: tuple[float, float | None, int | None, QueuedJob] | None = None


class WaitingJobs:
    def __init__(self, default_runtime_seconds: float) -> None:
        self.estimator = RuntimeEstimator(default_runtime_seconds)
        self._observed: set[str] = set()
        self._parsed: dict[str, _Parsed] = {}

    def learn(self, jobs: Iterable[dict[str, Any]], policy: QueuePolicy) -> None:
        """Queue defaults from this pass's policy, and run times of newly succeeded jobs."""
        self.estimator.queue_defaults = {
            name: spec.default_runtime_seconds
            for name, spec in policy.queues.items()
            if spec.default_runtime_seconds is not None
        }
        for job in jobs:
            status = job.get("status") or {}
            uid = job["metadata"].get("uid", "")
            if status.get("phase") != "Succeeded" or uid in self._observed:
                continue
            self._observed.add(uid)
            start, end = parse_time(status.get("startedAt")), parse_time(status.get("completedAt"))
            spec = job.get("spec") or {}
            if start is not None and end is not None:
                gpus = int(spec.get("workers", 1)) * int(spec.get("gpusPerWorker", 1))
                group = name_group(str(job["metadata"].get("name", "")))
                queue = str(spec.get("queue", "default"))
                self.estimator.observe(queue, gpus, end - start, group=group)

    def queued(
        self,
        jobs: Iterable[dict[str, Any]],
        now: float,
        priority_classes: Mapping[str, int] | None = None,
    ) -> list[QueuedJob]:
        """The jobs waiting for admission now (Queued, or new and not queued yet: waiting since
        their creation, operator/first_queue.py; not backing off, valid), in list order.
        `priority_classes` (name -> value) judges templates' priorityClassName; None: unjudged."""
        parsed: dict[str, _Parsed] = {}
        result = []
        for job in jobs:
            status = job.get("status") or {}
            if status.get("phase") != "Queued" and not is_new(job):
                continue
            if (parse_time(status.get("nextRetryAt")) or 0.0) > now:
                continue  # backing off after a release; it rejoins the queue when due
            meta = job["metadata"]
            uid, version = str(meta.get("uid", "")), str(meta.get("resourceVersion", ""))
            memo = self._parsed.get(uid)
            if memo is None or memo.version != version or not version:
                try:
                    memo = _Parsed(version, parse_trainingjob(job))
                except InvalidSpec:
                    memo = _Parsed(version, None)
            parsed[uid] = memo
            if memo.spec is None:
                continue
            spec = memo.spec
            submitted = place_in_line(job, now)
            if spec.moved_since_queued(status):
                submitted = now  # its old place is void; the reconciler restamps queuedAt
            estimate = self.estimator.predict(
                spec.queue,
                spec.total_gpus,
                spec.runtime_estimate_seconds,
                group=name_group(spec.name),
            )
            class_name = spec.priority_class_name
            class_value = (priority_classes or {}).get(class_name) if class_name else None
            built = memo.built
            if built is None or built[:3] != (submitted, estimate, class_value):
                queued = spec.queued(submitted, estimate, priority_classes)
                built = (submitted, estimate, class_value, queued)
                parsed[uid] = _Parsed(version, spec, built)
            result.append(built[3])
        self._parsed = parsed  # only this pass's queued jobs stay memoized
        return result
