"""`gangshare simulate` end to end on small files: outputs, determinism, one-line errors."""

import json
import random

import pytest

from gangshare.cli import main
from lucid_inputs import write_lucid

SPEC = """nodePools:
  - {name: n, count: 2, gpusPerNode: 4, gpuMemoryMiB: 16384, nvlinkIslands: [[0, 1, 2, 3]]}
queues:
  - {name: "a1b2c3", quota: 4}
  - {name: "d4e5f6", quota: 4}
"""


def philly_rows(count: int = 150) -> str:
    rng = random.Random(4)
    lines = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    for i in range(count):
        minute, gpus = i * 3 + rng.randint(0, 2), rng.choice([1, 1, 1, 2, 4])
        duration = rng.randint(60, 3000)
        vc = rng.choice(["a1b2c3", "d4e5f6"])
        lines.append(f"2017-10-02 {minute // 60:02d}:{minute % 60:02d}:00,{duration},{gpus},0,{vc}")
    return "\n".join(lines) + "\n"


@pytest.fixture
def files(tmp_path):
    write_lucid(tmp_path)
    (tmp_path / "cluster.yaml").write_text(SPEC)
    (tmp_path / "philly.csv").write_text(philly_rows())
    return tmp_path


def simulate(files, out, *extra):
    argv = ["simulate", "--trace", str(files / "philly.csv"), "--cluster"]
    argv += [str(files / "cluster.yaml"), "--colocation", str(files / "lucid")]
    return main([*argv, "--out", str(out), "--no-progress", *extra])


def results(out):
    doc = json.loads((out / "summary.json").read_text())
    for result in doc["results"]:
        result.pop("replay")  # wall-clock timings
    return doc


def test_simulate_writes_json_markdown_and_plots_policy_by_policy(files, capsys):
    out = files / "out"
    policies = ["--policy", "fifo", "--policy", "multi-queue,backfill,antman"]
    assert simulate(files, out, *policies, "--check-invariants", "--jobs-csv") == 0
    doc = results(out)
    assert [r["policy"] for r in doc["results"]] == ["fifo", "multi-queue,backfill,antman"]
    fifo, antman = doc["results"]
    assert fifo["jobs"] == antman["jobs"] == 150
    assert set(fifo["by_class"]) == {"Guaranteed"}
    assert set(antman["by_class"]) == {"Guaranteed", "Opportunistic"}
    assert fifo["jct"]["mean"] >= fifo["queueing"]["mean"] > 0
    assert len(fifo["series"]["sm_util"]) > 0
    table = (out / "summary.md").read_text()
    assert "| multi-queue,backfill,antman | 150 |" in table
    for name in ("jct_cdf.png", "queueing_cdf.png", "utilization.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    assert (out / "jobs-fifo.csv").read_text().count("\n") == 151
    assert "avg JCT" in capsys.readouterr().out


def test_identical_seeds_give_identical_outputs_and_the_seed_matters(files):
    policy = ["--policy", "qssf,fair-share,backfill,antman", "--no-plots"]
    assert simulate(files, files / "one", *policy, "--seed", "7") == 0
    assert simulate(files, files / "two", *policy, "--seed", "7") == 0
    assert simulate(files, files / "three", *policy, "--seed", "8") == 0
    assert results(files / "one") == results(files / "two")
    assert results(files / "one") != results(files / "three")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--policy", "fifo,lifo"], "error: --policy: unknown policy 'lifo'; choose from fifo,"),
        (["--window", "2017-10-02"], "error: --window: expected START,END as YYYY-MM-DD"),
        (["--limit", "0"], "error: --limit: must be at least 1, got 0"),
        (["--cluster-fraction", "0.5"], "error: --cluster-fraction: only applies to a node list"),
        (["--tolerance", "2"], "error: --tolerance: must be in (0, 1), got 2.0"),
    ],
)
def test_bad_flags_end_with_one_line_naming_the_flag(files, capsys, args, message):
    assert simulate(files, files / "out", *args) == 2
    err = capsys.readouterr().err
    assert err.startswith(message)
    assert err.count("\n") == 1


def test_a_bad_trace_column_or_missing_file_is_one_line(files, capsys):
    (files / "bad.csv").write_text("submit_time,duration,num_gpus\n0,ten,1\n")
    argv = ["simulate", "--cluster", str(files / "cluster.yaml"), "--out", str(files / "o")]
    assert main([*argv, "--trace", str(files / "bad.csv")]) == 2
    assert capsys.readouterr().err == (
        "error: --trace: line 2: duration: must be a number, got 'ten'\n"
    )
    assert main([*argv, "--trace", str(files / "missing.csv")]) == 2
    assert "error: --trace: cannot read" in capsys.readouterr().err
    argv = ["simulate", "--trace", str(files / "philly.csv"), "--cluster", str(files / "x.yaml")]
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith("error: --cluster: cannot read")
