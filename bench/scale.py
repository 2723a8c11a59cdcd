"""End to end at scale: KAI-Scheduler's scenarios through the real local control plane.

A LocalCluster (etcd, kube-apiserver, kube-controller-manager, KWOK) of `--nodes` nodes x
`--gpus` GPUs (two NVLink islands each). The cluster's own gangshare processes are stopped and
the bench runs `gangshare extender`, one kube-scheduler with gangshare's shipped profile (its
client unthrottled, as bench/extender.py and bench/gang_scale.py) and `gangshare operator` as a
real process with the chart's default policy stack (Priority, small-job lane of 2 GPUs, fair
share, backfill, 7-day starvation bound) except `--reclaim-min-runtime 0` (the bench's
borrowers are minutes old). Two Queues in one cohort: `scale-lender` holds the whole cluster
as quota, `scale-borrower` none, so its jobs run Opportunistic on borrowed GPUs.

Scenarios, in this order, timed on the client's clock from each TrainingJob's create call:
  gang         one `--gang-pods` x 1-GPU gang of the lender on the empty cluster: created to
               every worker Running (KAI publishes 49 s for 512 pods on 500 nodes)
  jobs         `--nodes x --gpus` 1-GPU jobs of the lender (Guaranteed; they fill the cluster):
               jobs/s from the first create to the last job Running, p50/p99 create-to-Running,
               the median time to each phase (KAI: 4,000 jobs in 6 min 38 s, about 10 jobs/s);
               then deleted
  borrowers    one `--gpus`-GPU job per node in the borrower queue: Opportunistic on the
               lender's idle quota (share slots beside anyone, as AntMan), the whole quota lent
  reclaim      `--reclaims` 1-GPU lender jobs, one after another: created to Running, each
               taking its quota back from a borrower, which is evicted and requeued (KAI:
               13.9 s on average for 1 GPU)
  big-reclaim  the lender jobs deleted, the borrowers back, then one lender gang of `--nodes`
               workers x `--gpus` GPUs (the whole cluster): created to every worker Running,
               every borrower evicted and requeued (KAI: 85 s for a 4,000-GPU job)
Per scenario: CPU seconds and peak RSS (VmHWM, reset before it) of the operator, the
extender, kube-apiserver, etcd, kube-scheduler and KWOK (each with its descendants).

Invariants, checked on every pod event and at the end (exit status 1 if broken): no GPU of a
node held by two live pods and no node over its GPUs (scale_watch.py); no job lost (every
TrainingJob created still exists, none Failed; reclaimed borrowers are requeued, not dropped);
and no drift found by the operator's snapshot audits (a rebuild from every object every 15 s,
compared with the snapshot its passes keep from watch changes; counted from its log).

    .venv/bin/python bench/scale.py [--nodes 500] [--gpus 8] [--gang-pods 512] [--reclaims 5]
        [--no-big-reclaim] [--json PATH]
The small version `make test` runs: --nodes 25 --gpus 4 --gang-pods 64 --reclaims 1
--no-big-reclaim (tests/e2e/test_scale_small.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

sys.path.insert(0, str(Path(__file__).parent))
from extender import percentile
from extender_cluster import cpu_seconds, scheduler_config, start_extender, start_operator
from gangshare.core.spec import parse_cluster_spec
from gangshare.dev import binaries, components, processes
from gangshare.dev.cluster import LocalCluster
from operator_scale import install_crds, server_requests
from scale_watch import GROUP, VERSION, Observer

SCHEDULER = "scale-sched"
# Seconds between the operator's snapshot audits in the bench (its default is 120).
AUDIT_SECONDS = 15.0
LENDER, BORROWER, COHORT = "scale-lender", "scale-borrower", "scale"
BACKLOG, BACKLOG_QUOTA = "scale-backlog", 8
WATCHED = ("kube-apiserver", "etcd", "kwok")


def tree_pids(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def peak_rss_mb(pid: int) -> float:
    total = 0
    for one in tree_pids(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{one}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total += int(line.split()[1])
    return total / 1024


def reset_peak_rss(pid: int) -> None:
    for one in tree_pids(pid):
        with contextlib.suppress(OSError):  # "5" resets VmHWM to the current RSS (Linux >= 4.0)
            Path(f"/proc/{one}/clear_refs").write_text("5")


@contextlib.contextmanager
def measured(
    pids: dict[str, int], into: dict[str, Any], admin: client.ApiClient, profile: Path | None
) -> Iterator[None]:
    """CPU seconds and peak RSS of each process over the block, into `into['processes']`, and
    kube-apiserver's requests by verb and resource (node heartbeats aside) into
    `into['requests']`."""
    for pid in pids.values():
        reset_peak_rss(pid)
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    served = server_requests(admin)
    spies = [
        subprocess.Popen(
            [
                str(Path(sys.executable).parent / "py-spy"),
                "record",
                "--pid",
                str(pids[name]),
                "--format",
                "raw",
                "--rate",
                "50",
                "--output",
                str(profile / f"{into['name']}-{name}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name in ("operator", "extender")
        if profile is not None
    ]
    try:
        yield
    finally:
        for spy in spies:
            spy.send_signal(signal.SIGINT)
            spy.wait(60)
        into["processes"] = {
            name: {"cpu_s": cpu_seconds(pid) - before[name], "peak_rss_mb": peak_rss_mb(pid)}
            for name, pid in pids.items()
        }
        into["requests"] = dict((server_requests(admin) - served).most_common())


def training_job(
    name: str, queue: str, workers: int, gpus: int, runtime: int | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "queue": queue,
            "workers": workers,
            "gpusPerWorker": gpus,
            "template": {"spec": {"containers": [{"name": "t", "image": "example.invalid/t:1"}]}},
        },
    }
    if runtime is not None:
        body["spec"]["runtimeEstimateSeconds"] = runtime
    return body


class Scale:
    def __init__(self, cluster: LocalCluster, args: argparse.Namespace, pids: dict[str, int]):
        state = cluster.state
        assert state is not None
        self.args = args
        self.pids = pids
        api_client = config.new_client_from_config(config_file=state.kubeconfig)
        api_client.configuration.connection_pool_maxsize = 32
        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.seen = Observer(self.core, self.custom)
        self.created: dict[str, float] = {}  # "ns/name" -> client clock before its create call
        self.deleted: set[str] = set()  # deleted by the bench: not lost
        self.total = args.nodes * args.gpus

    def namespace(self, name: str) -> None:
        self.core.create_namespace({"metadata": {"name": name}})
        self.seen.wait(
            f"{name}'s default service account",
            lambda: any(
                sa.metadata.name == "default"
                for sa in self.core.list_namespaced_service_account(name).items
            ),
            60,
        )

    def create(self, namespace: str, bodies: list[dict[str, Any]]) -> list[str]:
        def one(body: dict[str, Any]) -> None:
            key = f"{namespace}/{body['metadata']['name']}"
            self.created[key] = time.perf_counter()
            self.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, "trainingjobs", body, _preload_content=False
            ).read()

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(one, bodies))
        return [f"{namespace}/{b['metadata']['name']}" for b in bodies]

    def delete(self, keys: list[str]) -> None:
        def one(key: str) -> None:
            namespace, name = key.split("/")
            self.deleted.add(key)
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, "trainingjobs", name, _preload_content=False
            ).read()

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(one, keys))

    def delete_and_wait(self, keys: list[str], namespace: str, out: dict[str, Any]) -> None:
        """Delete the jobs and their pods and wait until none of them holds anything (timed).
        The pods go by one collection delete with no grace: left to kube-controller-manager's
        garbage collector, 4,000 orphans took over 11 minutes to go (its client's rate)."""
        started = time.perf_counter()
        self.delete(keys)
        self.core.delete_collection_namespaced_pod(
            namespace, grace_period_seconds=0, _preload_content=False
        ).read()
        self.seen.wait(
            f"{namespace}'s pods gone", lambda: self.seen.pods_held({namespace}) == 0, 600
        )
        out["deleted_s"] = time.perf_counter() - started

    def job_times(self, keys: list[str]) -> list[float]:
        with self.seen.lock:
            return [(self.seen.jobs[k].running or 0.0) - self.created[k] for k in keys]

    def steps(self, keys: list[str]) -> dict[str, float]:
        """Median seconds from each job's create call to the first sight of each phase."""
        marks: dict[str, list[float]] = {}
        with self.seen.lock:
            for key in keys:
                for phase, at in self.seen.jobs[key].at.items():
                    marks.setdefault(phase, []).append(at - self.created[key])
        return {phase: round(statistics.median(t), 2) for phase, t in marks.items()}

    def all_running(self, keys: list[str]) -> Callable[[], bool]:
        return lambda: self.seen.running_jobs(keys) == len(keys)

    def fill(self, ns: str, queue: str, count: int, gpus: int, out: dict[str, Any]) -> list[str]:
        """`count` single-worker jobs of `gpus` GPUs, created side by side, all Running."""
        self.namespace(ns)
        bodies = [training_job(f"job-{i:05d}", queue, 1, gpus) for i in range(count)]
        keys = self.create(ns, bodies)
        created = [self.created[k] for k in keys]
        self.seen.wait(f"{count} jobs Running", self.all_running(keys), self.args.timeout)
        waits = self.job_times(keys)
        last = max(w + c for w, c in zip(waits, created, strict=True))
        out["steps_p50_s"] = self.steps(keys)
        out.update(
            jobs=count,
            create_s=max(created) - min(created),
            all_running_s=last - min(created),
            jobs_per_s=count / (last - min(created)),
            p50_s=percentile(waits, 0.50),
            p99_s=percentile(waits, 0.99),
        )
        return keys

    # -- scenarios ---------------------------------------------------------------------------
    def gang(self, out: dict[str, Any]) -> None:
        pods, ns = self.args.gang_pods, "scale-gang"
        self.namespace(ns)
        with measured(self.pids, out, self.api_client, self.args.profile):
            (key,) = self.create(ns, [training_job("gang", LENDER, pods, 1)])
            start = self.created[key]
            self.seen.wait(
                f"{pods} gang workers Running",
                lambda: len(self.seen.pods_running(ns)) >= pods,
                self.args.timeout,
            )
            self.seen.wait("the gang's job Running", self.all_running([key]), 60)
        running = self.seen.pods_running(ns)
        bound = self.seen.bound_at.get(ns, {})
        out.update(
            pods=pods,
            first_bound_s=min(bound.values()) - start,
            last_bound_s=max(bound.values()) - start,
            all_running_s=max(running.values()) - start,
            job_running_s=self.job_times([key])[0],
        )
        self.delete_and_wait([key], ns, out)

    def backlog(self) -> None:
        """`--backlog` one-GPU jobs of a queue of BACKLOG_QUOTA GPUs, in no cohort: the first
        BACKLOG_QUOTA run (on the GPUs the cluster has beyond `--nodes`), the rest wait for
        its quota through every scenario, so each forecast replays them (in `jobs` alone,
        every job a pass sees is admitted by it: nothing is left to forecast)."""
        ns = "scale-backlog"
        self.namespace(ns)
        runtimes = [3600 * (1 + i % 4) for i in range(self.args.backlog)]
        bodies = [
            training_job(f"wait-{i:05d}", BACKLOG, 1, 1, runtime)
            for i, runtime in enumerate(runtimes)
        ]
        keys = self.create(ns, bodies)
        first = keys[: min(BACKLOG_QUOTA, len(keys))]
        self.seen.wait(f"{len(first)} backlog jobs Running", self.all_running(first), 300)

    def jobs(self, out: dict[str, Any]) -> None:
        with measured(self.pids, out, self.api_client, self.args.profile):
            keys = self.fill("scale-jobs", LENDER, self.total, 1, out)
        self.delete_and_wait(keys, "scale-jobs", out)

    def borrowers(self, out: dict[str, Any]) -> None:
        """The lender's quota lent out: one `--gpus`-GPU borrower per node, Opportunistic."""
        with measured(self.pids, out, self.api_client, self.args.profile):
            self.borrowed = self.fill(
                "scale-borrow", BORROWER, self.args.nodes, self.args.gpus, out
            )

    def reclaim(self, out: dict[str, Any]) -> None:
        ns = "scale-lender"
        self.namespace(ns)
        times, pod_times = [], []
        with measured(self.pids, out, self.api_client, self.args.profile):
            for i in range(self.args.reclaims):
                (key,) = self.create(ns, [training_job(f"reclaim-{i}", LENDER, 1, 1)])
                self.seen.wait(f"{key} Running", self.all_running([key]), self.args.timeout)
                times.append(self.job_times([key])[0])
                pod_times.append(max(self.seen.pods_running(ns).values()) - self.created[key])
        out.update(
            reclaims=len(times),
            job_running_s=times,
            mean_s=statistics.fmean(times),
            pod_running_mean_s=statistics.fmean(pod_times),
            borrowers=self.seen.phases("scale-borrow"),
        )

    def big_reclaim(self, out: dict[str, Any]) -> None:
        ns = "scale-big"
        lender = [k for k in self.created if k.startswith("scale-lender/")]
        # Their pods gone first: a terminating pod still holds its GPU for its grace period,
        # which would be timed here as the gang's wait.
        self.delete_and_wait(lender, "scale-lender", {})
        self.seen.wait("the borrowers back", self.all_running(self.borrowed), self.args.timeout)
        self.namespace(ns)
        workers, gpus = self.args.nodes, self.args.gpus
        with measured(self.pids, out, self.api_client, self.args.profile):
            (key,) = self.create(ns, [training_job("big", LENDER, workers, gpus)])
            self.seen.wait(
                f"{workers} x {gpus}-GPU workers Running",
                lambda: len(self.seen.pods_running(ns)) >= workers,
                self.args.timeout,
            )
        with self.seen.lock:
            said = self.seen.jobs[key].said
        out["said"] = [f"+{at - self.created[key]:.1f}s {what[:120]}" for at, what in said]
        out.update(
            workers=workers,
            gpus=workers * gpus,
            all_running_s=max(self.seen.pods_running(ns).values()) - self.created[key],
            borrowers=self.seen.phases("scale-borrow"),
        )

    def lost(self) -> list[str]:
        """Jobs created and not deleted by the bench that no longer exist, or that failed."""
        with self.seen.lock:
            missing = [k for k in self.created if k not in self.seen.jobs and k not in self.deleted]
            failed = [k for k, j in self.seen.jobs.items() if j.failed]
        return [f"{k}: gone" for k in missing] + [f"{k}: Failed" for k in failed]


def cluster_nodes(count: int, gpus: int) -> list[Any]:
    half = gpus // 2
    islands = [list(range(half)), list(range(half, gpus))] if gpus > 1 else [[0]]
    pool = {"name": "gpu", "count": count, "gpusPerNode": gpus, "nvlinkIslands": islands}
    return parse_cluster_spec({"nodePools": [pool]})


def apply(kubectl: list[str], objects: list[dict[str, Any]]) -> None:
    text = yaml.safe_dump_all(objects)
    subprocess.run([*kubectl, "apply", "-f", "-"], input=text, text=True, check=True)


def start_gangshare(
    cluster: LocalCluster,
    kubectl: list[str],
    forecast_period: float = 30.0,
    audit_seconds: float = AUDIT_SECONDS,
) -> tuple[list[processes.Child], dict[str, int]]:
    """The bench's extender, kube-scheduler and operator, with the Queues they serve."""
    state = cluster.state
    assert state is not None
    ours = [c for c in cluster.children if c.name.startswith("gangshare-")]
    processes.stop(ours)
    cluster.children = [c for c in cluster.children if c not in ours]
    install_crds(kubectl)
    children = []
    port = processes.free_port()
    children.append(start_extender(cluster, port, [SCHEDULER]))
    template = binaries.repo_root() / "extender" / "scheduler-config.yaml"
    settings = scheduler_config(Path(state.kubeconfig), SCHEDULER, port, template)
    shipped = yaml.safe_load(template.read_text())["profiles"][0]
    settings["profiles"] = [{**shipped, "schedulerName": SCHEDULER}]
    path = Path(state.root) / f"{SCHEDULER}.yaml"
    path.write_text(yaml.safe_dump(settings))
    argv = components.scheduler_argv(cluster.bins, cluster.layout, path, processes.free_port())
    children.append(processes.start(SCHEDULER, argv, Path(state.logs), attached=True))
    policy = [
        "--ordering=Priority",
        "--small-job-max-gpus=2",
        "--fair-share",
        "--backfill",
        "--starvation-seconds=604800",
        "--reclaim-min-runtime=0",
        f"--forecast-period={forecast_period}",
        # The pass's snapshot is kept from watch changes; a rebuild audits it this often.
        f"--snapshot-audit-seconds={audit_seconds}",
    ]
    children.append(start_operator(cluster, "scale-operator", SCHEDULER, policy))
    pids = {
        "operator": children[2].pid,
        "extender": children[0].pid,
        "kube-scheduler": children[1].pid,
    }
    pids.update({n: p for n, p in state.pids.items() if n in WATCHED})
    return children, pids


def queues(total: int) -> list[dict[str, Any]]:
    def queue(name: str, quota: int) -> dict[str, Any]:
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Queue",
            "metadata": {"name": name},
            "spec": {"nominalGPUs": quota, "cohort": COHORT},
        }

    backlog = {**queue(BACKLOG, BACKLOG_QUOTA), "spec": {"nominalGPUs": BACKLOG_QUOTA}}
    return [queue(LENDER, total), queue(BORROWER, 0), backlog]


def print_report(report: dict[str, Any], audit_seconds: float = AUDIT_SECONDS) -> None:
    for name, figures in report["scenarios"].items():
        shown = {k: v for k, v in figures.items() if k not in ("name", "processes", "requests")}
        print(f"\n== {name}: " + ", ".join(f"{k} {fmt(v)}" for k, v in shown.items()))
        for proc, stats in sorted(figures.get("processes", {}).items()):
            cpu, rss = stats["cpu_s"], stats["peak_rss_mb"]
            print(f"   {proc:<16} cpu {cpu:7.1f} s   peak rss {rss:7.0f} MB")
        requests = figures.get("requests", {})
        per = figures.get("jobs") or 1
        total = sum(requests.values())
        print(f"   API requests {total} ({total / per:.1f} per job), most:")
        for what, count in list(requests.items())[:8]:
            print(f"      {what:<40} {count:>7} ({count / per:.1f} per job)")
    print(f"\nlost jobs: {report['lost'] or 'none'}")
    print(f"GPUs held twice: {report['double_held'] or 'none'}")
    audits = report.get("audits") or {}
    print(
        f"snapshot audits (a rebuild every {audit_seconds:g} s, compared with the kept "
        f"snapshot): {audits.get('clean', 0)} without drift, {audits.get('drift', 0)} with"
    )


def fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} {fmt(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(fmt(v) for v in value) + "]"
    return str(value)


def run(args: argparse.Namespace) -> dict[str, Any]:
    bins = binaries.bin_dir(build=True)
    root = Path(tempfile.mkdtemp(prefix="gangshare-scale-"))
    cluster = LocalCluster(root, bins, attached=True)
    children: list[processes.Child] = []
    report: dict[str, Any] = {"scenarios": {}, "lost": [], "double_held": [], "error": None}
    started = time.perf_counter()
    try:
        # A backlog's running jobs get a node of their own, beyond the scenarios' `--nodes`.
        nodes = args.nodes + (1 if args.backlog else 0)
        state = cluster.up(cluster_nodes(nodes, args.gpus), timeout=900)
        report["cluster_up_s"] = time.perf_counter() - started
        kubectl = [str(bins / "kubectl"), f"--kubeconfig={state.kubeconfig}"]
        children, pids = start_gangshare(cluster, kubectl, args.forecast_period, args.audit_seconds)
        apply(kubectl, queues(args.nodes * args.gpus))
        scale = Scale(cluster, args, pids)
        scale.seen.start()
        if args.backlog:
            scale.backlog()
        steps: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
            ("gang", scale.gang),
            ("jobs", scale.jobs),
            ("borrowers", scale.borrowers),
            ("reclaim", scale.reclaim),
        ]
        if args.big_reclaim:
            steps.append(("big-reclaim", scale.big_reclaim))
        try:
            for name, step in steps:
                if args.only and name not in args.only:
                    continue
                figures: dict[str, Any] = {"name": name}
                report["scenarios"][name] = figures
                step(figures)
                print(f"{name}: done", flush=True)
        except TimeoutError as err:
            report["error"] = str(err)
        time.sleep(2)  # the last events in
        report["lost"] = scale.lost()
        report["double_held"] = [
            f"{v.node}: {v.what} ({', '.join(v.pods)})" for v in scale.seen.violations
        ]
        scale.seen.stop.set()
    finally:
        processes.stop(children)
        if children:
            report["audits"] = snapshot_audits(children[2].log)
        cluster.down()
    report["total_s"] = time.perf_counter() - started
    return report


def drifted(report: dict[str, Any]) -> bool:
    return bool((report.get("audits") or {}).get("drift"))


def snapshot_audits(operator_log: Path) -> dict[str, int]:
    """How many audits of the operator's kept snapshot found no drift, how many found some
    (each logged by operator/standing_view.py)."""
    text = operator_log.read_text(errors="replace") if operator_log.exists() else ""
    return {
        "clean": text.count("snapshot audit: no drift"),
        "drift": len(re.findall(r"snapshot audit: \d+ difference", text)),
    }


def main() -> None:
    # The bench's own watches are re-opened when the server ends a stream; that is not news.
    logging.getLogger("gangshare.kube").setLevel(logging.CRITICAL)
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--gang-pods", type=int, default=512)
    parser.add_argument("--reclaims", type=int, default=5)
    parser.add_argument("--big-reclaim", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per wait")
    parser.add_argument("--json", type=Path, help="write the report here too")
    parser.add_argument(
        "--forecast-period",
        type=float,
        default=30.0,
        help="the operator's --forecast-period (start-time forecasts; 0: off, to compare)",
    )
    parser.add_argument(
        "--backlog",
        type=int,
        default=0,
        help="one-GPU jobs left waiting on a small queue's quota through the scenarios, so "
        "that forecasts replay them (see Scale.backlog)",
    )
    parser.add_argument(
        "--audit-seconds",
        type=float,
        default=AUDIT_SECONDS,
        help="the operator's --snapshot-audit-seconds (a rebuild compared with the snapshot "
        "its passes keep; any drift fails the run)",
    )
    parser.add_argument(
        "--profile", type=Path, help="py-spy the operator and extender per scenario into here"
    )
    parser.add_argument(
        "--only",
        nargs="*",
        help="run only these scenarios (gang jobs borrowers reclaim big-reclaim)",
    )
    args = parser.parse_args()
    report = run(args)
    print_report(report, args.audit_seconds)
    print(f"total {report['total_s']:.0f} s (cluster up {report.get('cluster_up_s', 0):.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    if report["error"] or report["lost"] or report["double_held"] or drifted(report):
        print(f"FAILED: {report['error'] or 'invariant broken'}", file=sys.stderr)
        raise SystemExit(1)


if __name__ == "__main__":
    main()
