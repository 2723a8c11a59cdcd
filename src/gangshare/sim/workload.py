"""From trace rows to what the scheduler sees: gang shape, service class, priority, workload.

Class rules (only under the `antman` policy; otherwise every job is Guaranteed):
- Philly has no class: a 1-GPU job is Opportunistic with probability
  `opportunistic_fraction`, drawn from (seed, job key); multi-GPU gangs are Guaranteed.
- Alibaba 2023: Opportunistic when qos is BE (best-effort) or gpu_milli < 1000
  (a fractional GPU is a request to share); Guaranteed otherwise (LS, Burstable,
  Guaranteed on whole GPUs).
- Generic CSV: its service_class column, else Guaranteed.

Priority: Alibaba from qos (Guaranteed 3, LS 2, Burstable 1, BE 0); generic from
its column; Philly has none, so a seeded 20% of its jobs get priority 1 (synthetic).

Checkpoint interval: the generic CSV's checkpoint_interval column; Philly and Alibaba
have none, so their jobs use `gangshare simulate --checkpoint-interval`.

Every job runs one workload drawn from (seed, job key) among the measured
co-location configurations; it gives the job's solo utilization and memory and its
speeds beside others. Draws hash the key, so they do not depend on trace order.

GPU models: a queue's `gpuModel` (cluster spec) pins its jobs, as a TrainingJob's
`gpuModel` does. An Alibaba pod's gpu_spec does the same when it names one model; the
core's `gpu_model` takes only one, so a pod that accepts several (`V100M16|V100M32`)
asks instead, as a TrainingJob's template would, for required node affinity
`nvidia.com/gpu.product In (V100M16, V100M32)`: any node of any of those models will
do (the simulator labels each node with its GPU model). A pod whose models no node
has can never run; it is rejected on arrival and reported with that reason.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from gangshare.core.annotations import GPU_PRODUCT_LABEL
from gangshare.core.constraints import (
    UNCONSTRAINED,
    PodConstraints,
    Requirement,
    SelectorOperator,
    SelectorTerm,
)
from gangshare.core.job import GangRequest, ServiceClass
from gangshare.sim.colocation import ColocationModel
from gangshare.sim.trace import Trace, TraceJob

MAX_GPUS_PER_WORKER = 8
PHILLY_HIGH_PRIORITY_SHARE = 0.2
QOS_PRIORITY = {"Guaranteed": 3, "LS": 2, "Burstable": 1, "BE": 0}


@dataclass(frozen=True)
class JobSpec:
    trace: TraceJob
    gang: GangRequest
    workload: int
    priority: int
    # Seconds of a run between two checkpoints (the trace's); None: the simulator's flag.
    checkpoint_interval: float | None = None

    @property
    def key(self) -> str:
        return self.trace.key

    @property
    def service_class(self) -> ServiceClass:
        return self.gang.service_class


def seeded_unit(seed: int, purpose: str, key: str) -> float:
    """A uniform draw in [0, 1) that depends only on the seed, the purpose and the job key."""
    digest = hashlib.blake2b(f"{seed}/{purpose}/{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def gang_shape(gpus: int) -> tuple[int, int]:
    """(workers, GPUs per worker): one worker up to a node's 8 GPUs, else equal workers of <= 8."""
    if gpus <= MAX_GPUS_PER_WORKER:
        return 1, gpus
    per_worker = max(d for d in range(1, MAX_GPUS_PER_WORKER + 1) if gpus % d == 0)
    return gpus // per_worker, per_worker


def service_class(
    job: TraceJob, kind: str, seed: int, opportunistic_fraction: float
) -> ServiceClass:
    if kind == "alibaba":
        fractional = job.gpu_milli is not None and job.gpu_milli < 1000
        return (
            ServiceClass.OPPORTUNISTIC if job.qos == "BE" or fractional else ServiceClass.GUARANTEED
        )
    if kind == "philly":
        if job.gpus == 1 and seeded_unit(seed, "class", job.key) < opportunistic_fraction:
            return ServiceClass.OPPORTUNISTIC
        return ServiceClass.GUARANTEED
    return job.service_class or ServiceClass.GUARANTEED


def priority(job: TraceJob, kind: str, seed: int) -> int:
    if kind == "alibaba":
        return QOS_PRIORITY.get(job.qos or "", 0)
    if kind == "philly":
        return 1 if seeded_unit(seed, "priority", job.key) < PHILLY_HIGH_PRIORITY_SHARE else 0
    return job.priority


def model_constraints(
    models: tuple[str, ...], pin: str | None
) -> tuple[str | None, PodConstraints]:
    """(gpu_model, constraints) for a job that may run on `models` (empty: any) in a queue
    pinned to `pin`: one model is the core's gpu_model; several are a node affinity on
    the GPU model label (a pin outside them leaves the job nowhere to run)."""
    if not models or (pin is not None and pin in models):
        return pin, UNCONSTRAINED
    if len(models) == 1 and pin is None:
        return models[0], UNCONSTRAINED
    term = SelectorTerm((Requirement(GPU_PRODUCT_LABEL, SelectorOperator.IN, models),))
    return pin, PodConstraints(affinity=(term,), resources=())


def prepare_jobs(
    trace: Trace,
    model: ColocationModel,
    seed: int,
    antman: bool,
    opportunistic_fraction: float,
    pins: Mapping[str, str] | None = None,
    declare_memory: bool = False,
) -> list[JobSpec]:
    """`pins`: queue -> GPU model its jobs require (a VC that owns its machines).

    Opportunistic jobs declare their workload's GPU memory; with `declare_memory` every
    job does (cohorts: a guaranteed job that borrows runs as an Opportunistic tenant, and
    the memory it declares is what the core lends beside it). Guaranteed placement
    ignores it: a guaranteed worker owns whole GPUs.
    """
    pins = pins or {}
    specs = []
    # Affinities repeat (a handful of gpu_spec values): one object each, shared.
    models: dict[tuple[tuple[str, ...], str | None], tuple[str | None, PodConstraints]] = {}
    for job in trace.jobs:
        cls = (
            service_class(job, trace.kind, seed, opportunistic_fraction)
            if antman
            else ServiceClass.GUARANTEED
        )
        work = int(seeded_unit(seed, "workload", job.key) * len(model))
        workers, per_worker = gang_shape(job.gpus)
        memory = job.gpu_memory_mib or model.workloads[work].memory_mib
        asked = (job.gpu_models, pins.get(job.queue))
        if asked not in models:
            models[asked] = model_constraints(*asked)
        gpu_model, constraints = models[asked]
        gang = GangRequest(
            owner=job.key,
            workers=workers,
            gpus_per_worker=per_worker,
            service_class=cls,
            gpu_memory_mib=memory if declare_memory or cls is ServiceClass.OPPORTUNISTIC else None,
            gpu_model=gpu_model,
            constraints=constraints,
        )
        specs.append(
            JobSpec(job, gang, work, priority(job, trace.kind, seed), job.checkpoint_interval)
        )
    return specs
