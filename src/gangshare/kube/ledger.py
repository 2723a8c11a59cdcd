"""One ledger of GPU promises, kept the same way by the operator and the extender (pure).

Every promise is a claim on one node: a bound pod (a fact), a bind the extender
has decided (an assumption), or the rank of an admitted gang not bound yet (a
plan, from the TrainingJob's status). Whenever anything on a node changes, the
node's claims are held again in that order, so a fact always wins: a plan that
cannot be held any more (its node gone or unusable, a GPU taken by a pod the
kubelet may already run) is a displacement, which the operator turns into a
requeue of the whole gang. A fact with no GPUs recorded (kube-scheduler bound it,
and no node agent has reported the kubelet's choice yet) is held after the plans,
on GPUs they leave free, and before them only when nothing is left: it still wins
by count, but never breaks a plan over which indices it is counted on. The order
depends only on the objects, so every ledger built from them holds the same GPUs.
The operator builds a ledger per scheduling pass from lists; the extender keeps one
current from watches. See docs/decisions.md.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from gangshare.core.cluster import Cluster
from gangshare.core.job import WorkerRequest
from gangshare.core.node import NodeState
from gangshare.kube.claims import (
    Claim,
    ClaimKind,
    JobHold,
    PodFacts,
    WorkerIdentity,
    job_hold,
    job_key,
    pod_facts,
    pod_owner,
)
from gangshare.kube.holding import hold_claim

# Stands for a pod the ledger has no facts for (None means it has: none).
_UNSEEN: object = object()


class Ledger:
    def __init__(self) -> None:
        self.cluster = Cluster()
        self._pods: dict[str, PodFacts] = {}
        self._jobs: dict[str, JobHold] = {}
        self._workers: dict[str, set[str]] = {}  # job key -> pods that name it
        self._job_owners: dict[str, set[str]] = {}  # job key -> its rank claims
        self._claims: dict[str, Claim] = {}
        self._assumed: dict[str, Claim] = {}
        self._by_node: dict[str, set[str]] = {}
        # What is allocated in `cluster` on each node right now (released before re-holding).
        self._held: dict[str, set[str]] = {}
        self._dirty: set[str] = set()
        self._batch = 0
        # owner -> why its claim could not be held (plans: displacements; others: warnings)
        self.problems: dict[str, str] = {}

    # ----- reading ---------------------------------------------------------------------------

    def job(self, key: str) -> JobHold | None:
        return self._jobs.get(key)

    def displaced(self) -> dict[str, str]:
        """Admitted gangs whose promise broke: job key -> the first reason."""
        found: dict[str, str] = {}
        for owner, reason in sorted(self.problems.items()):
            claim = self._claims.get(owner)
            if claim is not None and claim.kind is ClaimKind.PLAN and claim.job:
                found.setdefault(claim.job, reason)
        return found

    def warnings(self) -> list[str]:
        return [
            f"{owner}: {reason}"
            for owner, reason in sorted(self.problems.items())
            if (claim := self._claims.get(owner)) is None or claim.kind is not ClaimKind.PLAN
        ]

    def current_hold(self, who: WorkerIdentity) -> JobHold | None:
        """The admitted job whose current, planned worker `who` names itself, else None."""
        hold = self._jobs.get(who.job)
        if hold is None or hold.uid != who.uid or hold.attempt != who.attempt:
            return None
        return hold if hold.plan_of(who.rank) is not None else None

    def verified_worker(self, facts: PodFacts) -> JobHold | None:
        """The admitted job this pod really is a current worker of, else None."""
        return self.current_hold(facts.identity) if facts.identity is not None else None

    def pod(self, owner: str) -> PodFacts | None:
        return self._pods.get(owner)

    def assumed_count(self) -> int:
        return len(self._assumed)

    # ----- batching ----------------------------------------------------------------------------

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Defer re-holding nodes until the end (bulk loads)."""
        self._batch += 1
        try:
            yield
        finally:
            self._batch -= 1
            self._flush()

    def replace_pods(self, pods: list[dict[str, Any]]) -> list[str]:
        """Everything known about pods becomes exactly this list (a relist)."""
        warnings = []
        with self.batch():
            seen = set()
            for pod in pods:
                meta = pod.get("metadata") or {}
                seen.add(pod_owner(meta.get("namespace", "default"), meta.get("name", "")))
                warning = self.set_pod(pod)
                if warning:
                    warnings.append(warning)
            for owner in set(self._pods) - seen:
                self._replace_pod(owner, None)
        return warnings

    def replace_jobs(self, jobs: list[dict[str, Any]]) -> list[str]:
        warnings = []
        with self.batch():
            seen = set()
            for job in jobs:
                seen.add(job_key(job))
                warning = self.set_job(job)
                if warning:
                    warnings.append(warning)
            for key in set(self._jobs) - seen:
                self._replace_job(key, None)
        return warnings

    def replace_nodes(self, nodes: list[NodeState]) -> None:
        with self.batch():
            names = {n.name for n in nodes}
            for name in set(self.cluster.nodes) - names:
                self.remove_node(name)
            for node in nodes:
                self.add_node(node)

    # ----- nodes -------------------------------------------------------------------------------

    def add_node(self, node: NodeState) -> None:
        if node.name in self.cluster.nodes:
            self.cluster.remove_node(node.name)
        self._held.pop(node.name, None)  # its allocations went with the old node
        self.cluster.add_node(node)
        self._touch(node.name)
        self._flush()

    def remove_node(self, name: str) -> None:
        if name in self.cluster.nodes:
            self.cluster.remove_node(name)
        self._held.pop(name, None)
        self._touch(name)
        self._flush()

    # ----- pods and jobs -------------------------------------------------------------------------

    def set_pod(self, pod: dict[str, Any]) -> str | None:
        """Record a pod as it is now; returns a warning about it, if any."""
        meta = pod.get("metadata") or {}
        owner = pod_owner(meta.get("namespace", "default"), meta.get("name", ""))
        facts, warning = pod_facts(pod)
        if facts != self._pods.get(owner, _UNSEEN):
            # Most pod updates (status, conditions, the kubelet's reports) change nothing the
            # ledger holds; re-deriving the job's claims for each was the watch's main cost.
            self._replace_pod(owner, facts)
        return warning

    def remove_pod(self, namespace: str, name: str) -> None:
        owner = pod_owner(namespace, name)
        self._drop_assumption(owner)
        self._replace_pod(owner, None)

    def set_job(self, job: dict[str, Any]) -> str | None:
        hold, warning = job_hold(job)
        self._replace_job(job_key(job), hold)
        return warning

    def remove_job(self, namespace: str, name: str) -> None:
        self._replace_job(f"{namespace}/{name}", None)

    # ----- assume / forget ---------------------------------------------------------------------

    def assume(
        self, owner: str, node: str, indices: tuple[int, ...], request: WorkerRequest
    ) -> None:
        """Hold GPUs for a bind in flight, until the bound pod (or forget) replaces it."""
        self._assumed[owner] = Claim(
            owner,
            ClaimKind.ASSUMED,
            node,
            request.service_class,
            request.gpus,
            indices,
            request.gpu_memory_mib,
        )
        self._touch(node)
        self._flush()

    def forget(self, owner: str) -> bool:
        found = self._drop_assumption(owner)
        self._flush()
        return found

    def _drop_assumption(self, owner: str) -> bool:
        claim = self._assumed.pop(owner, None)
        if claim is not None:
            self._touch(claim.node)
        return claim is not None

    def is_assumed(self, owner: str) -> bool:
        return owner in self._assumed

    def assumed_owners(self) -> list[str]:
        return list(self._assumed)

    # ----- deriving claims -----------------------------------------------------------------------

    def _replace_pod(self, owner: str, facts: PodFacts | None) -> None:
        old = self._pods.pop(owner, None)
        if facts is not None:
            self._pods[owner] = facts
            if facts.node is not None:
                self._drop_assumption(owner)  # the bound pod is the truth now
        jobs = {f.identity.job for f in (old, facts) if f is not None and f.identity is not None}
        if old is not None and old.identity is not None:
            self._workers.get(old.identity.job, set()).discard(owner)
        if facts is not None and facts.identity is not None:
            self._workers.setdefault(facts.identity.job, set()).add(owner)
        self._derive_pod(owner)
        for job in jobs:
            self._derive_job(job)
        self._flush()

    def _replace_job(self, key: str, hold: JobHold | None) -> None:
        if hold is None:
            self._jobs.pop(key, None)
        else:
            self._jobs[key] = hold
        self._derive_job(key)
        for owner in self._workers.get(key, set()):
            self._derive_pod(owner)
        self._flush()

    def _derive_pod(self, owner: str) -> None:
        """An unverified pod claims its GPUs once bound; a verified worker is its job's claim."""
        facts = self._pods.get(owner)
        claim = None
        if facts is not None and facts.node is not None and self.verified_worker(facts) is None:
            claim = Claim(
                owner,
                ClaimKind.FACT,
                facts.node,
                facts.service_class,
                facts.count,
                facts.indices,
                facts.memory_mib,
            )
        self._put(owner, claim)

    def _derive_job(self, key: str) -> None:
        hold = self._jobs.get(key)
        wanted: dict[str, Claim] = {}
        if hold is not None:
            bound: dict[int, PodFacts] = {}
            for owner in self._workers.get(key, set()):
                facts = self._pods.get(owner)
                if (
                    facts is not None
                    and facts.node
                    and facts.identity
                    and self.verified_worker(facts)
                ):
                    bound[facts.identity.rank] = facts
            for rank, node, gpus in hold.placement:
                owner = hold.rank_owner(rank)
                worker = bound.get(rank)
                if worker is not None and worker.node is not None:
                    indices = worker.indices or (gpus if worker.node == node else None)
                    wanted[owner] = Claim(
                        owner,
                        ClaimKind.FACT,
                        worker.node,
                        hold.service_class,
                        len(gpus),
                        indices,
                        hold.memory_mib,
                        job=key,
                    )
                else:
                    wanted[owner] = Claim(
                        owner,
                        ClaimKind.PLAN,
                        node,
                        hold.service_class,
                        len(gpus),
                        gpus,
                        hold.memory_mib,
                        hold.constraints.resources,
                        key,
                        hold.constraints,
                    )
        for owner in self._job_owners.get(key, set()) - set(wanted):
            self._put(owner, None)
        for owner, claim in wanted.items():
            self._put(owner, claim)
        if wanted:
            self._job_owners[key] = set(wanted)
        else:
            self._job_owners.pop(key, None)

    def _put(self, owner: str, claim: Claim | None) -> None:
        old = self._claims.get(owner)
        if old == claim:
            return
        if old is not None:
            self._by_node.get(old.node, set()).discard(owner)
            self._touch(old.node)
            del self._claims[owner]
        if claim is not None:
            self._claims[owner] = claim
            self._by_node.setdefault(claim.node, set()).add(owner)
            self._touch(claim.node)
        else:
            self.problems.pop(owner, None)

    # ----- holding -----------------------------------------------------------------------------

    def _touch(self, node: str) -> None:
        self._dirty.add(node)

    def _flush(self) -> None:
        if self._batch:
            return
        while self._dirty:
            self._rehold(self._dirty.pop())

    def _rehold(self, node_name: str) -> None:
        """Hold the node's claims again: recorded facts, assumptions, plans, then unrecorded
        facts; if an unrecorded fact finds no room that way, every fact goes first after all."""
        for owner in self._held.pop(node_name, set()):
            self.cluster.release(owner)
        owners = self._by_node.get(node_name, set())
        assumed = [c for c in self._assumed.values() if c.node == node_name]
        claims = [self._claims[o] for o in owners if o not in self._assumed] + assumed
        unrecorded = {c.owner for c in claims if _unrecorded(c)}
        held, problems = self._hold_in_order(sorted(claims, key=_plans_before_unrecorded))
        if unrecorded & problems.keys():
            for owner in held:
                self.cluster.release(owner)
            held, problems = self._hold_in_order(sorted(claims, key=_facts_first))
        for claim in claims:
            problem = problems.get(claim.owner)
            if problem is None:
                self.problems.pop(claim.owner, None)
            else:
                self.problems[claim.owner] = problem
        if held:
            self._held[node_name] = held

    def _hold_in_order(self, claims: list[Claim]) -> tuple[set[str], dict[str, str]]:
        held: set[str] = set()
        problems: dict[str, str] = {}
        for claim in claims:
            problem = hold_claim(self.cluster, claim)
            if problem is None:
                held.add(claim.owner)
            else:
                problems[claim.owner] = problem
                if self.cluster.allocations_of(claim.owner):
                    held.add(claim.owner)  # held by count, under a warning
        return held, problems


def _unrecorded(claim: Claim) -> bool:
    """A bound pod whose GPUs nobody recorded: the default binder placed it and no node agent
    has read the kubelet's choice back (yet), so any GPUs of the count are as true as others."""
    return claim.kind is ClaimKind.FACT and claim.indices is None


def _facts_first(claim: Claim) -> tuple[ClaimKind, str]:
    return claim.kind, claim.owner


def _plans_before_unrecorded(claim: Claim) -> tuple[bool, ClaimKind, str]:
    # An unrecorded fact takes whatever GPUs the plans leave: a pod placed beside an admitted
    # gang must not break the gang's plan by the accident of which indices it is counted on.
    return _unrecorded(claim), claim.kind, claim.owner
