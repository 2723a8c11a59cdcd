"""`gangshare extender`: the scheduler extender service (uvicorn + FastAPI).

Two listeners in one process: the verbs (filter, prioritize, bind) for kube-scheduler,
on loopback unless TLS with client certificates authenticates the caller; and
/healthz, /readyz, /metrics on a port of their own for probes and Prometheus.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import ssl
import threading
from pathlib import Path
from typing import Any


def add_extender_command(commands: Any) -> None:
    ext = commands.add_parser(
        "extender", help="run the kube-scheduler extender (filter, prioritize, bind)"
    )
    env = os.environ.get
    ext.add_argument(
        "--kubeconfig", default=env("KUBECONFIG"), help="default: in-cluster, then ~/.kube/config"
    )
    ext.add_argument(
        "--host",
        default=env("GANGSHARE_EXTENDER_HOST", "127.0.0.1"),
        help="address of the verbs; loopback unless --tls-cert/--tls-key/--client-ca are given",
    )
    ext.add_argument("--port", type=int, default=env("GANGSHARE_EXTENDER_PORT", "8888"))
    ext.add_argument(
        "--metrics-host",
        default=env("GANGSHARE_EXTENDER_METRICS_HOST", "0.0.0.0"),
        help="address of /healthz, /readyz and /metrics (no verbs there)",
    )
    ext.add_argument(
        "--metrics-port", type=int, default=env("GANGSHARE_EXTENDER_METRICS_PORT", "8889")
    )
    ext.add_argument(
        "--scheduler-name",
        action="append",
        default=None,
        help="schedulerName whose pods bind may bind (repeatable; default gangshare-scheduler)",
    )
    ext.add_argument("--tls-cert", type=Path, default=None, help="serving certificate (PEM)")
    ext.add_argument("--tls-key", type=Path, default=None, help="serving key (PEM)")
    ext.add_argument(
        "--client-ca",
        type=Path,
        default=None,
        help="CA whose client certificates may call the verbs (required with --tls-cert)",
    )
    ext.add_argument(
        "--assume-ttl",
        type=float,
        default=660.0,
        help=(
            "backstop, in seconds: what filter hands a pod is held until its bind ends (the "
            "binding seen, the pod deleted or filtered again, the bind failed), or after this "
            "long without any sign that the pod still waits (a verb naming it, a watched update "
            "showing it unbound). Default 660: longer than kube-scheduler's VolumeBinding "
            "bindTimeoutSeconds (600), for which PreBind may wait on a volume with no sign"
        ),
    )
    ext.add_argument(
        "--record",
        type=Path,
        default=None,
        help="debugging: save the first request body of each verb into this folder",
    )
    ext.add_argument("--verbose", action="store_true")
    ext.set_defaults(run=run_extender)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def verbs_exposure_error(args: argparse.Namespace) -> str | None:
    """Why these flags would expose the verbs to callers nobody authenticates."""
    tls = [args.tls_cert, args.tls_key, args.client_ca]
    if any(tls) and not all(tls):
        return "--tls-cert, --tls-key and --client-ca go together"
    if not all(tls) and not is_loopback(args.host):
        return (
            f"--host {args.host}: the verbs bind pods to nodes, so they listen on loopback "
            "(kube-scheduler beside them) unless --tls-cert, --tls-key and --client-ca make "
            "every caller show a client certificate"
        )
    if args.port == args.metrics_port:
        return "--port and --metrics-port must differ"
    return None


def run_extender(args: argparse.Namespace) -> int:
    import asyncio

    import uvicorn
    import uvloop

    from gangshare.core.clock import WallClock
    from gangshare.extender.app import (
        DEFAULT_SCHEDULER_NAMES,
        LOOPBACK,
        VerbsApp,
        create_ops_app,
    )
    from gangshare.extender.binder import Binder
    from gangshare.extender.cache import ClusterCache
    from gangshare.extender.health import Health
    from gangshare.extender.metrics import ExtenderMetrics
    from gangshare.extender.watch import start_watches
    from gangshare.kube.client import connect

    problem = verbs_exposure_error(args)
    if problem is not None:
        raise SystemExit(f"error: {problem}")
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    api_client = connect(args.kubeconfig)
    cache = ClusterCache(WallClock(), assume_ttl=args.assume_ttl)
    stop = threading.Event()
    start_watches(api_client, cache, stop)

    def expire() -> None:
        while not stop.wait(5.0):
            cache.expire_assumptions()

    threading.Thread(target=expire, name="assume-expiry", daemon=True).start()
    if args.record is not None:
        args.record.mkdir(parents=True, exist_ok=True)
    tls = args.tls_cert is not None
    metrics, health = ExtenderMetrics(), Health(cache)
    verbs = VerbsApp(
        cache,
        Binder(api_client.configuration),
        metrics,
        args.record,
        trusted_peers=None if tls else LOOPBACK,
        scheduler_names=frozenset(args.scheduler_name or DEFAULT_SCHEDULER_NAMES),
        health=health,
    )
    servers = [
        uvicorn.Server(
            uvicorn.Config(
                verbs,
                host=args.host,
                port=args.port,
                log_level="warning",
                access_log=False,
                # The peer check reads the socket's address; no header may stand in for it.
                proxy_headers=False,
                server_header=False,
                date_header=False,
                ssl_certfile=str(args.tls_cert) if tls else None,
                ssl_keyfile=str(args.tls_key) if tls else None,
                ssl_ca_certs=str(args.client_ca) if tls else None,
                ssl_cert_reqs=ssl.CERT_REQUIRED if tls else ssl.CERT_NONE,
            )
        ),
        uvicorn.Server(
            uvicorn.Config(
                create_ops_app(cache, metrics, health),
                host=args.metrics_host,
                port=args.metrics_port,
                log_level="warning",
                access_log=False,
            )
        ),
    ]

    async def serve() -> None:
        await asyncio.gather(*(server.serve() for server in servers))

    try:
        # uvloop, as uvicorn.run would pick: its transports write and wake in C, and the verbs'
        # reads, writes and API calls are most of the extender's CPU per pod.
        uvloop.run(serve())
    finally:
        stop.set()
    return 0
