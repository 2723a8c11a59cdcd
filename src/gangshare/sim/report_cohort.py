"""The backlogged cohort experiment: hard per-VC quotas against lending, and against the oracle.

`philly-cohort` replays a window of the Philly table whose submissions outrun the cluster
(report.py sets it up; `offered_load` says by how much). The "before" is exclusive FIFO
with each VC's quota a hard wall; the "after" is the full policy stack with the VCs in one
cohort, seeing only predicted run times; the reference is the same stack ordered by true
GPU-time (`sjf-oracle`). The simulator never preempts a job for a shorter one (only to
reclaim lent quota), so there is no SRTF reference.

Utilization is compared over the submission window, when every policy has work waiting:
the work of the whole replay is fixed by the trace, so averages over each run's own
makespan would mostly say how soon the backlog drained.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from typing import TYPE_CHECKING

from gangshare.sim.metrics import JobRecord
from gangshare.sim.outputs import class_table, jct_table, pct, utilization_table
from gangshare.sim.report_baselines import (
    ORACLE_JCT_TARGET,
    POOL,
    POOL_QUEUEING_TARGET,
    baseline_table,
    eviction_table,
    size_table,
    target_verdicts,
)
from gangshare.sim.report_compare import ANTMAN_MEMORY_GAIN, ANTMAN_SM_GAIN, by_policy, num
from gangshare.sim.run import RunResult

if TYPE_CHECKING:
    from gangshare.sim.outcome import Outcome

COHORT_STACK = "multi-queue,fair-share,backfill,antman,cohort"
BEFORE = "fifo"
AFTER = COHORT_STACK
AFTER_QSSF = f"qssf,{COHORT_STACK}"
ORACLE = f"sjf-oracle,{COHORT_STACK}"


def window_average(result: RunResult, channel: str, scale: float, seconds: float) -> float:
    """Time average of a channel over [0, seconds), from the hourly bins."""
    series = result.series
    bins = max(1, int(seconds // series.bin_seconds))
    values = series.averages(channel, scale)[:bins]
    return sum(values) / bins if values else 0.0


def window_metrics(result: RunResult, seconds: float) -> dict[str, float]:
    gpus = float(result.gpu_count)
    memory = float(result.summary["memory_capacity_mib"])
    return {
        "allocated": window_average(result, "guaranteed", gpus, seconds),
        "borrowed": window_average(result, "borrowed", gpus, seconds),
        "occupied": window_average(result, "busy", gpus, seconds),
        "sm": window_average(result, "util", 100.0 * gpus, seconds),
        "memory": window_average(result, "memory", memory, seconds),
    }


def offered_load(outcome: Outcome) -> tuple[float, float]:
    """(submission window in seconds, GPUs' worth of work submitted per second of it)."""
    jobs = outcome.trace.jobs
    span = max(j.submit for j in jobs) - min(j.submit for j in jobs)
    work = sum(j.duration * j.gpus for j in jobs)
    return span, work / max(span, 1.0)


def _ratio(new: float, old: float) -> str:
    return f"{new / old:.2f}x" if old else "-"


def _times(old: float, new: float) -> str:
    """How many times smaller `new` is than `old`."""
    if old == new:
        return "-"
    return f"{old / new:,.1f}x lower" if new else "all zero"


def headline_table(outcome: Outcome, seconds: float) -> list[str]:
    runs = by_policy(outcome)
    before, oracle = runs[BEFORE], runs[ORACLE]
    base = window_metrics(before, seconds)
    lines = [
        "| policy | GPUs allocated: guaranteed + borrowed | SM util | vs fifo | memory util "
        "| vs fifo | guaranteed slowdown mean / p99 | avg queueing | p99 queueing "
        "| avg JCT | p99 JCT | avg queueing vs fifo | avg JCT vs fifo | avg JCT vs oracle |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: |",
    ]
    for r in outcome.results:
        w, s = window_metrics(r, seconds), r.summary
        slow = s["guaranteed_slowdown"]
        slowdown = f"{pct(slow['mean'])} / {pct(slow['p99'])}" if slow.get("count") else "-"
        b = before.summary
        lines.append(
            f"| {r.policy} | {pct(w['allocated'])} + {pct(w['borrowed'])} "
            f"| {pct(w['sm'])} | {_change(w['sm'], base['sm'])} "
            f"| {pct(w['memory'])} | {_change(w['memory'], base['memory'])} | {slowdown} "
            f"| {num(s['queueing']['mean'])} | {num(s['queueing']['p99'])} "
            f"| {num(s['jct']['mean'])} | {num(s['jct']['p99'])} "
            f"| {_times(b['queueing']['mean'], s['queueing']['mean'])} "
            f"| {_ratio(s['jct']['mean'], b['jct']['mean'])} "
            f"| {_ratio(s['jct']['mean'], oracle.summary['jct']['mean'])} |"
        )
    return lines


def _change(new: float, old: float) -> str:
    return f"{100 * (new / old - 1):+.0f}%" if old else "-"


def _size(record: JobRecord) -> str:
    if record.gpus == 1:
        return "1 GPU"
    return "2-4 GPUs" if record.gpus <= 4 else "8 GPUs" if record.gpus <= 8 else "> 8 GPUs"


def gap_table(
    outcome: Outcome, policy: str, group: Callable[[JobRecord], str], label: str
) -> list[str]:
    """Where the average-JCT gap between `policy` and the oracle comes from."""
    runs = by_policy(outcome)
    ours = {r.key: r for r in runs[policy].records}
    theirs = {r.key: r for r in runs[ORACLE].records}
    groups: dict[str, list[tuple[JobRecord, JobRecord]]] = {}
    for key, record in ours.items():
        if key in theirs:
            groups.setdefault(group(record), []).append((record, theirs[key]))
    total = sum(len(pairs) for pairs in groups.values())
    gap = sum(a.jct - b.jct for a, b in (pair for g in groups.values() for pair in g))
    lines = [
        f"| {label} | jobs | avg JCT | oracle | avg queueing | oracle | share of the gap |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    rows = sorted(groups.items(), key=lambda kv: -sum(a.jct - b.jct for a, b in kv[1]))
    for name, pairs in rows:
        n = len(pairs)
        mine = sum(a.jct - b.jct for a, b in pairs)
        lines.append(
            f"| {name} | {n:,} | {num(sum(a.jct for a, _ in pairs) / n)} "
            f"| {num(sum(b.jct for _, b in pairs) / n)} "
            f"| {num(sum(a.queued for a, _ in pairs) / n)} "
            f"| {num(sum(b.queued for _, b in pairs) / n)} "
            f"| {mine / gap:.0%} |"
            if gap
            else f"| {name} | {n:,} | - | - | - | - | - |"
        )
    lines.append("")
    lines.append(f"Average JCT gap: {num(gap / max(total, 1))} s per job.")
    return lines


def plot_links(name: str) -> list[str]:
    """The experiment's three figures as report.py writes them, linked from the Markdown."""
    return [
        f"![JCT CDF](results/{name}-jct-cdf.png)",
        f"![queueing-delay CDF](results/{name}-queueing-cdf.png)",
        f"![utilization over time](results/{name}-utilization.png)",
        "",
    ]


def _para(text: str) -> list[str]:
    return [*textwrap.wrap(text, width=92, break_long_words=False, break_on_hyphens=False), ""]


def _gap_share(outcome: Outcome, policy: str, chosen: Callable[[JobRecord], bool]) -> float:
    """Share of the average-JCT gap to the oracle that the chosen jobs account for."""
    runs = by_policy(outcome)
    theirs = {r.key: r.jct for r in runs[ORACLE].records}
    pairs = [(r, theirs[r.key]) for r in runs[policy].records if r.key in theirs]
    gap = sum(r.jct - jct for r, jct in pairs)
    return sum(r.jct - jct for r, jct in pairs if chosen(r)) / gap if gap else 0.0


def shortfall(outcome: Outcome) -> list[str]:
    """Why the full stack stays short of the oracle, from the runs' own numbers."""
    runs = by_policy(outcome)
    after, oracle = runs[AFTER], runs[ORACLE]
    a, o = after.summary, oracle.summary
    gap = a["jct"]["mean"] - o["jct"]["mean"]
    lines: list[str] = []
    pool = runs[POOL].summary["queueing"]["mean"] if POOL in runs else 0.0
    queued = pool / max(a["queueing"]["mean"], 1e-9)
    if gap <= 0 or (
        gap <= (ORACLE_JCT_TARGET - 1) * o["jct"]["mean"] and queued >= POOL_QUEUEING_TARGET
    ):
        return lines  # nothing falls short
    multi = sum(1 for r in after.records if r.gpus > 1) / max(1, len(after.records))
    text = (
        f"Why the full stack stays {a['jct']['mean'] / o['jct']['mean']:.2f}x the oracle's"
        f" average JCT ({num(gap)} s per job): the order. Both run the same stack on the same"
        " jobs; only the oracle knows true run times, and orders by GPU-time with them."
        " Guaranteed jobs queue"
        f" {num(a['by_class']['Guaranteed']['queueing']['mean'])} s on average under"
        f" `{AFTER}` and {num(o['by_class']['Guaranteed']['queueing']['mean'])} s under the"
        " oracle; Opportunistic ones never queue under either. Multi-GPU jobs are"
        f" {multi:.0%} of the jobs and {_gap_share(outcome, AFTER, lambda r: r.gpus > 1):.0%}"
        " of the gap: beyond its quota such a job waits until that many GPUs of quota are"
        " idle at once, and when they are, the oracle gives them to the shortest job."
    )
    lines += _para(text)
    reserved = after.counters.reservations + oracle.counters.reservations
    if reserved == 0:
        lines += _para(
            "Run times mattered here only through that order: backfill never made a"
            " reservation in either run. With one cohort a job within its VC's quota found"
            " GPUs (the quotas add up to the cluster, and borrowers are Opportunistic tenants"
            " a guaranteed job may be placed beside until they are reclaimed), and a job"
            " beyond its quota waits for idle quota to borrow, which backfill does not"
            " reserve."
        )
    if AFTER_QSSF in runs:
        q = runs[AFTER_QSSF].summary["jct"]["mean"]
        closed = (a["jct"]["mean"] - q) / gap
        effect = f"closes {closed:.0%} of the gap" if closed > 0 else "does not close the gap"
        lines += _para(
            f"Ordering by predicted GPU-time (`{AFTER_QSSF}`) {effect}"
            f" ({q / o['jct']['mean']:.4f}x the oracle). The prediction is the median of the"
            " last finished runs of the job's VC at its GPU count: the Philly table records no"
            " job names or users, so every job of one VC and size gets the same prediction,"
            " and shortest-first can order between such classes but never within one. What"
            " it leaves is what ordering within those classes, and the error of the class"
            " predictions, are worth to the oracle."
        )
    reclaimed = after.counters.reclaims / max(1, after.counters.borrowed)
    lines += _para(
        f"Lending has its own cost: {reclaimed:.0%} of the admissions on borrowed quota"
        f" under `{AFTER}` were reclaimed ({after.counters.reclaims:,} evictions; the oracle"
        f" run reclaims {oracle.counters.reclaims:,} times). A reclaimed job loses the work"
        " done since its last checkpoint, pays a restart, and waits again at its old place in"
        f" its lane: {num(a['eviction_gpu_hours_lost'])} GPU-hours in all under `{AFTER}`,"
        f" {100 * a['eviction_lost_share']:.2f}% of the GPU-time its jobs held (the table"
        " below has every policy)."
    )
    return lines


def cohort_section(outcome: Outcome | None) -> list[str]:
    if outcome is None:
        return []
    runs = by_policy(outcome)
    if not {BEFORE, AFTER, ORACLE} <= set(runs):
        return []
    seconds, load = offered_load(outcome)
    gpus = runs[BEFORE].gpu_count
    after, before = runs[AFTER], runs[BEFORE]
    name = outcome.experiment.name
    lines = ["## Cohorts on a backlogged cluster: lending idle quota", ""]
    lines += _para(f"{outcome.experiment.title}.")
    lines += _para(
        f"Backlogged: over its {seconds / 86400:,.1f}-day submission window the trace submits"
        f" {num(load)} GPUs' worth of work (GPU-seconds submitted / seconds of window),"
        f" {load / gpus:.2f}x the {gpus:,} GPUs, so work piles up whatever the order. Under"
        " exclusive FIFO with hard per-VC quotas some job waits"
        f" {pct(before.summary['backlog_share'])} of the replay, and yet only"
        f" {pct(before.summary['gpu_allocation_rate'])} of the GPUs are allocated on average:"
        " a VC's idle quota is never lent. With `cohort` the eleven VCs form one cohort: a"
        " job beyond its VC's quota runs on idle quota of the others as an Opportunistic"
        " tenant, and is evicted whole (requeued from its last checkpoint) when a lender's own jobs"
        " take the quota back."
    )
    lines += _para(
        "Utilization columns are averages over the submission window, when every policy has"
        " work waiting, over all GPUs; `vs fifo` is the relative change from exclusive FIFO,"
        f" to set beside AntMan's published +{ANTMAN_SM_GAIN:.0%} SM and"
        f" +{ANTMAN_MEMORY_GAIN:.0%} memory utilization. Allocated GPUs are those held by"
        " guaranteed jobs plus those held on borrowed quota. The oracle is the same stack"
        f" ordered by true GPU-time (`{ORACLE}`); the simulator preempts only to reclaim lent"
        " quota, never for a shorter job, so there is no SRTF reference."
    )
    lines += [*headline_table(outcome, seconds), ""]
    lines += ["Against the targets (predicted run times only, eviction costs on):", ""]
    lines += [*target_verdicts(outcome, (AFTER, AFTER_QSSF), ORACLE), ""]
    lines += _para(
        "Every policy against the three baselines: exclusive FIFO with hard per-VC quotas"
        " (`fifo`), FIFO on one pool without quotas (`fifo,pool`: each VC keeps its lane,"
        " nothing is guaranteed or lent) and Kueue-like FIFO with cohort borrowing"
        " (`fifo,cohort`):"
    )
    lines += [*baseline_table(outcome), ""]
    lines += _para(
        "Queueing per job size (GPUs per job), seconds: averages hide the large gangs, a few"
        " percent of the jobs."
    )
    lines += [*size_table(outcome.results), ""]
    lines += ["What evictions cost (memory evictions and reclaims):", ""]
    lines += [*eviction_table(outcome.results), ""]
    lines += _para(
        f"Borrowing under `{AFTER}`: {after.counters.borrowed:,} admissions on borrowed"
        f" quota, {after.counters.reclaims:,} reclaims (evicted and requeued from their last"
        f" checkpoint); {after.summary['finished_borrowed']:,} jobs finished on borrowed quota."
    )
    lines += shortfall(outcome)
    lines += ["The average-JCT gap to the oracle by job size:", ""]
    lines += [*gap_table(outcome, AFTER, _size, "job size"), ""]
    lines += ["JCT and queueing delay, seconds:", "", *jct_table(outcome.results), ""]
    lines += ["Over the whole replay:", "", *utilization_table(outcome.results), ""]
    lines += ["By class:", "", *class_table(outcome.results), ""]
    if outcome.experiment.plotted is not None:
        lines += plot_links(name)
    return lines
