"""What a replay measured: per-job records, utilization over time, and their summaries.

Definitions (the Markdown report repeats them):
- JCT = end - submit; queueing delay = time spent pending (before the first start,
  plus after any eviction).
- guaranteed slowdown = run time / solo duration - 1, for guaranteed jobs (not those
  whose last run was on a cohort's borrowed quota: that run was Opportunistic).
- GPU allocation rate = GPUs holding a guaranteed job / all GPUs; occupied = GPUs
  with any tenant / all GPUs; borrowed = GPUs held by jobs on a cohort's borrowed quota
  / all GPUs (time averages).
- effective SM / memory utilization = the GPUs' modelled SM busy % and memory in
  use over all GPUs (cluster-wide), over occupied GPUs only, and over all GPUs
  while some job waits (backlog: where sharing can add work; over the whole replay
  the work is fixed by the trace, so only its timing can change).
- opportunistic progress = solo GPU-time of opportunistic jobs / share-slot time they
  held (their work-weighted speed while placed, as a fraction of solo); the same over
  the slots beside a guaranteed job only (time-averaged speed there).
- size classes by a job's GPUs: 1, 2-4, 5-8 and >8 (no Philly job asks for 5-7 GPUs; one
  that did would take most of a node, as an 8-GPU job does, so it counts with them).
- GPU-time lost to evictions = (solo-seconds of work lost since the last checkpoint +
  seconds of restart after an eviction) x GPUs held (share slots for an opportunistic
  tenant), over the finished jobs; its share is over all the GPU-time they held.
- Jain's fairness index over queues (virtual clusters) of x_q = mean over the
  queue's finished jobs of (solo duration / JCT): 1.0 when every queue's jobs are
  stretched alike, 1/n when one queue gets all the service.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class JobRecord:
    key: str
    queue: str
    service_class: str
    gpus: int
    submit: float
    first_start: float
    end: float
    duration: float
    queued: float
    # Seconds between the last start and the end (for guaranteed jobs: the whole run).
    last_run: float
    evictions: int
    # GPU-seconds held (guaranteed: GPUs; opportunistic: share slots).
    held: float
    # Its last run was on its cohort's borrowed quota (as an Opportunistic tenant).
    borrowed: bool = False
    # Evictions that reclaimed borrowed quota (counted in `evictions` too).
    reclaims: int = 0
    # Solo-seconds of work its evictions threw away (done since the last checkpoint).
    lost_work: float = 0.0
    # GPU-seconds evictions cost it: lost work and restart overheads, x GPUs held.
    lost_gpu_seconds: float = 0.0
    # The restart overheads' part of lost_gpu_seconds.
    restart_gpu_seconds: float = 0.0

    @property
    def jct(self) -> float:
        return self.end - self.submit


# (label, fewest GPUs, most GPUs or None) of the size classes `by_size` reports.
SIZE_CLASSES: tuple[tuple[str, int, int | None], ...] = (
    ("1", 1, 1),
    ("2-4", 2, 4),
    ("5-8", 5, 8),
    (">8", 9, None),
)


def size_class(gpus: int) -> str:
    for label, low, high in SIZE_CLASSES:
        if gpus >= low and (high is None or gpus <= high):
            return label
    raise ValueError(f"no size class for {gpus} GPUs")


def percentile(ordered: Sequence[float], share: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not ordered:
        return math.nan
    position = (len(ordered) - 1) * share
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def distribution(values: Iterable[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"count": 0}
    return {
        "count": len(ordered),
        "mean": sum(ordered) / len(ordered),
        "median": percentile(ordered, 0.5),
        "p95": percentile(ordered, 0.95),
        "p99": percentile(ordered, 0.99),
        "max": ordered[-1],
    }


def jain(values: Sequence[float]) -> float:
    if not values:
        return math.nan
    squares = sum(v * v for v in values)
    return sum(values) ** 2 / (len(values) * squares) if squares else 1.0


@dataclass
class TimeSeries:
    """Time integrals of cluster state in fixed bins, from piecewise-constant intervals."""

    bin_seconds: float
    # Per bin: integrals (value x seconds) of each channel.
    channels: tuple[str, ...] = (
        "util",
        "memory",
        "busy",
        "guaranteed",
        "slots",
        "backlog",
        "util_backlog",
        "memory_backlog",
        "beside",
        "beside_speed",
        "borrowed",
    )
    bins: list[list[float]] = field(default_factory=list)
    totals: dict[str, float] = field(default_factory=dict)

    def add(self, start: float, end: float, values: Sequence[float]) -> None:
        if end <= start:
            return
        for name, value in zip(self.channels, values, strict=True):
            self.totals[name] = self.totals.get(name, 0.0) + value * (end - start)
        at = start
        while at < end:
            index = int(at // self.bin_seconds)
            stop = min(end, (index + 1) * self.bin_seconds)
            while len(self.bins) <= index:
                self.bins.append([0.0] * len(self.channels))
            row = self.bins[index]
            for i, value in enumerate(values):
                row[i] += value * (stop - at)
            at = stop

    def averages(self, channel: str, scale: float) -> list[float]:
        """Per-bin time average of a channel, divided by `scale`."""
        i = self.channels.index(channel)
        return [row[i] / self.bin_seconds / scale for row in self.bins]


def summarize_jobs(records: Sequence[JobRecord]) -> dict[str, Any]:
    return {
        "jct": distribution(r.jct for r in records),
        "queueing": distribution(r.queued for r in records),
    }


def by_size(records: Sequence[JobRecord]) -> dict[str, dict[str, Any]]:
    """JCT and queueing per size class (every class, empty ones with count 0)."""
    groups: dict[str, list[JobRecord]] = {label: [] for label, _, _ in SIZE_CLASSES}
    for r in records:
        groups[size_class(r.gpus)].append(r)
    return {label: summarize_jobs(group) for label, group in groups.items()}


def eviction_cost(records: Sequence[JobRecord]) -> dict[str, float]:
    """GPU-time evictions cost the finished jobs, in GPU-hours and as a share of what they held."""
    held = sum(r.held for r in records)
    lost = sum(r.lost_gpu_seconds for r in records)
    restart = sum(r.restart_gpu_seconds for r in records)
    return {
        "gpu_hours_held": held / 3600.0,
        "eviction_gpu_hours_lost": lost / 3600.0,
        "eviction_lost_work_gpu_hours": (lost - restart) / 3600.0,
        "eviction_restart_gpu_hours": restart / 3600.0,
        "eviction_lost_share": lost / held if held else 0.0,
        "max_evictions_per_job": max((r.evictions for r in records), default=0),
    }


def fairness(records: Sequence[JobRecord]) -> float:
    """Jain's index across queues; undefined (NaN) with fewer than two queues."""
    by_queue: dict[str, list[float]] = {}
    for r in records:
        by_queue.setdefault(r.queue, []).append(r.duration / r.jct if r.jct > 0 else 1.0)
    if len(by_queue) < 2:
        return math.nan
    return jain([sum(v) / len(v) for v in by_queue.values()])


def summarize(
    records: Sequence[JobRecord],
    series: TimeSeries,
    gpu_count: int,
    memory_mib: int,
    start: float,
    makespan: float,
) -> dict[str, Any]:
    span = max(makespan - start, 1e-9)
    totals = series.totals
    busy = totals.get("busy", 0.0)
    backlog = totals.get("backlog", 0.0)
    guaranteed = [r for r in records if r.service_class == "Guaranteed" and not r.borrowed]
    opportunistic = [r for r in records if r.service_class == "Opportunistic"]
    slot_seconds = sum(r.held for r in opportunistic)
    classes = sorted({r.service_class for r in records})
    queues = sorted({r.queue for r in records})
    return {
        "jobs": len(records),
        "gpus": gpu_count,
        "memory_capacity_mib": memory_mib,
        **summarize_jobs(records),
        "by_class": {
            c: summarize_jobs([r for r in records if r.service_class == c]) for c in classes
        },
        "by_queue": {q: summarize_jobs([r for r in records if r.queue == q]) for q in queues},
        "by_size": by_size(records),
        "makespan_seconds": makespan,
        "gpu_allocation_rate": totals.get("guaranteed", 0.0) / (gpu_count * span),
        "gpu_occupied_rate": busy / (gpu_count * span),
        # GPUs held on a cohort's borrowed quota (Opportunistic tenants, whole gangs).
        "gpu_borrowed_rate": totals.get("borrowed", 0.0) / (gpu_count * span),
        "sm_util_cluster": totals.get("util", 0.0) / 100.0 / (gpu_count * span),
        "memory_util_cluster": totals.get("memory", 0.0) / (memory_mib * span),
        "sm_util_occupied": totals.get("util", 0.0) / 100.0 / busy if busy else 0.0,
        "memory_util_occupied": (
            totals.get("memory", 0.0) / (memory_mib / gpu_count) / busy if busy else 0.0
        ),
        "backlog_share": backlog / span,
        "sm_util_backlog": (
            totals.get("util_backlog", 0.0) / 100.0 / (gpu_count * backlog) if backlog else 0.0
        ),
        "memory_util_backlog": (
            totals.get("memory_backlog", 0.0) / (memory_mib * backlog) if backlog else 0.0
        ),
        "guaranteed_slowdown": distribution(
            max(0.0, r.last_run / r.duration - 1.0) for r in guaranteed
        ),
        "evictions": sum(r.evictions for r in records),
        "reclaims": sum(r.reclaims for r in records),
        **eviction_cost(records),
        # Jobs that finished on borrowed quota (their last run beyond their queue's quota).
        "finished_borrowed": sum(1 for r in records if r.borrowed),
        # Share of opportunistic GPU-time spent beside a guaranteed job (the rest: spare GPUs).
        "opportunistic_beside_guaranteed": (
            totals.get("beside", 0.0) / totals["slots"] if totals.get("slots") else 0.0
        ),
        # Solo GPU-time of the opportunistic jobs over the share-slot time they held: their
        # speed while placed (fraction of solo), work-weighted; and the same beside guaranteed
        # jobs only (where the coordinator's duty cycle caps them).
        "opportunistic_progress": (
            sum(r.duration * r.gpus for r in opportunistic) / slot_seconds
            if slot_seconds
            else math.nan
        ),
        "opportunistic_progress_beside": (
            totals.get("beside_speed", 0.0) / totals["beside"] if totals.get("beside") else math.nan
        ),
        "jain_fairness_queues": fairness(records),
    }
