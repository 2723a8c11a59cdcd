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
from gangshare.kube.holding import hold_node_claims

# Stands for a pod the ledger has no facts for (None means it has: none).
_UNSEEN: object = object()


class Ledger:
    def __init__(self) -> None:
        self.cluster = Cluster()
        self._pods: dict[str, PodFacts] = {}
        self._jobs: dict[str, JobHold] = {}
        self._workers: dict[str, set[str]] = {}  # job key -> pods that name it
        # (job key, rank) -> pods that name it (a queued Job's pods: their names are random)
        self._ranked: dict[tuple[str, int], set[str]] = {}
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

    def off_island(self) -> dict[str, str]:
        """Gangs that require one NVLink island per worker whose bound worker was given GPUs
        across islands by its node (the kubelet did not follow a plan that kept to one):
        job key -> the first reason. Such a gang is released, not left running degraded."""
        found: dict[str, str] = {}
        for key in sorted(self._jobs):
            hold = self._jobs[key]
            if not hold.islands_required:
                continue
            for owner in sorted(self._workers.get(key, set())):
                facts = self._pods.get(owner)
                if facts is None or facts.node is None or facts.indices is None:
                    continue
                if facts.identity is None or self.verified_worker(facts) is None:
                    continue
                plan = hold.plan_of(facts.identity.rank)
                node = self.cluster.nodes.get(facts.node)
                if plan is None or node is None:
                    continue
                if _one_island(node, plan[1]) and not _one_island(node, facts.indices):
                    found.setdefault(
                        key,
                        f"worker {facts.identity.rank} was given GPUs {list(facts.indices)} "
                        f"on {facts.node}, across NVLink islands; spec.topology requires one "
                        "island per worker",
                    )
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
        if hold.batch != who.batch:
            return None  # a TrainingJob's workers are its own pods, a queued Job's the Job's
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
        """Hold GPUs for a pod handed a node, until its bound pod (or forget) replaces it."""
        self._drop_assumption(owner)  # handed out again: the earlier node is free of it
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

    def assumed_node(self, owner: str) -> str | None:
        claim = self._assumed.get(owner)
        return claim.node if claim is not None else None

    def assumed_gpus(self, owner: str, node: str) -> tuple[int, ...] | None:
        """The GPUs a pod is held on by assumption on `node` (as held: recorded if free)."""
        claim = self._assumed.get(owner)
        if claim is None or claim.node != node:
            return None
        held = [a for a in self.cluster.allocations_of(owner) if a.node == node]
        return tuple(sorted(held[0].gpu_indices)) if held else None

    def assumed_owners(self) -> list[str]:
        return list(self._assumed)

    # ----- deriving claims -----------------------------------------------------------------------

    def _replace_pod(self, owner: str, facts: PodFacts | None) -> None:
        old = self._pods.pop(owner, None)
        if facts is not None:
            self._pods[owner] = facts
            if facts.node is not None:
                self._drop_assumption(owner)  # the bound pod is the truth now
        ranks = {
            (f.identity.job, f.identity.rank)
            for f in (old, facts)
            if f is not None and f.identity is not None
        }
        if old is not None and old.identity is not None:
            self._workers.get(old.identity.job, set()).discard(owner)
            self._ranked.get((old.identity.job, old.identity.rank), set()).discard(owner)
        if facts is not None and facts.identity is not None:
            self._workers.setdefault(facts.identity.job, set()).add(owner)
            self._ranked.setdefault((facts.identity.job, facts.identity.rank), set()).add(owner)
        self._derive_pod(owner)
        # Only this worker's rank changes: re-deriving the whole gang on each of its pods'
        # events cost a 512-worker gang 512 x 512 steps per event.
        for job, rank in ranks:
            self._derive_rank(job, rank)
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
        if (
            facts is not None
            and facts.node is not None
            and facts.count > 0  # a CPU-only pod is counted by the pod list alone
            and self.verified_worker(facts) is None
        ):
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
        wanted = {hold.rank_owner(rank) for rank, _, _ in hold.placement} if hold else set()
        for owner in self._job_owners.get(key, set()) - wanted:
            self._put(owner, None)
        if hold is None or not wanted:
            self._job_owners.pop(key, None)
            return
        self._job_owners[key] = wanted
        for rank, node, gpus in hold.placement:
            self._put(hold.rank_owner(rank), self._rank_claim(hold, rank, node, gpus))

    def _derive_rank(self, key: str, rank: int) -> None:
        hold = self._jobs.get(key)
        plan = hold.plan_of(rank) if hold is not None else None
        if hold is not None and plan is not None:
            self._put(hold.rank_owner(rank), self._rank_claim(hold, rank, *plan))

    def _rank_claim(self, hold: JobHold, rank: int, node: str, gpus: tuple[int, ...]) -> Claim:
        """A rank's claim: its bound, current worker as a fact, else its plan. A TrainingJob's
        worker is found by name (`<job>-worker-<rank>`, the only name a worker may have), a
        queued Job's among the pods that name its rank."""
        owner = hold.rank_owner(rank)
        namespace = hold.key.partition("/")[0]
        if hold.batch:
            named = self._ranked.get((hold.key, rank), set())
            found = [self._pods[o] for o in sorted(named) if o in self._pods]
            bound = [f for f in found if f.node is not None and self.verified_worker(f) is hold]
            worker = bound[0] if bound else None
        else:
            worker = self._pods.get(pod_owner(namespace, hold.pod_name(rank)))
        if (
            worker is not None
            and worker.node is not None
            and worker.identity is not None
            and worker.identity.rank == rank
            and self.verified_worker(worker) is hold
        ):
            indices = worker.indices or (gpus if worker.node == node else None)
            return Claim(
                owner,
                ClaimKind.FACT,
                worker.node,
                hold.service_class,
                len(gpus),
                indices,
                hold.memory_mib,
                job=hold.key,
            )
        return Claim(
            owner,
            ClaimKind.PLAN,
            node,
            hold.service_class,
            len(gpus),
            gpus,
            hold.memory_mib if gpus else None,
            hold.constraints_of(rank).resources,
            hold.key,
            hold.constraints_of(rank),
        )

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
            # Only here: an owner whose claim moved to another node in the same batch may
            # already hold there, if that node was held again first.
            self.cluster.release_on_node(owner, node_name)
        owners = self._by_node.get(node_name, set())
        assumed = [c for c in self._assumed.values() if c.node == node_name]
        claims = [self._claims[o] for o in owners if o not in self._assumed] + assumed
        held, problems = hold_node_claims(self.cluster, claims)
        for claim in claims:
            problem = problems.get(claim.owner)
            if problem is None:
                self.problems.pop(claim.owner, None)
            else:
                self.problems[claim.owner] = problem
        if held:
            self._held[node_name] = held


def _one_island(node: NodeState, indices: tuple[int, ...]) -> bool:
    return not node.islands or any(set(indices) <= set(island) for island in node.islands)
