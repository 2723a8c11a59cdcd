"""Every policy against the strongest baselines, per job size, with what evictions cost.

Three baselines run beside each stack: exclusive FIFO with hard per-VC quotas (`fifo`),
FIFO on one pool without quotas (`fifo,pool`: each VC keeps its lane, nothing is
guaranteed or lent), and Kueue-like FIFO with cohort borrowing (`fifo,cohort`). Averages
hide the large gangs (a few percent of jobs), so queueing is also shown per size class.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gangshare.sim.report_compare import by_policy, num
from gangshare.sim.run import RunResult

if TYPE_CHECKING:
    from gangshare.sim.outcome import Outcome

FIFO = "fifo"
POOL = "fifo,pool"
FIFO_COHORT = "fifo,cohort"
BASELINES = (FIFO, POOL, FIFO_COHORT)
SIZES = ("1", "2-4", "5-8", ">8")
# The targets for the full stack with predicted run times (philly-cohort window).
POOL_QUEUEING_TARGET = 10.0
ORACLE_JCT_TARGET = 1.10
EVICTION_LOSS_TARGET = 0.05


def _times(base: float, new: float) -> str:
    """How many times lower `new` is than `base` ("1.3x higher" when it is not)."""
    if base == new:
        return "-"
    if not new:
        return "all zero"
    ratio = base / new
    return f"{ratio:,.1f}x lower" if ratio >= 1 else f"{1 / ratio:,.2f}x higher"


def baseline_table(outcome: Outcome) -> list[str]:
    runs = by_policy(outcome)
    present = [b for b in BASELINES if b in runs]
    head = " | ".join(f"avg queueing vs {b}" for b in present)
    jct = " | ".join(f"avg JCT vs {b}" for b in present)
    lines = [
        f"| policy | avg queueing | {head} | avg JCT | {jct} |",
        "| --- | ---: | "
        + " | ".join("---:" for _ in present)
        + " | ---: | "
        + " | ".join("---:" for _ in present)
        + " |",
    ]
    for r in outcome.results:
        s = r.summary
        versus = " | ".join(
            _times(runs[b].summary["queueing"]["mean"], s["queueing"]["mean"]) for b in present
        )
        ratios = " | ".join(
            f"{s['jct']['mean'] / runs[b].summary['jct']['mean']:.2f}x" for b in present
        )
        lines.append(
            f"| {r.policy} | {num(s['queueing']['mean'])} | {versus} "
            f"| {num(s['jct']['mean'])} | {ratios} |"
        )
    return lines


def size_table(results: Sequence[RunResult]) -> list[str]:
    """Mean and p99 queueing per size class (GPUs per job), seconds."""
    first = results[0].summary["by_size"]
    counts = " / ".join(f"{first[k]['jct']['count']:,}" for k in SIZES)
    lines = [
        f"Jobs per size class ({' / '.join(SIZES)} GPUs): {counts}.",
        "",
        "| policy | " + " | ".join(f"{k} GPU: mean / p99 queueing" for k in SIZES) + " |",
        "| --- | " + " | ".join("---:" for _ in SIZES) + " |",
    ]
    for r in results:
        sizes = r.summary["by_size"]
        cells = " | ".join(
            f"{num(sizes[k]['queueing']['mean'])} / {num(sizes[k]['queueing']['p99'])}"
            if sizes[k]["jct"]["count"]
            else "-"
            for k in SIZES
        )
        lines.append(f"| {r.policy} | {cells} |")
    return lines


def eviction_table(results: Sequence[RunResult]) -> list[str]:
    lines = [
        "| policy | evictions | of them reclaims | most on one job | GPU-h lost: work + restarts "
        "| share of GPU-time held |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        s = r.summary
        lines.append(
            f"| {r.policy} | {s['evictions']:,} | {s['reclaims']:,} "
            f"| {s['max_evictions_per_job']:,} "
            f"| {num(s['eviction_lost_work_gpu_hours'])} + {num(s['eviction_restart_gpu_hours'])} "
            f"| {_pct2(s['eviction_lost_share'])} |"
        )
    return lines


def size_p99_misses(run: RunResult, base: RunResult) -> list[str]:
    """Size classes whose p99 queueing is above the baseline's, with by how much."""
    misses = []
    for k in SIZES:
        mine, theirs = run.summary["by_size"][k], base.summary["by_size"][k]
        if not mine["jct"]["count"]:
            continue
        if mine["queueing"]["p99"] > theirs["queueing"]["p99"]:
            misses.append(
                f"{k} GPU {num(mine['queueing']['p99'])} s against"
                f" {num(theirs['queueing']['p99'])} s"
            )
    return misses


def target_verdicts(outcome: Outcome, stacks: Sequence[str], oracle: str) -> list[str]:
    """Each stack against the four targets, met or missed by how much."""
    runs = by_policy(outcome)
    if not {FIFO, POOL, oracle} <= set(runs):
        return []
    pool, fifo, best = runs[POOL].summary, runs[FIFO], runs[oracle].summary
    lines = []
    for stack in stacks:
        if stack not in runs:
            continue
        s = runs[stack].summary
        lower = pool["queueing"]["mean"] / max(s["queueing"]["mean"], 1e-9)
        jct = s["jct"]["mean"] / best["jct"]["mean"]
        misses = size_p99_misses(runs[stack], fifo)
        lost = s["eviction_lost_share"]
        sizes = "met" if not misses else "NOT met: " + "; ".join(misses)
        lines.append(
            f"- `{stack}`: average queueing {lower:,.1f}x below `{POOL}` (target"
            f" {POOL_QUEUEING_TARGET:g}x: {_met(lower >= POOL_QUEUEING_TARGET)}); p99 queueing"
            f" of every size class no worse than `{FIFO}` ({sizes}); average JCT {jct:.3f}x"
            f" the oracle's (target {ORACLE_JCT_TARGET:.2f}x: {_met(jct <= ORACLE_JCT_TARGET)});"
            f" GPU-time lost to evictions {_pct2(lost)} (target under"
            f" {EVICTION_LOSS_TARGET:.0%}: {_met(lost < EVICTION_LOSS_TARGET)})."
        )
    return lines


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _pct2(share: float) -> str:
    return f"{100 * share:.2f}%"
