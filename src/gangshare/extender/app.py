"""The extender's HTTP surfaces: the verbs for kube-scheduler, and health and metrics apart.

- `create_app`: POST /filter, /prioritize, /bind (plus /healthz and /readyz for the
  scheduler's side). Meant to listen on loopback inside the scheduler pod; a caller
  from any other address is refused unless TLS with client certificates
  authenticates it (`trusted_peers=None`). Bind binds only what gangshare-scheduler
  would: a pending, ungated GPU pod of gangshare's scheduler names.
- `create_ops_app`: GET /healthz, /readyz, /metrics, on its own port for probes and
  Prometheus; it has no verbs, so exposing it hands out nothing.

A malformed or oversized request gets a 4xx with a JSON error that names what is
wrong. A well-formed request that cannot be served is answered with `Error` set,
which kube-scheduler turns into a FailedScheduling event on the pod.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ValidationError

from gangshare.extender.barrier import BARRIER_SECONDS, wait_for_gang
from gangshare.extender.binder import Binder, BindError
from gangshare.extender.cache import ClusterCache
from gangshare.extender.decisions import (
    BadPod,
    filter_nodes,
    gpus_for_bind,
    pod_ask,
    prioritize_nodes,
)
from gangshare.extender.health import Health
from gangshare.extender.metrics import ExtenderMetrics
from gangshare.extender.wire import (
    MAX_BODY_BYTES,
    ExtenderArgs,
    ExtenderBindingArgs,
    filter_result,
    priority_json,
    priority_list,
)
from gangshare.kube.claims import worker_identity

log = logging.getLogger("gangshare.extender")
Model = TypeVar("Model", bound=BaseModel)
LOOPBACK = frozenset({"127.0.0.1", "::1"})
VERBS = ("filter", "prioritize", "bind")
DEFAULT_SCHEDULER_NAMES = frozenset({"gangshare-scheduler"})


class RequestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _field(location: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in location) or "body"


async def read_model(request: Request, model: type[Model]) -> Model:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise RequestError(413, f"body: {declared} bytes is over the {MAX_BODY_BYTES}-byte limit")
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise RequestError(413, f"body: {len(body)} bytes is over the {MAX_BODY_BYTES}-byte limit")
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as err:
        raise RequestError(400, f"body: not valid JSON ({err})") from None
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        raise RequestError(422, f"{_field(first['loc'])}: {first['msg']}") from None


def _pod_name(args: ExtenderArgs) -> str:
    return f"{args.Pod.metadata.namespace}/{args.Pod.metadata.name}"


def create_app(
    cache: ClusterCache,
    binder: Binder | None,
    metrics: ExtenderMetrics,
    record: Path | None = None,
    trusted_peers: frozenset[str] | None = LOOPBACK,
    scheduler_names: frozenset[str] = DEFAULT_SCHEDULER_NAMES,
    health: Health | None = None,
    gang_barrier_seconds: float = BARRIER_SECONDS,
) -> FastAPI:
    app = FastAPI(
        title="gangshare scheduler extender", docs_url=None, redoc_url=None, openapi_url=None
    )
    health = health or Health(cache)

    if record is not None:
        # Debugging aid (--record): keep the first body of each verb, as kube-scheduler sent it.
        # Registered only when asked for: HTTP middleware costs every request. The file name
        # comes from a fixed list, never from the request, so nothing lands outside `record`.
        files = {f"/{verb}": record / f"{verb}-request.json" for verb in VERBS}

        @app.middleware("http")
        async def keep_first_request(request: Request, call_next: Any) -> Any:
            target = files.get(request.url.path)
            if request.method == "POST" and target is not None and not target.exists():
                target.write_bytes(await request.body())
            return await call_next(request)

    @app.exception_handler(RequestError)
    async def rejected(request: Request, err: RequestError) -> JSONResponse:
        verb = request.url.path.strip("/")
        metrics.requests.labels(verb if verb in VERBS else "unknown", "rejected").inc()
        return JSONResponse({"error": err.message}, status_code=err.status)

    def check_peer(request: Request) -> None:
        peer = request.client.host if request.client else ""
        if trusted_peers is not None and peer not in trusted_peers:
            raise RequestError(
                403,
                f"client {peer or 'unknown'}: the extender's verbs answer only kube-scheduler "
                "on loopback (or over TLS with a client certificate)",
            )

    def answer(verb: str, started: float, payload: Any, result: str = "ok") -> Response:
        metrics.requests.labels(verb, result).inc()
        metrics.latency.labels(verb).observe(time.perf_counter() - started)
        return payload if isinstance(payload, Response) else JSONResponse(payload)

    @app.post("/filter")
    async def filter_(request: Request) -> Response:
        started = time.perf_counter()
        check_peer(request)
        args = await read_model(request, ExtenderArgs)
        names = args.node_names()
        pod = args.Pod.model_dump()
        try:
            if binder is not None and plan_unseen(cache, pod):
                # The plan may be committed but not yet watched: read it, do not wait minutes
                # for kube-scheduler to retry an unschedulable pod.
                await run_in_threadpool(read_plan_through, cache, binder, pod)
            with cache.lock:
                ask = pod_ask(pod, cache.ledger)
                if ask is None:
                    return answer("filter", started, filter_result(args, names, {}, {}))
                passed, failed, unresolvable = filter_nodes(cache.cluster, ask, names, cache.memo)
        except BadPod as err:
            log.warning("filter %s: %s", _pod_name(args), err)
            return answer(
                "filter", started, filter_result(args, [], {}, {}, f"pod annotation {err}"), "error"
            )
        except Exception as err:
            log.exception("filter %s failed", _pod_name(args))
            return answer(
                "filter",
                started,
                filter_result(args, [], {}, {}, f"internal error: {err}"),
                "error",
            )
        metrics.nodes.labels("passed").inc(len(passed))
        metrics.nodes.labels("failed").inc(len(failed))
        metrics.nodes.labels("unresolvable").inc(len(unresolvable))
        return answer("filter", started, filter_result(args, passed, failed, unresolvable))

    @app.post("/prioritize")
    async def prioritize(request: Request) -> Response:
        started = time.perf_counter()
        check_peer(request)
        args = await read_model(request, ExtenderArgs)
        names = args.node_names()
        try:
            with cache.lock:
                ask = pod_ask(args.Pod.model_dump(), cache.ledger)
                if ask is None:
                    return answer("prioritize", started, priority_list([(n, 0) for n in names]))
                scores = prioritize_nodes(cache.cluster, ask, names, cache.memo)
        except Exception:
            # Scores are advice: on failure every node scores 0 and filter/bind still decide.
            log.exception("prioritize %s failed; scoring 0", _pod_name(args))
            return answer("prioritize", started, priority_list([(n, 0) for n in names]), "error")
        return answer(
            "prioritize", started, Response(priority_json(scores), media_type="application/json")
        )

    @app.post("/bind")
    async def bind(request: Request) -> Response:
        started = time.perf_counter()
        check_peer(request)
        args = await read_model(request, ExtenderBindingArgs)
        who = f"{args.PodNamespace}/{args.PodName}"
        if binder is None:
            return answer(
                "bind", started, {"Error": "binding is disabled in this extender"}, "error"
            )
        try:
            error = await run_in_threadpool(
                _bind, cache, binder, args, scheduler_names, gang_barrier_seconds
            )
        except Exception as err:
            log.exception("bind %s failed", who)
            error = f"internal error: {err}"
        metrics.assumed.set(cache.assumed_count())
        if error:
            log.warning("bind %s to %s: %s", who, args.Node, error)
        return answer("bind", started, {"Error": error}, "error" if error else "ok")

    add_health_routes(app, cache, metrics, health, with_metrics=False)
    return app


def create_ops_app(cache: ClusterCache, metrics: ExtenderMetrics, health: Health) -> FastAPI:
    """Probes and Prometheus, on a port of their own: nothing here can place a pod."""
    app = FastAPI(title="gangshare extender (ops)", docs_url=None, redoc_url=None, openapi_url=None)
    add_health_routes(app, cache, metrics, health, with_metrics=True)
    return app


def add_health_routes(
    app: FastAPI, cache: ClusterCache, metrics: ExtenderMetrics, health: Health, with_metrics: bool
) -> None:
    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        problem = health.problem()
        if problem is None:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": problem}, status_code=503)

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        if cache.ready:
            return JSONResponse({"status": "ready", "nodes": len(cache.cluster.nodes)})
        return JSONResponse({"status": "cache not synced yet"}, status_code=503)

    if with_metrics:

        @app.get("/metrics")
        async def metrics_endpoint() -> Response:
            metrics.cache_nodes.set(len(cache.cluster.nodes))
            metrics.assumed.set(cache.assumed_count())
            return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


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


def read_plan_through(cache: ClusterCache, binder: Binder, pod: dict[str, Any]) -> bool:
    """Fill the ledger with a gang worker's TrainingJob read from the API server. True when
    the cache took it; a failed read leaves the worker unplanned (kube-scheduler retries)."""
    who = worker_identity(pod)
    if who is None:
        return False
    seen = cache.job_version(who.job)
    namespace, _, name = who.job.partition("/")
    try:
        job = binder.read_trainingjob(namespace, name)
    except BindError as err:
        log.warning("filter: %s", err)
        return False
    return cache.fill_job(who.job, job, seen)


def _bind(
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
        pod = binder.read_pod(args.PodNamespace, args.PodName)  # the watch has not caught up
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
        chosen = gpus_for_bind(cache.cluster, ask, args.Node)
        if isinstance(chosen, str):
            return chosen
        gpus = chosen
        if not ask.gang:
            # A gang worker's GPUs are already its job's plan in the ledger; others are assumed.
            cache.assume(ask.owner, args.Node, gpus, ask.request)
    if ask.gang:
        waiting = wait_for_gang(cache, pod, gang_barrier_seconds)
        if waiting is not None:
            return f"gang not wholly ungated: {waiting}; not binding a part of it"
    try:
        binder.record_and_bind(pod, args.Node, gpus)
    except BindError as err:
        if not ask.gang:
            cache.forget(ask.owner)
        return str(err)
    return ""
