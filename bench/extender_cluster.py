"""Pods per second bound by the real kube-scheduler on KWOK nodes, with the extender and without.

The same pods in the same run: each measurement creates the pods first for a scheduler that is
not running yet, then starts a fresh kube-scheduler (plain profile, or gangshare's profile with
the extender) and times first bind to last bind. Both schedulers run with an unthrottled client
(see scheduler_config). Nothing of gangshare runs without the extender: the cluster's
gangshare-scheduler and extender are stopped, and the bench's extender runs only for the runs
with it. Runs come in back-to-back pairs (plain, then with the extender), every pair printed
with its ratio and the median of the pairs' ratios last. With --baseline-src, each round also
runs the extender of another source tree, for an A/B of two extenders within one run.

CPU per pod of every process is read over two windows: to the last bind, and until every pod
runs (KWOK starts pods about 2 s behind the binds, so most of a pod's work is outside the first
window in both modes).
"""

from __future__ import annotations

import json
import os
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

import yaml

from gangshare.dev import binaries, components, processes
from gangshare.dev.cluster import LocalCluster


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


def start_extender(
    cluster: LocalCluster, port: int, scheduler_names: list[str], source: Path | None = None
) -> Any:
    """The extender as `gangshare extender` runs it; `source`: from that tree's src instead."""
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
    env = {"PYTHONPATH": str(source)} if source is not None else None
    child = processes.start("bench-extender", argv, Path(state.logs), attached=True, env=env)
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


def start_operator(
    cluster: LocalCluster, name: str, scheduler_name: str, flags: list[str]
) -> processes.Child:
    """`gangshare operator` as a bench runs it: one replica, no metrics port, `flags` more."""
    state = cluster.state
    assert state is not None
    argv = [
        sys.executable,
        "-m",
        "gangshare.cli",
        "operator",
        f"--kubeconfig={state.kubeconfig}",
        f"--scheduler-name={scheduler_name}",
        "--no-leader-elect",
        "--metrics-address=",
        *flags,
    ]
    return processes.start(name, argv, Path(state.logs), attached=True)


# Modes of a measured run: kube-scheduler alone, with the extender of this tree, and (with
# --baseline-src) with the extender of another tree, for an A/B within one cluster and run.
PLAIN, EXT, BASE = "plain", "ext", "base"


def throughput(pods: int, rounds: int, baseline: Path | None = None) -> None:
    print(f"\n2. kube-scheduler throughput on KWOK nodes, {pods} one-GPU pods per run")
    bins = binaries.bin_dir(build=True)
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
    modes = [PLAIN, EXT] if baseline is None else [PLAIN, EXT, BASE]
    try:
        state = cluster.up(room)
        kubectl = [str(bins / "kubectl"), f"--kubeconfig={state.kubeconfig}"]
        # "Without" is kube-scheduler on a cluster without gangshare: gangshare's own
        # kube-scheduler and extender (they serve gangshare-scheduler, which no bench pod
        # names) are stopped, and the bench's extender runs only for the runs with it (its pod
        # watch alone costs CPU per pod). It binds only pods of the schedulers it serves, so it
        # is started for the bench's scheduler names.
        gangshare = [c for c in cluster.children if c.name.startswith("gangshare-")]
        processes.stop(gangshare)
        cluster.children = [c for c in cluster.children if c not in gangshare]
        tags = [f"warm{mode}" for mode in modes[1:]]
        tags += [f"{mode}{r}" for r in range(rounds) for mode in modes[1:]]
        extender_port = processes.free_port()
        rates: dict[str, list[float]] = {mode: [] for mode in modes}
        cpu: dict[str, list[RunCpu]] = {mode: [] for mode in modes}
        # Everything of the cluster that does work per pod, and the bench's extender.
        watched = {
            name: pid
            for name, pid in state.pids.items()
            if name in ("kube-apiserver", "etcd", "kwok", "kube-controller-manager")
        }

        def run(mode: str, tag: str) -> tuple[float, RunCpu]:
            if mode == PLAIN:
                return one_run(cluster, kubectl, pods, None, tag, watched)
            names = [f"bench-{t}" for t in tags]
            source = baseline if mode == BASE else None
            extender = start_extender(cluster, extender_port, names, source)
            try:
                these = {**watched, "extender": extender.pid}
                return one_run(cluster, kubectl, pods, extender_port, tag, these)
            finally:
                processes.stop([extender])

        # warm-up, not counted: a fresh cluster's first burst is slow
        for mode in modes:
            run(mode, f"warm{mode}")
        for round_ in range(rounds):
            # Back to back, the order of the extender runs alternating between rounds.
            order = modes if round_ % 2 == 0 else [PLAIN, *reversed(modes[1:])]
            for mode in order:
                rate, per_pod = run(mode, f"{mode}{round_}")
                rates[mode].append(rate)
                cpu[mode].append(per_pod)
            line = "  ".join(f"{mode} {rates[mode][-1]:6.1f}" for mode in modes)
            ratios = "  ".join(
                f"{mode}/plain {rates[mode][-1] / rates[PLAIN][-1]:.2f}" for mode in modes[1:]
            )
            print(f"   pair {round_ + 1}: {line} pods/s   {ratios}")
        print_throughput(rates, cpu, baseline)
    finally:
        cluster.down()


def print_throughput(
    rates: dict[str, list[float]], cpu: dict[str, list[RunCpu]], baseline: Path | None
) -> None:
    plain = statistics.median(rates[PLAIN])
    print(f"   without extender {plain:7.1f} pods/s (median of {len(rates[PLAIN])})")
    for mode in rates:
        if mode == PLAIN:
            continue
        which = f"baseline extender ({baseline})" if mode == BASE else "extender"
        ext = statistics.median(rates[mode])
        pairs = [e / p for e, p in zip(rates[mode], rates[PLAIN], strict=True)]
        print(f"   with {which}: {ext:7.1f} pods/s (median of {len(rates[mode])})")
        print(
            f"   ratio with/without, median of the {len(pairs)} pairs: "
            f"{statistics.median(pairs):.2f}  (pairs: {' '.join(f'{r:.2f}' for r in pairs)};"
            f" ratio of the medians {ext / plain:.2f})"
        )
    print_cpu_per_pod(cpu)


def print_cpu_per_pod(cpu: dict[str, list[RunCpu]]) -> None:
    """Median CPU ms per bound pod of each process: first bind to last bind, and first bind
    until every pod runs (all of each pod's work, whichever run was faster)."""
    windows = (
        ("first bind to last bind", "to_last_bind"),
        ("first bind until every pod runs", "until_running"),
    )
    modes = list(cpu)
    for title, window in windows:
        runs = {mode: [getattr(run, window) for run in cpu[mode]] for mode in modes}
        names = sorted({name for mode in runs.values() for run in mode for name in run})
        print(f"\n   CPU ms per pod, {title} (median of runs)")
        print(f"   {'':<32} " + " ".join(f"{mode:>8}" for mode in modes))
        totals = dict.fromkeys(modes, 0.0)
        for name in names:
            row = []
            for mode in modes:
                values = [run[name] for run in runs[mode] if name in run]
                if values:
                    median = statistics.median(values)
                    totals[mode] += median
                    row.append(f"{median:8.2f}")
                else:
                    row.append(f"{'-':>8}")
            print(f"   {name:<32} {' '.join(row)}")
        print(f"   {'all of them':<32} " + " ".join(f"{totals[m]:8.2f}" for m in modes))
        for mode in modes[1:]:
            label = f"CPU ratio {PLAIN} / {mode}"
            print(f"   {label:<32} {totals[PLAIN] / totals[mode]:8.2f}")
    lags = {mode: statistics.median(run.start_lag for run in cpu[mode]) for mode in modes}
    print(
        "   last pod running after the last bind (median): "
        + ", ".join(f"{lags[mode]:.2f} s {mode}" for mode in modes)
    )
