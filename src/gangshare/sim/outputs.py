"""Writing replays out: JSON, Markdown tables side by side, PNG plots, optional per-job CSV."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gangshare.sim.run import RunResult

SERIES_POINTS = 240


def pct(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{100 * value:.1f}%"


def _cell(summary: dict[str, Any], what: str, stat: str) -> str:
    value = summary[what].get(stat)
    return "-" if value is None else f"{value:,.0f}"


def jct_table(results: Sequence[RunResult]) -> list[str]:
    lines = [
        "| policy | jobs | avg JCT | median | p95 | p99 | avg queueing | median | p95 | p99 "
        "| makespan (days) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        s = r.summary
        cells = [_cell(s, m, stat) for m in ("jct", "queueing") for stat in _STATS]
        makespan = s["makespan_seconds"] / 86400
        lines.append(f"| {r.policy} | {s['jobs']:,} | {' | '.join(cells)} | {makespan:,.1f} |")
    return lines


_STATS = ("mean", "median", "p95", "p99")


def utilization_table(results: Sequence[RunResult]) -> list[str]:
    lines = [
        "| policy | GPUs allocated | GPUs occupied | SM util: cluster / occupied / backlog "
        "| memory util: cluster / occupied / backlog | guaranteed slowdown mean / p99 / max "
        "| evictions | Jain (queues) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        s = r.summary
        slow = s["guaranteed_slowdown"]
        slowdown = (
            " / ".join(pct(slow[k]) for k in ("mean", "p99", "max")) if slow.get("count") else "-"
        )
        lines.append(
            f"| {r.policy} | {pct(s['gpu_allocation_rate'])} | {pct(s['gpu_occupied_rate'])} "
            f"| {pct(s['sm_util_cluster'])} / {pct(s['sm_util_occupied'])} "
            f"/ {pct(s['sm_util_backlog'])} "
            f"| {pct(s['memory_util_cluster'])} / {pct(s['memory_util_occupied'])} "
            f"/ {pct(s['memory_util_backlog'])} "
            f"| {slowdown} | {s['evictions']:,} | {_jain(s['jain_fairness_queues'])} |"
        )
    return lines


def _jain(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.3f}"


def class_table(results: Sequence[RunResult]) -> list[str]:
    lines = [
        "| policy | class | jobs | avg JCT | p99 JCT | avg queueing | p99 queueing |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        for cls, s in r.summary["by_class"].items():
            lines.append(
                f"| {r.policy} | {cls} | {s['jct']['count']:,} | {_cell(s, 'jct', 'mean')} "
                f"| {_cell(s, 'jct', 'p99')} | {_cell(s, 'queueing', 'mean')} "
                f"| {_cell(s, 'queueing', 'p99')} |"
            )
    return lines


def speed_table(results: Sequence[RunResult]) -> list[str]:
    lines = [
        "| policy | wall time | events | events/s | scheduling cycles | skipped |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        rate = r.events / r.wall_seconds if r.wall_seconds else 0.0
        c = r.counters
        lines.append(
            f"| {r.policy} | {r.wall_seconds:.1f} s | {r.events:,} | {rate:,.0f} "
            f"| {c.cycles:,} | {c.skipped_cycles:,} |"
        )
    return lines


NEVER_HELD = "jobs the cluster can never hold (rejected on arrival)"


def never_held(result: RunResult) -> str:
    """The jobs a replay rejected on arrival, with how many for each reason:
    `none`, or `3 (2: reason; 1: reason)`; summary.json has them as rejected_jobs and
    rejected_reasons."""
    if not result.rejected:
        return "none"
    reasons = result.rejected_reasons or {"reason not recorded": len(result.rejected)}
    why = "; ".join(f"{count:,}: {reason}" for reason, count in reasons.items())
    return f"{len(result.rejected):,} ({why})"


def never_held_lines(results: Sequence[RunResult]) -> list[str]:
    """One Markdown bullet, or one per policy when the policies reject differently."""
    said = {never_held(r) for r in results}
    if len(said) <= 1:
        return [f"- {NEVER_HELD}: {said.pop() if said else 'none'}"]
    return [f"- {NEVER_HELD} under {r.policy}: {never_held(r)}" for r in results]


def markdown(header: dict[str, Any], results: Sequence[RunResult]) -> str:
    lines = [f"# Replay of {header.get('trace', 'a trace')}", ""]
    lines += [f"- {k}: {v}" for k, v in header.items()]
    lines += never_held_lines(results)
    lines += ["", "## JCT and queueing delay (seconds)", "", *jct_table(results)]
    lines += ["", "## Utilization, guarantees, fairness", "", *utilization_table(results)]
    lines += ["", "## By service class", "", *class_table(results)]
    lines += ["", "## Replay speed", "", *speed_table(results), ""]
    return "\n".join(lines)


def series_json(result: RunResult) -> dict[str, Any]:
    """The time series averaged to at most SERIES_POINTS points (fractions of the cluster)."""
    series = result.series
    group = max(1, -(-len(series.bins) // SERIES_POINTS))
    scales = {
        "sm_util": ("util", 100.0 * result.gpu_count),
        "memory_util": ("memory", float(result.summary["memory_capacity_mib"])),
        "occupied": ("busy", float(result.gpu_count)),
        "allocated": ("guaranteed", float(result.gpu_count)),
        "borrowed": ("borrowed", float(result.gpu_count)),
    }
    out: dict[str, Any] = {"seconds_per_point": group * series.bin_seconds}
    for name, (channel, scale) in scales.items():
        values = series.averages(channel, scale)
        if name == "borrowed" and not any(values):
            continue  # no cohort: nothing is ever borrowed
        out[name] = [
            round(sum(values[i : i + group]) / len(values[i : i + group]), 4)
            for i in range(0, len(values), group)
        ]
    return out


def write_json(path: Path, header: dict[str, Any], results: Sequence[RunResult]) -> None:
    doc = {
        **header,
        "results": [{**r.to_json(), "series": series_json(r)} for r in results],
    }
    path.write_text(json.dumps(doc, indent=1, sort_keys=True, default=_plain) + "\n")


def _plain(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    raise TypeError(f"not JSON serialisable: {value!r}")


def write_jobs_csv(path: Path, result: RunResult) -> None:
    with path.open("w", newline="") as handle:
        records = [asdict(r) for r in result.records]
        if not records:
            return
        writer = csv.DictWriter(handle, fieldnames=[*records[0], "jct"])
        writer.writeheader()
        for record, row in zip(result.records, records, strict=True):
            writer.writerow({**row, "jct": record.jct})


def write_outputs(
    out: Path,
    header: dict[str, Any],
    results: Sequence[RunResult],
    plots: bool = True,
    jobs_csv: bool = False,
) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "summary.json", out / "summary.md"]
    write_json(written[0], header, results)
    written[1].write_text(markdown(header, results))
    if jobs_csv:
        for result in results:
            path = out / f"jobs-{result.policy.replace(',', '+')}.csv"
            write_jobs_csv(path, result)
            written.append(path)
    if plots:
        from gangshare.sim.plots import plot_cdfs, plot_utilization

        title = str(header.get("trace", ""))
        plot_cdfs(results, "jct", f"JCT CDF - {title}", out / "jct_cdf.png")
        plot_cdfs(results, "queueing", f"Queueing delay CDF - {title}", out / "queueing_cdf.png")
        plot_utilization(results, f"Utilization - {title}", out / "utilization.png")
        written += [out / "jct_cdf.png", out / "queueing_cdf.png", out / "utilization.png"]
    return written
