"""List once, then follow a watch: the informer loop the extender and the operator share.

The one module under gangshare.kube that talks to the API server (through a list call it
is handed); everything else here is pure parsing of API objects.
"""

from __future__ import annotations

import gc
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes.client.exceptions import ApiException

log = logging.getLogger("gangshare.kube")
WATCH_SECONDS = 120
# A read timeout longer than the server-side watch timeout: a stream that stays silent past
# it is dead, and the watch is re-opened instead of waiting forever.
WATCH_TIMEOUT = (5.0, WATCH_SECONDS + 30.0)
LIST_TIMEOUT = (5.0, 120.0)


def watch_events(
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


def follow(
    name: str,
    list_call: Callable[..., Any],
    replace: Callable[[list[dict[str, Any]]], None],
    apply: Callable[[str, dict[str, Any]], None],
    stop: threading.Event,
    heard: Callable[[], None],
    missing_means_empty: bool = False,
    wanted: Callable[[bytes], bool] | None = None,
) -> None:
    """Until `stop`: list into `replace`, then `apply` each watch event; relist on 410 Gone
    or any break. `heard` is called on every sign of life from the API server."""
    while not stop.is_set():
        try:
            try:
                listing = json.loads(
                    list_call(_preload_content=False, _request_timeout=LIST_TIMEOUT).data
                )
            except ApiException as err:
                if not (missing_means_empty and err.status == 404):
                    raise
                # No CRD yet means no objects: synced, empty; look again shortly.
                replace([])
                heard()
                stop.wait(2.0)
                continue
            replace(listing["items"])
            heard()
            # The cache lives for the process: keep the cyclic GC from rescanning it on every
            # full collection (those pauses are the latency tail).
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
                    for event in watch_events(response, wanted):
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
