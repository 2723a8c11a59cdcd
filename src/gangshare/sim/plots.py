"""PNG plots of replays (matplotlib, Agg): JCT and queueing-delay CDFs, utilization over time.

Curves are thinned before drawing (a CDF to a few hundred quantiles, a time series
to a few hundred points), which keeps the files small and the figures readable.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from gangshare.sim.metrics import percentile
from gangshare.sim.run import RunResult

CDF_POINTS = 300
SERIES_POINTS = 240
DPI = 72


def _quantiles(values: Sequence[float]) -> tuple[list[float], list[float]]:
    ordered = sorted(values)
    shares = [i / (CDF_POINTS - 1) for i in range(CDF_POINTS)]
    return [max(1.0, percentile(ordered, s)) for s in shares], shares


def plot_cdfs(results: Sequence[RunResult], metric: str, title: str, path: Path) -> None:
    """metric: "jct" or "queueing"."""
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for result in results:
        values = [r.jct if metric == "jct" else r.queued for r in result.records]
        if values:
            xs, ys = _quantiles(values)
            ax.plot(xs, ys, label=result.policy, linewidth=1.2)
    ax.set_xscale("log")
    ax.set_xlabel("seconds (log; values below 1 s drawn at 1 s)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _thin(values: list[float], bin_seconds: float) -> tuple[list[float], list[float]]:
    group = max(1, -(-len(values) // SERIES_POINTS))
    xs, ys = [], []
    for start in range(0, len(values), group):
        chunk = values[start : start + group]
        xs.append((start + len(chunk) / 2) * bin_seconds / 86400)
        ys.append(100 * sum(chunk) / len(chunk))
    return xs, ys


def plot_utilization(results: Sequence[RunResult], title: str, path: Path) -> None:
    """Cluster-wide effective SM and memory utilization, and the GPU allocation rate, by day.

    Drawn up to shortly after the last submission: the tail after it only drains.
    """
    fig, axes = plt.subplots(3, 1, figsize=(6.4, 6.0), sharex=True)
    last = max((r.submit for result in results for r in result.records), default=0.0)
    panels = (
        ("util", "SM util %", 100.0),
        ("memory", "memory util %", None),
        ("guaranteed", "GPUs allocated %", 1.0),
    )
    for result in results:
        series = result.series
        for ax, (channel, label, scale) in zip(axes, panels, strict=True):
            if scale is None:
                total = result.summary.get("memory_capacity_mib", 1)
                values = series.averages(channel, total)
            else:
                values = series.averages(channel, scale * result.gpu_count)
            xs, ys = _thin(values, series.bin_seconds)
            ax.plot(xs, ys, label=result.policy, linewidth=0.9)
            ax.set_ylabel(label, fontsize=8)
            ax.grid(True, alpha=0.3)
    axes[0].set_title(title, fontsize=10)
    axes[0].legend(fontsize=7, loc="upper left")
    axes[-1].set_xlim(0, 1.05 * last / 86400)
    axes[-1].set_xlabel("days since the first submission (to the last one)")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
