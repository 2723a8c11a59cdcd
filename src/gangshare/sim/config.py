"""A replay's settings: SimConfig and the defaults of its eviction and reclaim knobs.

The DEFAULT_* constants are the `gangshare simulate` flags' defaults as well
(docs/simulator.md). engine.py re-exports all of this, so importers may name either module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gangshare.core.coordinator import ControlParams

# Eviction costs and reclaim limits (docs/simulator.md; `gangshare simulate` flags). The
# last two were measured on the philly-cohort experiment (docs/simulator.md has the table): a
# borrower runs one checkpoint interval before reclaim may take it, so every run it gets keeps
# work; no cap, as a capped borrower holds its lenders' quota to its end (days, for the jobs
# that reach a cap) and the over-lent cohort lends nothing more meanwhile.
DEFAULT_CHECKPOINT_INTERVAL = 1800.0
DEFAULT_RESTART_OVERHEAD = 120.0
DEFAULT_RECLAIM_MIN_RUNTIME = 1800.0
DEFAULT_MAX_EVICTIONS: int | None = None
# A quota-blocked head waiting 7 days gets its queue's quota: on the philly-cohort window it
# halved the p99 queueing of jobs over 8 GPUs and lowered average queueing too (2 days cost
# the other sizes more than it gave; docs/simulator.md).
DEFAULT_STARVATION: float | None = 7 * 86400.0


@dataclass(frozen=True)
class SimConfig:
    tolerance: float = 0.05
    # The coordinator's decision period (ControlParams.period_seconds).
    control_period: float = ControlParams.period_seconds
    bin_seconds: float = 3600.0
    check_invariants: bool = False
    # Seconds of a run between two checkpoints, for jobs whose trace gives none; 0: every
    # instant (an eviction loses no work).
    checkpoint_interval: float = DEFAULT_CHECKPOINT_INTERVAL
    # Seconds a run that follows an eviction holds its GPUs before it progresses again.
    restart_overhead: float = DEFAULT_RESTART_OVERHEAD
    # QueuePolicy.reclaim_min_runtime_seconds and max_evictions_per_job (None: no cap).
    reclaim_min_runtime: float = DEFAULT_RECLAIM_MIN_RUNTIME
    max_evictions: int | None = DEFAULT_MAX_EVICTIONS
    # QueuePolicy.starvation_seconds: a quota-blocked head this old gets its queue's quota.
    starvation: float | None = DEFAULT_STARVATION

    def __post_init__(self) -> None:
        for name in ("checkpoint_interval", "restart_overhead", "reclaim_min_runtime"):
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                raise ValueError(f"{name}: must be a non-negative number of seconds, got {value}")
        if self.max_evictions is not None and self.max_evictions < 0:
            raise ValueError(f"max_evictions: must not be negative, got {self.max_evictions}")
        if self.starvation is not None and not 0 <= self.starvation < math.inf:
            raise ValueError(f"starvation: must be a non-negative number, got {self.starvation}")
