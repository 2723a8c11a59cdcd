"""`gangshare extender`: the scheduler extender service (uvicorn + FastAPI)."""

from __future__ import annotations

import argparse
import logging
import os
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
    ext.add_argument("--host", default=env("GANGSHARE_EXTENDER_HOST", "0.0.0.0"))
    ext.add_argument("--port", type=int, default=int(env("GANGSHARE_EXTENDER_PORT", "8888")))
    ext.add_argument(
        "--assume-ttl",
        type=float,
        default=30.0,
        help="seconds a bind in flight holds its GPUs before the cache forgets it",
    )
    ext.add_argument(
        "--record",
        type=Path,
        default=None,
        help="debugging: save the first request body of each verb into this folder",
    )
    ext.add_argument("--verbose", action="store_true")
    ext.set_defaults(run=run_extender)


def run_extender(args: argparse.Namespace) -> int:
    import uvicorn

    from gangshare.core.clock import WallClock
    from gangshare.extender.app import create_app
    from gangshare.extender.binder import Binder
    from gangshare.extender.cache import ClusterCache
    from gangshare.extender.metrics import ExtenderMetrics
    from gangshare.extender.watch import start_watches
    from gangshare.operator.kubeapi import connect

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
    app = create_app(cache, Binder(api_client), ExtenderMetrics(), args.record)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    finally:
        stop.set()
    return 0
