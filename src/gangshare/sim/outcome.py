"""What `make results` runs (an experiment: a trace, a cluster, policies) and what one run of
it gave, shared by the runner (report.py) and the pages written from it (report_*.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from gangshare.sim.run import RunResult
from gangshare.sim.trace import Trace


@dataclass(frozen=True)
class Experiment:
    name: str
    title: str
    # Relative to the traces directory.
    trace: str
    # Relative to the repository root, or (a node list) to the traces directory.
    cluster: str
    policies: tuple[str, ...]
    fraction: float = 1.0
    window: str | None = None
    # Policies drawn in the plots (all of them when empty); no plots when None.
    plotted: tuple[str, ...] | None = field(default=())


@dataclass
class Outcome:
    experiment: Experiment
    trace: Trace
    cluster: str
    results: list[RunResult]
