"""The scheduling loop's reads: jobs, nodes and live pods held current by watches.

A pass used to LIST every TrainingJob, Node and live Pod from the API server; at 10,000
jobs on 5,000 nodes those reads (and decoding them) outweighed the decision itself. Here
each kind is listed once and then followed (gangshare.kube.follow), as kube-scheduler's
informers do. What the operator writes itself is *assumed* at once from the API server's
answer, so the next pass never decides from a state older than its own last write (an
admission not yet seen would free its GPUs for a second gang); a watch event older than an
assumed object is ignored.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from gangshare.core.annotations import JOB_LABEL
from gangshare.kube.follow import follow
from gangshare.kube.podgroup import group_name
from gangshare.kube.trainingjob import GROUP, PLURAL, VERSION

LIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
# A watch asks for bookmarks and is re-opened every 2 minutes, so even an idle cluster is
# heard from far more often than this; past it the stores are stale and liveness fails.
SILENCE_LIMIT = 300.0


def newer(incoming: dict[str, Any], held: dict[str, Any] | None) -> bool:
    """Whether `incoming` is at least as recent as `held`. resourceVersions are opaque by
    contract but integers from etcd; anything else is taken as newer (as a relist would)."""
    if held is None:
        return True
    a = (incoming.get("metadata") or {}).get("resourceVersion", "")
    b = (held.get("metadata") or {}).get("resourceVersion", "")
    if not (a.isdigit() and b.isdigit()):
        return True
    return int(a) >= int(b)


def object_key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace")
    return f"{namespace}/{meta.get('name')}" if namespace else str(meta.get("name"))


Indexer = Callable[[dict[str, Any]], "str | None"]


class Store:
    """One kind's objects by namespace/name, as last listed, watched or written, with
    optional secondary indexes (a gang's pods, a node's pods) kept as they change: a reconcile
    asks for one job's pods thousands of times a minute at scale, and a scan of every pod per
    question grew with the cluster instead of with the gang."""

    def __init__(self, name: str, indexers: dict[str, Indexer] | None = None) -> None:
        self.name = name
        self.synced = threading.Event()
        self.heard = time.monotonic()
        self._objects: dict[str, dict[str, Any]] = {}
        self._indexers = dict(indexers or {})
        self._index: dict[str, dict[str, set[str]]] = {n: {} for n in self._indexers}
        self._lock = threading.Lock()
        # What changed since the last take_changes: key -> the object now (None: gone). None
        # until someone follows the changes (the pass's standing snapshot).
        self._changes: dict[str, dict[str, Any] | None] | None = None

    def replace(self, items: list[dict[str, Any]]) -> None:
        with self._lock:
            if self._changes is not None:
                self._changes.update(dict.fromkeys(self._objects))  # a relist: all may be gone
            self._objects = {}
            self._index = {n: {} for n in self._indexers}
            for obj in items:
                self._put(object_key(obj), obj)
        self.synced.set()

    def apply(self, kind: str, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        with self._lock:
            if kind == "DELETED":
                self._drop(key)
            elif newer(obj, self._objects.get(key)):
                self._drop(key)
                self._put(key, obj)

    def _put(self, key: str, obj: dict[str, Any]) -> None:
        self._objects[key] = obj
        if self._changes is not None:
            self._changes[key] = obj
        for name, indexer in self._indexers.items():
            value = indexer(obj)
            if value is not None:
                self._index[name].setdefault(value, set()).add(key)

    def _drop(self, key: str) -> None:
        old = self._objects.pop(key, None)
        if old is None:
            return
        if self._changes is not None:
            self._changes[key] = None
        for name, indexer in self._indexers.items():
            value = indexer(old)
            keys = self._index[name].get(value) if value is not None else None
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._index[name][value]  # type: ignore[arg-type]

    def assume(self, obj: dict[str, Any]) -> None:
        """Hold what a write returned, unless the watch already brought something newer."""
        self.apply("MODIFIED", obj)

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objects.get(key)

    def by(self, index: str, value: str) -> list[dict[str, Any]]:
        """The objects an index files under `value`."""
        with self._lock:
            return [self._objects[k] for k in self._index[index].get(value, ())]

    def items(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._objects.values())

    def heard_from(self) -> None:
        self.heard = time.monotonic()

    def take_changes(self) -> Changed:
        """What changed since the last call (key -> the object now, None: gone); the first
        call starts following and returns everything held. Call with the store locked
        (Informers.take_changes)."""
        changes: Changed = dict(self._objects) if self._changes is None else self._changes
        self._changes = {}
        return changes


Changed = dict[str, "dict[str, Any] | None"]


@dataclass(frozen=True)
class Taken:
    """What Informers.take_changes saw at one moment."""

    changes: tuple[Changed, Changed, Changed]  # jobs, nodes, pods
    jobs: list[dict[str, Any]]
    nodes: list[dict[str, Any]] | None = None
    pods: list[dict[str, Any]] | None = None


def pod_job(pod: dict[str, Any]) -> str | None:
    """namespace/job of a gang worker (its job label), for the pod store's index."""
    meta = pod.get("metadata") or {}
    job = (meta.get("labels") or {}).get(JOB_LABEL)
    return f"{meta.get('namespace')}/{job}" if job else None


def pod_node(pod: dict[str, Any]) -> str | None:
    return (pod.get("spec") or {}).get("nodeName") or None


class Informers:
    """TrainingJobs, Nodes and live Pods, each a Store fed by its own watch thread."""

    def __init__(self) -> None:
        self.jobs = Store("trainingjobs")
        self.nodes = Store("nodes")
        self.pods = Store("pods", {"job": pod_job, "node": pod_node})
        # Told every pod watch event once the store holds it (handlers.pod_listener): the pod
        # watch the loop needs anyway is what drives the reconciles of gang workers too.
        self.pod_listener: Callable[[str, dict[str, Any]], None] | None = None

    @property
    def stores(self) -> tuple[Store, Store, Store]:
        return self.jobs, self.nodes, self.pods

    def synced(self) -> bool:
        return all(store.synced.is_set() for store in self.stores)

    def take_changes(self, with_items: bool = False) -> Taken:
        """Every store's changes since the last take and every job held, all at one moment
        (the stores locked together); with `with_items`, every node and pod too: an audit
        compares a rebuild from those with the state the changes keep (kube/standing.py)."""
        with contextlib.ExitStack() as locked:
            for store in self.stores:
                locked.enter_context(store._lock)
            jobs, nodes, pods = (store.take_changes() for store in self.stores)
            return Taken(
                (jobs, nodes, pods),
                list(self.jobs._objects.values()),
                list(self.nodes._objects.values()) if with_items else None,
                list(self.pods._objects.values()) if with_items else None,
            )

    def restart_changes(self) -> None:
        """The next take_changes brings everything the stores hold, as the first did."""
        for store in self.stores:
            with store._lock:
                store._changes = None

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(s.synced.wait(max(0.0, deadline - time.monotonic())) for s in self.stores)

    def silent(self, limit: float = SILENCE_LIMIT) -> str | None:
        """Why the stores count as stale (a watch that hears nothing), or None."""
        now = time.monotonic()
        for store in self.stores:
            if now - store.heard > limit:
                quiet = now - store.heard
                return f"{store.name} watch has heard nothing from the API server for {quiet:.0f}s"
        return None

    # The SchedulerLoop's reads (the same names as KubeApi's, which serve when not watching).

    def list_jobs(self) -> list[dict[str, Any]]:
        return self.jobs.items()

    def list_nodes(self) -> list[dict[str, Any]]:
        return self.nodes.items()

    def list_live_pods(self) -> list[dict[str, Any]]:
        return self.pods.items()

    def live_pods_of_job(self, namespace: str, name: str) -> list[dict[str, Any]]:
        return self.pods.by("job", f"{namespace}/{name}")

    def live_pods_on_node(self, node: str) -> list[dict[str, Any]]:
        return self.pods.by("node", node)

    def start(self, api_client: client.ApiClient, stop: threading.Event) -> list[threading.Thread]:
        core = client.CoreV1Api(api_client)
        custom = client.CustomObjectsApi(api_client)
        calls = {
            self.jobs: (
                functools.partial(custom.list_cluster_custom_object, GROUP, VERSION, PLURAL),
                True,  # no CRD yet: no jobs
            ),
            self.nodes: (core.list_node, False),
            # A pod that ends leaves the selector: the watch says DELETED.
            self.pods: (
                functools.partial(core.list_pod_for_all_namespaces, field_selector=LIVE_PODS),
                False,
            ),
        }
        threads = [
            threading.Thread(
                target=follow,
                args=(
                    store.name,
                    call,
                    self._replacer(store),
                    self._applier(store),
                    stop,
                    store.heard_from,
                ),
                kwargs={"missing_means_empty": missing},
                name=f"operator-watch-{store.name}",
                daemon=True,
            )
            for store, (call, missing) in calls.items()
        ]
        for thread in threads:
            thread.start()
        return threads

    def listen_to_pods(self, listener: Callable[[str, dict[str, Any]], None]) -> None:
        """Tell `listener` every pod watch event from now on, and the pod groups held now."""
        self.pod_listener = listener
        self.replay_pod_groups()

    def replay_pod_groups(self) -> None:
        """Tell the listener of every pod group's member held now (a new leader, or a listener
        set after the first list): a pod group has no object whose listing would bring it up
        (kube/podgroup.py)."""
        listener = self.pod_listener
        if listener is None:
            return
        for pod in self.pods.items():
            if group_name(pod) is not None:
                listener("ADDED", pod)

    def _replacer(self, store: Store) -> Callable[[list[dict[str, Any]]], None]:
        if store is not self.pods:
            return store.replace

        def replace(items: list[dict[str, Any]]) -> None:
            store.replace(items)
            self.replay_pod_groups()

        return replace

    def _applier(self, store: Store) -> Callable[[str, dict[str, Any]], None]:
        if store is not self.pods:
            return store.apply

        def apply(kind: str, obj: dict[str, Any]) -> None:
            store.apply(kind, obj)
            if self.pod_listener is not None:
                self.pod_listener(kind, obj)

        return apply
