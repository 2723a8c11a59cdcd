"""Watches that keep the extender's cache current: list once, then follow changes."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from gangshare.extender.cache import ClusterCache

log = logging.getLogger("gangshare.extender")


def _follow(
    name: str,
    list_call: Callable[..., Any],
    replace: Callable[[list[dict[str, Any]]], None],
    apply: Callable[[str, dict[str, Any]], None],
    stop: threading.Event,
) -> None:
    while not stop.is_set():
        try:
            listing = json.loads(list_call(_preload_content=False).data)
            replace(listing["items"])
            version = listing["metadata"]["resourceVersion"]
            stream = watch.Watch()  # type: ignore[no-untyped-call]
            for event in stream.stream(  # type: ignore[no-untyped-call]
                list_call, resource_version=version, timeout_seconds=120, allow_watch_bookmarks=True
            ):
                if stop.is_set():
                    stream.stop()  # type: ignore[no-untyped-call]
                    break
                if event["type"] == "BOOKMARK":
                    continue
                apply(event["type"], event["raw_object"])
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

    threads = [
        threading.Thread(
            target=_follow,
            args=("nodes", core.list_node, cache.replace_nodes, on_node, stop),
            name="watch-nodes",
            daemon=True,
        ),
        threading.Thread(
            target=_follow,
            args=("pods", core.list_pod_for_all_namespaces, cache.replace_pods, on_pod, stop),
            name="watch-pods",
            daemon=True,
        ),
    ]
    for thread in threads:
        thread.start()
    return threads
