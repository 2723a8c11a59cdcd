"""Extender benchmarks.

1. filter + prioritize latency over HTTP (nodeCacheCapable requests naming every node) against
   the real extender app under uvicorn, on caches of 1,000 and 5,000 nodes x 8 GPUs, half full.
2. Pods per second bound by the real kube-scheduler on KWOK nodes, with the extender and without
   (extender_cluster.py): back-to-back pairs, every pair and the median ratio printed.

    .venv/bin/python bench/extender.py [--sizes 1000 5000] [--requests 200] [--pods 1000]
        [--rounds 5] [--baseline-src OTHER/src] [--skip-cluster] [--skip-latency]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import subprocess
import sys
import time
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import uvicorn

sys.path.insert(0, str(Path(__file__).parent))
from extender_cluster import throughput
from gangshare.core.clock import WallClock
from gangshare.core.job import ServiceClass
from gangshare.dev import processes
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
    parser.add_argument(
        "--baseline-src",
        type=Path,
        default=None,
        help="also run, in every round, the extender of this source tree (its src folder, put "
        "on PYTHONPATH): an A/B of two extenders in one cluster and run",
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
        throughput(args.pods, args.rounds, args.baseline_src)


if __name__ == "__main__":
    main()
