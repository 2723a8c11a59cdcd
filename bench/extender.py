"""Extender benchmarks.

1. filter + prioritize latency over HTTP (nodeCacheCapable requests naming every node) against
   the real FastAPI app under uvicorn, on caches of 1,000 and 5,000 nodes x 8 GPUs, half full.
2. Pods per second bound by the real kube-scheduler on KWOK nodes, with the extender and without,
   the same pods in the same run: each measurement creates the pods first for a scheduler that is
   not running yet, then starts a fresh kube-scheduler (plain profile, or gangshare's profile with
   the extender) and times first bind to last bind. Both schedulers run with an unthrottled
   client (see scheduler_config). Nothing of gangshare runs without the extender: the
   cluster's gangshare-scheduler and extender are stopped, and the bench's extender runs only
   for the runs with it. CPU per pod of every process is read over two windows: to
   the last bind, and until every pod runs (KWOK starts pods about 2 s behind the binds, so
   most of a pod's work is outside the first window in both modes).

    .venv/bin/python bench/extender.py [--sizes 1000 5000] [--requests 200] [--pods 1000]
        [--rounds 5] [--skip-cluster] [--skip-latency]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import uvicorn
import yaml

sys.path.insert(0, str(Path(__file__).parent))
from gangshare.core.clock import WallClock
from gangshare.core.job import ServiceClass
from gangshare.dev import binaries, components, processes
from gangshare.dev.cli import load_nodes
from gangshare.dev.cluster import LocalCluster
from gangshare.extender.app import VerbsApp
from gangshare.extender.cache import ClusterCache
from gangshare.extender.metrics import ExtenderMetrics
from placement import half_full_cluster

POD = {
    "metadata": {"name": "bench", "namespace": "default", "uid": "bench-uid"},
    "spec": {"containers": [{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
}


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def serve_synthetic(size: int, port: int) -> None:
    """Server process: a half-full synthetic cache; before each /filter one node changes, as the
    previous pod's bind would change it, so the memo only ever skips unchanged nodes."""
    cache = ClusterCache(WallClock())
    cache.ledger.cluster = half_full_cluster(size)
    for synced in cache.synced.values():
        synced.set()
    gc.collect()
    gc.freeze()  # as `gangshare extender` does after each cache (re)list
    # Loopback peers only (the default), as kube-scheduler in the same pod calls it.
    app = VerbsApp(cache, None, ExtenderMetrics())
    names = list(cache.cluster.nodes)
    rng = random.Random(11)
    counter = iter(range(10**9))

    async def one_bind_between_pods(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/filter":
            i = next(counter)
            with cache.lock:
                node = cache.cluster.node(rng.choice(names))
                cache.cluster.release(f"bench-{i - 1}")
                free = [g.index for g in node.gpus if g.free_for_guaranteed]
                if free:
                    cache.cluster.allocate(
                        f"bench-{i}", f"bench-{i}", node.name, free[:1], ServiceClass.GUARANTEED
                    )
        await app(scope, receive, send)

    uvicorn.run(
        one_bind_between_pods, host="127.0.0.1", port=port, log_level="error", access_log=False
    )


def http_latency(sizes: list[int], requests: int) -> None:
    print("1. filter (the shipped path: it answers only the best nodes) and prioritize (for a")
    print("   configuration that still names it) over HTTP, all nodes named in each request,")
    print("   server in its own process; between two pods one node changes (the last bind);")
    print("   cold = first pod, no memo")
    print(
        f"{'nodes':>6} {'cold both':>10} {'filter p50':>11} {'filter p99':>11} {'prio p50':>9} "
        f"{'prio p99':>9} {'both p50':>9} {'both p99':>9}  (ms)"
    )
    for size in sizes:
        port = processes.free_port()
        server = subprocess.Popen([sys.executable, __file__, "--serve", str(size), str(port)])
        try:
            # A plain keep-alive connection, like kube-scheduler's Go client: httpx's own
            # overhead would otherwise be part of every figure.
            deadline = time.monotonic() + 60
            while True:
                try:
                    http = HTTPConnection("127.0.0.1", port, timeout=60)
                    http.request("GET", "/healthz")
                    http.getresponse().read()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            names = [f"node-{i:05d}" for i in range(size)]
            body = json.dumps({"Pod": POD, "Nodes": None, "NodeNames": names}).encode()
            headers = {"content-type": "application/json"}
            times: dict[str, list[float]] = {"filter": [], "prioritize": [], "both": []}
            cold = 0.0
            for i in range(requests + 1):
                both = 0.0
                for verb in ("filter", "prioritize"):
                    start = time.perf_counter()
                    http.request("POST", f"/{verb}", body=body, headers=headers)
                    reply = http.getresponse()
                    json.loads(reply.read())
                    elapsed = (time.perf_counter() - start) * 1000
                    if reply.status != 200:
                        raise SystemExit(f"/{verb} answered {reply.status}")
                    both += elapsed
                    if i:
                        times[verb].append(elapsed)
                if i:
                    times["both"].append(both)
                else:
                    cold = both
            http.close()
        finally:
            server.terminate()
            server.wait(10)
        row = [
            f"{percentile(times[k], q):>9.2f}"
            for k in ("filter", "prioritize", "both")
            for q in (0.5, 0.99)
        ]
        print(f"{size:>6} {cold:>10.1f} " + " ".join(row))


def scheduler_config(
    kubeconfig: Path, name: str, extender_port: int | None, template: Path
) -> dict[str, Any]:
    if extender_port is None:
        config = components.scheduler_config(kubeconfig)
    else:
        config = components.gangshare_scheduler_config(template, kubeconfig, extender_port)
    config["profiles"] = [{"schedulerName": name}]
    # Unthrottled in both modes: at the shipped qps 200 / burst 400, a backlog of more than 400
    # pods is paced by the client's rate limiter, which the default binder's Bindings use and
    # the extender's do not (it binds with its own client): 1,000-pod runs then measured the
    # limiter (330 pods/s without the extender, flat) instead of CPU.
    config["clientConnection"].update({"qps": 100000, "burst": 100000})
    return config


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and every descendant (a launcher's child is the work)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        todo.extend(children.get(current, []))
    return total


class CpuMeter:
    """CPU seconds per component from the first bind to the last bind, and to the moment every
    pod runs. The second window holds all of each pod's work: KWOK starts a pod a little after
    its bind, and in a fast run much of that (and the API server's and watchers' share of it)
    falls after the last bind, outside the first window."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.first: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.settled: dict[str, float] = {}

    def read(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def per_pod_ms(self, pods: int, until: str = "last") -> dict[str, float]:
        end = self.settled if until == "settled" else self.last
        return {
            name: (end[name] - self.first[name]) * 1000 / max(1, pods - 1) for name in self.pids
        }


@dataclass
class RunCpu:
    """CPU ms per pod of each process to the last bind and until every pod ran, and how long
    after the last bind the last pod started."""

    to_last_bind: dict[str, float]
    until_running: dict[str, float]
    start_lag: float


def follow_pods(
    api: Any,
    namespace: str,
    seen: Any,
    done: threading.Event,
    errors: list[str],
    seconds: float,
) -> None:
    """Every pod event of a namespace from now on to `seen(pod)` until it returns True, `done` is
    set or `seconds` pass; the watch is opened again after any error (kept in `errors`)."""
    from gangshare.kube.follow import watch_events

    listing = json.loads(api.list_namespaced_pod(namespace, _preload_content=False).data)
    version = listing["metadata"]["resourceVersion"]
    deadline = time.monotonic() + seconds
    while not done.is_set() and time.monotonic() < deadline:
        try:
            response = api.list_namespaced_pod(
                namespace,
                watch=True,
                resource_version=version,
                timeout_seconds=60,
                _preload_content=False,
            )
            for event in watch_events(response):
                pod = event["object"]
                version = pod["metadata"].get("resourceVersion", version)
                if seen(pod) or done.is_set():
                    done.set()
                    return
        except Exception as err:  # keep watching; report what went wrong
            errors.append(repr(err))


class BindWatch:
    """Client-side bind times from a watch (sub-second, unlike the 1 s PodScheduled timestamps)."""

    def __init__(
        self, kubeconfig: str, namespace: str, expected: int, meter: CpuMeter | None = None
    ) -> None:
        from kubernetes import client, config

        self.api = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
        self.namespace = namespace
        self.expected = expected
        self.meter = meter
        self.bound: dict[str, float] = {}
        self.running: set[str] = set()
        self.settled_at = 0.0
        self.errors: list[str] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        follow_pods(self.api, self.namespace, self._seen, self.done, self.errors, 300)

    def _seen(self, pod: dict[str, Any]) -> bool:
        """Records one pod event; True once every pod is bound and running."""
        if pod.get("spec", {}).get("nodeName") and pod["metadata"]["name"] not in self.bound:
            self.bound[pod["metadata"]["name"]] = time.perf_counter()
            if self.meter is not None and len(self.bound) == 1:
                self.meter.first = self.meter.read()
        if len(self.bound) >= self.expected and self.meter and not self.meter.last:
            self.meter.last = self.meter.read()
        if (pod.get("status") or {}).get("phase") == "Running":
            self.running.add(pod["metadata"]["name"])
        if len(self.running) >= self.expected and len(self.bound) >= self.expected:
            self.settled_at = time.perf_counter()
            if self.meter is not None:
                self.meter.settled = self.meter.read()
            return True
        return False

    def wait(self, timeout: float) -> list[float]:
        self.done.wait(timeout)
        self.done.set()
        if self.errors:
            print(f"   (watch restarted after: {self.errors[:3]})")
        return sorted(self.bound.values())


def one_run(
    cluster: LocalCluster,
    kubectl: list[str],
    pods: int,
    extender_port: int | None,
    tag: str,
    watched: dict[str, int],
) -> tuple[float, RunCpu]:
    """Pods/s from first to last bind, and CPU ms per pod of each watched process over it."""
    state = cluster.state
    assert state is not None
    name = f"bench-{tag}"
    namespace = name
    subprocess.run([*kubectl, "create", "namespace", namespace], check=True, capture_output=True)
    while subprocess.run(
        [*kubectl, "get", "sa", "default", "-n", namespace], capture_output=True
    ).returncode:
        time.sleep(0.2)
    manifest = "\n---\n".join(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"p{i}", "namespace": namespace},
                "spec": {
                    "schedulerName": name,
                    "containers": [
                        {
                            "name": "t",
                            "image": "example.invalid/t:1",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            }
        )
        for i in range(pods)
    )
    subprocess.run(
        [*kubectl, "apply", "-f", "-"], input=manifest, text=True, check=True, capture_output=True
    )
    config_path = Path(state.root) / f"{name}.yaml"
    template = binaries.repo_root() / "extender" / "scheduler-config.yaml"
    config_path.write_text(
        yaml.safe_dump(scheduler_config(Path(state.kubeconfig), name, extender_port, template))
    )
    meter = CpuMeter(dict(watched))
    binds = BindWatch(state.kubeconfig, namespace, pods, meter)
    scheduler = processes.start(
        name,
        components.scheduler_argv(cluster.bins, cluster.layout, config_path, processes.free_port()),
        Path(state.logs),
        attached=True,
    )
    meter.pids["kube-scheduler"] = scheduler.pid
    try:
        stamps = binds.wait(300)
    finally:
        processes.stop([scheduler])
    subprocess.run(
        [*kubectl, "delete", "namespace", namespace, "--wait=true"], check=True, capture_output=True
    )
    if len(stamps) < pods or not binds.settled_at:
        raise SystemExit(f"{tag}: {len(stamps)} of {pods} pods bound, {len(binds.running)} ran")
    return (pods - 1) / (stamps[-1] - stamps[0]), RunCpu(
        meter.per_pod_ms(pods), meter.per_pod_ms(pods, "settled"), binds.settled_at - stamps[-1]
    )


def start_extender(cluster: LocalCluster, port: int, scheduler_names: list[str]) -> Any:
    state = cluster.state
    assert state is not None
    metrics_port = processes.free_port()
    argv = [
        sys.executable,
        "-m",
        "gangshare.cli",
        "extender",
        f"--kubeconfig={state.kubeconfig}",
        "--host=127.0.0.1",
        f"--port={port}",
        "--metrics-host=127.0.0.1",
        f"--metrics-port={metrics_port}",
        *(f"--scheduler-name={name}" for name in scheduler_names),
    ]
    child = processes.start("bench-extender", argv, Path(state.logs), attached=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            conn = HTTPConnection("127.0.0.1", metrics_port, timeout=2)
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                return child
        except OSError:
            pass
        time.sleep(0.3)
    processes.stop([child])
    raise SystemExit("the bench's extender did not become ready within 60 s")


def throughput(pods: int, rounds: int) -> None:
    print(f"\n2. kube-scheduler throughput on KWOK nodes, {pods} one-GPU pods per run")
    bins = binaries.bin_dir(build=True)
    nodes = load_nodes(None)
    spec_nodes = [n for n in nodes]  # demo cluster shape, repeated below to have room for every pod
    from gangshare.core.spec import parse_cluster_spec

    room = parse_cluster_spec(
        {
            "nodePools": [
                {
                    "name": "bench",
                    "count": max(1, pods // 8 + 2),
                    "gpusPerNode": 8,
                    "nvlinkIslands": [[0, 1, 2, 3], [4, 5, 6, 7]],
                }
            ]
        }
    )
    root = Path(tempfile.mkdtemp(prefix="gangshare-bench-"))
    cluster = LocalCluster(root, bins, attached=True)
    try:
        state = cluster.up(spec_nodes[:0] + room)
        kubectl = [str(bins / "kubectl"), f"--kubeconfig={state.kubeconfig}"]
        # "Without" is kube-scheduler on a cluster without gangshare: gangshare's own
        # kube-scheduler and extender (they serve gangshare-scheduler, which no bench pod
        # names) are stopped, and the bench's extender runs only for the runs with it (its pod
        # watch alone costs CPU per pod). It binds only pods of the schedulers it serves, so it
        # is started for the bench's scheduler names.
        gangshare = [c for c in cluster.children if c.name.startswith("gangshare-")]
        processes.stop(gangshare)
        cluster.children = [c for c in cluster.children if c not in gangshare]
        ext_tags = ["warmext", *(f"ext{r}" for r in range(rounds))]
        extender_port = processes.free_port()
        rates: dict[bool, list[float]] = {False: [], True: []}
        cpu: dict[bool, list[RunCpu]] = {False: [], True: []}
        # Everything of the cluster that does work per pod, and the bench's extender.
        watched = {
            name: pid
            for name, pid in state.pids.items()
            if name in ("kube-apiserver", "etcd", "kwok", "kube-controller-manager")
        }

        def run(with_extender: bool, tag: str) -> tuple[float, RunCpu]:
            if not with_extender:
                return one_run(cluster, kubectl, pods, None, tag, watched)
            names = [f"bench-{t}" for t in ext_tags]
            extender = start_extender(cluster, extender_port, names)
            try:
                these = {**watched, "extender": extender.pid}
                return one_run(cluster, kubectl, pods, extender_port, tag, these)
            finally:
                processes.stop([extender])

        # warm-up, not counted: a fresh cluster's first burst is slow
        run(False, "warmplain")
        run(True, "warmext")
        for round_ in range(rounds):
            for with_extender in (False, True):
                tag = f"{'ext' if with_extender else 'plain'}{round_}"
                rate, per_pod = run(with_extender, tag)
                rates[with_extender].append(rate)
                cpu[with_extender].append(per_pod)
                print(f"   run {tag:<7} {rate:7.1f} pods/s")
        plain, ext = statistics.median(rates[False]), statistics.median(rates[True])
        print(f"   without extender {plain:7.1f} pods/s (median of {len(rates[False])})")
        print(f"   with extender    {ext:7.1f} pods/s (median of {len(rates[True])})")
        cost = max(0.0, 1 - ext / plain)
        print(f"   ratio with/without: {ext / plain:.2f}  (extender cost {cost:.0%} of throughput)")
        print_cpu_per_pod(cpu)
    finally:
        cluster.down()


def print_cpu_per_pod(cpu: dict[bool, list[RunCpu]]) -> None:
    """Median CPU ms per bound pod of each process: first bind to last bind, and first bind
    until every pod runs (all of each pod's work, whichever run was faster)."""
    windows = (
        ("first bind to last bind", "to_last_bind"),
        ("first bind until every pod runs", "until_running"),
    )
    for title, window in windows:
        runs: dict[bool, list[dict[str, float]]] = {
            mode: [getattr(run, window) for run in cpu[mode]] for mode in (False, True)
        }
        names = sorted({name for mode in runs.values() for run in mode for name in run})
        print(f"\n   CPU ms per pod, {title} (median of runs)")
        print(f"   {'':<32} {'without':>8} {'with':>8}")
        totals = {False: 0.0, True: 0.0}
        for name in names:
            row = []
            for mode in (False, True):
                values = [run[name] for run in runs[mode] if name in run]
                if values:
                    median = statistics.median(values)
                    totals[mode] += median
                    row.append(f"{median:8.2f}")
                else:
                    row.append(f"{'-':>8}")
            print(f"   {name:<32} {' '.join(row)}")
        print(f"   {'all of them':<32} {totals[False]:8.2f} {totals[True]:8.2f}")
        print(f"   {'CPU ratio without / with':<32} {totals[False] / totals[True]:17.2f}")
    lags = {mode: statistics.median(run.start_lag for run in cpu[mode]) for mode in (False, True)}
    print(
        f"   last pod running after the last bind: {lags[False]:.2f} s without, "
        f"{lags[True]:.2f} s with (median)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--requests", type=int, default=200)
    # 300-pod runs last under a second, and three invocations of one tree gave ratios from
    # 0.56 to 0.73; 1,000 pods and 5 rounds settle it.
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument(
        "--rounds", type=int, default=5, help="measured runs per mode (after a warm-up)"
    )
    parser.add_argument("--skip-cluster", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument(
        "--serve", nargs=2, type=int, metavar=("NODES", "PORT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.serve:
        serve_synthetic(*args.serve)
        return
    if not args.skip_latency:
        http_latency(args.sizes, args.requests)
    if not args.skip_cluster:
        throughput(args.pods, args.rounds)


if __name__ == "__main__":
    main()
