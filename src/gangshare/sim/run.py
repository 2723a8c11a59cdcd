"""One replay, end to end: trace + cluster + policy + seed -> records, time series and a summary."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gangshare.sim.clusters import SimCluster
from gangshare.sim.colocation import ColocationModel
from gangshare.sim.engine import Counters, SimConfig, Simulation
from gangshare.sim.invariants import check_state
from gangshare.sim.metrics import JobRecord, TimeSeries, summarize
from gangshare.sim.policy import SimPolicy
from gangshare.sim.trace import Trace
from gangshare.sim.workload import prepare_jobs

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
    if config.check_invariants:
        sim.check = check_state
    sim.recorder = recorder
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
    )
