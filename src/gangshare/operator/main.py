"""`gangshare operator`: the global scheduler as a kopf operator."""

from __future__ import annotations

import argparse
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from gangshare.core.clock import WallClock
from gangshare.core.queueing import Ordering, QueuePolicy
from gangshare.kube.snapshot_drift import AUDIT_SECONDS

log = logging.getLogger("gangshare.operator")


def add_operator_command(commands: Any) -> None:
    op = commands.add_parser(
        "operator", help="run the TrainingJob operator (gang admission, lifecycle)"
    )
    env = os.environ.get
    op.add_argument(
        "--kubeconfig", default=env("KUBECONFIG"), help="default: in-cluster, then ~/.kube/config"
    )
    op.add_argument(
        "--liveness",
        default=env("GANGSHARE_LIVENESS", "http://0.0.0.0:8080/healthz"),
        help="kopf liveness endpoint URL",
    )
    op.add_argument(
        "--scheduler-name", default=env("GANGSHARE_SCHEDULER_NAME", "gangshare-scheduler")
    )
    op.add_argument("--cycle-interval", type=float, default=env("GANGSHARE_CYCLE_INTERVAL", "1.0"))
    op.add_argument(
        "--forecast-period",
        type=float,
        default=env("GANGSHARE_FORECAST_PERIOD", "30"),
        help="seconds between start-time forecasts of waiting jobs (status.forecast; at least "
        "20x what the last one took); 0 turns them off",
    )
    op.add_argument(
        "--ordering",
        choices=[o.value for o in Ordering],
        default=env("GANGSHARE_ORDERING", "Priority"),
    )
    op.add_argument(
        "--small-job-max-gpus",
        type=int,
        default=None,
        help="multi-queue: jobs with at most this many GPUs wait in their own lane",
    )
    op.add_argument("--fair-share", action="store_true", help="serve queues by usage/weight")
    op.add_argument(
        "--backfill", action="store_true", help="EASY backfill with predicted run times"
    )
    op.add_argument(
        "--starvation-seconds",
        type=_seconds,
        default=None,
        help="a head blocked by its queue's quota this long gets the quota outright: no other "
        "job of its queue starts guaranteed before it (default: off)",
    )
    op.add_argument(
        "--reclaim-min-runtime",
        type=_seconds,
        default=0.0,
        help="seconds a borrower runs before reclaim may evict it",
    )
    op.add_argument(
        "--max-evictions",
        type=_count,
        default=None,
        help="a borrower evicted this many times runs to its end (default: no cap)",
    )
    op.add_argument(
        "--quota",
        action="append",
        default=[],
        metavar="QUEUE=GPUS",
        help="guaranteed GPU quota of a queue (repeatable)",
    )
    op.add_argument(
        "--max-priority",
        action="append",
        default=[],
        metavar="QUEUE=PRIORITY",
        help="highest spec.priority a queue accepts; '*' for every queue not named (repeatable)",
    )
    op.add_argument(
        "--start-timeout",
        type=float,
        default=env("GANGSHARE_START_TIMEOUT", "120"),
        help="seconds an admitted gang may take to have every worker bound before its GPUs "
        "are released and it is requeued",
    )
    op.add_argument(
        "--unschedulable-release",
        type=float,
        default=5.0,
        help="seconds after a gang's first worker was bound that a sibling kube-scheduler "
        "refuses for a reason of its own (pod affinity, spread, volumes, ports) releases the "
        "whole gang (no partial gang runs longer)",
    )
    op.add_argument(
        "--stuck-pod-seconds",
        type=float,
        default=60.0,
        help="a pod this long past its deletion deadline is force-deleted (its node is dead)",
    )
    op.add_argument(
        "--image-pull-grace",
        type=float,
        default=300.0,
        help="seconds the kubelet may retry a failing image pull before the gang restarts",
    )
    op.add_argument(
        "--stall-seconds",
        type=float,
        default=120.0,
        help="liveness fails when no scheduling pass has finished for this long",
    )
    op.add_argument(
        "--snapshot-audit-seconds",
        type=float,
        default=AUDIT_SECONDS,
        help="seconds between audits of the pass's snapshot (kept from watch changes): a "
        "rebuild from every object, compared; drift is counted, logged and repaired",
    )
    op.add_argument("--user-error-retries", type=int, default=0)
    op.add_argument(
        "--backoff-base-seconds",
        type=float,
        default=10.0,
        help="first gang-restart delay; doubles per restart up to 10 minutes",
    )
    op.add_argument(
        "--metrics-address",
        default=env("GANGSHARE_METRICS_ADDRESS", "0.0.0.0:8081"),
        help="HOST:PORT of Prometheus /metrics (gangshare_* series); empty: no metrics server",
    )
    op.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="act only while holding the leader Lease, so several replicas may run (one acts); "
        "--no-leader-elect for a single process that must act at once",
    )
    op.add_argument("--lease-name", default="gangshare-operator", help="the leader Lease's name")
    op.add_argument(
        "--lease-namespace",
        default=env("POD_NAMESPACE", "default"),
        help="namespace of the leader Lease (default: $POD_NAMESPACE, else default)",
    )
    op.add_argument("--verbose", action="store_true")
    op.set_defaults(run=run_operator)


def parse_quotas(values: list[str]) -> dict[str, int]:
    quotas = {}
    for value in values:
        queue, _, amount = value.partition("=")
        if not queue or not amount.isdigit():
            raise SystemExit(f"error: --quota {value!r}: expected QUEUE=GPUS, e.g. research=16")
        quotas[queue] = int(amount)
    return quotas


def parse_priority_limits(values: list[str]) -> dict[str, int]:
    limits = {}
    for value in values:
        queue, _, amount = value.partition("=")
        try:
            limits[queue] = int(amount)
        except ValueError:
            queue = ""
        if not queue:
            raise SystemExit(
                f"error: --max-priority {value!r}: expected QUEUE=PRIORITY, e.g. research=100"
            )
    return limits


API_CONNECTIONS = 64


def run_operator(args: argparse.Namespace) -> int:
    import kopf

    from gangshare.kube.client import connect
    from gangshare.operator.batch_reconcile import BatchReconciler
    from gangshare.operator.batchapi import BatchApi
    from gangshare.operator.first_queue import FIRST_QUEUE_GRACE_SECONDS
    from gangshare.operator.handlers import build_registry, pod_listener
    from gangshare.operator.informers import Informers
    from gangshare.operator.kubeapi import KubeApi
    from gangshare.operator.leader import LeaderElector
    from gangshare.operator.lifecycle import Limits
    from gangshare.operator.metrics import OperatorMetrics, serve
    from gangshare.operator.reconcile import OperatorOptions, Reconciler
    from gangshare.operator.scheduler import SchedulerLoop
    from gangshare.operator.store_steps import CachedReads

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # kopf's own login reads it
    policy = QueuePolicy(
        ordering=Ordering(args.ordering),
        small_job_max_gpus=args.small_job_max_gpus,
        fair_share=args.fair_share,
        backfill=args.backfill,
        starvation_seconds=args.starvation_seconds,
        reclaim_min_runtime_seconds=args.reclaim_min_runtime,
        max_evictions_per_job=args.max_evictions,
        quotas=parse_quotas(args.quota),
        max_priority=parse_priority_limits(args.max_priority),
    )
    # One connection per thread that calls at once (the pass's and the reconcilers' workers,
    # their per-pod calls): at the default 10, a busy minute discarded connections and paid a
    # TLS handshake for each new one.
    api = KubeApi(connect(args.kubeconfig, pool_size=API_CONNECTIONS))
    clock = WallClock()
    options = OperatorOptions(
        scheduler_name=args.scheduler_name,
        user_error_retries=args.user_error_retries,
        backoff_base_seconds=args.backoff_base_seconds,
        limits=Limits(
            start_timeout_seconds=args.start_timeout,
            stuck_pod_seconds=args.stuck_pod_seconds,
            image_pull_grace_seconds=args.image_pull_grace,
            unschedulable_seconds=args.unschedulable_release,
            # The scheduling pass runs beside the reconciler and writes new jobs' first status.
            first_queue_grace_seconds=FIRST_QUEUE_GRACE_SECONDS,
        ),
    )
    metrics = OperatorMetrics()
    try:
        serve(metrics, args.metrics_address)
    except (OSError, ValueError) as err:
        raise SystemExit(f"error: --metrics-address {args.metrics_address!r}: {err}") from None
    elector = None
    leading: Callable[[], bool] = always
    if args.leader_elect:
        elector = LeaderElector(
            api, args.lease_namespace, args.lease_name, api.instance, on_lost=exit_on_lost
        )
        leading = elector.is_leader
        # The write fence: a reconcile or pass in flight when the lead is lost writes nothing
        # more (a standby may take over 5 s after the lead is lost here, not before).
        api.fence = elector.is_leader
        log.info(
            "leader election on Lease %s/%s as %s",
            args.lease_namespace,
            args.lease_name,
            api.instance,
        )
    metrics.leader.set_function(lambda: float(leading()))
    reconciler = Reconciler(api, clock, options, metrics)
    # batch/v1 Jobs labelled gangshare.io/queue are queued as gangs too (kube/batchjob.py).
    reconciler.batch = BatchReconciler(
        api,
        BatchApi(api),
        clock,
        options.limits,
        options.backoff_base_seconds,
        scheduler_name=args.scheduler_name,
        metrics=reconciler.metrics,
    )
    # The loop reads from watch-fed stores; a standby keeps them warm too, so a new leader's
    # first pass needs no listing.
    informers, watching = Informers(), threading.Event()
    informers.start(connect(args.kubeconfig), watching)
    api.on_job_written = informers.jobs.assume
    api.on_pod_written = informers.pods.assume
    reconciler.pods_on_node = informers.live_pods_on_node
    reconciler.cached = CachedReads(informers.jobs.get, informers.live_pods_of_job)
    loop = SchedulerLoop(
        api,
        reconciler,
        policy,
        clock,
        args.cycle_interval,
        metrics=metrics,
        leading=leading,
        informers=informers,
    )
    loop.forecasts.period_seconds = args.forecast_period
    if loop.view is not None:
        loop.view.audit_seconds = args.snapshot_audit_seconds
    loop.forecast_beside_the_pass()
    informers.listen_to_pods(pod_listener(reconciler, loop, leading))
    thread = threading.Thread(target=loop.run_forever, name="gangshare-scheduler", daemon=True)
    thread.start()
    if elector is not None:

        def elected() -> None:
            # Pod groups a standby ignored are adopted; the first pass as leader starts at once.
            informers.replay_pod_groups()
            loop.poke()

        elector.on_elected = elected
        threading.Thread(target=elector.run, name="gangshare-leader", daemon=True).start()
    try:
        kopf.run(
            registry=build_registry(reconciler, loop, args.stall_seconds, leading),
            clusterwide=True,
            standalone=True,
            liveness_endpoint=args.liveness,
        )
    finally:
        loop.stop()
        watching.set()
        thread.join(timeout=10)
        if elector is not None:
            elector.stop()
            elector.release()  # after the loop stopped: nothing acts once a standby may
    return 0


def always() -> bool:
    """Without leader election this process always acts."""
    return True


def exit_on_lost(why: str) -> None:
    """A replica that lost the Lease exits at once, with status 1: whatever it was doing may
    now be done by the new leader, and a restart comes back as a plain standby."""
    log.critical("leadership lost (%s): exiting so that only the new leader acts", why)
    logging.shutdown()
    os._exit(1)


def _seconds(text: str) -> float:
    """A non-negative number of seconds (argparse names the flag in its error)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value
