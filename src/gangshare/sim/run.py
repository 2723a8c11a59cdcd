"""One replay, end to end: trace + cluster + policy + seed -> records, time series and a summary."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gangshare.core.gang import never_fits
from gangshare.core.job import GangRequest
from gangshare.core.queueing import QueuedJob, policy_refusal
from gangshare.sim.clusters import SimCluster
from gangshare.sim.colocation import ColocationModel
from gangshare.sim.engine import Counters, SimConfig, Simulation
from gangshare.sim.invariants import check_state
from gangshare.sim.metrics import JobRecord, TimeSeries, summarize
from gangshare.sim.policy import SimPolicy
from gangshare.sim.trace import Trace
from gangshare.sim.workload import JobSpec, prepare_jobs

if TYPE_CHECKING:
    from gangshare.sim.openmetrics import ReplayMetrics

DEFAULT_OPPORTUNISTIC_FRACTION = 0.5


@dataclass
class RunResult:
    policy: str
    summary: dict[str, Any]
    records: list[JobRecord]
    series: TimeSeries
    counters: Counters
    wall_seconds: float
    unfinished: list[str]
    rejected: list[str]
    gpu_count: int
    # Why the rejected jobs can never run: reason -> how many (they sum to len(rejected)).
    rejected_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def events(self) -> int:
        """Arrivals, completions, control ticks and evictions handled."""
        c = self.counters
        arrivals = len(self.records) + len(self.unfinished)
        return arrivals + c.completions + c.ticks + c.evictions

    def to_json(self) -> dict[str, Any]:
        c = self.counters
        return {
            "policy": self.policy,
            **self.summary,
            "unfinished_jobs": len(self.unfinished),
            "rejected_jobs": len(self.rejected),
            "rejected_reasons": self.rejected_reasons,
            "replay": {
                "wall_seconds": self.wall_seconds,
                "events": self.events,
                "events_per_second": self.events / self.wall_seconds if self.wall_seconds else None,
                "instants": c.instants,
                "cycles": c.cycles,
                "skipped_cycles": c.skipped_cycles,
                "control_ticks": c.ticks,
                "evictions": c.evictions,
                "reclaims": c.reclaims,
                "borrowed_admissions": c.borrowed,
                "backfill_reservations": c.reservations,
                # Every job's, finished or not (the summary's eviction_* count finished ones).
                "eviction_lost_work_gpu_hours": c.lost_work_gpu_seconds / 3600.0,
                "eviction_restart_gpu_hours": c.restart_gpu_seconds / 3600.0,
            },
        }


def simulate(
    trace: Trace,
    make_cluster: Callable[[], SimCluster],
    policy: SimPolicy,
    model: ColocationModel,
    seed: int = 0,
    config: SimConfig | None = None,
    opportunistic_fraction: float = DEFAULT_OPPORTUNISTIC_FRACTION,
    on_progress: Callable[[int], None] | None = None,
    recorder: ReplayMetrics | None = None,
    probe: Callable[[Simulation, list[QueuedJob], float], None] | None = None,
) -> RunResult:
    config = config or SimConfig()
    setup = make_cluster()  # a fresh cluster per run: the simulation allocates on it
    specs = prepare_jobs(
        trace,
        model,
        seed,
        policy.antman,
        opportunistic_fraction,
        setup.pins,
        declare_memory=policy.cohort,
    )
    sim = Simulation(specs, setup, policy, model, config, on_progress)
    reasons = rejection_reasons(sim, specs)  # while the cluster is still empty
    if config.check_invariants:
        sim.check = check_state
    sim.recorder = recorder
    sim.probe = probe
    records = sim.run()
    gpus = setup.gpu_count
    start = min((s.trace.submit for s in specs), default=0.0)
    makespan = max((r.end for r in records), default=start)
    summary = summarize(records, sim.series, gpus, sim.ledger.capacity_mib, start, makespan)
    return RunResult(
        policy.name,
        summary,
        records,
        sim.series,
        sim.counters,
        sim.wall_seconds,
        sim.unfinished,
        sim.rejected,
        gpus,
        reasons,
    )


def rejection_reasons(sim: Simulation, specs: Sequence[JobSpec]) -> dict[str, int]:
    """Why each job the simulation rejected on arrival can never run, counted by reason
    (commonest first): the queue's policy refuses it, it asks for GPU models no node has
    (gpu_spec), or, in the core's words, it cannot be placed even on the empty cluster."""
    if not sim.rejected:
        return {}
    by_key = {s.key: s for s in specs}
    models = {n.gpu_model for n in sim.cluster.nodes.values()}
    cache: dict[GangRequest, str] = {}  # by shape: the owner set aside
    counts: dict[str, int] = {}
    for key in sim.rejected:
        spec = by_key[key]
        gang, job = spec.gang, spec.trace
        queued = QueuedJob(key, gang, job.submit, job.queue, spec.priority)
        why = policy_refusal(sim.queue_policy, queued)
        if why is None and job.gpu_models and not models.intersection(job.gpu_models):
            which = "that GPU model" if len(job.gpu_models) == 1 else "any of those GPU models"
            why = f"gpu_spec {'|'.join(job.gpu_models)}: no node has {which}"
        if why is None:
            shape = replace(gang, owner="")
            if shape not in cache:
                cache[shape] = never_fits(sim.cluster, gang) or "can never fit"
            why = cache[shape]
        counts[why] = counts.get(why, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
