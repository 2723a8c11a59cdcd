"""`gangshare queue`: a queue's (or a cohort's) waiting workloads in the order they are
forecast to start, with their forecast, what blocks them and their class.

Reads TrainingJobs from any cluster in the kubeconfig (every queued Job, JobSet, PyTorchJob,
TrainJob and pod group has one: its KIND column says which). What it shows is what the
operator last wrote into status.forecast; a job the operator has not forecast yet is listed
last, with its status message.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from gangshare.kube.snapshot import parse_time
from gangshare.kube.trainingjob import GROUP, PLURAL, VERSION

REASON_WIDTH = 70


@dataclass(frozen=True)
class Row:
    position: str
    queue: str
    name: str
    kind: str
    service_class: str
    gpus: int
    forecast: str
    waited: str
    reason: str


def add_queue_command(commands: Any) -> None:
    view = commands.add_parser(
        "queue", help="list a queue's or cohort's waiting workloads: position, forecast, reason"
    )
    view.add_argument("name", nargs="?", help="the queue (or, with --cohort, the cohort)")
    view.add_argument("--cohort", action="store_true", help="NAME is a cohort, not a queue")
    view.add_argument("-n", "--namespace", help="only this namespace (default: all)")
    view.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube)")
    view.add_argument("--wide", action="store_true", help="reasons in full")
    view.set_defaults(run=run_queue_view)


def run_queue_view(args: argparse.Namespace) -> int:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from gangshare.kube.client import connect

    found: dict[str, Any]
    try:
        api = client.CustomObjectsApi(connect(args.kubeconfig))
        if args.namespace:
            found = cast(
                dict[str, Any],
                api.list_namespaced_custom_object(GROUP, VERSION, args.namespace, PLURAL),
            )
        else:
            found = cast(dict[str, Any], api.list_cluster_custom_object(GROUP, VERSION, PLURAL))
    except ApiException as err:
        print(f"error: cannot list TrainingJobs: {err.status} {err.reason}", file=sys.stderr)
        return 1
    except Exception as err:  # no kubeconfig, unreachable server: said in one line
        print(f"error: cannot reach the cluster: {err}", file=sys.stderr)
        return 1
    rows = queue_rows(found.get("items") or [], time.time(), args.name, cohort=args.cohort)
    print(render(rows, wide=args.wide))
    return 0


def queue_rows(
    jobs: Iterable[Mapping[str, Any]], now: float, name: str | None = None, cohort: bool = False
) -> list[Row]:
    """The waiting jobs of queue `name` (or of cohort `name`; all queues when None), in the
    order they are forecast to start."""
    chosen = []
    for job in jobs:
        status, spec = job.get("status") or {}, job.get("spec") or {}
        if status.get("phase") != "Queued":
            continue
        forecast = status.get("forecast") or {}
        if name is not None:
            if cohort and forecast.get("cohort") != name:
                continue
            if not cohort and spec.get("queue", "default") != name:
                continue
        chosen.append(job)
    position_field = "positionInCohort" if cohort else "positionInQueue"

    def order(job: Mapping[str, Any]) -> tuple[object, ...]:
        status = job.get("status") or {}
        forecast = status.get("forecast") or {}
        position = forecast.get(position_field)
        queue = "" if cohort else (job.get("spec") or {}).get("queue", "default")
        queued_at = parse_time(status.get("queuedAt")) or 0.0
        return (queue, position is None, position or 0, queued_at)

    return [_row(job, now, position_field) for job in sorted(chosen, key=order)]


def _row(job: Mapping[str, Any], now: float, position_field: str) -> Row:
    meta, spec, status = job.get("metadata") or {}, job.get("spec") or {}, job.get("status") or {}
    forecast = status.get("forecast") or {}
    position = forecast.get(position_field)
    start = parse_time(forecast.get("startTime"))
    if forecast and start is None:
        when = "not within a week"
    elif start is None:
        when = "not yet forecast"
    else:
        when = f"{_in_words(start - now)} ({forecast['startTime']})"
    queued_at = parse_time(status.get("queuedAt"))
    return Row(
        position=str(position) if position is not None else "-",
        queue=str(spec.get("queue", "default")),
        name=f"{meta.get('namespace')}/{meta.get('name')}",
        kind=str((spec.get("jobRef") or {}).get("kind") or "TrainingJob"),
        service_class=str(spec.get("serviceClass", "Guaranteed")),
        gpus=_gpus(spec),
        forecast=when,
        waited=_in_words(now - queued_at, ago=True) if queued_at is not None else "-",
        reason=str(forecast.get("blockedBy") or status.get("message") or ""),
    )


def _gpus(spec: Mapping[str, Any]) -> int:
    groups = spec.get("replicaGroups")
    if groups:
        return sum(int(g.get("replicas", 1)) * int(g.get("gpus", 0)) for g in groups)
    return int(spec.get("workers", 1)) * int(spec.get("gpusPerWorker", 0))


def _in_words(seconds: float, ago: bool = False) -> str:
    if seconds < 60:
        return "now" if not ago else f"{max(0, round(seconds))}s"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            value = f"{round(seconds / size)}{unit}"
            return value if ago else f"in ~{value}"
    return ""


def render(rows: Sequence[Row], wide: bool = False) -> str:
    if not rows:
        return "No waiting workloads."
    header = ("POS", "QUEUE", "WORKLOAD", "KIND", "CLASS", "GPUS", "FORECAST", "WAITED", "REASON")
    table = [header]
    for row in rows:
        reason = row.reason
        if not wide and len(reason) > REASON_WIDTH:
            reason = reason[: REASON_WIDTH - 3] + "..."
        table.append(
            (
                row.position,
                row.queue,
                row.name,
                row.kind,
                row.service_class,
                str(row.gpus),
                row.forecast,
                row.waited,
                reason,
            )
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(header) - 1)]
    return "\n".join(
        "   ".join(cell.ljust(width) for cell, width in zip(line[:-1], widths, strict=True))
        + "   "
        + line[-1]
        for line in table
    )
