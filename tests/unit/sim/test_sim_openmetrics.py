"""`gangshare simulate --metrics-out`: the live components' series over a replay, as OpenMetrics.

By hand on the cohort case of test_sim_cohorts.py (A2 borrows b's idle quota at t=0, B1 takes
it back at t=50, A2 is requeued and runs within a's quota from t=100), sampled every 25 s; then
through the CLI, where every name written must be one the operator or the agent exports, with
the live type, and the text must parse as OpenMetrics with monotone counters and whole
histograms.
"""

from __future__ import annotations

import io
import itertools
import math
import time
from collections import defaultdict
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from simkit import FREE_EVICTIONS, job, model, setup

import dashboards
from gangshare.cli import main
from gangshare.sim.engine import Simulation
from gangshare.sim.openmetrics import WRITTEN, ReplayMetrics
from gangshare.sim.policy import parse_policy
from lucid_inputs import write_lucid

Series = dict[tuple[str, frozenset[tuple[str, str]]], list[tuple[float, float]]]


def parse(text: str) -> tuple[dict[str, str], Series]:
    """Family name -> type, and (sample name, labels) -> [(timestamp, value)].

    Each timestamp's samples are parsed as one exposition with every family's metadata:
    prometheus_client's parser takes a histogram's samples at a second timestamp for duplicates
    of the first's (its de-duplication ignores the timestamp) and drops them. promtool reads
    the whole file in tests/e2e/test_sim_replay.py.
    """
    lines = text.splitlines()
    assert lines[-1] == "# EOF" and "# EOF" not in lines[:-1]
    meta: dict[str, list[str]] = {}
    at: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    family = ""
    for line in lines[:-1]:
        if line.startswith("# "):
            family = line.split()[2]
            meta.setdefault(family, []).append(line)
        else:
            at[line.rsplit(" ", 1)[1]][family].append(line)
    # Each family once: its HELP and TYPE, then all its samples.
    assert all(len(m) == 2 for m in meta.values()), meta
    types: dict[str, str] = {}
    series: Series = defaultdict(list)
    for stamp in sorted(at, key=float):
        chunk = [line for f, found in at[stamp].items() for line in (*meta[f], *found)]
        for parsed in text_string_to_metric_families("\n".join([*chunk, "# EOF", ""])):
            types[parsed.name] = parsed.type
            for sample in parsed.samples:
                assert sample.timestamp is not None and float(sample.timestamp) == float(stamp)
                key = (sample.name, frozenset(sample.labels.items()))
                series[key].append((float(stamp), sample.value))
    return types, dict(series)


def values(series: Series, name: str, **labels: str) -> list[float]:
    return [v for _, v in series[(name, frozenset(labels.items()))]]


def by_hand() -> tuple[ReplayMetrics, Series]:
    jobs = [job("A1", 0, 100, 2, queue="a"), job("A2", 0, 100, 2, queue="a")]
    jobs.append(job("B1", 50, 100, 2, queue="b"))
    build = setup(gpus=4, quotas={"a": 2, "b": 2})
    sim = Simulation(jobs, build(), parse_policy("fifo,cohort"), model(), FREE_EVICTIONS)
    sim.recorder = recorder = ReplayMetrics(step=25)
    sim.run()
    out = io.StringIO()
    recorder.write_to(out, start=1000)
    return recorder, parse(out.getvalue())[1]


def test_a_reclaim_by_hand_as_the_operator_would_count_it():
    recorder, series = by_hand()
    # Sample 0 is the empty cluster a step before the first arrival; the last is the end.
    assert recorder.times == [-25, 0, 25, 50, 75, 100, 125, 150]
    stamps = [t for t, _ in series[("gangshare_operator_leader", frozenset())]]
    assert stamps == [1000 + 25 * i for i in range(8)]
    assert values(series, "gangshare_operator_leader") == [1] * 8
    admissions = "gangshare_admissions_total"
    # A replayed job is a TrainingJob of its own: that is the kind of every job's series.
    tj = {"kind": "TrainingJob"}
    a = {"queue": "a", "service_class": "Guaranteed", "borrowed": "false", **tj}
    assert values(series, admissions, **a) == [0, 1, 1, 1, 1, 2, 2, 2]
    borrowed = {"queue": "a", "service_class": "Opportunistic", "borrowed": "true", **tj}
    assert values(series, admissions, **borrowed) == [0, 1, 1, 1, 1, 1, 1, 1]
    b = {"queue": "b", "service_class": "Guaranteed", "borrowed": "false", **tj}
    # First seen at t=50: a 0 at the sample before, so increase() counts it.
    assert values(series, admissions, **b) == [0, 1, 1, 1, 1, 1]
    reclaimed = values(series, "gangshare_preemptions_total", queue="a", reason="Reclaimed", **tj)
    assert reclaimed == [0, 1, 1, 1, 1, 1]
    assert values(series, "gangshare_requeues_total", reason="Preempted", **tj) == [
        0,
        1,
        1,
        1,
        1,
        1,
    ]
    assert values(series, "gangshare_queue_borrowed_gpus", queue="a") == [0, 2, 2, 0, 0, 0, 0, 0]
    assert values(series, "gangshare_queue_guaranteed_gpus", queue="a") == [0, 2, 2, 2, 2, 2, 2, 0]
    assert values(series, "gangshare_queue_guaranteed_gpus", queue="b") == [0, 0, 0, 2, 2, 2, 2, 0]
    assert values(series, "gangshare_queue_pending_jobs", queue="a") == [0, 0, 0, 1, 1, 0, 0, 0]
    assert values(series, "gangshare_queue_admitted_jobs", queue="a") == [0, 2, 2, 1, 1, 1, 1, 0]
    assert values(series, "gangshare_queue_nominal_gpus", queue="b") == [2] * 8
    # Requeued, A2 is counted with its spec's class again; every phase is there, 0 included.
    jobs = "gangshare_trainingjobs"
    opportunistic = {"service_class": "Opportunistic", "queue": "a", **tj}
    assert values(series, jobs, phase="Running", **opportunistic) == [1, 1, 0, 0, 0, 0, 0]
    guaranteed = {"service_class": "Guaranteed", "queue": "a", **tj}
    assert values(series, jobs, phase="Queued", **guaranteed) == [0, 0, 1, 1, 0, 0, 0]
    assert values(series, jobs, phase="Succeeded", **guaranteed) == [0, 0, 0, 0, 1, 1, 2]
    assert values(series, jobs, phase="Failed", **guaranteed) == [0] * 7
    # Waits: A1 and A2 at once, then A2 100 s after its submission (queuedAt is kept).
    assert values(series, "gangshare_queue_wait_seconds_count", queue="a")[-1] == 3
    assert values(series, "gangshare_queue_wait_seconds_sum", queue="a")[-1] == 100
    assert values(series, "gangshare_queue_wait_seconds_bucket", queue="a", le="1.0")[-1] == 2
    # One node, four GPUs, each with the ledger's modelled use; all idle at the end.
    gpus = {labels for name, labels in series if name == "gangshare_gpu_sm_utilization_ratio"}
    assert gpus == {frozenset({("node", "n0"), ("gpu", str(g))}) for g in range(4)}
    busy = [
        values(series, "gangshare_gpu_sm_utilization_ratio", node="n0", gpu=str(g))
        for g in range(4)
    ]
    assert all(v[1] == 0.5 and v[-1] == 0 for v in busy)  # workload 0 alone: 50% SM
    memory = values(series, "gangshare_gpu_memory_used_bytes", node="n0", gpu="0")
    assert memory[1] == 4000 * 1024 * 1024 and memory[-1] == 0


@pytest.fixture(scope="module")
def replay(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    files = write_inputs(tmp_path_factory.mktemp("replay"))
    out = files / "metrics.om"
    before = time.time()
    assert simulate(files, "--metrics-out", str(out)) == 0
    assert before - 1 <= float(out.read_text().splitlines()[-2].split()[-1]) <= time.time()
    return out, out.read_text()


SPEC = """nodePools:
  - {name: n, count: 2, gpusPerNode: 4, gpuMemoryMiB: 16384, nvlinkIslands: [[0, 1, 2, 3]]}
queues:
  - {name: research, quota: 4}
  - {name: prod, quota: 4}
"""


def write_inputs(folder: Path) -> Path:
    """Research borrows prod's idle quota, prod comes back for it; opportunistic 1-GPU jobs."""
    write_lucid(folder)
    (folder / "cluster.yaml").write_text(SPEC)
    rows = ["job_id,submit_time,duration,num_gpus,queue,service_class,priority"]
    rows += [f"r{i},{i * 60},1800,4,research,," for i in range(3)]
    rows += [f"o{i},{300 + i * 120},900,1,research,opportunistic," for i in range(4)]
    rows += [f"p{i},{900 + i * 600},1200,4,prod,," for i in range(3)]
    (folder / "trace.csv").write_text("\n".join(rows) + "\n")
    return folder


def simulate(files: Path, *extra: str) -> int:
    argv = ["simulate", "--trace", str(files / "trace.csv"), "--cluster"]
    argv += [str(files / "cluster.yaml"), "--colocation", str(files / "lucid")]
    argv += ["--policy", "multi-queue,backfill,antman,cohort", "--no-plots", "--no-progress"]
    return main([*argv, "--out", str(files / "out"), *extra])


def test_every_name_written_is_one_the_live_components_export_with_their_type(replay):
    types, series = parse(replay[1])
    live = dashboards.exported_families()
    assert set(types) == WRITTEN
    assert {name: live.get(name) for name in types} == types
    exported = dashboards.exported_series()
    assert {name for name, _ in series} - set(exported) == set()
    # The check catches a name no component exports.
    bogus = replay[1].replace("gangshare_queue_pending_jobs", "gangshare_queue_waiting_jobs")
    assert {name for name, _ in parse(bogus)[1]} - set(exported) == {"gangshare_queue_waiting_jobs"}


def test_counters_are_monotone_and_histograms_whole(replay):
    types, series = parse(replay[1])
    step = 60.0
    for (name, labels), points in series.items():
        stamps = [t for t, _ in points]
        assert stamps == sorted(stamps), name
        # One sample a step apart (the last one: the replay's end, within a step).
        gaps = [b - a for a, b in itertools.pairwise(stamps)] or [step]
        assert all(math.isclose(g, step) for g in gaps[:-1]) and 0 < gaps[-1] <= step, name
        family = dashboards.exported_series()[name]
        if types[family] in ("counter", "histogram"):
            v = [value for _, value in points]
            assert v == sorted(v) and v[0] == 0, (name, labels)
    histogram = "gangshare_queue_wait_seconds"
    for (name, labels), points in series.items():
        if name != f"{histogram}_count":
            continue
        queue = dict(labels)["queue"]
        buckets = {
            dict(key_labels)["le"]: pts
            for (key_name, key_labels), pts in series.items()
            if key_name == f"{histogram}_bucket" and dict(key_labels)["queue"] == queue
        }
        assert "+Inf" in buckets and len(buckets) == 15
        assert [v for _, v in buckets["+Inf"]] == [v for _, v in points]
        assert (f"{histogram}_sum", labels) in series
    assert types["gangshare_requeues"] == "counter"
    assert (
        values(
            series,
            "gangshare_preemptions_total",
            queue="research",
            reason="Reclaimed",
            kind="TrainingJob",
        )[-1]
        > 0
    )


def test_the_replay_starts_where_asked_and_samples_every_step(tmp_path):
    files = write_inputs(tmp_path)
    out = tmp_path / "m.om"
    argv = ("--metrics-out", str(out), "--metrics-start", "1700000000", "--metrics-step", "30")
    assert simulate(files, *argv) == 0
    _, series = parse(out.read_text())
    stamps = [t for t, _ in series[("gangshare_operator_leader", frozenset())]]
    assert stamps[:3] == [1700000000, 1700000030, 1700000060]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--metrics-step", "30"], "error: --metrics-step, --metrics-start: only apply with"),
        (["--metrics-out", "m.om", "--policy", "fifo"], "error: --metrics-out: takes one --policy"),
        (["--metrics-out", "m.om", "--metrics-step", "600"], "error: --metrics-step: must be in"),
        (["--metrics-out", "m.om", "--metrics-start", "-1"], "error: --metrics-start: must be"),
    ],
)
def test_bad_metrics_flags_are_one_line(tmp_path, capsys, args, message):
    files = write_inputs(tmp_path)
    assert simulate(files, *args) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
