"""A replay's Prometheus series: what the operator and the node agents would have exported.

`gangshare simulate --metrics-out FILE` writes them as OpenMetrics text with timestamps, one
sample per series every `step` simulated seconds, for `promtool tsdb create-blocks-from
openmetrics` to backfill, so the Grafana dashboards of deploy/grafana show a replay as they show
a live cluster (docs/simulator.md).

The series are not a copy of the live ones' names: the recorder drives the live components' own
metric objects (`OperatorMetrics`, `AgentMetrics`, on registries of its own) through the same
methods the operator calls (`admitted`, `set_trainingjob_counts`, `set_queues`), and each
sample is what their `collect()` returns at that simulated instant, so names, help, types,
labels and histogram buckets are the live ones by construction. Only the families in WRITTEN
are written: what the simulator models. Left out, and why:
- gangshare_gang_failures_total: a replayed job never fails;
- gangshare_gang_start_seconds: a gang starts the instant it is admitted (no binding, no pull);
- gangshare_scheduling_cycle_duration_seconds, gangshare_admission_decision_seconds: wall-clock
  durations of live passes; a replay runs in virtual time, and its output is deterministic;
- the extender's series: placement comes from the core's plans, no kube-scheduler calls it;
- the agent's per-pod coordinator series (duty and memory caps, slowdown, squeezes, throttles,
  evictions): the simulator models each GPU's settled share, not the agent's pods and backstop.

How the replay maps onto the operator's view (operator/metrics.py, operator/queue_status.py):
a job is Queued from its submission, Running from its admission (a gang starts at once, so
Admitted is never seen at a sample), Queued again (with its spec's class, as a requeue clears
status.serviceClass) when it is reclaimed (requeue reason Preempted, preemption reason
Reclaimed) or evicted for memory (OpportunisticEvicted), and Succeeded at its end. Its queue
wait is measured from its submission, which a requeue keeps (queuedAt). Jobs the simulator
rejects up front (they could never run) are counted nowhere, as validation would refuse them.
Queue gauges cover every queue of the cluster spec and of the trace; the per-GPU series are the
ledger's modelled SM utilization and memory in use, labelled with the simulated node names.
A replayed job is a TrainingJob of its own: its series' `kind` label is TrainingJob.
"""

from __future__ import annotations

import math
import time
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from gangshare.agent.metrics import MIB, AgentMetrics
from gangshare.core.queues import QueueSpec
from gangshare.operator.job_counts import TrainingJobKey
from gangshare.operator.metrics import OperatorMetrics

if TYPE_CHECKING:
    from gangshare.sim.engine import Simulation

DEFAULT_STEP_SECONDS = 60.0
# The `kind` label of every replayed job (kube.queued_kinds.workload_kind_name of a TrainingJob
# without spec.jobRef): a trace names no other kind of workload.
KIND = "TrainingJob"

# The families a replay writes (family names, as collect() names them: no _total).
WRITTEN = frozenset(
    {
        "gangshare_trainingjobs",
        "gangshare_queue_pending_jobs",
        "gangshare_queue_admitted_jobs",
        "gangshare_queue_nominal_gpus",
        "gangshare_queue_guaranteed_gpus",
        "gangshare_queue_borrowed_gpus",
        "gangshare_queue_wait_seconds",
        "gangshare_admissions",
        "gangshare_preemptions",
        "gangshare_requeues",
        "gangshare_operator_leader",
        "gangshare_gpu_sm_utilization_ratio",
        "gangshare_gpu_memory_used_bytes",
    }
)
# Families whose series start from 0: one that first shows up at a sample gets a 0 at the
# sample before, so rate() and increase() count its first events too.
CUMULATIVE = ("counter", "histogram")


@dataclass
class _Group:
    """One series (a histogram's: its buckets, count and sum) over the replay's samples, kept
    in flat arrays: a long replay of a large cluster holds millions of points."""

    # `name{labels}` of each sample line, in exposition order.
    prefixes: tuple[str, ...]
    # The index of each point's sample on the grid, and its values in prefix order (flat).
    indices: array[int] = field(default_factory=lambda: array("q"))
    values: array[float] = field(default_factory=lambda: array("d"))

    def add(self, index: int, values: Iterable[float]) -> None:
        self.indices.append(index)
        self.values.extend(values)


@dataclass
class _Family:
    name: str
    type: str
    documentation: str
    groups: dict[tuple[tuple[str, str], ...], _Group] = field(default_factory=dict)


@dataclass(frozen=True)
class _Job:
    phase: str
    service_class: str
    queue: str
    spec_class: str


class ReplayMetrics:
    """Fed by the engine's hooks (Simulation.recorder); `write` once the replay has ended."""

    def __init__(self, step: float = DEFAULT_STEP_SECONDS) -> None:
        if not step > 0:
            raise ValueError(f"step must be positive, got {step}")
        self.step = step
        self.operator = OperatorMetrics(CollectorRegistry())
        self.agent = AgentMetrics("", CollectorRegistry())
        # The simulated operator runs without leader election and acts (the help's "1").
        self.operator.leader.set(1)
        self._jobs: dict[str, _Job] = {}
        self._counts: dict[TrainingJobKey, int] = {}
        self._queues: set[str] = set()
        self._families: dict[str, _Family] = {}
        self._gpus: dict[tuple[str, int], tuple[Gauge, Gauge]] = {}
        # Simulated time of sample 0, and the times of every sample taken (sample i at times[i]).
        self._origin: float | None = None
        self.times: list[float] = []
        self._closed = False

    # ----- the engine's hooks --------------------------------------------------------------

    def arrived(self, key: str, queue: str, service_class: str) -> None:
        self._queues.add(queue)
        self._move(key, _Job("Queued", service_class, queue, service_class))

    def admitted(self, key: str, service_class: str, borrowed: bool, wait: float) -> None:
        job = self._jobs[key]
        self.operator.admitted(job.queue, service_class, borrowed, wait, KIND)
        self._move(key, _Job("Running", service_class, job.queue, job.spec_class))

    def requeued(self, key: str, reason: str) -> None:
        """Released and back in its queue: Preempted (reclaimed) or OpportunisticEvicted."""
        job = self._jobs[key]
        self.operator.requeues.labels(reason, KIND).inc()
        if reason == "Preempted":
            self.operator.preemptions.labels(job.queue, "Reclaimed", KIND).inc()
        self._move(key, _Job("Queued", job.spec_class, job.queue, job.spec_class))

    def finished(self, key: str) -> None:
        job = self._jobs[key]
        self._move(key, _Job("Succeeded", job.service_class, job.queue, job.spec_class))

    def advance(self, sim: Simulation, start: float, end: float) -> None:
        """The state is sim's from `start` until `end`: sample it at each grid time in between.

        The first call comes before the first arrival: sample 0, a step before it, is the
        empty cluster, so every counter and histogram starts from 0 on the grid."""
        if self._origin is None:
            self._origin = start - self.step
        while (at := self._origin + len(self.times) * self.step) < end:
            self._sample(sim, at)

    def close(self, sim: Simulation, end: float) -> None:
        """The replay ended at `end`: its last sample (the final state), on the grid or not."""
        if self._closed:
            return
        self._closed = True
        self.advance(sim, end, end)
        if not self.times or self.times[-1] < end:
            self._sample(sim, end)

    # ----- sampling ------------------------------------------------------------------------

    def _move(self, key: str, job: _Job) -> None:
        old = self._jobs.get(key)
        if old is not None:
            self._counts[(old.phase, old.service_class, old.queue, KIND)] -= 1
        self._jobs[key] = job
        new = (job.phase, job.service_class, job.queue, KIND)
        self._counts[new] = self._counts.get(new, 0) + 1

    def _queue_state(self, sim: Simulation) -> None:
        quotas = sim.setup.quotas
        self._queues.update(quotas)
        statuses = {
            q: {"pendingJobs": 0, "admittedJobs": 0, "guaranteedGPUs": 0, "borrowedGPUs": 0}
            for q in self._queues
        }
        for (phase, _, queue, _), count in self._counts.items():
            if phase == "Queued":
                statuses[queue]["pendingJobs"] += count
            elif phase == "Running":
                statuses[queue]["admittedJobs"] += count
        for queue, gpus in sim.usage.items():
            statuses[queue]["guaranteedGPUs"] = gpus
        for queue, gpus in sim.borrowed.items():
            statuses[queue]["borrowedGPUs"] = gpus
        specs = {q: QueueSpec(q, nominal_gpus=quota) for q, quota in quotas.items()}
        self.operator.set_queues(statuses, specs)

    def _gpu_state(self, sim: Simulation) -> None:
        for gid, share in sim.ledger.share.items():
            children = self._gpus.get(gid)
            if children is None:
                labels = (gid[0], str(gid[1]))
                sm, memory = self.agent.sm.labels(*labels), self.agent.memory.labels(*labels)
                children = self._gpus[gid] = (sm, memory)
            children[0].set(share.util / 100.0)
            children[1].set(share.memory_mib * MIB)

    def _sample(self, sim: Simulation, at: float) -> None:
        index = len(self.times)
        self.times.append(at)
        self.operator.set_trainingjob_counts(self._counts)
        self._queue_state(sim)
        self._gpu_state(sim)
        for metric in [*self.operator.registry.collect(), *self.agent.registry.collect()]:
            if metric.name in WRITTEN:
                self._record(metric, index)

    def _record(self, metric: Metric, index: int) -> None:
        family = self._families.get(metric.name)
        if family is None:
            family = _Family(metric.name, metric.type, metric.documentation)
            self._families[metric.name] = family
        # Label sets come in the metric's label-name order, so they key groups unsorted.
        current: dict[tuple[tuple[str, str], ...], tuple[list[Sample], list[float]]] = {}
        for sample in metric.samples:
            if sample.name.endswith("_created"):
                continue  # a process's start; a replay has none
            key = tuple((k, v) for k, v in sample.labels.items() if k != "le")
            entry = current.get(key)
            if entry is None:
                entry = current[key] = ([], [])
            entry[0].append(sample)
            entry[1].append(float(sample.value))
        for key, (samples, values) in current.items():
            group = family.groups.get(key)
            if group is None:
                prefixes = tuple(s.name + _labels(s.labels) for s in samples)
                group = family.groups[key] = _Group(prefixes)
                if family.type in CUMULATIVE and index > 0:
                    group.add(index - 1, [0.0] * len(values))
            group.add(index, values)

    # ----- output --------------------------------------------------------------------------

    @property
    def span(self) -> float:
        """Simulated seconds from the first sample to the last."""
        return self.times[-1] - self.times[0] if self.times else 0.0

    def families(self) -> list[str]:
        return sorted(self._families)

    def write(self, path: Path, start: float | None = None) -> float:
        """Write the OpenMetrics text; sample 0 at epoch `start` (default: the replay ends
        now). Returns the epoch of sample 0."""
        if start is None:
            start = math.floor(time.time() - self.span)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w") as out:
            self.write_to(out, start)
        return start

    def write_to(self, out: TextIO, start: float) -> None:
        origin = self.times[0] if self.times else 0.0
        stamps = [f"{start + (t - origin):.3f}" for t in self.times]
        for name in self.families():
            family = self._families[name]
            out.write(f"# HELP {name} {_escape_help(family.documentation)}\n")
            out.write(f"# TYPE {name} {family.type}\n")
            for group in family.groups.values():
                out.writelines(_lines(group, stamps))
        out.write("# EOF\n")


def _lines(group: _Group, stamps: list[str]) -> Iterable[str]:
    width = len(group.prefixes)
    for point, index in enumerate(group.indices):
        stamp = stamps[index]
        values = group.values[point * width : (point + 1) * width]
        for prefix, value in zip(group.prefixes, values, strict=True):
            # repr: the shortest text that reads back as the same float (no NaN or inf here).
            yield f"{prefix} {value!r} {stamp}\n"


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape_label(v)}"' for k, v in labels.items())
    return "{" + inner + "}"


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
