"""The queued TrainingJobs of a pass as the core sees them, with predicted run times.

Parsing every queued job's spec on every pass was a fifth of a pass at 10,000 jobs; a job's
spec and status change only with its resourceVersion, so each is parsed (spec, times, name
group) once per version. The run-time estimator learns from jobs that succeeded, each once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
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
    # What the pass reads of this version besides the spec: its name's group (the run-time
    # estimator's), when it may retry, its place in line (None: unknown, now) and whether it
    # moved since it took that place (then its place is void).
    group: str = ""
    retry_at: float = 0.0
    placed: float | None = None
    moved: bool = False
    # The last QueuedJob built from it, and what it was built with (queuedAt, the predicted
    # run time, the value of the template's PriorityClass).
    built: tuple[float, float | None, int | None, QueuedJob] | None = None
    learnt: int = -1  # WaitingJobs._learnt when its run time was predicted


def _parse(job: dict[str, Any], version: str) -> _Parsed:
    status = job.get("status") or {}
    retry_at = parse_time(status.get("nextRetryAt")) or 0.0
    try:
        spec = parse_trainingjob(job)
    except InvalidSpec:
        return _Parsed(version, None, retry_at=retry_at)
    # place_in_line without a clock: NaN stands for "now" (a job with no time recorded).
    placed = place_in_line(job, math.nan)
    return _Parsed(
        version,
        spec,
        name_group(spec.name),
        retry_at,
        None if math.isnan(placed) else placed,
        spec.moved_since_queued(status),
    )


class WaitingJobs:
    def __init__(self, default_runtime_seconds: float) -> None:
        self.estimator = RuntimeEstimator(default_runtime_seconds)
        self._observed: set[str] = set()
        self._parsed: dict[str, _Parsed] = {}
        # Bumped whenever what the estimator predicts may change (a run learnt, new queue
        # defaults): until then a job's kept prediction stands.
        self._learnt = 0

    def learn(self, jobs: Iterable[dict[str, Any]], policy: QueuePolicy) -> None:
        """Queue defaults from this pass's policy, and run times of newly succeeded jobs."""
        defaults = {
            name: spec.default_runtime_seconds
            for name, spec in policy.queues.items()
            if spec.default_runtime_seconds is not None
        }
        if defaults != self.estimator.queue_defaults:
            self.estimator.queue_defaults = defaults
            self._learnt += 1
        for job in jobs:
            status = job.get("status") or {}
            if status.get("phase") != "Succeeded":
                continue
            uid = job["metadata"].get("uid", "")
            if uid in self._observed:
                continue
            self._observed.add(uid)
            start, end = parse_time(status.get("startedAt")), parse_time(status.get("completedAt"))
            spec = job.get("spec") or {}
            if start is not None and end is not None:
                gpus = int(spec.get("workers", 1)) * int(spec.get("gpusPerWorker", 1))
                group = name_group(str(job["metadata"].get("name", "")))
                queue = str(spec.get("queue", "default"))
                self.estimator.observe(queue, gpus, end - start, group=group)
                self._learnt += 1

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
        predict = self.estimator.predict
        for job in jobs:
            status = job.get("status") or {}
            if status.get("phase") != "Queued" and not is_new(job):
                continue
            meta = job["metadata"]
            uid, version = str(meta.get("uid", "")), str(meta.get("resourceVersion", ""))
            memo = self._parsed.get(uid)
            if memo is None or memo.version != version or not version:
                memo = _parse(job, version)
            parsed[uid] = memo
            if memo.retry_at > now:
                continue  # backing off after a release; it rejoins the queue when due
            spec = memo.spec
            if spec is None:
                continue
            # A moved job's old place is void; the reconciler restamps queuedAt.
            submitted = now if memo.moved or memo.placed is None else memo.placed
            built = memo.built
            if built is not None and memo.learnt == self._learnt:
                estimate = built[1]
            else:
                estimate = predict(
                    spec.queue, spec.total_gpus, spec.runtime_estimate_seconds, group=memo.group
                )
            class_name = spec.priority_class_name
            class_value = (priority_classes or {}).get(class_name) if class_name else None
            if built is None or built[:3] != (submitted, estimate, class_value):
                queued = spec.queued(submitted, estimate, priority_classes)
                built = (submitted, estimate, class_value, queued)
            if built is not memo.built or memo.learnt != self._learnt:
                # Kept as predicted now, even when the prediction came out the same.
                parsed[uid] = replace(memo, built=built, learnt=self._learnt)
            result.append(built[3])
        self._parsed = parsed  # only this pass's queued jobs stay memoized
        return result
