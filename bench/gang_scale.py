"""One 512-pod gang through the real control plane, and what it costs bare pods meanwhile.

A LocalCluster (etcd, kube-apiserver, kube-controller-manager, KWOK) with 64 gang nodes x 8
GPUs (two NVLink islands) and `--bare-nodes` more x 8 GPUs for bare pods. The cluster's own
gangshare-scheduler and extender are stopped; the bench runs `gangshare extender`, one
kube-scheduler with gangshare's shipped profile (preemption off) and its client unthrottled
(as bench/extender.py; the shipped qps 200 would pace the binds instead), and `gangshare
operator` as a real process whose workers name that scheduler. The TrainingJob (512 workers x
1 GPU, spec.gpuModel on the gang nodes) waits in a Queue whose quota is 0.

Each run streams one-GPU bare pods at `--rate` per second (created side by side, paced) for
`--seconds`, on the bare nodes, through the same kube-scheduler and extender. In a gang run
the Queue's quota is raised to 512 `--gang-at` seconds into the stream: the operator admits
the gang, creates its workers gated, lifts their gates side by side, and kube-scheduler places
them among the bare pods (the stream goes on until the gang is bound). From a pod watch
(client clock, sub-second):
  lift->bound     first worker seen ungated to last worker bound (the issue's figure)
  admit->bound    the quota raised to last worker bound (admission, creation, lift too)
  bare/s          bare pods bound per second inside the gang's window (first lift to last
                  bind), and in the run without the gang over the same offsets from its
                  stream's start; the ratio side by side (target >= 0.8)
  bare p99        create-to-bind of the bare pods created inside that window, both runs
Runs alternate without / with the gang, `--rounds` times, after a warm-up pair.

    .venv/bin/python bench/gang_scale.py [--rate 100] [--seconds 20] [--bare-nodes 300]
        [--rounds 3]

The stream stops at `--seconds` whatever the gang does; a window that outlasts it is cut at
the stream's last creation.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

sys.path.insert(0, str(Path(__file__).parent))
from extender import percentile
from extender_cluster import (
    cpu_seconds,
    follow_pods,
    scheduler_config,
    start_extender,
    start_operator,
)
from gangshare.core.spec import parse_cluster_spec
from gangshare.dev import binaries, components, processes
from gangshare.dev.cluster import LocalCluster
from operator_scale import server_requests

GANG_WORKERS = 512
GANG_NODES = 64
GANG_MODEL = "H100-GANG"
BARE_MODEL = "H100-BARE"
SCHEDULER = "bench-sched"
QUEUE = "gang-q"
GROUP, VERSION = "gangshare.io", "v1alpha1"


class PodTimes:
    """Per pod of a namespace: when it was first seen ungated and when bound (client clock)."""

    def __init__(self, api: client.CoreV1Api, namespace: str) -> None:
        self.seen: dict[str, float] = {}
        self.ungated: dict[str, float] = {}
        self.bound: dict[str, float] = {}
        self.stop = threading.Event()
        self.errors: list[str] = []
        args = (api, namespace, self._seen, self.stop, self.errors, 900)
        self.thread = threading.Thread(target=follow_pods, args=args, daemon=True)
        self.thread.start()

    def _seen(self, pod: dict[str, Any]) -> bool:
        now, name, spec = time.perf_counter(), pod["metadata"]["name"], pod.get("spec") or {}
        self.seen.setdefault(name, now)
        if not spec.get("schedulingGates"):
            self.ungated.setdefault(name, now)
        if spec.get("nodeName"):
            self.bound.setdefault(name, now)
        return False


class BareStream:
    """One-GPU bare pods created at a steady rate until stopped; when each was created."""

    def __init__(self, api: client.CoreV1Api, namespace: str, rate: float) -> None:
        self.api = api
        self.namespace = namespace
        self.rate = rate
        self.created: dict[str, float] = {}
        self.stop = threading.Event()
        self.started = time.perf_counter()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _create(self, name: str) -> None:
        self.api.create_namespaced_pod(
            self.namespace,
            {
                "metadata": {"name": name},
                "spec": {
                    "schedulerName": SCHEDULER,
                    "nodeSelector": {"nvidia.com/gpu.product": BARE_MODEL},
                    "containers": [
                        {
                            "name": "t",
                            "image": "example.invalid/t:1",
                            "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
            },
            _preload_content=False,
        ).read()
        self.created[name] = time.perf_counter()

    def _run(self) -> None:
        with ThreadPoolExecutor(16) as pool:
            count = 0
            while not self.stop.is_set():
                due = self.started + count / self.rate
                pause = due - time.perf_counter()
                if pause > 0:
                    self.stop.wait(pause)
                pool.submit(self._create, f"bare-{count}")
                count += 1


def gang_job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "queue": QUEUE,
            "workers": GANG_WORKERS,
            "gpusPerWorker": 1,
            "gpuModel": GANG_MODEL,
            "template": {"spec": {"containers": [{"name": "t", "image": "example.invalid/t:1"}]}},
        },
    }


def wait_for(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


@dataclass
class RunResult:
    started: float  # the bare stream's start
    created: dict[str, float]
    bound: dict[str, float]
    lift_to_bound: float = 0.0
    admit_to_bound: float = 0.0
    window: tuple[float, float] = (0.0, 0.0)  # the gang's placement, from the stream's start
    # The gang's steps, seconds from the quota raised: first and last worker seen, first and
    # last seen ungated, first and last bound.
    steps: tuple[float, ...] = ()
    cpu: dict[str, float] = field(default_factory=dict)  # CPU seconds per process in the run
    # Per second from the quota raised: bare binds, workers created, ungated and bound.
    timeline: list[tuple[int, int, int, int]] = field(default_factory=list)
    # kube-apiserver's requests in the run by verb and resource (node heartbeats aside).
    requests: Counter[str] = field(default_factory=Counter)

    def bare_rate(self, window: tuple[float, float]) -> float:
        """Bare pods bound per second in the window (cut at the stream's last creation)."""
        start, end = (self.started + offset for offset in window)
        end = min(end, max(self.created.values()))
        return sum(start <= t <= end for t in self.bound.values()) / (end - start)

    def bare_latency_p99(self, window: tuple[float, float]) -> float:
        start, end = (self.started + offset for offset in window)
        waits = [
            self.bound[name] - made
            for name, made in self.created.items()
            if start <= made <= end and name in self.bound
        ]
        return percentile(waits, 0.99) if waits else float("nan")


class Bench:
    def __init__(
        self, cluster: LocalCluster, kubectl: list[str], extender_port: int, pids: dict[str, int]
    ) -> None:
        self.pids = dict(pids)  # the processes whose CPU a run reads
        self.cluster = cluster
        self.kubectl = kubectl
        self.extender_port = extender_port
        state = cluster.state
        assert state is not None
        api_client = config.new_client_from_config(config_file=state.kubeconfig)
        api_client.configuration.connection_pool_maxsize = 32
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    def namespace(self, name: str) -> None:
        self.core.create_namespace({"metadata": {"name": name}})
        wait_for(f"{name}'s default service account", lambda: self._has_sa(name), 60)

    def _has_sa(self, namespace: str) -> bool:
        return any(
            sa.metadata.name == "default"
            for sa in self.core.list_namespaced_service_account(namespace).items
        )

    def _gone(self, namespaces: set[str]) -> bool:
        return not namespaces & {n.metadata.name for n in self.core.list_namespace().items}

    def set_quota(self, gpus: int) -> None:
        self.custom.patch_cluster_custom_object(
            GROUP, VERSION, "queues", QUEUE, {"spec": {"nominalGPUs": gpus}}
        )

    def start_scheduler(self, tag: str) -> processes.Child:
        state = self.cluster.state
        assert state is not None
        path = Path(state.root) / f"{SCHEDULER}-{tag}.yaml"
        template = binaries.repo_root() / "extender" / "scheduler-config.yaml"
        settings = scheduler_config(Path(state.kubeconfig), SCHEDULER, self.extender_port, template)
        # The shipped profile (preemption off) under the bench's scheduler name.
        shipped = yaml.safe_load(template.read_text())["profiles"][0]
        settings["profiles"] = [{**shipped, "schedulerName": SCHEDULER}]
        path.write_text(yaml.safe_dump(settings))
        argv = components.scheduler_argv(
            self.cluster.bins, self.cluster.layout, path, processes.free_port()
        )
        return processes.start(f"{SCHEDULER}-{tag}", argv, Path(state.logs), attached=True)

    def run(self, tag: str, args: argparse.Namespace, with_gang: bool) -> RunResult:
        bare_ns, gang_ns = f"bare-{tag}", f"gang-{tag}"
        self.namespace(bare_ns)
        self.namespace(gang_ns)
        if with_gang:
            self.custom.create_namespaced_custom_object(
                GROUP, VERSION, gang_ns, "trainingjobs", gang_job("big")
            )
        bare, gang = PodTimes(self.core, bare_ns), PodTimes(self.core, gang_ns)
        scheduler = self.start_scheduler(tag)
        self.pids["kube-scheduler"] = scheduler.pid
        cpu = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        before = server_requests(self.api_client)
        time.sleep(2)  # the scheduler's informers synced
        stream = BareStream(self.core, bare_ns, args.rate)
        raised = 0.0
        ends = threading.Timer(args.seconds, stream.stop.set)
        ends.start()
        try:
            if with_gang:
                time.sleep(args.gang_at)
                raised = time.perf_counter()
                self.set_quota(GANG_WORKERS)
                wait_for("every gang worker bound", lambda: len(gang.bound) >= GANG_WORKERS, 300)
            stream.thread.join()
            wait_for("every bare pod bound", lambda: set(stream.created) <= set(bare.bound), 120)
        finally:
            used = {name: cpu_seconds(pid) - cpu[name] for name, pid in self.pids.items()}
            served = server_requests(self.api_client) - before
            ends.cancel()
            stream.stop.set()
            processes.stop([scheduler])
            bare.stop.set()
            gang.stop.set()
        result = RunResult(stream.started, dict(stream.created), dict(bare.bound))
        result.cpu = used
        result.requests = served
        if with_gang:
            lift, done = min(gang.ungated.values()), max(gang.bound.values())
            result.lift_to_bound = done - lift
            result.admit_to_bound = done - raised
            result.window = (lift - stream.started, done - stream.started)
            result.steps = tuple(
                f(times.values()) - raised
                for times in (gang.seen, gang.ungated, gang.bound)
                for f in (min, max)
            )
            seconds = int(max(gang.bound.values()) - raised) + 2
            result.timeline = [
                tuple(  # type: ignore[misc]
                    sum(raised + i <= t < raised + i + 1 for t in times.values())
                    for times in (bare.bound, gang.seen, gang.ungated, gang.bound)
                )
                for i in range(seconds)
            ]
        self.set_quota(0)
        for namespace in (gang_ns, bare_ns):
            self.core.delete_namespace(namespace)
        wait_for("the run's namespaces gone", lambda: self._gone({gang_ns, bare_ns}), 300)
        return result


def cluster_nodes(bare_nodes: int) -> list[Any]:
    islands = [[0, 1, 2, 3], [4, 5, 6, 7]]
    pools = [
        ("gang", GANG_NODES, GANG_MODEL),
        ("bare", bare_nodes, BARE_MODEL),
    ]
    return parse_cluster_spec(
        {
            "nodePools": [
                {
                    "name": name,
                    "count": count,
                    "gpusPerNode": 8,
                    "gpuModel": model,
                    "nvlinkIslands": islands,
                }
                for name, count, model in pools
            ]
        }
    )


def install(kubectl: list[str]) -> None:
    """The CRDs and the template policy, as `kubectl apply -f crds/`, and the gang's Queue."""
    for name in ("trainingjob.yaml", "trainingjob-admission-policy.yaml", "queue.yaml"):
        path = binaries.repo_root() / "crds" / name
        subprocess.run([*kubectl, "apply", "-f", str(path)], check=True, capture_output=True)
    crds = ["crd/trainingjobs.gangshare.io", "crd/queues.gangshare.io"]
    subprocess.run(
        [*kubectl, "wait", "--for=condition=Established", "--timeout=60s", *crds],
        check=True,
        capture_output=True,
    )
    queue = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Queue",
        "metadata": {"name": QUEUE},
        "spec": {"nominalGPUs": 0},
    }
    subprocess.run(
        [*kubectl, "apply", "-f", "-"],
        input=yaml.safe_dump(queue),
        text=True,
        check=True,
        capture_output=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=100.0, help="bare pods created per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the stream runs")
    parser.add_argument("--gang-at", type=float, default=4.0, help="seconds into the stream")
    parser.add_argument("--bare-nodes", type=int, default=300, help="8-GPU nodes for bare pods")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeline", action="store_true", help="print the last gang run's")
    args = parser.parse_args()
    if args.rate * (args.seconds + 1) > args.bare_nodes * 8:
        raise SystemExit("too few bare nodes for the stream: raise --bare-nodes")
    bins = binaries.bin_dir(build=True)
    root = Path(tempfile.mkdtemp(prefix="gangshare-gang-bench-"))
    cluster = LocalCluster(root, bins, attached=True)
    children: list[processes.Child] = []
    try:
        state = cluster.up(cluster_nodes(args.bare_nodes), timeout=600)
        kubectl = [str(bins / "kubectl"), f"--kubeconfig={state.kubeconfig}"]
        print(
            f"cluster: {GANG_NODES} gang nodes + {args.bare_nodes} bare nodes x 8 GPUs (KWOK); "
            f"gang {GANG_WORKERS} x 1 GPU; bare pods {args.rate:.0f}/s for {args.seconds:.0f} s, "
            f"the gang's quota raised {args.gang_at:.0f} s in"
        )
        gangshare = [c for c in cluster.children if c.name.startswith("gangshare-")]
        processes.stop(gangshare)
        cluster.children = [c for c in cluster.children if c not in gangshare]
        install(kubectl)
        extender_port = processes.free_port()
        children.append(start_extender(cluster, extender_port, [SCHEDULER]))
        children.append(
            start_operator(cluster, "bench-operator", SCHEDULER, ["--cycle-interval=0.5"])
        )
        watched = {
            name: pid
            for name, pid in state.pids.items()
            if name in ("kube-apiserver", "etcd", "kwok", "kube-controller-manager")
        }
        watched.update(extender=children[0].pid, operator=children[1].pid)
        bench = Bench(cluster, kubectl, extender_port, watched)
        bench.run("warm-plain", args, False)
        bench.run("warm-gang", args, True)
        if not args.rounds:
            return
        print(
            f"\n{'round':>5} {'lift->bound s':>13} {'admit->bound s':>14} "
            f"{'bare/s with':>11} {'bare/s without':>14} {'ratio':>6} "
            f"{'bare p99 s with':>15} {'bare p99 s without':>18}"
        )
        lifts, ratios = [], []
        steps: list[tuple[float, ...]] = []
        cpus: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for round_ in range(args.rounds):
            plain = bench.run(f"plain{round_}", args, False)
            gang = bench.run(f"gang{round_}", args, True)
            steps.append(gang.steps)
            cpus[False].append(plain.cpu)
            cpus[True].append(gang.cpu)
            with_rate, without_rate = gang.bare_rate(gang.window), plain.bare_rate(gang.window)
            lifts.append(gang.lift_to_bound)
            ratios.append(with_rate / without_rate)
            print(
                f"{round_:>5} {gang.lift_to_bound:>13.2f} {gang.admit_to_bound:>14.2f} "
                f"{with_rate:>11.1f} {without_rate:>14.1f} {ratios[-1]:>6.2f} "
                f"{gang.bare_latency_p99(gang.window):>15.2f} "
                f"{plain.bare_latency_p99(gang.window):>18.2f}"
            )
        print(
            "\nthe gang's steps, s from the quota raised (median): first/last worker created, "
            "first/last ungated, first/last bound"
        )
        print("   " + "  ".join(f"{statistics.median(s):6.2f}" for s in zip(*steps, strict=True)))
        if args.timeline:
            print("the last gang run, per second from the quota raised:")
            print(f"   {'s':>3} {'bare bound':>10} {'created':>8} {'ungated':>8} {'bound':>6}")
            for second, row in enumerate(gang.timeline):
                print(
                    f"   {second:>3} "
                    + " ".join(f"{n:>{w}}" for n, w in zip(row, (10, 8, 8, 6), strict=True))
                )
        if args.timeline:
            print("kube-apiserver requests in the last runs (more than 100), without / with:")
            for what in sorted(gang.requests, key=lambda w: -gang.requests[w]):
                if max(gang.requests[what], plain.requests[what]) > 100:
                    print(f"   {what:<40} {plain.requests[what]:>7} {gang.requests[what]:>7}")
        print("CPU seconds per process, median over the runs: without / with the gang")
        for name in sorted(cpus[False][0]):
            without = statistics.median(c[name] for c in cpus[False])
            with_ = statistics.median(c[name] for c in cpus[True])
            print(f"   {name:<24} {without:7.1f} {with_:7.1f}")
        print(
            f"\nmedian: gang lift->bound {statistics.median(lifts):.2f} s (target < 10 s; "
            f"KAI-Scheduler publishes 49 s for one 512-pod gang on 500 KWOK nodes); bare pods "
            f"bound per second while it places, with / without it: "
            f"{statistics.median(ratios):.2f} (target >= 0.8)"
        )
    finally:
        processes.stop(children)
        cluster.down()


if __name__ == "__main__":
    main()
