"""Watches that keep the extender's cache current: list once, then follow changes."""

from __future__ import annotations

import functools
import gc
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gangshare.core.annotations import GPU_RESOURCE, SHARE_RESOURCE
from gangshare.extender.cache import ClusterCache
from gangshare.kube.trainingjob import GROUP, PLURAL, VERSION

log = logging.getLogger("gangshare.extender")
WATCH_SECONDS = 120
# A read timeout longer than the server-side watch timeout: a stream that stays silent past
# it is dead, and the watch is re-opened instead of waiting forever.
WATCH_TIMEOUT = (5.0, WATCH_SECONDS + 30.0)
LIST_TIMEOUT = (5.0, 120.0)


def _events(
    response: Any, wanted: Callable[[bytes], bool] | None = None
) -> Iterator[dict[str, Any]]:
    """Watch events as plain dicts, straight from the stream (no client model objects);
    `wanted` skips an event line before it is decoded."""
    pending = b""
    for chunk in response.stream(amt=None, decode_content=True):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip() and (wanted is None or wanted(line)):
                yield json.loads(line)
    if pending.strip() and (wanted is None or wanted(pending)):
        yield json.loads(pending)


GPU_MARKERS = (f'"{GPU_RESOURCE}"'.encode(), f'"{SHARE_RESOURCE}"'.encode())
OBJECT_EVENTS = (b'{"type":"ADDED"', b'{"type":"MODIFIED"', b'{"type":"DELETED"')


def maybe_gpu_pod_event(line: bytes) -> bool:
    """False for an event about a pod that requests no GPUs, which the cache ignores: most
    pods of a cluster, and decoding each of their updates was most of the watch's CPU. A GPU
    resource is immutable and always named in the object; bookmarks and errors always pass."""
    return not line.startswith(OBJECT_EVENTS) or any(m in line for m in GPU_MARKERS)


def _follow(
    name: str,
    list_call: Callable[..., Any],
    replace: Callable[[list[dict[str, Any]]], None],
    apply: Callable[[str, dict[str, Any]], None],
    stop: threading.Event,
    heard: Callable[[], None],
    missing_means_empty: bool = False,
    wanted: Callable[[bytes], bool] | None = None,
) -> None:
    while not stop.is_set():
        try:
            try:
                listing = json.loads(
                    list_call(_preload_content=False, _request_timeout=LIST_TIMEOUT).data
                )
            except ApiException as err:
                if not (missing_means_empty and err.status == 404):
                    raise
                # No CRD yet means no TrainingJobs: synced, empty; look again shortly.
                replace([])
                heard()
                stop.wait(2.0)
                continue
            replace(listing["items"])
            heard()
            # The cache lives for the process: keep the cyclic GC from rescanning it on every
            # full collection (those pauses are the extender's latency tail).
            gc.collect()
            gc.freeze()
            version = listing["metadata"]["resourceVersion"]
            while not stop.is_set():
                response = list_call(
                    watch=True,
                    resource_version=version,
                    timeout_seconds=WATCH_SECONDS,
                    allow_watch_bookmarks=True,
                    _preload_content=False,
                    _request_timeout=WATCH_TIMEOUT,
                )
                heard()
                try:
                    for event in _events(response, wanted):
                        heard()
                        kind, obj = event["type"], event["object"]
                        if kind == "ERROR":
                            raise ApiException(
                                status=obj.get("code", 500), reason=obj.get("message")
                            )
                        version = obj.get("metadata", {}).get("resourceVersion") or version
                        if kind != "BOOKMARK":
                            apply(kind, obj)
                        if stop.is_set():
                            break
                finally:
                    response.release_conn()
        except ApiException as err:
            if err.status != 410:  # 410 Gone: our version expired, simply list again
                log.warning("%s watch failed (%s); relisting", name, err.reason)
                time.sleep(1)
        except Exception:
            log.exception("%s watch broke; relisting", name)
            time.sleep(1)


def start_watches(
    api_client: client.ApiClient, cache: ClusterCache, stop: threading.Event
) -> list[threading.Thread]:
    core = client.CoreV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)

    def on_node(kind: str, node: dict[str, Any]) -> None:
        if kind == "DELETED":
            cache.delete_node(node["metadata"]["name"])
        else:
            cache.upsert_node(node)

    def on_pod(kind: str, pod: dict[str, Any]) -> None:
        if kind == "DELETED":
            cache.delete_pod(pod["metadata"].get("namespace", "default"), pod["metadata"]["name"])
        else:
            cache.upsert_pod(pod)

    def on_job(kind: str, job: dict[str, Any]) -> None:
        meta = job["metadata"]
        if kind == "DELETED":
            cache.delete_job(meta.get("namespace", ""), meta["name"])
        else:
            cache.upsert_job(job)

    jobs = functools.partial(custom.list_cluster_custom_object, GROUP, VERSION, PLURAL)
    Follow = tuple[str, Callable[..., Any], Any, Any, bool, Callable[[bytes], bool] | None]
    follows: list[Follow] = [
        ("nodes", core.list_node, cache.replace_nodes, on_node, False, None),
        (
            "pods",
            core.list_pod_for_all_namespaces,
            cache.replace_pods,
            on_pod,
            False,
            maybe_gpu_pod_event,
        ),
        # Admitted gangs' plans, so the ledger holds them before their pods exist.
        ("trainingjobs", jobs, cache.replace_jobs, on_job, True, None),
    ]
    threads = [
        threading.Thread(
            target=_follow,
            args=(
                name,
                call,
                replace,
                apply,
                stop,
                functools.partial(cache.heard_from, name),
                missing,
                wanted,
            ),
            name=f"watch-{name}",
            daemon=True,
        )
        for name, call, replace, apply, missing, wanted in follows
    ]
    for thread in threads:
        thread.start()
    return threads
