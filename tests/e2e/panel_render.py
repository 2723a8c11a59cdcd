"""Dashboard panels drawn with matplotlib from a real Prometheus, for the README (make panels).

Grafana cannot run here, so this draws what its time-series panel would: each target's
query_range, one line per series, named by the target's legendFormat.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

# The object API, not pyplot: no display, no global figure state.
from matplotlib.figure import Figure
from prometheus_process import PrometheusProcess

import dashboards


def render(
    prometheus: PrometheusProcess,
    board: dict[str, Any],
    titles: list[str],
    start: float,
    end: float,
    out: Path,
    variables: dict[str, str],
    rename: Callable[[str], str] = lambda name: name,
    origin: float | None = None,
) -> None:
    """Draw the panels `titles` of `board` one above the other into `out` (PNG), times in
    seconds since `origin` (default `start`)."""
    origin = start if origin is None else origin
    figure = Figure(figsize=(9, 3.2 * len(titles)))
    axes = figure.subplots(len(titles), 1, sharex=True, squeeze=False)[:, 0]
    for ax, title in zip(axes, titles, strict=True):
        panel = dashboards.panel(board, title)
        for target in panel["targets"]:
            expr = dashboards.concrete(target["expr"], "10s", variables)
            for series in prometheus.query_range(expr, start, end, "1s"):
                times = [float(t) - origin for t, _ in series["values"]]
                values = [float(v) for _, v in series["values"]]
                name = rename(dashboards.legend(target["legendFormat"], series["metric"]))
                ax.step(times, values, where="post", label=name)
        ax.set_title(f"{board['title']}: {title}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    axes[-1].set_xlabel("seconds since the first job was submitted")
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
