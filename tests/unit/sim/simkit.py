"""Small clusters, jobs and a co-location table for simulator tests, with answers worked by hand."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gangshare.core import Cluster, GangRequest, ServiceClass
from gangshare.core.gpu import Gpu
from gangshare.core.spec import NodeSpec, gpu_uuid
from gangshare.sim.clusters import SimCluster
from gangshare.sim.colocation import ColocationModel, Workload
from gangshare.sim.engine import SimConfig, Simulation
from gangshare.sim.invariants import check_state
from gangshare.sim.policy import parse_policy
from gangshare.sim.trace import TraceJob
from gangshare.sim.workload import JobSpec, gang_shape

G, OPP = ServiceClass.GUARANTEED, ServiceClass.OPPORTUNISTIC
# Evictions that cost nothing (a checkpoint at every instant, no restart) and reclaim at
# once (no minimum run time): for answers worked by hand about something else than what an
# eviction costs (test_sim_eviction_cost.py has those).
FREE_EVICTIONS = SimConfig(checkpoint_interval=0.0, restart_overhead=0.0, reclaim_min_runtime=0.0)


def model() -> ColocationModel:
    """Workload 0 ("big") slows to 0.8 beside 1 ("small"), which runs at 0.6 beside it.

    Workload 2 was measured with nobody, so its pairs fall back to the workload's
    mean measured speed (1.0 when it has none).
    """
    return ColocationModel(
        [Workload("big", 50.0, 4000), Workload("small", 30.0, 2000), Workload("lone", 20.0, 1000)],
        {(0, 1): (0.8, 70.0), (1, 0): (0.6, 70.0), (1, 1): (0.9, 45.0), (0, 0): (0.7, 80.0)},
    )


def setup(
    nodes: int = 1,
    gpus: int = 4,
    memory_mib: int = 16384,
    quotas: dict[str, int] | None = None,
    slots: int = 4,
    racks: int = 1,
    cohorts: dict[str, str] | None = None,
) -> Callable[[], SimCluster]:
    def build() -> SimCluster:
        specs = [
            NodeSpec(
                name=f"n{i}",
                rack=f"r{i % racks}",
                gpus=tuple(Gpu(g, gpu_uuid(f"n{i}", g), "H100", memory_mib) for g in range(gpus)),
                islands=((tuple(range(gpus)),)),
                share_slots=slots,
            )
            for i in range(nodes)
        ]
        quota = dict(quotas or {})
        cluster = Cluster(s.to_state() for s in specs)
        return SimCluster(
            cluster, "test", quota, dict.fromkeys(quota, 1.0), cohorts=dict(cohorts or {})
        )

    return build


def job(
    key: str,
    submit: float,
    duration: float,
    gpus: int = 1,
    cls: ServiceClass = G,
    workload: int = 0,
    queue: str = "default",
    priority: int = 0,
) -> JobSpec:
    workers, per_worker = gang_shape(gpus)
    memory = model().workloads[workload].memory_mib if cls is OPP else None
    gang = GangRequest(key, workers, per_worker, cls, gpu_memory_mib=memory)
    return JobSpec(TraceJob(key, submit, duration, gpus, queue), gang, workload, priority)


def simulate(
    specs: Sequence[JobSpec],
    build: Callable[[], SimCluster],
    policy: str = "fifo",
    config: SimConfig | None = None,
    checked: bool = True,
) -> Simulation:
    sim = Simulation(specs, build(), parse_policy(policy), model(), config)
    if checked:
        sim.check = check_state
    sim.run()
    return sim


def by_key(sim: Simulation) -> dict[str, tuple[float, float, float]]:
    """key -> (first start, end, queueing delay)."""
    return {r.key: (r.first_start, r.end, r.queued) for r in sim.records}
