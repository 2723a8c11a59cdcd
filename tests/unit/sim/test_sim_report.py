"""docs/results.md is built from replays: tables per policy, comparisons with published figures."""

import os
import random

from simkit import model, setup

from gangshare.sim.outcome import Outcome
from gangshare.sim.policy import parse_policy
from gangshare.sim.report import EXPERIMENTS, main
from gangshare.sim.report_md import results_markdown
from gangshare.sim.run import simulate
from gangshare.sim.trace import Trace, TraceJob

NAMED = {e.name: e for e in EXPERIMENTS}


def tiny_trace() -> Trace:
    rng = random.Random(2)
    jobs = [
        TraceJob(f"j{i:03d}", i * 20.0, float(rng.randint(30, 900)), rng.choice([1, 1, 2, 4]), q)
        for i, q in enumerate(rng.choice(["vc-a", "vc-b"]) for _ in range(80))
    ]
    return Trace("philly", "tiny.csv", jobs, {"no GPU": 3})


def outcome(name: str, policies: list[str]) -> Outcome:
    trace = tiny_trace()
    results = [
        simulate(trace, setup(nodes=2, gpus=4), parse_policy(p), model(), seed=1) for p in policies
    ]
    return Outcome(NAMED[name], trace, "2 nodes, 8 GPUs", results)


def test_results_markdown_tables_every_policy_and_compares_with_helios():
    outcomes = [
        outcome("philly", ["fifo", "multi-queue,fair-share,backfill", "antman"]),
        outcome("helios-3of8", ["fifo", "sjf-oracle", "qssf"]),
        outcome("helios-full", ["fifo", "sjf-oracle", "qssf"]),
    ]
    machine = "Measured on 2 core(s) of a test CPU; 2 replays ran side by side."
    text = results_markdown(outcomes, 90.0, 2, machine)
    assert "took 1.5 minutes with 2 replay process(es)" in text
    assert f"## Replay speed in this run\n\n{machine} Each time below" in text
    philly = outcomes[0].results[0].summary
    assert f"| fifo | 80 | {philly['jct']['mean']:,.0f} |" in text
    helios = outcomes[1].results[0].summary
    assert f"| fifo | 86,072 | 56,531 | {helios['jct']['mean']:,.0f} |" in text
    duration = helios["jct"]["mean"] - helios["queueing"]["mean"]
    assert f"the same window here averages {duration:,.0f} s" in text
    assert "| philly | fifo | antman |" in text  # the AntMan comparison row
    assert "opportunistic GPU-time beside a guaranteed job" in text
    antman = outcomes[0].results[2].summary
    # What sharing cost the guaranteed jobs and gave the opportunistic ones.
    slow = antman["guaranteed_slowdown"]
    progress = antman["opportunistic_progress"]
    assert f"| philly | antman | {100 * slow['mean']:.1f}% / " in text
    assert f"% | {100 * progress:.1f}% | " in text
    assert 0 < progress < 1
    change = 100 * (antman["jct"]["mean"] / philly["jct"]["mean"] - 1)
    assert f"| antman | {antman['jct']['mean']:,.0f} | {change:+.0f}% |" in text
    assert "| vc-a |" in text and "| vc-b |" in text  # per-VC queueing
    assert "3 no GPU" in text


def test_an_unknown_experiment_name_is_a_one_line_error(capsys):
    assert main(["--only", "nonsense"]) == 2
    assert capsys.readouterr().err.startswith("error: --only: no experiment of that name")


def test_the_cohort_section_compares_before_after_the_baselines_and_the_oracle():
    from gangshare.sim.report_cohort import AFTER, AFTER_QSSF, BEFORE, ORACLE

    trace = tiny_trace()
    policies = [BEFORE, "fifo,pool", "fifo,cohort", AFTER, AFTER_QSSF, ORACLE]
    build = setup(nodes=2, gpus=4, quotas={"vc-a": 4, "vc-b": 4})
    results = [simulate(trace, build, parse_policy(p), model(), seed=1) for p in policies]
    assert [r.policy for r in results] == policies
    cohort = Outcome(NAMED["philly-cohort"], trace, "2 nodes, 8 GPUs", results)
    text = results_markdown([cohort], 60.0, 2, "Measured here.")
    assert "## Cohorts on a backlogged cluster" in text
    pool, after, oracle = (results[i].summary for i in (1, 3, 5))
    ratio = pool["queueing"]["mean"] / after["queueing"]["mean"]
    jct = after["jct"]["mean"] / oracle["jct"]["mean"]
    assert f"- `{AFTER}`: average queueing {ratio:,.1f}x below `fifo,pool`" in text
    assert f"average JCT {jct:.3f}x the oracle's" in text
    row = f"| {AFTER} | "
    assert f"{after['queueing']['mean']:,.0f} | {after['queueing']['p99']:,.0f} |" in text
    # The headline, baseline, size, eviction and JCT tables each have a row per policy.
    assert text.count(row) >= 5
    sizes = after["by_size"]
    cells = " | ".join(
        f"{s['queueing']['mean']:,.0f} / {s['queueing']['p99']:,.0f}" if s["jct"]["count"] else "-"
        for s in (sizes[k] for k in ("1", "2-4", "5-8", ">8"))
    )
    assert f"| {AFTER} | {cells} |" in text
    assert f"| {after['evictions']:,} | {after['reclaims']:,} |" in text
    assert results[3].counters.borrowed > 0  # vc-a and vc-b lent each other idle quota


def test_the_machine_sentence_names_cores_model_commit_and_side_by_side(tmp_path):
    from gangshare.sim.machine import describe_machine

    alone = describe_machine(1, tmp_path)  # not a git checkout: the commit is unknown
    assert alone.startswith(f"Measured on {os.cpu_count()} core(s) of ")
    assert "at commit unknown; replays ran one at a time." in alone
    assert "2 replays ran side by side" in describe_machine(2, tmp_path)
