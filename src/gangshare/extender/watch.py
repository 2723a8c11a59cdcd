"""Watches that keep the extender's cache current: list once, then follow changes."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client

from gangshare.core.annotations import GPU_RESOURCE, SHARE_RESOURCE
from gangshare.extender.cache import ClusterCache
from gangshare.kube.follow import follow
from gangshare.kube.trainingjob import GROUP, PLURAL, VERSION

GPU_MARKERS = (f'"{GPU_RESOURCE}"'.encode(), f'"{SHARE_RESOURCE}"'.encode())
OBJECT_EVENTS = (b'{"type":"ADDED"', b'{"type":"MODIFIED"', b'{"type":"DELETED"')


def maybe_gpu_pod_event(line: bytes) -> bool:
    """False for an event about a pod that requests no GPUs, which the cache ignores: most
    pods of a cluster, and decoding each of their updates was most of the watch's CPU. A GPU
    resource is immutable and always named in the object; bookmarks and errors always pass."""
    return not line.startswith(OBJECT_EVENTS) or any(m in line for m in GPU_MARKERS)


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
            target=follow,
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
