"""kopf wiring: watches turn into reconciles and scheduler pokes. No decisions here."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from gangshare.core.annotations import JOB_LABEL
from gangshare.kube import podgroup
from gangshare.kube.queue import QUEUE_PLURAL
from gangshare.kube.queued import WorkloadKind, is_queued, was_queued
from gangshare.kube.queued_kinds import KINDS, parent_of
from gangshare.kube.trainingjob import GROUP, PLURAL, VERSION
from gangshare.operator.lifecycle import job_needs_reconcile
from gangshare.operator.reconcile import Reconciler
from gangshare.operator.scheduler import SchedulerLoop

log = logging.getLogger("gangshare.operator")


def pod_listener(
    reconciler: Reconciler, loop: SchedulerLoop, leading: Callable[[], bool] = lambda: True
) -> Callable[[str, dict[str, Any]], None]:
    """What the operator's pod watch (operator/informers.py) does with each event: a gang
    worker's reconciles its job (dispatched, one at a time per job) and wakes the scheduling
    loop. kopf's own pod watch decoded and processed every pod of the cluster a second time."""

    def seen(kind: str, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        job = (meta.get("labels") or {}).get(JOB_LABEL)
        group = podgroup.group_name(pod)
        if group and not job and meta.get("namespace") and leading() and reconciler.batch:
            # A pod group's member not yet resumed as its TrainingJob's (a labelled one is
            # reconciled below): the group is queued once all its pods exist.
            namespace = str(meta["namespace"])
            reconciler.batch.adopt_by_name_later(
                podgroup.PODGROUP, group, namespace, reconciler.reconcile_later
            )
        if not job or not meta.get("namespace") or not leading():
            return
        reconciler.reconcile_later(str(meta["namespace"]), str(job))
        loop.poke()

    return seen


def in_cluster_server(info: kopf.ConnectionInfo, environ: Mapping[str, str]) -> kopf.ConnectionInfo:
    """The API server where client-go's in-cluster config finds it: KUBERNETES_SERVICE_HOST and
    _PORT, which the kubelet sets in every pod. kopf's service-account login names
    https://kubernetes.default.svc, which needs cluster DNS: where a pod cannot resolve it (DNS
    not up yet, a node without it) the operator's watches never started."""
    host = environ.get("KUBERNETES_SERVICE_HOST")
    port = environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return info
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return dataclasses.replace(info, server=f"https://{host}:{port}")


def build_registry(
    reconciler: Reconciler,
    loop: SchedulerLoop,
    stall_seconds: float = 120.0,
    leading: Callable[[], bool] = lambda: True,
) -> kopf.OperatorRegistry:
    """`leading`: whether this replica holds the leader Lease. A standby's watches keep running
    (a new leader needs no warm-up: its passes resync every job nobody reconciled lately, a few
    per pass), but its handlers act on nothing."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # An explicit registry lacks kopf's default login handlers: in-cluster, then KUBECONFIG.
        info: kopf.ConnectionInfo | None = kopf.login_with_service_account(**kwargs)
        if info is not None:
            return in_cluster_server(info, os.environ)
        return kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # gangshare posts its own CamelCase events; kopf's handler chatter would bury them.
        settings.posting.enabled = False
        settings.execution.max_workers = 8
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        # Every other API call kopf makes (patches, events) ends within a minute.
        settings.networking.request_timeout = 60
        settings.networking.connect_timeout = 10

    @kopf.on.probe(id="schedulingLoop", registry=registry)
    def scheduling_loop(**_: Any) -> str:
        # kopf answers the liveness endpoint with 500 when a probe fails for good.
        stalled = loop.stalled(stall_seconds)
        if stalled is not None:
            raise kopf.PermanentError(stalled)
        return "passing"

    def reconcile_quietly(namespace: str, name: str, seen: dict[str, Any]) -> None:
        try:
            # On the reconciler's workers: kopf's own (8) doing a gang's pod creations held up
            # every other job's events (bench/scale.py: 8.7 s from create to Queued).
            reconciler.reconcile_later(namespace, name, seen)
        except Exception:  # the scheduler's resync retries; a watch event must never be fatal
            log.exception("reconcile of %s/%s failed; will retry", namespace, name)

    @kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)
    def job_event(
        type: str, name: str, namespace: str | None, body: Mapping[str, Any], **_: Any
    ) -> None:
        if not leading():
            return
        if type != "DELETED" and namespace and job_needs_reconcile(body):
            reconcile_quietly(namespace, name, dict(body))
        loop.poke()

    def queued_object_event(kind: WorkloadKind, type: str, body: Mapping[str, Any]) -> None:
        # A labelled Job or JobSet: queued through its TrainingJob (made here), reconciled.
        # One that was queued and lost its label: its TrainingJob is reconciled, and released.
        if type == "DELETED" or not leading() or reconciler.batch is None:
            return
        parent = parent_of(kind, body)
        if parent is not None:
            # A TrainJob's JobSet: its parent is the gang (sized from it, now it exists).
            namespace = str((body.get("metadata") or {}).get("namespace", ""))
            reconciler.batch.adopt_by_name_later(*parent, namespace, reconciler.reconcile_later)
            loop.poke()
            return
        if is_queued(body):
            reconciler.batch.adopt_later(kind, dict(body), reconciler.reconcile_later)
        elif was_queued(body):
            meta = body.get("metadata") or {}
            name = kind.workload_name(str(meta.get("name", "")))
            reconciler.reconcile_later(str(meta.get("namespace", "")), name)
        else:
            return
        loop.poke()

    for kind in [k for k in KINDS.values() if not k.virtual]:
        # kopf waits for a kind whose CRD is not installed (JobSet's, Kubeflow's) and follows it
        # once it is. A pod group is followed through the operator's own pod watch.
        # Not filtered by the queue label: a Job whose label is removed must still be seen.
        kopf.on.event(
            kind.group,
            kind.version,
            kind.plural,
            registry=registry,
            id=f"queued-{kind.plural}",
        )(functools.partial(_queued_event, queued_object_event, kind))

    @kopf.on.event(GROUP, VERSION, QUEUE_PLURAL, registry=registry)
    def queue_event(**_: Any) -> None:
        # Quotas, cohorts and accepted sizes changed: inadmissible jobs are judged again.
        if leading():
            loop.poke()

    @kopf.on.event("", "v1", "nodes", registry=registry)
    def node_event(type: str, **_: Any) -> None:
        if type in ("ADDED", "DELETED") and leading():
            loop.poke()

    return registry


def _queued_event(
    handle: Callable[[WorkloadKind, str, Mapping[str, Any]], None],
    kind: WorkloadKind,
    type: str,
    body: Mapping[str, Any],
    **_: Any,
) -> None:
    handle(kind, type, body)
