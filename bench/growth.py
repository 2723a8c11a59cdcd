"""How cost grows (issue #27): the operator's pass and the extender's cache, by jobs and nodes.

In-process, no API server; each size in a fresh subprocess. The operator's real SchedulerLoop
runs on its watch-fed stores (operator/informers.py) holding API-shaped objects: Nodes (8 GPUs,
two NVLink islands), running TrainingJobs holding half the GPUs (1-, 2-, 4-GPU workers) with
their bound Pods, queued TrainingJobs (bench/operator_cycle.py's mix, status as the first
reconcile writes it), Queues `default` and q0..q3 (40/30/20/10% of the GPUs as quota, one
cohort; q3 starts over its quota and borrows). The chart's policy: Priority, multi-queue (2
GPUs), fair share, backfill, 7-day starvation bound, 30-minute minimum run before reclaim.
Status writes are merged in memory and assumed by the job store (as KubeApi.on_job_written
makes them); reconciles are no-ops; no start-time forecasts (the operator makes them in a worker
process). Columns: first pass (a new leader), then the median of
the next --passes ("steady"); read = reads + snapshot, dec = schedule_cycle, pass = run_once()
up to the writes (wall), cpu = its process CPU seconds (steadier on a shared machine); stores =
VmRSS growth from loading the stores; peak = the first pass's VmHWM (reset through
/proc/self/clear_refs) over the RSS before it; RSS after the last pass. The extender's
ClusterCache is filled as its watches fill it (replace_nodes/_pods/_jobs) with the same Nodes,
with and without the running jobs and pods: traced MB is what tracemalloc still sees once the
inputs are dropped, RSS MB what it added. k: least-squares slope of log(value) on log(size).
A size that runs past --timeout is stopped; its row shows the passes it finished.

    .venv/bin/python bench/growth.py [--nodes 500 5000] [--jobs 1000 10000 50000] [--passes 3]
        [--timeout 420] [--profile NODES JOBS]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import itertools
import json
import math
import pstats
import random
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).parent))
from gangshare.core.clock import ManualClock, WallClock
from gangshare.core.queueing import Ordering, QueuePolicy
from gangshare.extender.cache import ClusterCache
from gangshare.kube.queue import default_queue_object
from gangshare.kube.trainingjob import API_VERSION, parse_trainingjob
from gangshare.operator.conditions import iso, set_condition
from gangshare.operator.informers import Informers
from gangshare.operator.kubeapi import KubeApi
from gangshare.operator.manifests import worker_pod
from gangshare.operator.reconcile import Reconciler
from gangshare.operator.scheduler import SchedulerLoop
from operator_cycle import SIZES, job, nodes

NOW = 1_795_400_000.0
QUOTA_SHARES = {"q0": 0.4, "q1": 0.3, "q2": 0.2, "q3": 0.1}
CHART_POLICY = QueuePolicy(Ordering.PRIORITY, 2, fair_share=True, backfill=True)
CHART_POLICY = replace(CHART_POLICY, starvation_seconds=604800.0, reclaim_min_runtime_seconds=1800)
WORKER_GPUS = [1] * 7 + [2, 4]  # running workers, as a half-full cluster holds them


def vm_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def reset_peak_rss() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS


def running(
    node_objs: list[dict[str, Any]], rng: random.Random, rv: Iterator[int]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Running 1-worker jobs and their bound pods, half of every node's GPUs."""
    jobs: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    for node in node_objs:
        name = node["metadata"]["name"]
        free = list(range(8))
        rng.shuffle(free)
        held = 0
        while held < 4:
            gpus = rng.choice([g for g in WORKER_GPUS if g <= 4 - held])
            indices, free = sorted(free[:gpus]), free[gpus:]
            held += gpus
            started = NOW - rng.randint(60, 6 * 3600)
            status = {
                "phase": "Running",
                "attempt": 0,
                "observedGeneration": 1,
                "serviceClass": "Guaranteed",
                "queuedAt": iso(started - 60),
                "admittedAt": iso(started - 5),
                "startedAt": iso(started),
                "placement": [{"rank": 0, "node": name, "gpus": indices}],
            }
            obj = job(f"run-{len(jobs)}", 1, gpus, rng, status)
            obj["metadata"]["resourceVersion"] = str(next(rv))
            pod = worker_pod(parse_trainingjob(obj), 0, name, indices, 0)
            pod["metadata"].update(uid=f"pod-{len(jobs)}", resourceVersion=str(next(rv)))
            pod["spec"]["nodeName"] = name
            pod["spec"].pop("schedulingGates", None)
            pod["status"] = {"phase": "Running"}
            jobs.append(obj)
            pods.append(pod)
    return jobs, pods


def queued(count: int, rng: random.Random, rv: Iterator[int]) -> list[dict[str, Any]]:
    """Queued jobs with the status the operator's first reconcile writes (lifecycle._enqueue)."""
    jobs = []
    for i in range(count):
        obj = job(f"q-{i}", *rng.choice(SIZES), rng, {})
        spec = obj["spec"]
        at = NOW - (count - i)
        message = f"waiting for {spec['workers']}x{spec['gpusPerWorker']} GPUs"
        obj["status"] = {
            "phase": "Queued",
            "queuedAt": iso(at),
            "queuedAs": {"queue": spec["queue"], "priority": spec["priority"]},
            "message": message,
            "observedGeneration": 1,
            "attempt": 0,
            "conditions": set_condition(None, "Admitted", False, "Queued", message, at, 1),
        }
        obj["metadata"]["resourceVersion"] = str(next(rv))
        jobs.append(obj)
    return jobs


def queue_objects(gpus: int) -> list[dict[str, Any]]:
    queues = [default_queue_object()]
    for name, share in QUOTA_SHARES.items():
        spec = {"cohort": "research", "nominalGPUs": int(gpus * share)}
        queues.append(
            {"apiVersion": API_VERSION, "kind": "Queue", "metadata": {"name": name}, "spec": spec}
        )
    return queues


class MemoryApi:
    """KubeApi's calls that a pass makes, answered from memory: a status write is merged
    (JSON merge patch) and handed to the job store, as KubeApi.on_job_written does."""

    def __init__(self, informers: Informers, queues: list[Any], rv: Iterator[int]) -> None:
        self.informers, self.queues, self.rv = informers, queues, rv

    def list_queues(self) -> list[dict[str, Any]]:
        return self.queues

    def list_priority_classes(self) -> dict[str, int]:
        return {}

    def create_queue(self, body: dict[str, Any]) -> bool:
        self.queues.append(body)
        return True

    def patch_queue_status(self, name: str, status: dict[str, Any]) -> None:
        for queue in self.queues:
            if queue["metadata"]["name"] == name:
                queue["status"] = {**(queue.get("status") or {}), **status}

    def patch_job_status(self, job: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        merged = {**(job.get("status") or {}), **status}
        merged = {key: value for key, value in merged.items() if value is not None}
        meta = {**job["metadata"], "resourceVersion": str(next(self.rv))}
        patched = {**job, "metadata": meta, "status": merged}
        self.informers.jobs.assume(patched)
        return patched

    def post_event(self, *args: Any, **kwargs: Any) -> None:
        pass


class NoReconciles:
    """The reconciler's part in a pass (resync bookkeeping); its API work is not timed here."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.at: dict[str, float] = {}

    def due(self, now: float) -> list[str]:
        return []

    def reconciled_at(self, key: str) -> float | None:
        return self.at.get(key)

    def forget_all_but(self, keys: set[str]) -> None:
        for key in self.at.keys() - keys:
            del self.at[key]

    def reconcile(self, namespace: str, name: str, displaced: Any = None) -> None:
        self.at[f"{namespace}/{name}"] = self.clock.now()

    def reconcile_later(self, namespace: str, name: str, seen: Any = None) -> None:
        self.reconcile(namespace, name)


def operator_size(node_count: int, job_count: int, passes: int, profile: bool) -> None:
    rng, rv = random.Random(3), itertools.count(1001)
    gc.collect()
    rss0 = vm_kb("VmRSS")
    informers = Informers()
    node_objs = nodes(node_count)
    for node in node_objs:
        node["metadata"]["resourceVersion"] = str(next(rv))
    run_jobs, pods = running(node_objs, rng, rv)
    informers.nodes.replace(node_objs)
    informers.pods.replace(pods)
    informers.jobs.replace(run_jobs + queued(job_count, rng, rv))
    del node_objs, run_jobs, pods
    gc.collect()
    stores_mb = (vm_kb("VmRSS") - rss0) / 1024
    clock = ManualClock(NOW)
    api = MemoryApi(informers, queue_objects(8 * node_count), rv)
    reconciler = cast(Reconciler, NoReconciles(clock))
    loop = SchedulerLoop(cast(KubeApi, api), reconciler, CHART_POLICY, clock, informers=informers)
    # The operator makes forecasts in a worker process beside the pass (timed by
    # bench/scale.py); made here in the pass, one round at 50,000 jobs took 211 s.
    loop.forecasts.period_seconds = 0.0
    out: dict[str, Any] = {"stores_mb": stores_mb, "passes": []}
    for i in range(1 + passes):
        if i:
            clock.advance(1.0)
        gc.collect()
        before = vm_kb("VmRSS")
        reset_peak_rss()
        profiler = cProfile.Profile() if profile and i in (0, passes) else None
        cpu = time.process_time()
        if profiler is not None:
            profiler.enable()
        report = loop.run_once()
        if profiler is not None:
            profiler.disable()
        row = {
            "read": report.read_seconds,
            "decision": report.decision_seconds,
            "pass": report.seconds,
            "cpu": time.process_time() - cpu,
            "admitted": len(report.admitted),
            "pending": report.pending,
        }
        if i == 0:
            out["peak_mb"] = (vm_kb("VmHWM") - before) / 1024
        out["passes"].append(row)
        out["rss_mb"] = vm_kb("VmRSS") / 1024
        print(json.dumps(out), flush=True)  # what is done so far, should the parent time out
        if profiler is not None:
            print(f"--- pass {i} ---", file=sys.stderr)
            pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(40)
    loop._workers.shutdown()


def cache_size(node_count: int, with_pods: bool) -> dict[str, Any]:
    gc.collect()
    rss0 = vm_kb("VmRSS")
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    cache = ClusterCache(WallClock())
    node_objs = nodes(node_count)
    cache.replace_nodes(node_objs)
    run_jobs: list[dict[str, Any]] = []
    pods: list[dict[str, Any]] = []
    if with_pods:
        run_jobs, pods = running(node_objs, random.Random(3), itertools.count(1001))
    cache.replace_pods(pods)
    cache.replace_jobs(run_jobs)
    count = len(pods)
    del node_objs, run_jobs, pods
    gc.collect()
    retained = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    gc.collect()
    return {
        "pods": count,
        "traced_mb": retained / 2**20,
        "rss_mb": (vm_kb("VmRSS") - rss0) / 1024,
    }


def slope(xs: list[float], ys: list[float]) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(max(y, 1e-9)) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum(
        (a - mx) ** 2 for a in lx
    )


def child(what: list[str], timeout: float) -> tuple[dict[str, Any] | None, str]:
    """One measurement in a fresh interpreter, so each RSS figure starts clean: its last
    report, and why it stopped early ("" when it did not)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--child", *what], stdout=out, stderr=err
        )
        note = ""
        try:
            if proc.wait(timeout) != 0:
                err.seek(0)
                note = f"failed: {err.read()[-2000:]}"
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            note = f"stopped at the {timeout:.0f} s limit"
        out.seek(0)
        lines = out.read().strip().splitlines()
    return (json.loads(lines[-1]) if lines else None), note


def steady(r: dict[str, Any], key: str) -> float | None:
    rows = r["passes"][1:]
    return statistics.median(p[key] for p in rows) if rows else None


def fmt(value: float | None, width: int, digits: int = 2) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"


def fit(label: str, points: list[tuple[float, float | None]]) -> str:
    known = [(x, y) for x, y in points if y is not None]
    if len(known) < 2:
        return f"{label} -"
    return f"{label} {slope([x for x, _ in known], [y for _, y in known]):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, nargs="+", default=[500, 5000])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1000, 10000, 50000])
    parser.add_argument("--passes", type=int, default=3, help="steady passes after the first")
    parser.add_argument("--timeout", type=float, default=420, help="seconds per size at most")
    parser.add_argument("--profile", type=int, nargs=2, metavar=("NODES", "JOBS"))
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, *rest = args.child
        if kind == "operator":
            operator_size(int(rest[0]), int(rest[1]), int(rest[2]), rest[3] == "1")
        else:
            print(json.dumps(cache_size(int(rest[0]), rest[1] == "1")))
        return
    if args.profile:
        what = [sys.executable, __file__, "--child", "operator", *map(str, args.profile), "2", "1"]
        subprocess.run(what, check=True)
        return
    started = time.perf_counter()
    print("operator pass (run_once), chart policy, half the GPUs held; seconds: read+snapshot,")
    print("decision, pass (wall), cpu (process CPU); steady = median of the passes after the first")
    print(
        f"{'nodes':>5} {'jobs':>6} |{'read':>6} {'dec':>7} {'pass':>7} {'cpu':>7} {'adm':>6} |"
        f"{'read':>6} {'dec':>6} {'pass':>6} {'cpu':>6} | {'stores':>6} {'peak':>5} {'RSS':>5} MB"
    )
    results: dict[tuple[int, int], dict[str, Any]] = {}
    for n in args.nodes:
        for j in args.jobs:
            r, note = child(["operator", str(n), str(j), str(args.passes), "0"], args.timeout)
            if r is None:
                print(f"{n:>5} {j:>6} | not measured: {note}", flush=True)
                continue
            results[n, j] = r
            f = r["passes"][0]
            print(
                f"{n:>5} {j:>6} |{f['read']:>6.2f} {f['decision']:>7.2f} {f['pass']:>7.2f} "
                f"{f['cpu']:>7.2f} {f['admitted']:>6} |{fmt(steady(r, 'read'), 6)} "
                f"{fmt(steady(r, 'decision'), 6)} {fmt(steady(r, 'pass'), 6)} "
                f"{fmt(steady(r, 'cpu'), 6)} | {r['stores_mb']:>6.0f} {r['peak_mb']:>5.0f} "
                f"{r['rss_mb']:>5.0f}  {note}",
                flush=True,
            )
    metrics: dict[str, Any] = {
        "first pass": lambda r: r["passes"][0]["pass"],
        "first cpu": lambda r: r["passes"][0]["cpu"],
        "steady pass": lambda r: steady(r, "pass"),
        "steady cpu": lambda r: steady(r, "cpu"),
        "steady decision": lambda r: steady(r, "decision"),
        "stores MB": lambda r: r["stores_mb"],
    }
    print("\nexponent k, value ~ jobs^k, per node count:")
    for n in args.nodes:
        have = [j for j in args.jobs if (n, j) in results]
        fits = [fit(m, [(j, get(results[n, j])) for j in have]) for m, get in metrics.items()]
        print(f"  {n} nodes: " + ", ".join(fits))
    print("exponent k, value ~ nodes^k, per job count:")
    for j in args.jobs:
        have = [n for n in args.nodes if (n, j) in results]
        fits = [fit(m, [(n, get(results[n, j])) for n in have]) for m, get in metrics.items()]
        print(f"  {j} jobs: " + ", ".join(fits))
    print("\nextender ClusterCache: nodes, bound pods (half the GPUs) and their running jobs")
    print(f"{'nodes':>6} {'pods':>6} {'traced MB':>10} {'RSS MB':>7}")
    cache: dict[tuple[int, bool], float | None] = {}
    for with_pods in (False, True):
        for n in args.nodes:
            c, note = child(["cache", str(n), "1" if with_pods else "0"], args.timeout)
            cache[n, with_pods] = None if c is None else c["traced_mb"]
            if c is None:
                print(f"{n:>6} not measured: {note}")
                continue
            print(f"{n:>6} {c['pods']:>6} {c['traced_mb']:>10.1f} {c['rss_mb']:>7.1f}", flush=True)
    for pods in (False, True):
        points = [(n, cache[n, pods]) for n in args.nodes]
        print("  " + fit(f"traced MB ~ nodes^k, {'with' if pods else 'no'} pods: k =", points))
    print(f"\n(took {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
