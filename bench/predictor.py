"""Accuracy of run-time prediction (gangshare.core.estimate) on the shared traces.

Replays ../shared/traces/philly/philly_jobs.csv and
../shared/traces/alibaba-gpu-v2023/openb_pod_list_default.csv in submission order
(read by gangshare.sim.trace, as the simulator reads them). Each job is predicted at
its submission from the jobs that ended before then, and compared with its true run
time. A job ends at submit + duration: Philly has no start times, and Alibaba's pods
were scheduled a median 2 s after creation, so this moves history earlier by the
queueing delay, no more. Every job is learnt from: neither trace says which succeeded
in a form the reader keeps (Philly has no status at all).

Groups: Philly has no user or job name, so its group is "" and the group rule never
applies. Alibaba's group is its pod name without the suffix (`name_group`); the
published names are all openb-pod-NNNN, one group, so the pod's request (CPU, memory,
GPU share, GPU model, QoS) is tried too: a stand-in for the job template a real name
would identify. The number of distinct groups follows each group's label.

The baseline is the estimator as it was: the median of the last 50 runs of the same
queue and GPU count, else one hour (the traces declare no estimates).

    .venv/bin/python bench/predictor.py [--quantiles 0.5 0.75 0.9] [--min-samples 3]
"""

from __future__ import annotations

import argparse
import csv
import heapq
import statistics
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gangshare.core.estimate import RuntimeEstimator, Source, name_group
from gangshare.sim.cli import TRACES
from gangshare.sim.policy import DEFAULT_RUNTIME_SECONDS
from gangshare.sim.trace import TraceJob, load_trace

ALIBABA_PODS = "alibaba-gpu-v2023/openb_pod_list_default.csv"
SOURCES = (Source.HISTORY, Source.HISTORY_QUEUE, Source.DEFAULT)
# A predictor: (queue, gpus, group) -> (seconds, source); learns through `observe`.
Predict = Callable[[str, int, str], tuple[float, Source]]
Observe = Callable[[str, int, str, float], None]


class Baseline:
    """The estimator before groups and quantiles: median of the last 50 per (queue, GPUs)."""

    def __init__(self) -> None:
        self.runs: dict[tuple[str, int], deque[float]] = {}

    def observe(self, queue: str, gpus: int, group: str, seconds: float) -> None:
        self.runs.setdefault((queue, gpus), deque(maxlen=50)).append(seconds)

    def predict(self, queue: str, gpus: int, group: str) -> tuple[float, Source]:
        runs = self.runs.get((queue, gpus))
        if runs:
            return float(statistics.median(runs)), Source.HISTORY_QUEUE
        return DEFAULT_RUNTIME_SECONDS, Source.DEFAULT


def constant(seconds: float) -> tuple[Predict, Observe]:
    """A reference that learns nothing: what any history has to beat."""
    return (lambda queue, gpus, group: (seconds, Source.DEFAULT)), (lambda *_: None)


def estimator(quantile: float, min_samples: int) -> tuple[Predict, Observe]:
    est = RuntimeEstimator(DEFAULT_RUNTIME_SECONDS, quantile=quantile, min_samples=min_samples)

    def predict(queue: str, gpus: int, group: str) -> tuple[float, Source]:
        got = est.prediction(queue, gpus, group=group)
        return got.seconds, got.source

    def observe(queue: str, gpus: int, group: str, seconds: float) -> None:
        est.observe(queue, gpus, seconds, group=group)

    return predict, observe


@dataclass
class Score:
    jobs: int
    sources: Counter[Source]
    mae: float
    median_error: float
    under: float


def replay(
    jobs: Sequence[TraceJob], groups: Sequence[str], predict: Predict, observe: Observe
) -> Score:
    """Predict each job at its submission from the jobs that ended before it."""
    ends: list[tuple[float, int]] = []
    errors: list[float] = []
    sources: Counter[Source] = Counter()
    under = 0
    for i, job in enumerate(jobs):  # jobs are in submission order
        while ends and ends[0][0] <= job.submit:
            _, done = heapq.heappop(ends)
            ended = jobs[done]
            observe(ended.queue, ended.gpus, groups[done], ended.duration)
        seconds, source = predict(job.queue, job.gpus, groups[i])
        sources[source] += 1
        errors.append(abs(seconds - job.duration))
        under += seconds < job.duration
        heapq.heappush(ends, (job.submit + job.duration, i))
    count = len(jobs)
    return Score(count, sources, sum(errors) / count, statistics.median(errors), under / count)


def request_shapes(path: Path) -> dict[str, str]:
    """Pod name -> its request, for the Alibaba comparison (columns the reader does not keep)."""
    with path.open(newline="") as handle:
        columns = ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos")
        return {
            row["name"].strip(): "/".join(row[c].strip() for c in columns)
            for row in csv.DictReader(handle)
        }


WIDTHS = (40, 8, 10, 8, 9, 11, 6)


def _line(cells: Sequence[str]) -> str:
    # The name left-aligned, the figures right-aligned.
    rest = (f"{c:>{w}}" for c, w in zip(cells[1:], WIDTHS[1:], strict=True))
    return "  ".join([f"{cells[0]:<{WIDTHS[0]}}", *rest])


def table(title: str, rows: list[tuple[str, Score]]) -> None:
    print(f"\n{title}")
    print(_line(("predictor", "history", "hist-queue", "default", "MAE s", "median AE s", "under")))
    for name, score in rows:
        shares = [f"{score.sources[s] / score.jobs:.1%}" for s in SOURCES]
        errors = (f"{score.mae:,.0f}", f"{score.median_error:,.0f}", f"{score.under:.1%}")
        print(_line((name, *shares, *errors)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=Path, default=TRACES, help="../shared/traces")
    parser.add_argument("--quantiles", type=float, nargs="+", default=[0.5, 0.75, 0.9])
    parser.add_argument("--min-samples", type=int, default=3, help="runs a group needs")
    args = parser.parse_args()

    began = time.perf_counter()
    philly = load_trace(args.traces / "philly/philly_jobs.csv").jobs
    alibaba_path = args.traces / ALIBABA_PODS
    alibaba = load_trace(alibaba_path).jobs
    shapes = request_shapes(alibaba_path)
    print(f"traces read in {time.perf_counter() - began:.1f} s; a job ends at submit + duration")

    cases: list[tuple[str, Sequence[TraceJob], list[tuple[str, Sequence[str]]]]] = [
        ("philly: queue = VC, no group", philly, [("", [""] * len(philly))]),
        (
            "alibaba 2023: GPU pods, one queue",
            alibaba,
            [
                ("name", [name_group(j.key) for j in alibaba]),
                ("request", [shapes.get(j.key, "") for j in alibaba]),
            ],
        ),
    ]
    for title, jobs, groupings in cases:
        durations = [j.duration for j in jobs]
        middle = statistics.median(durations)
        no_group = [""] * len(jobs)
        baseline = Baseline()
        rows = [
            ("constant 1 h (the default)", replay(jobs, no_group, *constant(3600.0))),
            (
                f"constant {middle:,.0f} s (median, hindsight)",
                replay(jobs, no_group, *constant(middle)),
            ),
            (
                "baseline: median of 50, (queue,gpus)",
                replay(jobs, no_group, baseline.predict, baseline.observe),
            ),
        ]
        for label, groups in groupings:
            for q in args.quantiles:
                distinct = len(set(groups))
                name = f"new q={q:g}" + (f", group={label} ({distinct:,})" if label else "")
                rows.append((name, replay(jobs, groups, *estimator(q, args.min_samples))))
        mean = statistics.mean(durations)
        table(
            f"{title}: {len(jobs):,} jobs, run time mean {mean:,.0f} s, median {middle:,.0f} s",
            rows,
        )
    print(f"\n{time.perf_counter() - began:.1f} s in all")


if __name__ == "__main__":
    main()
