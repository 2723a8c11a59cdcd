"""The extender's HTTP surfaces: the verbs for kube-scheduler, and health and metrics apart.

- `VerbsApp`: POST /filter, /prioritize, /bind (plus /healthz and /readyz for the
  scheduler's side), a bare ASGI application (asgi.py). Meant to listen on loopback
  inside the scheduler pod; a caller from any other address is refused unless TLS with
  client certificates authenticates it (`trusted_peers=None`). Bind binds only what
  gangshare-scheduler would: a pending, ungated GPU pod of gangshare's scheduler names.
- `create_ops_app`: GET /healthz, /readyz, /metrics, on its own port for probes and
  Prometheus; it has no verbs, so exposing it hands out nothing.

A malformed or oversized request gets a 4xx with a JSON error that names what is
wrong. A well-formed request that cannot be served is answered with `Error` set,
which kube-scheduler turns into a FailedScheduling event on the pod.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gangshare.core.annotations import GANG_BARRIER_REFUSAL
from gangshare.extender.asgi import (
    HttpError,
    Receive,
    Scope,
    Send,
    decode_json,
    encode_json,
    lifespan,
    read_body,
    respond,
)
from gangshare.extender.barrier import (
    BARRIER_SECONDS,
    RefusalCounter,
    gang_not_ready,
    wait_for_gang,
)
from gangshare.extender.binder import Binder, BindError
from gangshare.extender.cache import ClusterCache
from gangshare.extender.decisions import (
    BadPod,
    PodAsk,
    filter_nodes,
    first_holding,
    gpus_for_bind,
    pod_ask,
    prioritize_nodes,
)
from gangshare.extender.health import Health
from gangshare.extender.metrics import ExtenderMetrics
from gangshare.extender.verdicts import FilterAnswer
from gangshare.extender.wire import (
    MAX_BODY_BYTES,
    ExtenderArgs,
    ExtenderBindingArgs,
    WireError,
    filter_result,
    priority_json,
)
from gangshare.kube.claims import pod_owner, worker_identity

log = logging.getLogger("gangshare.extender")
LOOPBACK = frozenset({"127.0.0.1", "::1"})
VERBS = ("filter", "prioritize", "bind")
DEFAULT_SCHEDULER_NAMES = frozenset({"gangshare-scheduler"})


class VerbsApp:
    """The verbs' ASGI application (see asgi.py for why it is not a framework's)."""

    def __init__(
        self,
        cache: ClusterCache,
        binder: Binder | None,
        metrics: ExtenderMetrics,
        record: Path | None = None,
        trusted_peers: frozenset[str] | None = LOOPBACK,
        scheduler_names: frozenset[str] = DEFAULT_SCHEDULER_NAMES,
        health: Health | None = None,
        gang_barrier_seconds: float = BARRIER_SECONDS,
    ) -> None:
        self.cache = cache
        self.binder = binder
        self.metrics = metrics
        self.trusted_peers = trusted_peers
        self.scheduler_names = scheduler_names
        self.health = health or Health(cache)
        self.gang_barrier_seconds = gang_barrier_seconds
        self.refusals = RefusalCounter()
        self.verbs: dict[str, Callable[[Any], Awaitable[tuple[Any, str]]]] = {
            "/filter": self.filter,
            "/prioritize": self.prioritize,
            "/bind": self.bind,
        }
        # Debugging aid (--record): keep the first body of each verb, as kube-scheduler sent
        # it. The file name comes from a fixed list, never from the request, so nothing lands
        # outside `record`.
        self.record = (
            {f"/{verb}": record / f"{verb}-request.json" for verb in VERBS} if record else {}
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            if self.binder is not None:
                await self.binder.close()
            return
        if scope["type"] != "http":
            return
        path, method = scope["path"], scope["method"]
        if method == "GET" and path in HEALTH_PATHS:
            status, payload = health_answer(path, self.cache, self.health)
            await respond(send, status, encode_json(payload))
            return
        handler = self.verbs.get(path)
        if handler is None or method != "POST":
            status, problem = (404, "no such verb") if handler is None else (405, "use POST")
            await respond(send, status, encode_json({"error": f"{method} {path}: {problem}"}))
            return
        verb, started = path[1:], time.perf_counter()
        try:
            self.check_peer(scope)
            body = await read_body(scope, receive, MAX_BODY_BYTES)
            target = self.record.get(path)
            if target is not None and not target.exists():
                target.write_bytes(body)
            payload, result = await handler(decode_json(body))
        except WireError as err:
            self.metrics.requests.labels(verb, "rejected").inc()
            await respond(send, 422, encode_json({"error": str(err)}))
            return
        except HttpError as err:
            self.metrics.requests.labels(verb, "rejected").inc()
            await respond(send, err.status, encode_json({"error": err.message}))
            return
        self.metrics.requests.labels(verb, result).inc()
        self.metrics.latency.labels(verb).observe(time.perf_counter() - started)
        await respond(send, 200, payload if isinstance(payload, bytes) else encode_json(payload))

    def check_peer(self, scope: Scope) -> None:
        peer = (scope.get("client") or ("",))[0] or ""
        if self.trusted_peers is not None and peer not in self.trusted_peers:
            raise HttpError(
                403,
                f"client {peer or 'unknown'}: the extender's verbs answer only kube-scheduler "
                "on loopback (or over TLS with a client certificate)",
            )

    async def filter(self, data: Any) -> tuple[Any, str]:
        args = ExtenderArgs.parse(data)
        names, pod, cache = args.node_names(), args.Pod, self.cache
        try:
            if self.binder is not None and plan_unseen(cache, pod):
                # The plan may be committed but not yet watched: read it, do not wait minutes
                # for kube-scheduler to retry an unschedulable pod.
                await read_plan_through(cache, self.binder, pod)
            if worker_identity(pod) is not None and not plan_unseen(cache, pod):
                waiting = gang_not_ready(cache, pod)
                meta = pod.get("metadata") or {}
                owner = pod_owner(meta.get("namespace") or "default", meta.get("name", ""))
                if waiting is not None:
                    why = self.refusals.refusal_reason(owner, waiting, "placing")
                    return filter_result(args, [], dict.fromkeys(names, why), {}), "ok"
                self.refusals.forget(owner)
            with cache.lock:
                ask = pod_ask(pod, cache.ledger)
                if ask is None:
                    return filter_result(args, names, {}, {}), "ok"
                if not ask.gang:
                    cache.forget(ask.owner)  # filtered again: its earlier node is not held
                if ask.gang:
                    passed, failed, unresolvable = filter_nodes(cache.cluster, ask, names)
                    answer = FilterAnswer(passed, failed, unresolvable, len(passed))
                    best = passed
                else:
                    answer = cache.verdicts.current(cache.cluster, ask.request).filter(names)
                    best = hand_out(cache, ask, answer.best)
        except BadPod as err:
            log.warning("filter %s: %s", args.pod_name, err)
            return filter_result(args, [], {}, {}, f"pod annotation {err}"), "error"
        except Exception as err:
            log.exception("filter %s failed", args.pod_name)
            return filter_result(args, [], {}, {}, f"internal error: {err}"), "error"
        filtered = self.metrics.filtered
        filtered["passed"].inc(answer.passed)
        filtered["failed"].inc(len(answer.failed))
        filtered["unresolvable"].inc(len(answer.unresolvable))
        return filter_result(args, best, answer.failed, answer.unresolvable), "ok"

    async def prioritize(self, data: Any) -> tuple[Any, str]:
        args = ExtenderArgs.parse(data)
        names, cache = args.node_names(), self.cache
        try:
            with cache.lock:
                ask = pod_ask(args.Pod, cache.ledger)
                if ask is None:
                    return priority_json([(n, 0) for n in names]), "ok"
                handed = cache.ledger.assumed_node(ask.owner)
                if handed is not None:
                    # Filter chose and holds it there; scoring its own hold would count twice.
                    cache.still_waiting(ask.owner)
                    return priority_json([(n, 10 if n == handed else 0) for n in names]), "ok"
                if ask.gang:
                    return priority_json(prioritize_nodes(cache.cluster, ask, names)), "ok"
                return cache.verdicts.current(cache.cluster, ask.request).priorities(names), "ok"
        except Exception:
            # Scores are advice: on failure every node scores 0 and filter/bind still decide.
            log.exception("prioritize %s failed; scoring 0", args.pod_name)
            return priority_json([(n, 0) for n in names]), "error"

    async def bind(self, data: Any) -> tuple[Any, str]:
        args = ExtenderBindingArgs.parse(data)
        who = f"{args.PodNamespace}/{args.PodName}"
        if self.binder is None:
            return {"Error": "binding is disabled in this extender"}, "error"
        try:
            error = await _bind(
                self.cache, self.binder, args, self.scheduler_names, self.gang_barrier_seconds
            )
        except Exception as err:
            log.exception("bind %s failed", who)
            error = f"internal error: {err}"
        self.metrics.assumed.set(self.cache.assumed_count())
        if error:
            log.warning("bind %s to %s: %s", who, args.Node, error)
        return {"Error": error}, "error" if error else "ok"


def hand_out(cache: ClusterCache, ask: PodAsk, best: list[str]) -> list[str]:
    """Filter's answer for a pod gangshare does not plan: one node, assumed at once (call with
    the cache's lock held). kube-scheduler binds where filter says; until the watch brings
    the binding back, the next filter must already count these GPUs, or two pods filtered in
    that window both get the last free GPU beside an admitted gang's plan, and the gang is
    displaced. The hold lasts until the bind ends, however long kube-scheduler's PreBind
    takes (cache.py); a TTL without any sign of the pod is only the backstop."""
    held = first_holding(cache.cluster, ask, best)
    if held is None:
        return []
    node, gpus = held
    cache.assume(ask.owner, node, gpus, ask.request)
    return [node]


HEALTH_PATHS = ("/healthz", "/readyz")


def health_answer(path: str, cache: ClusterCache, health: Health) -> tuple[int, dict[str, Any]]:
    if path == "/healthz":
        problem = health.problem()
        return (200, {"status": "ok"}) if problem is None else (503, {"status": problem})
    if cache.ready:
        return 200, {"status": "ready", "nodes": len(cache.cluster.nodes)}
    return 503, {"status": "cache not synced yet"}


def create_ops_app(cache: ClusterCache, metrics: ExtenderMetrics, health: Health) -> FastAPI:
    """Probes and Prometheus, on a port of their own: nothing here can place a pod."""
    app = FastAPI(title="gangshare extender (ops)", docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        status, payload = health_answer("/healthz", cache, health)
        return JSONResponse(payload, status_code=status)

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        status, payload = health_answer("/readyz", cache, health)
        return JSONResponse(payload, status_code=status)

    @app.get("/metrics")
    async def metrics_endpoint() -> Response:
        metrics.cache_nodes.set(len(cache.cluster.nodes))
        metrics.assumed.set(cache.assumed_count())
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


def bind_refusal(pod: dict[str, Any], scheduler_names: frozenset[str]) -> str | None:
    """Why this pod is not gangshare's to bind: only what gangshare-scheduler would bind."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    name = f"{meta.get('namespace')}/{meta.get('name')}"
    if spec.get("schedulerName") not in scheduler_names:
        return f"pod {name} belongs to scheduler {spec.get('schedulerName')!r}, not gangshare's"
    if spec.get("nodeName"):
        return f"pod {name} is already bound to {spec['nodeName']}"
    if spec.get("schedulingGates"):
        return f"pod {name} still has scheduling gates"
    if meta.get("deletionTimestamp"):
        return f"pod {name} is being deleted"
    return None


def plan_unseen(cache: ClusterCache, pod: dict[str, Any]) -> bool:
    """A pod that names itself a gang worker whose plan the ledger does not hold."""
    who = worker_identity(pod)
    if who is None:
        return False
    with cache.lock:
        return cache.ledger.current_hold(who) is None


async def read_plan_through(cache: ClusterCache, binder: Binder, pod: dict[str, Any]) -> bool:
    """Fill the ledger with a gang worker's TrainingJob read from the API server. True when
    the cache took it; a failed read leaves the worker unplanned (kube-scheduler retries)."""
    who = worker_identity(pod)
    if who is None:
        return False
    seen = cache.job_version(who.job)
    namespace, _, name = who.job.partition("/")
    try:
        job = await binder.read_trainingjob(namespace, name)
    except BindError as err:
        log.warning("filter: %s", err)
        return False
    return cache.fill_job(who.job, job, seen)


async def _bind(
    cache: ClusterCache,
    binder: Binder,
    args: ExtenderBindingArgs,
    scheduler_names: frozenset[str],
    gang_barrier_seconds: float = BARRIER_SECONDS,
) -> str:
    """Pick GPUs, hold them on assumption, record them on the pod, bind. Returns an error or ''."""
    pod = cache.pod(args.PodNamespace, args.PodName)
    if (
        pod is None
        or (args.PodUID and pod["metadata"].get("uid") != args.PodUID)
        # kube-scheduler binds only pods it saw ungated: a gated copy is one behind.
        or (pod.get("spec") or {}).get("schedulingGates")
    ):
        try:
            pod = await binder.read_pod(args.PodNamespace, args.PodName)  # the watch is behind
        except BindError as err:
            return str(err)
    if args.PodUID and pod["metadata"].get("uid") != args.PodUID:
        return f"pod {args.PodNamespace}/{args.PodName} was replaced (uid changed); not binding"
    refusal = bind_refusal(pod, scheduler_names)
    if refusal is not None:
        return refusal
    with cache.lock:
        try:
            ask = pod_ask(pod, cache.ledger)
        except BadPod as err:
            return f"pod annotation {err}"
        if ask is None:
            who = f"{args.PodNamespace}/{args.PodName}"
            return f"pod {who} requests no GPUs; gangshare binds only GPU pods"
        held = None if ask.gang else cache.ledger.assumed_gpus(ask.owner, args.Node)
        if held is None and not ask.gang:
            cache.forget(ask.owner)  # filter handed it another node, or nothing
        chosen = held or gpus_for_bind(cache.cluster, ask, args.Node)
        if isinstance(chosen, str):
            return chosen
        gpus = chosen
        if not ask.gang:
            # A gang worker's GPUs are already its job's plan in the ledger; others are assumed.
            cache.assume(ask.owner, args.Node, gpus, ask.request)
    if ask.gang:
        waiting = await wait_for_gang(cache, pod, gang_barrier_seconds)
        if waiting is not None:
            return f"{GANG_BARRIER_REFUSAL}: {waiting}; not binding a part of it"
    try:
        await binder.record_and_bind(pod, args.Node, gpus)
    except BindError as err:
        if not ask.gang:
            cache.forget(ask.owner)
        return str(err)
    return ""
