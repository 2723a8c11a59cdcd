"""Regenerate docs/results.md and docs/results/: every experiment, policies side by side.

    .venv/bin/python -m gangshare.sim.report            # writes docs/results.md, docs/results/
    .venv/bin/python -m gangshare.sim.report --only alibaba --out /tmp/r

Runs use every CPU (one replay per process); the traces are read from
../shared/traces beside the repository (override with --traces).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from functools import cache
from pathlib import Path

from gangshare.sim.cli import REPO_ROOT, TRACES, parse_window
from gangshare.sim.clusters import SimCluster, load_sim_cluster
from gangshare.sim.colocation import ColocationModel, load_colocation
from gangshare.sim.forecast_accuracy import ForecastProbe
from gangshare.sim.machine import describe_machine
from gangshare.sim.metrics import JobRecord
from gangshare.sim.outcome import Experiment, Outcome
from gangshare.sim.outputs import write_json
from gangshare.sim.policy import parse_policy
from gangshare.sim.report_forecasts import (
    ForecastOutcome,
    ForecastRun,
    measure,
    write_forecast_json,
)
from gangshare.sim.run import RunResult, simulate
from gangshare.sim.trace import Trace, load_trace

SEED = 1
FULL_STACK = "multi-queue,fair-share,backfill,antman"
COHORT_STACK = f"{FULL_STACK},cohort"


PHILLY = "philly/philly_jobs.csv"
ALIBABA = "alibaba-gpu-v2023/openb_pod_list_default.csv"
ALIBABA_NODES = "alibaba-gpu-v2023/openb_node_list_gpu_node.csv"
HELIOS_WINDOW = "2017-10-01,2017-11-30 23:59:00"
# Six weeks whose submissions outrun the 3/16-size cluster (philly-helios-3of16.yaml says why).
COHORT_WINDOW = "2017-09-22,2017-11-03"

EXPERIMENTS = (
    Experiment(
        "philly",
        "Philly, all 82,247 jobs, Helios VCs at 3/8 size on one shared pool (1,056 GPUs)",
        PHILLY,
        "examples/clusters/philly-helios-3of8.yaml",
        (
            "fifo",
            "priority",
            "qssf",
            "sjf-oracle",
            "multi-queue",
            "fair-share",
            "backfill",
            "multi-queue,fair-share,backfill",
            "antman",
            FULL_STACK,
        ),
        plotted=(
            "fifo",
            "qssf",
            "multi-queue",
            "multi-queue,fair-share,backfill",
            "antman",
            FULL_STACK,
        ),
    ),
    Experiment(
        "helios-3of8",
        "Philly Oct-Nov 2017 (Helios' window), Helios VCs partitioned, at 3/8 size",
        PHILLY,
        "examples/clusters/philly-helios-3of8-partitioned.yaml",
        ("fifo", "sjf-oracle", "qssf"),
        window=HELIOS_WINDOW,
        plotted=None,
    ),
    Experiment(
        "helios-full",
        "Philly Oct-Nov 2017 (Helios' window), Helios VCs partitioned, at full size",
        PHILLY,
        "examples/clusters/philly-helios-partitioned.yaml",
        ("fifo", "sjf-oracle", "qssf"),
        window=HELIOS_WINDOW,
        plotted=None,
    ),
    Experiment(
        "philly-full-size",
        "Philly, all 82,247 jobs, Helios VCs at full size on one shared pool (2,816 GPUs)",
        PHILLY,
        "examples/clusters/philly-helios.yaml",
        ("fifo",),
        plotted=None,
    ),
    Experiment(
        "philly-cohort",
        "Philly Sep 22 - Nov 3 2017 (backlogged), Helios VCs at 3/16 size on one shared pool"
        " (528 GPUs), with and without one cohort of all VCs",
        PHILLY,
        "examples/clusters/philly-helios-3of16.yaml",
        (
            "fifo",
            "fifo,pool",
            "fifo,cohort",
            FULL_STACK,
            COHORT_STACK,
            f"qssf,{COHORT_STACK}",
            f"sjf-oracle,{COHORT_STACK}",
        ),
        window=COHORT_WINDOW,
        plotted=("fifo", "fifo,cohort", FULL_STACK, COHORT_STACK, f"sjf-oracle,{COHORT_STACK}"),
    ),
    Experiment(
        "alibaba",
        "Alibaba GPU 2023 default pod list, 1.1% of the node list (11 nodes, 58 GPUs)",
        ALIBABA,
        ALIBABA_NODES,
        (
            "fifo",
            "priority",
            "qssf",
            "multi-queue",
            "backfill",
            "multi-queue,backfill",
            "antman",
            "multi-queue,backfill,antman",
        ),
        fraction=0.011,
        plotted=("fifo", "priority", "qssf", "multi-queue", "backfill", "antman"),
    ),
)


# Start-time forecasts asked at every N-th submission (report_forecasts.py).
FORECAST_RUNS = (
    ForecastRun("philly-cohort", "fifo", 100),
    ForecastRun("alibaba", "fifo", 5),
)


def _cluster_path(experiment: Experiment, traces: Path) -> Path:
    if experiment.cluster.endswith(".csv"):
        return traces / experiment.cluster
    return REPO_ROOT / experiment.cluster


@cache
def _trace(traces: Path, path: str, window: str | None) -> Trace:
    return load_trace(traces / path, parse_window(window) if window else None)


@cache
def _model(traces: Path) -> ColocationModel:
    return load_colocation(traces / "lucid-colocation")


def _setup(experiment: Experiment, traces: Path) -> SimCluster:
    return load_sim_cluster(_cluster_path(experiment, traces), experiment.fraction)


def run_one(experiment: Experiment, policy: str, traces: Path) -> RunResult:
    trace = _trace(traces, experiment.trace, experiment.window)
    return simulate(
        trace,
        lambda: _setup(experiment, traces),
        parse_policy(policy),
        _model(traces),
        SEED,
    )


def forecast_one(run: ForecastRun, traces: Path) -> ForecastOutcome:
    experiment = next(e for e in EXPERIMENTS if e.name == run.experiment)

    def replay(probe: ForecastProbe) -> tuple[list[JobRecord], float]:
        trace = _trace(traces, experiment.trace, experiment.window)
        result = simulate(
            trace,
            lambda: _setup(experiment, traces),
            parse_policy(run.policy),
            _model(traces),
            SEED,
            probe=probe,
        )
        return result.records, result.wall_seconds

    return measure(run, replay)


def run_all(
    experiments: Sequence[Experiment], traces: Path, workers: int
) -> tuple[list[Outcome], list[ForecastOutcome], float]:
    began = time.perf_counter()
    tasks = [(e, p) for e in experiments for p in e.policies]
    names = {e.name for e in experiments}
    forecasts = [r for r in FORECAST_RUNS if r.experiment in names]
    # Sharing runs are the slowest (opportunistic placement scans every node): start them first.
    tasks.sort(key=lambda t: ("antman" not in t[1], t[0].name not in ("philly", "philly-cohort")))
    found: dict[tuple[str, str], RunResult] = {}
    with ProcessPoolExecutor(max_workers=workers) as pool:
        probes = {pool.submit(forecast_one, r, traces): r for r in forecasts}
        futures = {pool.submit(run_one, e, p, traces): (e.name, p) for e, p in tasks}
        for done, future in enumerate(as_completed(futures), start=1):
            key = futures[future]
            result = future.result()
            found[key] = result
            print(
                f"[{done}/{len(tasks)}] {key[0]:<17} {key[1]:<40} {result.wall_seconds:6.1f} s",
                file=sys.stderr,
                flush=True,
            )
        forecast_outcomes: list[ForecastOutcome] = []
        for measured in as_completed(probes):
            forecast = measured.result()
            forecast_outcomes.append(forecast)
            print(
                f"[forecasts] {forecast.run.experiment:<17} {forecast.run.policy:<40}"
                f" {forecast.replay_seconds:6.1f} s",
                file=sys.stderr,
                flush=True,
            )
    forecast_outcomes.sort(key=lambda o: FORECAST_RUNS.index(o.run))
    outcomes = [
        Outcome(
            e,
            _trace(traces, e.trace, e.window),
            _setup(e, traces).description,
            [found[(e.name, p)] for p in e.policies],
        )
        for e in experiments
    ]
    return outcomes, forecast_outcomes, time.perf_counter() - began


def write_artifacts(outcomes: Sequence[Outcome], directory: Path) -> None:
    from gangshare.sim.plots import plot_cdfs, plot_utilization

    directory.mkdir(parents=True, exist_ok=True)
    for outcome in outcomes:
        e = outcome.experiment
        header = {
            "experiment": e.title,
            "trace": e.trace,
            "window": e.window,
            "cluster": outcome.cluster,
            "seed": SEED,
            "dropped rows": outcome.trace.dropped,
        }
        write_json(directory / f"{e.name}.json", header, outcome.results)
        if e.plotted is None:
            continue
        shown = [r for r in outcome.results if not e.plotted or r.policy in e.plotted]
        short = e.title.split(",")[0]
        plot_cdfs(shown, "jct", f"{short}: JCT", directory / f"{e.name}-jct-cdf.png")
        queueing = directory / f"{e.name}-queueing-cdf.png"
        plot_cdfs(shown, "queueing", f"{short}: queueing delay", queueing)
        utilization = directory / f"{e.name}-utilization.png"
        plot_utilization(shown, f"{short}: cluster-wide utilization", utilization)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gangshare.sim.report", description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "docs", help="docs directory")
    parser.add_argument("--traces", type=Path, default=TRACES)
    parser.add_argument("--only", action="append", help="experiment name(s) to run")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    chosen = [e for e in EXPERIMENTS if not args.only or e.name in args.only]
    if not chosen:
        names = ", ".join(e.name for e in EXPERIMENTS)
        print(f"error: --only: no experiment of that name; choose from {names}", file=sys.stderr)
        return 2
    outcomes, forecasts, seconds = run_all(chosen, args.traces, args.workers)
    from gangshare.sim.report_md import results_markdown

    write_artifacts(outcomes, args.out / "results")
    if forecasts:
        write_forecast_json(args.out / "results" / "forecasts.json", forecasts)
    side_by_side = min(args.workers, sum(len(e.policies) for e in chosen))
    machine = describe_machine(side_by_side, REPO_ROOT)
    page = results_markdown(outcomes, seconds, args.workers, machine, forecasts)
    (args.out / "results.md").write_text(page)
    print(f"wrote {args.out / 'results.md'} and {args.out / 'results'}/", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
