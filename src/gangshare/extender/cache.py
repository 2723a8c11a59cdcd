"""The extender's view of the cluster, fed by watches (nodeCacheCapable mode).

Like kube-scheduler's cache, plus the one GPU ledger the operator also builds
(gangshare.kube.ledger): nodes, GPU pods, and admitted TrainingJobs, so a gang's
plan is held here from the moment the operator commits it, before its pods
exist. What filter hands a pod is *assumed*: held, like kube-scheduler's assumed
pods, until its bind ends: its bound update arrives, it is deleted (or being deleted,
or finished), it is filtered again, or its bind fails (forget). A TTL counted from the
pod's last sign of still waiting is only a backstop.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from gangshare.core.annotations import NODE_TOPOLOGY, AnnotationError
from gangshare.core.clock import Clock
from gangshare.core.job import WorkerRequest
from gangshare.core.node import NodeState
from gangshare.extender.verdicts import Verdicts
from gangshare.kube.claims import WorkerIdentity, gpu_request, job_key, pod_owner, worker_identity
from gangshare.kube.ledger import Ledger
from gangshare.kube.scheduling import TERMINAL_POD_PHASES
from gangshare.kube.snapshot import decode_api_node

log = logging.getLogger("gangshare.extender")
# The backstop must outlast any binding cycle that sends us no sign: kube-scheduler's
# VolumeBinding PreBind waits up to bindTimeoutSeconds (600 s by default) for a volume to be
# provisioned, and nothing about the pod changes meanwhile. A hold forgotten before that ends
# lets a second pod be handed the same GPUs, and both bind (issue #36). Longer costs little:
# kube-scheduler filters a pod it has not bound again within minutes (it retries unschedulable
# pods at least every 5), and that filter releases or re-assumes the hold.
DEFAULT_ASSUME_TTL = 660.0
WATCHES = ("nodes", "pods", "trainingjobs")


class ClusterCache:
    def __init__(self, clock: Clock, assume_ttl: float = DEFAULT_ASSUME_TTL) -> None:
        self.lock = threading.RLock()
        self.clock = clock
        self.assume_ttl = assume_ttl
        self.ledger = Ledger()
        self._topology: dict[str, str] = {}
        # GPU pods as last seen, so bind needs no extra read of the pod.
        self._gpu_pods: dict[str, dict[str, Any]] = {}
        # Gang workers by (job, uid, attempt): rank -> still gated (the gang barrier's view).
        self._gangs: dict[tuple[str, str, int], dict[int, bool]] = {}
        self._gang_of: dict[str, tuple[tuple[str, str, int], int]] = {}
        self._expiry: dict[str, float] = {}
        self._warned: dict[str, str] = {}
        # Every node's verdict per request shape, judged again as nodes change.
        self.verdicts = Verdicts()
        self.synced = {name: threading.Event() for name in WATCHES}
        # Watch events per TrainingJob (and relists), so a read-through never overwrites
        # something the watch delivered after the read began.
        self._job_events: dict[str, int] = {}
        self._job_relists = 0
        # Monotonic time each watch last heard from the API server (events or bookmarks).
        self.heard: dict[str, float] = dict.fromkeys(WATCHES, time.monotonic())

    @property
    def cluster(self) -> Any:
        return self.ledger.cluster

    @property
    def ready(self) -> bool:
        return all(event.is_set() for event in self.synced.values())

    def assumed_count(self) -> int:
        return self.ledger.assumed_count()

    def heard_from(self, watch: str) -> None:
        self.heard[watch] = time.monotonic()

    # ----- nodes ------------------------------------------------------------------

    def replace_nodes(self, nodes: list[dict[str, Any]]) -> None:
        with self.lock:
            states = []
            self._topology.clear()
            for node in nodes:
                state = self._decode(node)
                if state is not None:
                    states.append(state)
                    self._topology[state.name] = _topology(node)
            self.ledger.replace_nodes(states)
            self._log_problems()
            self.synced["nodes"].set()

    def upsert_node(self, node: dict[str, Any]) -> None:
        with self.lock:
            name = node["metadata"]["name"]
            existing = self.cluster.nodes.get(name)
            fresh = self._decode(node)
            if (
                existing is not None
                and fresh is not None
                and _topology(node) == self._topology.get(name)
                and fresh.rack == existing.rack
            ):
                _refresh_in_place(existing, fresh)
                self.cluster.nodes_edited()
                self.cluster.touch(name)
                return
            if fresh is None:
                self._topology.pop(name, None)
                self.ledger.remove_node(name)
            else:
                self._topology[name] = _topology(node)
                self.ledger.add_node(fresh)
            self._log_problems()

    def delete_node(self, name: str) -> None:
        with self.lock:
            self._topology.pop(name, None)
            self.ledger.remove_node(name)

    # ----- pods ------------------------------------------------------------------

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            return self._gpu_pods.get(pod_owner(namespace, name))

    def gang_members(self, who: WorkerIdentity) -> dict[int, bool]:
        """rank -> gated, for the workers of `who`'s gang and attempt as last watched."""
        with self.lock:
            return self._gangs.get((who.job, who.uid, who.attempt), {})

    def _index_worker(self, owner: str, pod: dict[str, Any] | None) -> None:
        old = self._gang_of.pop(owner, None)
        if old is not None:
            members = self._gangs.get(old[0], {})
            members.pop(old[1], None)
            if not members:
                self._gangs.pop(old[0], None)
        who = worker_identity(pod) if pod is not None else None
        if pod is None or who is None:
            return
        key = (who.job, who.uid, who.attempt)
        gated = bool((pod.get("spec") or {}).get("schedulingGates"))
        self._gangs.setdefault(key, {})[who.rank] = gated
        self._gang_of[owner] = (key, who.rank)

    def replace_pods(self, pods: list[dict[str, Any]]) -> None:
        gpu_pods = [p for p in pods if gpu_request(p) is not None]
        with self.lock:
            shown = set(self._gpu_pods)
            self._gpu_pods = {_owner(p): p for p in gpu_pods}
            self._gangs.clear()
            self._gang_of.clear()
            for owner, pod in self._gpu_pods.items():
                self._index_worker(owner, pod)
            for warning in self.ledger.replace_pods(gpu_pods):
                log.warning(warning)
            self._follow_relisted_holds(shown)
            self._expire_gone()
            self._log_problems()
            self.synced["pods"].set()

    def upsert_pod(self, pod: dict[str, Any]) -> None:
        if gpu_request(pod) is None:
            return
        with self.lock:
            owner = _owner(pod)
            self._gpu_pods[owner] = pod
            self._index_worker(owner, pod)
            warning = self.ledger.set_pod(pod)
            if warning:
                log.warning(warning)
            self._follow_hold(owner, pod)
            self._log_problems()

    def delete_pod(self, namespace: str, name: str) -> None:
        owner = pod_owner(namespace, name)
        with self.lock:
            self._gpu_pods.pop(owner, None)
            self._index_worker(owner, None)
            self._expiry.pop(owner, None)
            self.ledger.remove_pod(namespace, name)

    # ----- TrainingJobs ------------------------------------------------------------------

    def replace_jobs(self, jobs: list[dict[str, Any]]) -> None:
        with self.lock:
            self._job_relists += 1
            for warning in self.ledger.replace_jobs(jobs):
                log.warning(warning)
            self._log_problems()
            self.synced["trainingjobs"].set()

    def upsert_job(self, job: dict[str, Any]) -> None:
        with self.lock:
            self._count_job_event(job)
            self._set_job(job)

    def delete_job(self, namespace: str, name: str) -> None:
        with self.lock:
            key = f"{namespace}/{name}"
            self._job_events[key] = self._job_events.get(key, 0) + 1
            self.ledger.remove_job(namespace, name)

    def job_version(self, key: str) -> tuple[int, int]:
        """What the watch has delivered for a job so far; pass it back to `fill_job`."""
        with self.lock:
            return self._job_relists, self._job_events.get(key, 0)

    def fill_job(self, key: str, job: dict[str, Any] | None, seen: tuple[int, int]) -> bool:
        """Take a TrainingJob read from the API server (None: it does not exist), unless the
        watch delivered anything for it since `seen`: then the watch is as fresh or fresher."""
        with self.lock:
            if (self._job_relists, self._job_events.get(key, 0)) != seen:
                return False
            if job is None:
                namespace, _, name = key.partition("/")
                self.ledger.remove_job(namespace, name)
            else:
                self._set_job(job)
            return True

    def _count_job_event(self, job: dict[str, Any]) -> None:
        key = job_key(job)
        self._job_events[key] = self._job_events.get(key, 0) + 1

    def _set_job(self, job: dict[str, Any]) -> None:
        warning = self.ledger.set_job(job)
        if warning:
            log.warning(warning)
        self._log_problems()

    # ----- assume / forget ------------------------------------------------------------------

    def assume(
        self, owner: str, node: str, indices: tuple[int, ...], request: WorkerRequest
    ) -> None:
        """Hold GPUs for a pod whose bind is in flight (call with the lock held)."""
        self.ledger.assume(owner, node, indices, request)
        self._expiry[owner] = self.clock.now() + self.assume_ttl

    def still_waiting(self, owner: str) -> None:
        """A sign that the pod's bind is still in flight: its hold's backstop starts over."""
        with self.lock:
            if owner in self._expiry:
                self._expiry[owner] = self.clock.now() + self.assume_ttl

    def forget(self, owner: str) -> None:
        with self.lock:
            self._expiry.pop(owner, None)
            self.ledger.forget(owner)

    def expire_assumptions(self) -> int:
        """The backstop: forget holds whose pods showed no sign for a whole TTL."""
        with self.lock:
            # Under one lock with the forgetting: a filter between the two would re-assume
            # the pod, and its fresh hold would be forgotten.
            now = self.clock.now()
            stale = [owner for owner, until in self._expiry.items() if until <= now]
            for owner in stale:
                log.warning(
                    "%s: no sign of its bind for %.0f s; its GPUs are no longer held",
                    owner,
                    self.assume_ttl,
                )
                self.forget(owner)
        return len(stale)

    # ----- internals ------------------------------------------------------------------

    def _follow_hold(self, owner: str, pod: dict[str, Any]) -> None:
        """A watched pod ends its hold once no bind of it can be in flight, else shows that
        it is still waiting (a stale event too: the pod was no less unbound then)."""
        if not self.ledger.is_assumed(owner):
            self._expiry.pop(owner, None)
        elif _bind_over(pod):
            self.forget(owner)
        else:
            self.still_waiting(owner)

    def _follow_relisted_holds(self, shown: set[str]) -> None:
        """After a relist, a held pod the watch had shown and the list lacks was deleted while
        the watch was down. One never shown may be younger than the list's snapshot
        (kube-scheduler filtered it before its creation reached us): only the backstop ends
        that hold, unless the watch shows the pod later."""
        for owner in self.ledger.assumed_owners():
            pod = self._gpu_pods.get(owner)
            if pod is not None:
                self._follow_hold(owner, pod)
            elif owner in shown:
                self.forget(owner)

    def _expire_gone(self) -> None:
        for owner in list(self._expiry):
            if not self.ledger.is_assumed(owner):
                del self._expiry[owner]

    def _decode(self, node: dict[str, Any]) -> NodeState | None:
        try:
            # kube-scheduler checks taints, selectors and resources itself before calling us.
            return decode_api_node(node, scheduling=False)
        except AnnotationError as err:
            log.warning("node %s ignored: %s", node["metadata"]["name"], err)
            return None

    def _log_problems(self) -> None:
        current = dict(self.ledger.problems)
        for owner, problem in current.items():
            if self._warned.get(owner) != problem:
                log.warning("ledger: %s: %s", owner, problem)
        self._warned = current


def _owner(pod: dict[str, Any]) -> str:
    meta = pod["metadata"]
    return pod_owner(meta.get("namespace", "default"), meta["name"])


def _bind_over(pod: dict[str, Any]) -> bool:
    """No bind of this pod is in flight: it is bound, finished, or being deleted (the API
    server refuses to bind a pod being deleted)."""
    meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
    return bool(
        spec.get("nodeName")
        or meta.get("deletionTimestamp")
        or status.get("phase") in TERMINAL_POD_PHASES
    )


def _topology(node: dict[str, Any]) -> str:
    return str((node["metadata"].get("annotations") or {}).get(NODE_TOPOLOGY, ""))


def _refresh_in_place(existing: NodeState, fresh: NodeState) -> None:
    """Utilization, labels and schedulability change often; allocations do not move."""
    existing.unschedulable_reason = fresh.unschedulable_reason
    existing.labels = fresh.labels
    for old, new in zip(existing.gpus, fresh.gpus, strict=True):
        old.utilization = new.utilization
        old.memory_used_mib = new.memory_used_mib
    existing.recount()
