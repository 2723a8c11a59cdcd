"""Prometheus metrics of the operator (label values are documented in each help text).

What a pass sees (jobs by phase, queue usage) is a snapshot swapped in whole each pass, so a
scrape never sees a half-updated set and a phase or queue that emptied does not linger. What
happened (admissions, requeues, failures) is counted where it is committed: the admission's
status write in the scheduling loop, the status write of applied Actions in the reconciler.
Only the leader runs passes and reconciles, so only the leader's series move; a standby
reports `gangshare_operator_leader 0` and no snapshot.

The series of jobs (the jobs gauge, admissions, requeues, preemptions, gang failures) carry a
`kind` label: what the TrainingJob record queues, kube.queued_kinds.workload_kind_name (one of
TrainingJob, Job, JobSet, PyTorchJob, TrainJob, Other), so each workload is counted under its
kind and the label stays bounded. Histograms (queue wait, gang start) do not, to keep their
bucket series few.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gangshare.core.forecast import Forecast
from gangshare.core.queues import QueueSpec
from gangshare.kube.queued_kinds import workload_kind_name
from gangshare.kube.snapshot import parse_time
from gangshare.kube.snapshot_drift import DRIFT_KINDS
from gangshare.operator.actions import Event
from gangshare.operator.job_counts import JobCounts, TrainingJobKey

# Every phase a TrainingJob's status can have; New: no status yet (the operator has not seen it).
PHASES = ("New", "Queued", "Admitted", "Running", "Restarting", "Succeeded", "Failed")
# Event reasons of the releases that put a gang back in its queue (operator/requeue.py).
REQUEUE_REASONS = ("GangDisplaced", "GangStartTimeout", "Preempted", "OpportunisticEvicted")
# Event reasons handle_failure posts: a restart after a failure, or the job's end.
FAILURE_REASONS = ("GangRestarting", "Failed")
# The `kind` label of the per-job series: what a TrainingJob record queues
# (kube.queued_kinds.workload_kind_name), so every workload is counted under its kind.
KIND_HELP = (
    "kind (what the TrainingJob record queues: TrainingJob, one of its own; Job, JobSet, "
    "PyTorchJob or TrainJob, the object its spec.jobRef names; Other, a jobRef to none of those)"
)


def trainingjob_counts(jobs: Iterable[Mapping[str, Any]]) -> dict[TrainingJobKey, int]:
    """TrainingJobs by (phase, service class, queue, kind) but those being deleted; every
    phase, 0 included, for each class, queue and kind that has a job, so a count that drops
    to 0 reads 0 instead of vanishing."""
    counts = JobCounts.of(jobs).counts()
    for _, service_class, queue, kind in list(counts):
        for phase in PHASES:
            counts.setdefault((phase, service_class, queue, kind), 0)
    return counts


# Queue gauge name -> the Queue status field it reports.
QUEUE_FIELDS = {
    "gangshare_queue_pending_jobs": "pendingJobs",
    "gangshare_queue_admitted_jobs": "admittedJobs",
    "gangshare_queue_guaranteed_gpus": "guaranteedGPUs",
    "gangshare_queue_borrowed_gpus": "borrowedGPUs",
}
QUEUE_HELP = {
    "gangshare_queue_pending_jobs": "TrainingJobs waiting in the queue (phase Queued, not "
    "backing off) after the last scheduling pass; label queue: the Queue's name.",
    "gangshare_queue_admitted_jobs": "TrainingJobs of the queue holding GPUs (admitted or "
    "running) after the last scheduling pass; label queue: the Queue's name.",
    "gangshare_queue_nominal_gpus": "The queue's guaranteed quota (spec.nominalGPUs); no "
    "series for a queue without quota; label queue: the Queue's name.",
    "gangshare_queue_guaranteed_gpus": "GPUs the queue's Guaranteed jobs hold within its quota "
    "after the last scheduling pass; label queue: the Queue's name.",
    "gangshare_queue_borrowed_gpus": "GPUs the queue's jobs hold on quota borrowed from its "
    "cohort after the last scheduling pass; label queue: the Queue's name.",
}


def queue_samples(
    statuses: Mapping[str, Mapping[str, Any]], specs: Mapping[str, QueueSpec]
) -> dict[str, dict[str, float]]:
    """Queue gauge name -> {queue: value}, from the pass's Queue statuses (queue_status.py)."""
    samples: dict[str, dict[str, float]] = {name: {} for name in QUEUE_HELP}
    for queue, status in statuses.items():
        for metric, field in QUEUE_FIELDS.items():
            samples[metric][queue] = float(status.get(field) or 0)
        spec = specs.get(queue)
        if spec is not None and spec.nominal_gpus is not None:
            samples["gangshare_queue_nominal_gpus"][queue] = float(spec.nominal_gpus)
    return samples


class Committed(Protocol):
    """What outcome_of reads of a reconcile's decision: operator.actions.Actions, or the
    BatchActions of a record that queues another kind (the same status and events)."""

    @property
    def status(self) -> Mapping[str, Any]: ...

    @property
    def events(self) -> Sequence[Event]: ...


@dataclass(frozen=True)
class Outcome:
    """What one set of applied Actions counts."""

    requeues: tuple[str, ...] = ()
    # The queue of a gang evicted because its cohort's lenders reclaimed their quota.
    preempted_queue: str | None = None
    # User or Infrastructure (core.failures.FailureClass) when a gang failed.
    failure_class: str | None = None
    # Admission -> every worker running, when the job just moved to Running.
    start_seconds: float | None = None


def outcome_of(job: Mapping[str, Any], actions: Committed) -> Outcome:
    reasons = [event.reason for event in actions.events]
    status = job.get("status") or {}
    failure = actions.status.get("lastFailure") or {}
    failure_class = None
    if any(r in FAILURE_REASONS for r in reasons) and failure.get("class"):
        failure_class = str(failure["class"])
    start_seconds = None
    if actions.status.get("phase") == "Running":
        admitted = parse_time(status.get("admittedAt"))
        started = parse_time(actions.status.get("startedAt"))
        if admitted is not None and started is not None:
            start_seconds = max(0.0, started - admitted)
    preempted = "Preempted" in reasons
    return Outcome(
        requeues=tuple(r for r in reasons if r in REQUEUE_REASONS),
        preempted_queue=str((job.get("spec") or {}).get("queue", "default")) if preempted else None,
        failure_class=failure_class,
        start_seconds=start_seconds,
    )


class _Snapshot(Collector):
    """Gauge families rebuilt each pass and swapped in at once (no clear-then-set gap)."""

    def __init__(self, families: Callable[[], list[Metric]]) -> None:
        self._empty = families
        self._families: list[Metric] = []
        self._lock = threading.Lock()

    def replace(self, families: list[Metric]) -> None:
        with self._lock:
            self._families = families

    def describe(self) -> Iterator[Metric]:
        return iter(self._empty())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            return iter(list(self._families))


FORECAST_WAIT = "gangshare_forecast_wait_seconds"
FORECAST_BEYOND = "gangshare_forecast_beyond_horizon_jobs"
FORECAST_HELP = {
    FORECAST_WAIT: "Forecast wait of a queue's waiting jobs at the last forecast "
    "(status.forecast), by queue and position: first, median and last of its jobs by "
    "forecast start.",
    FORECAST_BEYOND: "Waiting jobs of a queue that the last forecast does not start within its "
    "horizon (a week).",
}

TRAININGJOBS_HELP = (
    "TrainingJobs present (not being deleted) after the last scheduling pass, by phase (New: "
    "not seen by the operator yet, Queued, Admitted, Running, Restarting, Succeeded, Failed), "
    "service_class (Guaranteed or Opportunistic: the class admission decided, else the spec's), "
    "queue (spec.queue) and " + KIND_HELP + ". Every phase is reported, 0 included, for each "
    "class, queue and kind that has a job."
)
SECONDS_TO_A_DAY = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400)


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self._jobs = _Snapshot(lambda: [GaugeMetricFamily("gangshare_trainingjobs", "")])
        self._queues = _Snapshot(lambda: [GaugeMetricFamily(n, "") for n in QUEUE_HELP])
        r.register(self._jobs)
        r.register(self._queues)
        self._forecasts = _Snapshot(
            lambda: [GaugeMetricFamily(n, "") for n in (FORECAST_WAIT, FORECAST_BEYOND)]
        )
        r.register(self._forecasts)
        self.forecast = Histogram(
            "gangshare_forecast_duration_seconds",
            "One start-time forecast: the pass's snapshot replayed forward through the cycle.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.leader = Gauge(
            "gangshare_operator_leader",
            "1 while this operator process holds the leader Lease (or runs without leader "
            "election) and acts; 0 on a standby, whose other series do not move.",
            registry=r,
        )
        self.queue_wait = Histogram(
            "gangshare_queue_wait_seconds",
            "Time from queuedAt to admission (status.queueWaitSeconds), observed once per "
            "admission; label queue: spec.queue.",
            ["queue"],
            buckets=SECONDS_TO_A_DAY,
            registry=r,
        )
        self.cycle = Histogram(
            "gangshare_scheduling_cycle_duration_seconds",
            "One scheduling pass: listing, snapshot, decision, admission and status writes, and "
            "the reconciles it triggers.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.decision = Histogram(
            "gangshare_admission_decision_seconds",
            "The scheduling decision alone (core schedule_cycle) within one pass.",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.admissions = Counter(
            "gangshare_admissions_total",
            "Gangs admitted, by queue (spec.queue), service_class (the class admitted as: "
            "Guaranteed, or Opportunistic, which borrowing always is), borrowed (true: on "
            "quota borrowed from the cohort; false) and " + KIND_HELP + ".",
            ["queue", "service_class", "borrowed", "kind"],
            registry=r,
        )
        self.reconciles = Counter(
            "gangshare_operator_reconciles_total",
            "Reconciles of a TrainingJob, by reads: cache (the watch-fed stores showed nothing "
            "to do; no API request) or api (the job, its pods and Service read afresh).",
            ["reads"],
            registry=r,
        )
        self.snapshot_audits = Counter(
            "gangshare_snapshot_audits_total",
            "Audits of the scheduling pass's snapshot, kept from watch changes: each rebuilds it "
            "from every Node, Pod and TrainingJob and compares.",
            registry=r,
        )
        self.snapshot_drift = Counter(
            "gangshare_snapshot_drift_total",
            "Differences an audit found between the kept snapshot and its rebuild (each repaired "
            "by starting afresh from the rebuild), by kind: nodes, allocations, requests, "
            "running, displaced, warnings. Anything but 0 is a bug to report.",
            ["kind"],
            registry=r,
        )
        for kind in DRIFT_KINDS:  # each at 0 from the start: a panel's rate reads 0, not nothing
            self.snapshot_drift.labels(kind)
        self.preemptions = Counter(
            "gangshare_preemptions_total",
            "Running gangs evicted whole by the scheduler, by queue (the victim's spec.queue), "
            "reason (Reclaimed: its cohort's lenders took their quota back) and " + KIND_HELP + ".",
            ["queue", "reason", "kind"],
            registry=r,
        )
        self.requeues = Counter(
            "gangshare_requeues_total",
            "Gangs whose GPUs were released and that went back to their queue, keeping their "
            "place, by reason (the event's: GangDisplaced: the plan broke before it started; "
            "GangStartTimeout: workers not all bound in time; Preempted: reclaimed by lenders; "
            "OpportunisticEvicted: the node's coordinator evicted a worker) and " + KIND_HELP + ".",
            ["reason", "kind"],
            registry=r,
        )
        self.gang_failures = Counter(
            "gangshare_gang_failures_total",
            "Gang failures (a restart or the job's end), by failure_class (User: the job's own "
            "error; Infrastructure: eviction, node loss, signals, late exits), as in "
            "status.lastFailure.class, and " + KIND_HELP + ".",
            ["failure_class", "kind"],
            registry=r,
        )
        self.gang_start = Histogram(
            "gangshare_gang_start_seconds",
            "Time from admission (admittedAt) to every worker running, observed when a job "
            "moves to Running.",
            buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800),
            registry=r,
        )

    def set_trainingjobs(self, jobs: Iterable[Mapping[str, Any]]) -> None:
        self.set_trainingjob_counts(trainingjob_counts(jobs))

    def set_trainingjob_counts(self, counts: Mapping[TrainingJobKey, int]) -> None:
        """The snapshot from counts by (phase, service class, queue, kind), as
        trainingjob_counts makes them from the objects (the simulator keeps them as it goes);
        every phase is reported, 0 included, for each class, queue and kind that has a count."""
        family = GaugeMetricFamily(
            "gangshare_trainingjobs",
            TRAININGJOBS_HELP,
            labels=["phase", "service_class", "queue", "kind"],
        )
        full = {(phase, c, q, k): 0 for _, c, q, k in counts for phase in PHASES}
        full.update(counts)
        for key, count in sorted(full.items()):
            family.add_metric(list(key), count)
        self._jobs.replace([family])

    def set_queues(
        self, statuses: Mapping[str, Mapping[str, Any]], specs: Mapping[str, QueueSpec]
    ) -> None:
        families: list[Metric] = []
        for name, values in queue_samples(statuses, specs).items():
            family = GaugeMetricFamily(name, QUEUE_HELP[name], labels=["queue"])
            for queue, value in sorted(values.items()):
                family.add_metric([queue], value)
            families.append(family)
        self._queues.replace(families)

    def set_forecasts(self, forecasts: Iterable[Forecast], now: float) -> None:
        """Per queue, the forecast waits of its first, median and last waiting job (by
        forecast start), and how many it does not start within the horizon."""
        waits: dict[str, list[float]] = {}
        beyond: dict[str, int] = {}
        for forecast in forecasts:
            wait = forecast.wait(now)
            if wait is None:
                beyond[forecast.queue] = beyond.get(forecast.queue, 0) + 1
            else:
                waits.setdefault(forecast.queue, []).append(wait)
            beyond.setdefault(forecast.queue, 0)
        wait_family = GaugeMetricFamily(
            FORECAST_WAIT, FORECAST_HELP[FORECAST_WAIT], labels=["queue", "position"]
        )
        for queue, values in sorted(waits.items()):
            values.sort()
            picks = (("first", values[0]), ("median", values[len(values) // 2]))
            for position, value in (*picks, ("last", values[-1])):
                wait_family.add_metric([queue, position], value)
        beyond_family = GaugeMetricFamily(
            FORECAST_BEYOND, FORECAST_HELP[FORECAST_BEYOND], labels=["queue"]
        )
        for queue, count in sorted(beyond.items()):
            beyond_family.add_metric([queue], count)
        self._forecasts.replace([wait_family, beyond_family])

    def admitted(
        self, queue: str, service_class: str, borrowed: bool, wait: float, kind: str
    ) -> None:
        """Count an admission; `kind` as kube.queued_kinds.workload_kind_name of the record."""
        self.admissions.labels(queue, service_class, "true" if borrowed else "false", kind).inc()
        self.queue_wait.labels(queue).observe(wait)

    def applied(self, job: Mapping[str, Any], actions: Committed) -> None:
        """Count what a reconcile just committed (its status write succeeded)."""
        outcome, kind = outcome_of(job, actions), workload_kind_name(job)
        for reason in outcome.requeues:
            self.requeues.labels(reason, kind).inc()
        if outcome.preempted_queue is not None:
            self.preemptions.labels(outcome.preempted_queue, "Reclaimed", kind).inc()
        if outcome.failure_class is not None:
            self.gang_failures.labels(outcome.failure_class, kind).inc()
        if outcome.start_seconds is not None:
            self.gang_start.observe(outcome.start_seconds)


def parse_address(address: str) -> tuple[str, int]:
    """`host:port` (`[::]:8081` for IPv6) -> (host, port)."""
    host, colon, port = address.rpartition(":")
    if not colon or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{address!r}: expected HOST:PORT, e.g. 0.0.0.0:8081")
    return host.strip("[]") or "0.0.0.0", int(port)


def serve(metrics: OperatorMetrics, address: str) -> Any:
    """Serve /metrics on `address` in a daemon thread; the server (None when address is "")."""
    if not address:
        return None
    host, port = parse_address(address)
    server, _ = start_http_server(port, host, registry=metrics.registry)
    return server
