"""The operator's admission pass through the real API server, at 1,000 and 10,000 queued jobs.

One LocalCluster (etcd, kube-apiserver, kube-scheduler, KWOK) of `--nodes` nodes x 8 GPUs in
two NVLink islands, with crds/ installed as `kubectl apply -f crds/` does. For each size the
bench creates that many TrainingJobs (bench/operator_cycle.py's Philly-like size mix, 8
namespaces, 4 Queues) from a thread pool, and writes each one's status as the operator's first
reconcile would (`detect_actions` on the new job: phase Queued, queuedAt, conditions; its
"Queued" event is not posted). The Queues have `--quota` GPUs of nominalGPUs each and no
cohort, so one pass admits only a few hundred GPUs' worth of gangs (their pods are created
too) however many jobs wait; the rest stay Queued with a pending reason.

The operator's SchedulerLoop then runs in this process as a freshly started leader does (no
kopf): its watch-fed stores (operator/informers.py) list jobs, nodes and pods once ("sync s",
and "cache MB", the RSS they add), then `run_once()` is timed `--passes` times, 2 s apart: the
first pass (admissions, the first pending reasons), then the passes after it.
With `--lists` the loop reads by LIST every pass instead, as it did before the stores. Per pass:
  pass s      run_once() wall time;     read s     the reads (stores or lists) + snapshot
  decision s  schedule_cycle alone (the operator's gangshare_admission_decision_seconds)
  writes s    admissions, pending reasons, events, queue statuses (the rest of report.seconds)
  reconc. s   pods of the admitted gangs and the backstop resync (run_once's tail)
  reasons     pending-reason status writes (at most 200 a pass; operator/pending.py)
  resync      jobs reconciled by the backstop resync (at most 32 a pass)
  op req      the operator's own API requests (counted in its client)
  adm/adm     of those, the ones not about pending reasons (the reason writes and their
              events), per admitted job: what admitting a job costs in the operator
  srv/adm     kube-apiserver's apiserver_request_total delta, all clients (scheduler binds,
              KWOK pod status), less the background rate measured just before, per admitted
              job; node heartbeats (Leases, node status) are left out
  peak MB     growth of this process's peak RSS (VmHWM, reset before the pass) over its RSS
              before the pass;   RSS MB   the process's RSS after the pass
Jobs are deleted (and their pods) between sizes.

    .venv/bin/python bench/operator_scale.py [--nodes 5000] [--jobs 1000 10000] [--quota 64]
                                             [--lists]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client, config

sys.path.insert(0, str(Path(__file__).parent))
from gangshare.core.clock import WallClock
from gangshare.core.queueing import Ordering, QueuePolicy
from gangshare.core.spec import parse_cluster_spec
from gangshare.dev import binaries
from gangshare.dev.cluster import LocalCluster
from gangshare.kube.client import connect
from gangshare.kube.queue import QUEUE_PLURAL
from gangshare.kube.trainingjob import API_VERSION, GROUP, KIND, PLURAL, VERSION
from gangshare.operator.actions import Observation
from gangshare.operator.informers import Informers
from gangshare.operator.kubeapi import KubeApi
from gangshare.operator.lifecycle import detect_actions
from gangshare.operator.metrics import OperatorMetrics
from gangshare.operator.reconcile import OperatorOptions, Reconciler
from gangshare.operator.scheduler import SchedulerLoop
from operator_cycle import SIZES, job

NAMESPACES = [f"team-{i}" for i in range(8)]  # job() spreads jobs over these and queues q0..q3
QUEUES = [f"q{i}" for i in range(4)]
CRDS = ["crd/trainingjobs.gangshare.io", "crd/queues.gangshare.io"]
SAMPLE = re.compile(r"^apiserver_request_total\{(.*)\} (\S+)$", re.M)
LABEL = re.compile(r'(\w+)="([^"]*)"')


def vm_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def reset_peak_rss() -> None:
    with contextlib.suppress(OSError):  # Linux >= 4.0: "5" resets VmHWM to the current RSS
        Path("/proc/self/clear_refs").write_text("5")


# The node heartbeats of thousands of KWOK nodes (Leases, node status) are a background far
# larger and noisier than what admissions cause; they are left out of srv/adm.
HEARTBEATS = ("leases", "nodes", "nodes/status")


def server_requests(admin: client.ApiClient) -> Counter[str]:
    """kube-apiserver's request counters, as 'VERB resource[/subresource]', heartbeats aside."""
    method, url, headers, _, _ = admin.param_serialize(
        "GET", "/metrics", auth_settings=["BearerToken"]
    )
    response: Any = admin.call_api(method, url, header_params=headers)
    text = response.read().decode()
    counts: Counter[str] = Counter()
    for labels, value in SAMPLE.findall(text):
        tags = dict(LABEL.findall(labels))
        what = tags.get("resource") or "(non-resource)"
        if tags.get("subresource"):
            what += "/" + tags["subresource"]
        if what not in HEARTBEATS:
            counts[f"{tags.get('verb', '?')} {what}"] += int(float(value))
    return counts


def count_requests(api_client: client.ApiClient) -> Counter[str]:
    """Counts every request made through `api_client` as 'METHOD path template'."""
    counts: Counter[str] = Counter()
    inner = api_client.param_serialize

    def param_serialize(method: str, resource_path: str, *args: Any, **kwargs: Any) -> Any:
        counts[f"{method} {resource_path}"] += 1
        return inner(method, resource_path, *args, **kwargs)

    api_client.param_serialize = param_serialize  # type: ignore[method-assign]
    return counts


def install_crds(kubectl: list[str]) -> None:
    for name in ("trainingjob.yaml", "trainingjob-admission-policy.yaml", "queue.yaml"):
        path = binaries.repo_root() / "crds" / name
        subprocess.run([*kubectl, "apply", "-f", str(path)], check=True, capture_output=True)
    subprocess.run(
        [*kubectl, "wait", "--for=condition=Established", "--timeout=60s", *CRDS],
        check=True,
        capture_output=True,
    )


def create_jobs(custom: client.CustomObjectsApi, count: int, seed: int) -> None:
    """`count` jobs, each created then set Queued as the operator's first reconcile does."""
    rng = random.Random(seed)
    bodies = []
    for i in range(count):
        body = job(f"tj-{i:05d}", *rng.choice(SIZES), rng, {})
        del body["status"], body["metadata"]["uid"], body["metadata"]["generation"]
        bodies.append({"apiVersion": API_VERSION, "kind": KIND, **body})

    def one(body: dict[str, Any]) -> None:
        namespace = body["metadata"]["namespace"]
        response: Any = custom.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, body, _preload_content=False
        )
        created = json.loads(response.data)
        seen = Observation(created, [], False, time.time())
        status = detect_actions(seen, OperatorOptions().scheduler_name).status
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, created["metadata"]["name"], {"status": status}
        )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, bodies))


def clear_jobs(core: client.CoreV1Api, custom: client.CustomObjectsApi) -> None:
    for namespace in NAMESPACES:
        custom.delete_collection_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        jobs: Any = custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        jobs = jobs["items"]
        pods = sum(len(core.list_namespaced_pod(ns).items) for ns in NAMESPACES)
        if not jobs and not pods:
            return
        time.sleep(1)
    raise SystemExit("jobs or pods of the last size were not deleted within 300 s")


def timed_pass(loop: SchedulerLoop, ours: Counter[str], admin: client.ApiClient) -> dict[str, Any]:
    """One run_once(), with its phases, requests and memory."""
    before_server = server_requests(admin)
    time.sleep(2)
    background = sum((server_requests(admin) - before_server).values()) / 2
    gc.collect()
    ours.clear()
    before_server = server_requests(admin)
    rss = vm_kb("VmRSS")
    reset_peak_rss()
    events = loop.pending.events_posted
    started = time.perf_counter()
    report = loop.run_once()
    seconds = time.perf_counter() - started
    peak = vm_kb("VmHWM")
    server = server_requests(admin) - before_server
    if report.skipped:
        raise SystemExit(f"the pass was skipped: {report.skipped}")
    return {
        "pass": seconds,
        "read": report.read_seconds,
        "decision": report.decision_seconds,
        "writes": report.seconds - report.read_seconds - report.decision_seconds,
        "reconcile": seconds - report.seconds,
        "admitted": len(report.admitted),
        "reasons": report.reasons_written,
        "reason_events": loop.pending.events_posted - events,
        "resynced": report.resynced,
        "ours": Counter(ours),
        "server": max(0.0, sum(server.values()) - background * seconds),
        "peak": (peak - rss) / 1024,
        "rss_after": vm_kb("VmRSS") / 1024,
    }


HEADER = (
    f"{'jobs':>6} {'nodes':>6} {'pass':<7}{'pass s':>8}{'read s':>8}{'decide s':>9}{'write s':>8}"
    f"{'reconc. s':>10}{'admitted':>9}{'reasons':>8}{'resync':>7}{'op req':>8}{'adm/adm':>8}"
    f"{'srv/adm':>8}{'peak MB':>8}{'RSS MB':>8}"
)


def print_row(size: int, nodes: int, label: str, r: dict[str, Any]) -> None:
    ours, admitted = sum(r["ours"].values()), r["admitted"]
    # The operator's requests for admitting, less those telling waiting jobs why they wait.
    admitting = ours - r["reasons"] - r["reason_events"]
    per = [f"{n / admitted:>8.1f}" if admitted else f"{'-':>8}" for n in (admitting, r["server"])]
    print(
        f"{size:>6} {nodes:>6} {label:<7}{r['pass']:>8.2f}{r['read']:>8.2f}{r['decision']:>9.3f}"
        f"{r['writes']:>8.2f}{r['reconcile']:>10.2f}{admitted:>9}{r['reasons']:>8}"
        f"{r['resynced']:>7}{ours:>8}{''.join(per)}{r['peak']:>8.1f}{r['rss_after']:>8.0f}"
    )


def start_loop(
    kubeconfig: str, lists: bool
) -> tuple[SchedulerLoop, Counter[str], threading.Event, dict[str, float]]:
    """A SchedulerLoop as the operator builds it (synced stores unless `lists`), the counter
    of its API requests, the event that stops its watches, and the stores' sync figures."""
    api_client = connect(kubeconfig)
    counted = count_requests(api_client)
    api = KubeApi(api_client)
    stop, informers, figures = threading.Event(), None, {"sync": 0.0, "cache": 0.0}
    if not lists:
        gc.collect()
        rss, started = vm_kb("VmRSS"), time.perf_counter()
        informers = Informers()
        informers.start(connect(kubeconfig), stop)
        if not informers.wait_synced(600):
            raise SystemExit("the operator's watches did not sync within 600 s")
        figures = {"sync": time.perf_counter() - started, "cache": (vm_kb("VmRSS") - rss) / 1024}
        api.on_job_written = informers.jobs.assume
    clock, metrics = WallClock(), OperatorMetrics()
    policy = QueuePolicy(ordering=Ordering.PRIORITY)  # the operator's default
    reconciler = Reconciler(api, clock, OperatorOptions(), metrics)
    loop = SchedulerLoop(api, reconciler, policy, clock, metrics=metrics, informers=informers)
    return loop, counted, stop, figures


def run(args: argparse.Namespace) -> None:
    bins = binaries.bin_dir(build=True)
    pool = {
        "name": "bench",
        "count": args.nodes,
        "gpusPerNode": 8,
        "racks": [f"rack-{r}" for r in range(max(1, args.nodes // 40))],
        "nvlinkIslands": [[0, 1, 2, 3], [4, 5, 6, 7]],
    }
    cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="gangshare-bench-")), bins, attached=True)
    results: dict[int, list[dict[str, Any]]] = {}
    try:
        started = time.perf_counter()
        state = cluster.up(parse_cluster_spec({"nodePools": [pool]}), timeout=1800)
        print(f"cluster of {args.nodes} KWOK nodes up in {time.perf_counter() - started:.0f} s")
        install_crds([str(bins / "kubectl"), f"--kubeconfig={state.kubeconfig}"])
        admin = config.new_client_from_config(config_file=state.kubeconfig)  # type: ignore[no-untyped-call]
        loader = connect(state.kubeconfig, pool_size=16)
        core, custom = client.CoreV1Api(loader), client.CustomObjectsApi(loader)
        for namespace in NAMESPACES:
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
        for name in QUEUES:
            body = {"apiVersion": API_VERSION, "kind": "Queue", "metadata": {"name": name}}
            body["spec"] = {"nominalGPUs": args.quota}
            custom.create_cluster_custom_object(GROUP, VERSION, QUEUE_PLURAL, body)
        print(f"{len(QUEUES)} queues x {args.quota} GPUs of quota, no cohort\n")
        mode = "LIST every pass" if args.lists else "watch-fed stores"
        for size in args.jobs:
            started = time.perf_counter()
            create_jobs(custom, size, seed=size)
            print(f"({size} jobs created and Queued in {time.perf_counter() - started:.1f} s)")
            gc.collect()
            loop, counted, stop, figures = start_loop(state.kubeconfig, args.lists)
            print(f"reads: {mode}; sync {figures['sync']:.1f} s, cache {figures['cache']:.0f} MB")
            passes = [timed_pass(loop, counted, admin) for _ in range(args.passes)]
            results[size] = passes
            print(HEADER)
            for i, one in enumerate(passes):
                print_row(size, args.nodes, ("first", "next")[min(i, 1)], one)
            print("   operator requests in the first pass:")
            for what, n in passes[0]["ours"].most_common(8):
                print(f"   {n:>7}  {what}")
            stop.set()
            del loop
            started = time.perf_counter()
            clear_jobs(core, custom)
            print(f"(jobs deleted in {time.perf_counter() - started:.1f} s)\n")
    finally:
        cluster.down()
    small, large = min(results), max(results)
    if small != large:
        a, b = results[small][0], results[large][0]
        print(f"growth {small} -> {large} jobs (first pass, x{large / small:.0f} jobs):")
        for key in ("pass", "read", "decision", "peak", "rss_after"):
            print(f"   {key:<9} x{b[key] / max(a[key], 1e-9):.1f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--quota", type=int, default=64, help="nominalGPUs of each of 4 queues")
    parser.add_argument("--lists", action="store_true", help="LIST every pass (no stores)")
    parser.add_argument("--passes", type=int, default=3, help="timed passes per size, 2 s apart")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
