"""The text of docs/results.md: setup, the tables of each experiment, how to run a replay.

Every number in the text is read from the replays; only the published figures
(Helios, AntMan, the Philly study) are constants, each with its source.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gangshare.core.coordinator import ControlParams
from gangshare.sim.engine import SimConfig
from gangshare.sim.outputs import (
    class_table,
    jct_table,
    never_held,
    speed_table,
    utilization_table,
)
from gangshare.sim.policy import __doc__ as POLICY_DOC
from gangshare.sim.report_cohort import cohort_section, plot_links
from gangshare.sim.report_compare import (
    antman_section,
    by_policy,
    change,
    helios_section,
    num,
    philly_study_section,
)
from gangshare.sim.report_forecasts import ForecastOutcome, forecast_section
from gangshare.sim.run import DEFAULT_OPPORTUNISTIC_FRACTION, RunResult

if TYPE_CHECKING:
    from gangshare.sim.outcome import Outcome


def setup_section(outcomes: Sequence[Outcome]) -> list[str]:
    law = ControlParams(tolerance=SimConfig.tolerance, period_seconds=SimConfig.control_period)
    step, tol, period = law.step_up, law.tolerance, law.period_seconds
    lines = ["## Setup", "", "| experiment | trace | cluster | jobs replayed | left out |"]
    lines.append("| --- | --- | --- | ---: | --- |")
    for o in outcomes:
        e = o.experiment
        window = f" submitted {e.window.replace(',', ' .. ')}" if e.window else ""
        dropped = ", ".join(f"{n:,} {why}" for why, n in o.trace.dropped.items()) or "none"
        if o.results[0].rejected:  # gpu_spec reasons hold "|": escaped for the table
            never = f"rejected on arrival: {never_held(o.results[0])}".replace("|", "\\|")
            dropped = never if dropped == "none" else f"{dropped}; {never}"
        lines.append(
            f"| `{e.name}` | `{e.trace}`{window} | {o.cluster} | {len(o.trace.jobs):,} "
            f"| {dropped} |"
        )
    lines += [
        "",
        "Cluster specs are in `examples/clusters/` (each file's header says what is assumed);",
        "the Alibaba cluster is derived from `openb_node_list_gpu_node.csv` with",
        "`--cluster-fraction 0.011`, keeping 1.1% of each (GPU model, GPUs per node) group: the",
        "published pod list never uses more than 71 GPUs at once, so the 6,212-GPU cluster it",
        "came from never queues anything, while 58 GPUs hold its average demand, not its bursts.",
        "",
        "### Policies (`--policy`, comma-combinable)",
        "",
        *(POLICY_DOC or "").split("\n\n")[1].splitlines(),
        "",
        "Queues are the trace's virtual clusters (Philly) or one `default` queue (Alibaba); a",
        "cluster spec's `queues` give each VC a guaranteed-GPU quota (its Helios size) and a",
        "fair-share weight equal to that quota. Run times: the backfill reservations and `qssf`",
        "see only `RuntimeEstimator` predictions (median of the last 50 finished runs of the same",
        "VC and GPU count, made when the job is submitted); only `sjf-oracle` and",
        "`oracle-runtimes` see true durations.",
        "",
        "### Service classes (under `antman` only; otherwise every job is Guaranteed)",
        "",
        "- Philly has no class: each 1-GPU job is Opportunistic with probability"
        f" {DEFAULT_OPPORTUNISTIC_FRACTION},",
        "  drawn from (seed, job id); every multi-GPU gang is Guaranteed. Philly has no",
        "  priority either: `priority` there uses a synthetic, seeded 20% of jobs at priority 1.",
        "- Alibaba: Opportunistic when `qos` is BE or `gpu_milli` < 1000 (a fractional GPU is a",
        "  request to share); Guaranteed otherwise. Priority from `qos`: Guaranteed 3, LS 2,",
        "  Burstable 1, BE 0. Without `antman` a fractional pod takes a whole GPU.",
        "",
        "### Sharing model",
        "",
        "Each job runs one of the 56 workloads (model, dataset, batch size, AMP) measured in",
        "pairs by Lucid (`lucid-colocation`), drawn from (seed, job id); it gives the job's solo",
        "SM utilization and GPU memory, and its speed beside any other workload (measured speed",
        "/ solo speed, clipped at 1.0; unmeasured pairs use the workload's mean). Opportunistic",
        "jobs declare their workload's memory; the core lends memory beside a guaranteed job",
        "from its published use plus 10% headroom. On a GPU, opportunistic tenants run at a duty",
        "cycle d: guaranteed speed = 1 - d * sum(1 - s(G|O_i)), opportunistic speed = d * (1 -",
        "its summed losses). d is where the node agent's own control law",
        "(`gangshare.core.coordinator`, run to rest by `gangshare.core.settle`) settles against",
        "that response: it pauses the opportunistic tenants while it measures the guaranteed",
        f"job's solo step time, then grows d in steps of {step:g} while the guaranteed job's step",
        f"time stays within {tol:.0%} of solo, so d is the highest step within {tol:.0%}",
        "(0 where even the lowest is too much). After a change of tenants on a GPU that holds a",
        "guaranteed job, its opportunistic tenants are paused for as long as the law takes to",
        f"settle (its decisions x {period:g} s, under a minute), then run at d; with no",
        "guaranteed job nothing is capped. A gang moves at its slowest GPU's speed. An",
        "opportunistic job whose GPU runs out of memory is evicted and requeued.",
        "",
        "### What an eviction costs",
        "",
        "A memory eviction or a reclaim keeps the work done up to the job's last checkpoint (one",
        "every 30 minutes of each run, `--checkpoint-interval`), loses the rest, and the next run",
        "first holds its GPUs for a 120 s restart (`--restart-overhead`); GPU-time lost = (work",
        "lost + restart) x GPUs held. Reclaim never evicts a borrower that has run less than 30",
        "minutes (`--reclaim-min-runtime`, KAI-Scheduler's minimum runtime); no cap on evictions",
        "per job (`--max-evictions`: a capped borrower keeps its lenders' quota to its end, and",
        "every cap measured raised queueing; docs/simulator.md has the table).",
        "",
        "### Metrics",
        "",
        "JCT = end - submit; queueing = time pending; guaranteed slowdown = run time / solo",
        "duration - 1. Utilization is time-averaged: GPUs allocated (holding a guaranteed job),",
        "GPUs occupied (any tenant), and effective SM and memory utilization over all GPUs, over",
        "occupied GPUs, and over all GPUs while at least one job waits (backlog). Jain's index is",
        "over VCs of x = mean(solo duration / JCT) of the VC's jobs. Opportunistic progress =",
        "their solo GPU-time / the share-slot time they held (their average speed while placed,",
        "as a fraction of solo), and the time-averaged speed of those beside a guaranteed job.",
        "",
    ]
    return lines


def experiment_section(outcome: Outcome, heading: str, plots: bool) -> list[str]:
    results = outcome.results
    name = outcome.experiment.name
    lines = [f"## {heading}", "", f"{outcome.experiment.title}.", ""]
    lines += ["Against exclusive FIFO:", "", *versus_fifo(results), ""]
    lines += same_outcomes(results)
    lines += ["JCT and queueing delay, seconds:", "", *jct_table(results), ""]
    lines += ["Utilization, guarantees and fairness:", "", *utilization_table(results), ""]
    shared = [r for r in results if "antman" in r.policy]
    if shared:
        lines += ["By class (sharing runs):", "", *class_table(shared), ""]
        lines += makespan_note(results)
    if plots:
        lines += plot_links(name)
    return lines


def versus_fifo(results: Sequence[RunResult]) -> list[str]:
    base = by_policy_results(results).get("fifo")
    if base is None:
        return []
    b = base.summary
    lines = [
        "| policy | avg JCT | vs fifo | avg queueing | vs fifo | p99 queueing | vs fifo |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        s = r.summary
        cells = []
        for metric, stat in (("jct", "mean"), ("queueing", "mean"), ("queueing", "p99")):
            cells += [num(s[metric][stat]), change(s[metric][stat], b[metric][stat])]
        lines.append(f"| {r.policy} | {' | '.join(cells)} |")
    return lines


def by_policy_results(results: Sequence[RunResult]) -> dict[str, RunResult]:
    return {r.policy: r for r in results}


def same_outcomes(results: Sequence[RunResult]) -> list[str]:
    """Policies whose every job started and ended at the same times."""
    groups: dict[tuple[tuple[str, float, float], ...], list[str]] = {}
    for r in results:
        timeline = tuple(sorted((j.key, j.first_start, j.end) for j in r.records))
        groups.setdefault(timeline, []).append(r.policy)
    same = [" = ".join(f"`{p}`" for p in group) for group in groups.values() if len(group) > 1]
    if not same:
        return []
    return [f"Identical outcomes, job for job: {'; '.join(same)}.", ""]


def makespan_note(results: Sequence[RunResult]) -> list[str]:
    runs = by_policy_results(results)
    base, shared = runs.get("fifo"), runs.get("antman")
    if base is None or shared is None or not shared.records:
        return []
    before, after = base.summary["makespan_seconds"], shared.summary["makespan_seconds"]
    if after <= 1.1 * before:
        return []
    last = max(shared.records, key=lambda r: r.end)
    return [
        f"Under `antman` the makespan grows from {before / 86400:,.0f} to {after / 86400:,.0f}"
        f" days: the last job to finish, `{last.key}` ({last.service_class},"
        f" {last.duration / 86400:,.0f} days alone), ran at {last.duration / last.last_run:.0%}"
        " of its solo speed, squeezed beside guaranteed work as the class intends.",
        "",
    ]


def vc_table(outcome: Outcome, policies: Sequence[str]) -> list[str]:
    runs = by_policy(outcome)
    shown = [p for p in policies if p in runs]
    queues = sorted(runs[shown[0]].summary["by_queue"], key=lambda q: -_jobs(runs[shown[0]], q))
    lines = ["| VC | jobs | " + " | ".join(f"{p}: avg queueing" for p in shown) + " |"]
    lines.append("| --- | ---: |" + " ---: |" * len(shown))
    for queue in queues:
        cells = [num(runs[p].summary["by_queue"][queue]["queueing"]["mean"]) for p in shown]
        lines.append(f"| {queue} | {_jobs(runs[shown[0]], queue):,} | {' | '.join(cells)} |")
    return lines


def _jobs(result: RunResult, queue: str) -> int:
    count: int = result.summary["by_queue"][queue]["jct"]["count"]
    return count


def usage_section() -> list[str]:
    return [
        "## Running your own replay",
        "",
        "```bash",
        ".venv/bin/gangshare simulate --trace ../shared/traces/philly/philly_jobs.csv \\",
        "    --cluster examples/clusters/philly-helios-3of8.yaml \\",
        "    --policy fifo --policy multi-queue,fair-share,backfill,antman --seed 1 --out sim-out",
        "```",
        "",
        "writes `summary.json`, `summary.md` and the three plots into `--out` (add `--jobs-csv`",
        "for one row per job). Other flags: `--window START,END` (Philly), `--limit N`,",
        "`--cluster-fraction F` (node list CSV), `--opportunistic-fraction`, `--tolerance`,",
        "`--control-period`, `--colocation DIR`, `--check-invariants` (checks every GPU after",
        "every event; for small replays); what an eviction costs and how reclaim is bounded:",
        "`--checkpoint-interval` (1800 s), `--restart-overhead` (120 s), `--reclaim-min-runtime`",
        "(1800 s), `--max-evictions` (none), and `--starvation` (none). `--trace` reads the",
        "Philly table, an Alibaba 2023 pod list (its `gpu_spec` honoured where present), or a",
        "generic CSV with columns `submit_time,duration,num_gpus` (seconds, seconds, GPUs) and",
        "optional `job_id,queue,service_class,priority,gpu_memory_mib,checkpoint_interval`.",
        "`--cluster`",
        "reads a cluster spec (`nodePools` as for `gangshare plan`, plus `queues` with `quota`,",
        "`weight`, `gpuModel`, `cohort`, `borrowingLimit` and `lendingLimit`) or an Alibaba",
        "node list. A bad file, column or policy ends with one line naming the flag and field,",
        "and exit code 2.",
        "",
        "`.venv/bin/python bench/simulator.py` times the Philly replay alone by trace length.",
        "",
        "`--metrics-out FILE` also writes the operator's and the GPUs' Prometheus series over",
        "the replay, for the Grafana dashboards; `docs/simulator.md` has the three commands.",
        "",
    ]


def results_markdown(
    outcomes: Sequence[Outcome],
    seconds: float,
    workers: int,
    machine: str,
    forecasts: Sequence[ForecastOutcome] = (),
) -> str:
    """`machine`: sim/machine.py's sentence on where the timings were measured."""
    named = {o.experiment.name: o for o in outcomes}
    lines = [
        "# Simulator results",
        "",
        "Every number below comes from one run of",
        "",
        "```bash",
        ".venv/bin/python -m gangshare.sim.report   # writes docs/results.md and docs/results/",
        "```",
        "",
        f"which took {seconds / 60:.1f} minutes with {workers} replay process(es) on the machine",
        "that wrote this file. The replays call the scheduling core exactly as the operator",
        "does (`schedule_cycle`, `RuntimeEstimator`, `Cluster.release`, `parse_cluster_spec`,",
        "virtual time through `ManualClock`); see `src/gangshare/sim/`. Seed 1 throughout.",
        "",
    ]
    lines += setup_section(outcomes)
    if "philly" in named:
        lines += experiment_section(named["philly"], "Philly: policies side by side", True)
        lines += ["Average queueing by VC (largest first):", ""]
        lines += [*vc_table(named["philly"], ["fifo", "multi-queue,fair-share,backfill"]), ""]
        lines += [
            "Why some policies change nothing here: `fair-share` only reorders lanes, and with",
            "every VC capped by a guaranteed quota and the quotas summing to the cluster, lanes",
            "of different VCs never compete for the same GPUs. Under `backfill` the core never",
            "holds a guaranteed job behind a blocked one in its lane, which is what `multi-queue`",
            "would otherwise relieve; what keeps jobs waiting is their VC's quota.",
            "",
        ]
    lines += cohort_section(named.get("philly-cohort"))
    lines += helios_section(named)
    lines += philly_study_section(named)
    if "alibaba" in named:
        lines += experiment_section(named["alibaba"], "Alibaba 2023: policies side by side", True)
    lines += antman_section(named)
    lines += forecast_section(forecasts)
    lines += usage_section()
    lines += ["## Replay speed in this run", ""]
    lines += [
        f"{machine} Each time below was measured in the run that wrote this page;",
        "`bench/simulator.py` measures a replay alone and how its time grows with trace length.",
        "",
    ]
    for outcome in outcomes:
        lines += [f"`{outcome.experiment.name}`:", "", *speed_table(outcome.results), ""]
    return "\n".join(lines)
