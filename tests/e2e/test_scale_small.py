"""bench/scale.py's small version on the real local control plane (operator, extender,
kube-scheduler, KWOK): 100 one-GPU jobs, one 64-pod gang, one reclaim.

It fails if any job is lost (deleted by nobody, or Failed), if any GPU is held by two live
pods or a node holds more than it has (checked on every pod event), if a scenario does
not finish, or if the operator's snapshot audits (a rebuild every second, compared with the
snapshot its passes keep from watch changes) found drift or never ran. The figures it
prints are not asserted: timings belong to the benchmark.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "scale.py"
pytestmark = pytest.mark.e2e


def test_small_scale_run_loses_no_job_and_holds_no_gpu_twice(tmp_path: Path) -> None:
    report_path = tmp_path / "report.json"
    run = subprocess.run(
        [
            sys.executable,
            str(BENCH),
            "--nodes=25",
            "--gpus=4",
            "--gang-pods=64",
            "--reclaims=1",
            "--no-big-reclaim",
            "--timeout=240",
            # Its scenarios take seconds: an audit every second, so that several run.
            "--audit-seconds=1",
            f"--json={report_path}",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(run.stdout[-4000:])
    assert report_path.exists(), run.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["error"] is None, report["error"]
    assert report["lost"] == []
    assert report["double_held"] == []
    assert report["audits"]["drift"] == 0 and report["audits"]["clean"] >= 1, report["audits"]
    scenarios = report["scenarios"]
    assert list(scenarios) == ["gang", "jobs", "borrowers", "reclaim"]
    assert scenarios["gang"]["pods"] == 64
    assert scenarios["jobs"]["jobs"] == 100
    # The reclaim took quota back from a borrower, which was requeued, not dropped.
    assert scenarios["reclaim"]["borrowers"] == {"Running": 24, "Queued": 1}
    assert run.returncode == 0, run.stderr[-3000:]
