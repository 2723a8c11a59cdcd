"""`gangshare demo`: the whole system on one machine, start to finish.

Starts the local control plane with the embedded demo cluster (simulated GPU
nodes), installs the CRD, runs the operator, applies the sample TrainingJobs
from examples/ (plus a burst of extra gangs, so some must queue), and prints a
status table until every job has finished. KWOK plays the kubelet: each worker
"runs" for a few seconds, marked by annotations the demo adds to the template.
At the end it says where the operator's and the extender's /metrics are, with a few
figures read from them.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from gangshare.dev import binaries, processes
from gangshare.dev.cli import load_nodes
from gangshare.dev.cluster import ClusterError, LocalCluster

TERMINAL = ("Succeeded", "Failed")


def add_demo_command(commands: Any) -> None:
    demo = commands.add_parser(
        "demo", help="local cluster + operator + sample TrainingJobs, with a status table"
    )
    demo.add_argument("--examples", type=Path, default=None, help="folder of TrainingJob manifests")
    demo.add_argument("--burst", type=int, default=3, help="extra 2x8-GPU gangs to make jobs queue")
    demo.add_argument(
        "--run-seconds", type=int, default=6, help="how long each simulated worker runs"
    )
    demo.add_argument("--timeout", type=float, default=300.0)
    demo.set_defaults(run=run_demo)


def demo_jobs(folder: Path, burst: int, run_seconds: int) -> list[dict[str, Any]]:
    """The TrainingJobs of `folder` plus the burst, and the batch/v1 Jobs of its sibling
    `jobs/` (queued by the same operator), each worker marked to run a few seconds on KWOK."""
    jobs = [yaml.safe_load(p.read_text()) for p in sorted(folder.glob("*.yaml"))]
    template = next(
        (j for j in jobs if j["spec"]["workers"] * j["spec"]["gpusPerWorker"] >= 16), None
    )
    for i in range(burst if template is not None else 0):
        assert template is not None
        extra = copy.deepcopy(template)
        extra["metadata"]["name"] = f"{template['metadata']['name']}-burst-{i}"
        jobs.append(extra)
    jobs += [yaml.safe_load(p.read_text()) for p in sorted((folder.parent / "jobs").glob("*.yaml"))]
    for position, job in enumerate(jobs):
        meta = job["spec"]["template"].setdefault("metadata", {})
        meta.setdefault("annotations", {}).update(
            {
                "gangshare.io/kwok-exit-code": "0",
                "gangshare.io/kwok-run-for": f"{run_seconds + (position % 3) * 2}s",
            }
        )
    return jobs


def status_table(jobs: list[dict[str, Any]]) -> str:
    header = (
        f"{'JOB':<28}{'CLASS':<15}{'QUEUE':<10}{'GANG':<7}{'PHASE':<12}{'WAIT':>6}  NODES (GPUS)"
    )
    lines = [header]
    for job in sorted(jobs, key=lambda j: j["metadata"]["name"]):
        spec, status = job["spec"], job.get("status") or {}
        # A batch/v1 Job's TrainingJob holds its place: shown by the Job's own name.
        ref = spec.get("jobRef") or {}
        name = f"Job/{ref['name']}" if ref.get("name") else job["metadata"]["name"]
        placement = status.get("placement") or []
        where = ", ".join(f"{w['node']}({','.join(map(str, w['gpus']))})" for w in placement)
        if not where and status.get("phase") not in TERMINAL:
            where = (status.get("message") or "")[:60]
        if where and status.get("borrowed"):
            where = f"borrowed: {where}"
        wait = status.get("queueWaitSeconds")
        # The shape it runs in: spec.reshape: Admit may have taken another allowed one.
        shape = status.get("reshapedTo") or spec
        gang = f"{shape['workers']}x{shape['gpusPerWorker']}"
        # The class it was admitted as: beyond its queue's quota a job runs Opportunistic.
        service_class = status.get("serviceClass") or spec.get("serviceClass", "Guaranteed")
        lines.append(
            f"{name:<28}{service_class:<15}"
            f"{spec.get('queue', ''):<10}{gang:<7}{status.get('phase', '-'):<12}"
            f"{'' if wait is None else f'{wait:.0f}s':>6}  {where}"
        )
    return "\n".join(lines)


def run_demo(args: argparse.Namespace) -> int:
    folder = args.examples or binaries.repo_root() / "examples" / "trainingjobs"
    repo = binaries.repo_root()
    bins = binaries.bin_dir(build=True)
    root = Path(tempfile.mkdtemp(prefix="gangshare-demo-"))
    cluster = LocalCluster(root / "cluster", bins, attached=True)
    operator = None
    try:
        print(
            f"starting the local control plane (logs: {root / 'cluster' / 'logs'}) ...", flush=True
        )
        state = cluster.up(load_nodes(None))
        kubectl = [str(bins / "kubectl"), f"--kubeconfig={state.kubeconfig}"]
        print(
            subprocess.run(
                [*kubectl, "get", "nodes", "-L", "gangshare.io/rack,nvidia.com/gpu.product"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        )
        subprocess.run(
            # The CRDs and the policy that keeps TrainingJob templates from escalating.
            [*kubectl, "apply", "-f", str(repo / "crds")],
            check=True,
            capture_output=True,
        )
        subprocess.run(
            [
                *kubectl,
                "wait",
                "--for=condition=Established",
                "crd/trainingjobs.gangshare.io",
                "crd/queues.gangshare.io",
            ],
            check=True,
            capture_output=True,
        )
        # With Queues served, a job naming a queue that does not exist is never admitted; these
        # include the queues the sample jobs name.
        subprocess.run(
            [*kubectl, "apply", "-f", str(repo / "examples" / "queues")],
            check=True,
            capture_output=True,
        )
        operator_metrics = f"http://127.0.0.1:{processes.free_port()}/metrics"
        operator = processes.start(
            "operator",
            [
                sys.executable,
                "-m",
                "gangshare.cli",
                "operator",
                "--kubeconfig",
                state.kubeconfig,
                "--liveness",
                f"http://127.0.0.1:{processes.free_port()}/healthz",
                # Loopback and a free port: the default 0.0.0.0:8081 may be taken on a laptop.
                "--metrics-address",
                operator_metrics.removeprefix("http://").removesuffix("/metrics"),
                "--cycle-interval",
                "0.5",
            ],
            root / "cluster" / "logs",
            attached=True,
        )
        jobs = demo_jobs(folder, args.burst, args.run_seconds)
        # JSON, not YAML: a YAML round trip turns strings like "3e-4" into numbers for kubectl.
        manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": jobs})
        subprocess.run(
            [*kubectl, "apply", "-f", "-"],
            input=manifest,
            text=True,
            check=True,
            capture_output=True,
        )
        queued = sum(1 for j in jobs if j["kind"] == "Job")
        print(
            f"applied {len(jobs) - queued} TrainingJobs from {folder} (+{args.burst} burst "
            f"gangs) and {queued} batch/v1 Job(s) labelled gangshare.io/queue\n",
            flush=True,
        )
        code = _watch(kubectl, len(jobs), args.timeout)
        endpoints = {
            "operator": operator_metrics,
            "extender": f"http://127.0.0.1:{state.ports['extender_metrics']}/metrics",
        }
        print(metrics_report(endpoints, {name: _scrape(url) for name, url in endpoints.items()}))
        return code
    except (ClusterError, binaries.BinariesError, subprocess.CalledProcessError) as err:
        detail = getattr(err, "stderr", "") or ""
        print(f"error: {err} {detail}".strip(), file=sys.stderr)
        return 1
    finally:
        if operator is not None:
            processes.stop([operator])
        cluster.down()
        print("local control plane stopped")


def _watch(kubectl: list[str], expected: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    shown_borrowing = False
    while True:
        raw = subprocess.run(
            [*kubectl, "get", "tj", "-o", "yaml"], capture_output=True, text=True, check=True
        )
        jobs = yaml.safe_load(raw.stdout)["items"]
        print(status_table(jobs), flush=True)
        if not shown_borrowing and any(_borrowing(j) for j in jobs):
            shown_borrowing = True
            print("\nqueues while research runs on quota borrowed from its cohort:")
            print(_queues_table(kubectl), flush=True)
        done = [j for j in jobs if (j.get("status") or {}).get("phase") in TERMINAL]
        if len(done) == expected:
            failed = [j["metadata"]["name"] for j in done if j["status"]["phase"] == "Failed"]
            print(f"\nall {expected} jobs finished; failed: {failed or 'none'}\n")
            print(_queues_table(kubectl), flush=True)
            return 1 if failed else 0
        if time.monotonic() > deadline:
            print(
                f"\ntimed out after {timeout:.0f}s with {expected - len(done)} jobs unfinished",
                file=sys.stderr,
            )
            return 1
        print(flush=True)
        time.sleep(3)


def _borrowing(job: dict[str, Any]) -> bool:
    status = job.get("status") or {}
    return bool(status.get("borrowed")) and status.get("phase") == "Running"


def _queues_table(kubectl: list[str]) -> str:
    shown = subprocess.run([*kubectl, "get", "queues"], capture_output=True, text=True, check=True)
    return shown.stdout


def _scrape(url: str) -> str | Exception:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())
    except OSError as err:
        return err


def _totals(text: str, family: str, by: str) -> dict[str, float]:
    """A counter family's samples summed by one label."""
    totals: dict[str, float] = {}
    for metric in text_string_to_metric_families(text):
        if metric.name == family:
            for sample in metric.samples:
                if sample.name == f"{family}_total":
                    key = sample.labels.get(by, "")
                    totals[key] = totals.get(key, 0.0) + sample.value
    return totals


def metrics_report(endpoints: Mapping[str, str], scraped: Mapping[str, str | Exception]) -> str:
    """Where the demo's metrics are, and a few figures read from them (while they still run)."""
    lines = ["metrics (Prometheus text format, served until the demo stops):"]
    lines += [f"  {name:<9}{url}" for name, url in endpoints.items()]
    operator, extender = scraped.get("operator"), scraped.get("extender")
    figures = []
    if isinstance(operator, str):
        by_class = _totals(operator, "gangshare_admissions", "service_class")
        borrowed = _totals(operator, "gangshare_admissions", "borrowed").get("true", 0)
        preempted = sum(_totals(operator, "gangshare_preemptions", "queue").values())
        admitted = ", ".join(f"{n:.0f} {c}" for c, n in sorted(by_class.items())) or "none"
        figures.append(
            f"admissions {admitted} ({borrowed:.0f} on borrowed quota), {preempted:.0f} preempted"
        )
    if isinstance(extender, str):
        verbs = _totals(extender, "gangshare_extender_requests", "verb")
        answered = ", ".join(f"{n:.0f} {v}" for v, n in sorted(verbs.items())) or "none"
        figures.append(f"extender requests {answered}")
    failed = [f"{name}: {err}" for name, err in scraped.items() if isinstance(err, Exception)]
    lines.append("  " + "; ".join(figures + [f"unreadable {f}" for f in failed]))
    return "\n".join(lines)
