"""One scheduling cycle on a cluster snapshot (Kueue-style, in numbered phases).

  1. usage: guaranteed and borrowed GPUs each queue holds now (quota, cohorts, fair share);
  2. lanes: pending jobs grouped and ordered by the queue policy;
  3. admission: repeatedly take the head of the next open lane (heads within their
     quota before heads that must borrow, then least-served), check quota (or borrow
     from the cohort, as Opportunistic), backfill reservations and the gang plan; an
     admitted plan is applied to the snapshot at once (assumed), so later jobs in the
     cycle see it;
  4. reclaim: a cohort whose lenders took their quota back is over-lent; borrowers
     are chosen for eviction (lowest priority, least progress, whole gangs) until
     what is borrowed fits what is lent;
  5. result: admitted jobs with their plans, every other job with its reason,
     the preemptions.

The operator runs it on a snapshot built from the API server; the simulator on
its live state. Same function, same decisions.
"""

from __future__ import annotations

from dataclasses import replace

from gangshare.core.backfill import Reservation
from gangshare.core.cluster import Cluster
from gangshare.core.gang import GangPlan, Unschedulable, apply_plan, never_fits, plan_gang
from gangshare.core.held import avoiding, gpus_by_node
from gangshare.core.job import GangRequest, ServiceClass, Topology
from gangshare.core.lane_pick import LanePicker
from gangshare.core.queueing import (
    QueuedJob,
    QueuePolicy,
    RunningJob,
    order_lanes,
    policy_refusal,
)
from gangshare.core.queues import CohortBook
from gangshare.core.reclaim import reclaim_for_waiting_lenders, reclaim_over_lent
from gangshare.core.reserving import ReservationBook
from gangshare.core.results import (
    Admission,
    CycleResult,
    Pending,
    PendingKind,
    Preemption,
    holding_out,
)

__all__ = [
    "Admission",
    "CycleResult",
    "Pending",
    "PendingKind",
    "Preemption",
    "Reservation",
    "schedule_cycle",
]


def schedule_cycle(
    cluster: Cluster,
    pending: list[QueuedJob],
    running: list[RunningJob],
    policy: QueuePolicy,
    now: float,
) -> CycleResult:
    # The cycle changes nodes only by allocate and release: what it judged of one holds until.
    with cluster.verdicts_kept():
        return _schedule(cluster, pending, running, policy, now)


def _schedule(
    cluster: Cluster,
    pending: list[QueuedJob],
    running: list[RunningJob],
    policy: QueuePolicy,
    now: float,
) -> CycleResult:
    # Phase 1
    book = CohortBook(policy.queues)
    for holder in running:
        if holder.borrowed:
            book.borrowed[holder.queue] = book.borrowed.get(holder.queue, 0) + holder.gpus
        elif holder.service_class is ServiceClass.GUARANTEED:
            book.guaranteed[holder.queue] = book.guaranteed.get(holder.queue, 0) + holder.gpus
    # Phase 2
    lanes = order_lanes(policy, pending, book.guaranteed, now)
    # Phase 3
    cycle = _Cycle(cluster, running, policy, now, book)
    cycle.reserve_quota_for_heads(lanes)
    cohorts = any(spec.cohort for spec in policy.queues.values())
    pick_best = policy.fair_share or cohorts
    open_lanes = [lane for lane in lanes if lane]
    picker = LanePicker(cycle.lane_priority, lambda: len(cycle.result.admitted))
    while open_lanes:
        lane = picker.pick(open_lanes) if pick_best else open_lanes[0]
        job = lane.pop(0)
        blocked = cycle.consider(job)
        if blocked and not (
            policy.backfill_of(job.queue) and job.service_class is ServiceClass.GUARANTEED
        ):
            for waiting in lane:
                if not cycle.mark_if_inadmissible(waiting):
                    cycle.result.pending.append(
                        Pending(
                            waiting,
                            f"waiting behind {job.key} (strict order in its queue)",
                            PendingKind.BEHIND,
                        )
                    )
            lane.clear()
        if not lane:
            open_lanes.remove(lane)
    # Phase 4
    if cohorts:
        reclaim_over_lent(cycle.result, policy, book, running, cluster, now)
        reclaim_for_waiting_lenders(cycle.result, policy, book, running, now)
    # Phase 5
    return cycle.result


# What a cycle's judgement of a job reads, by when it last changed (see _Cycle._state).
_State = tuple[int, int, int]
# Stands for the run time in the kind of a refusal that did not read it (_Cycle.consider).
ANY_RUN_TIME = object()


class _Cycle:
    def __init__(
        self,
        cluster: Cluster,
        running: list[RunningJob],
        policy: QueuePolicy,
        now: float,
        book: CohortBook,
    ) -> None:
        self.cluster = cluster
        self.running = running
        self.policy = policy
        self.now = now
        self.book = book
        self.usage = book.guaranteed
        self.result = CycleResult()
        # The cluster only fills up during a cycle, so a shape that failed keeps failing.
        # A kind of job (_kind_of) -> the state it was last refused in, and how.
        self._refused: dict[
            tuple[object, ...], tuple[tuple[int, int, int], PendingKind, str, bool]
        ] = {}
        # (shape, topology as it stands) -> the fewest workers that failed, and why.
        self.failed_shapes: dict[tuple[object, Topology], tuple[int, str]] = {}
        self._shapes_failed = 0
        # Whether judging the job at hand read its run time (the backfill check).
        self._read_run_time = False
        self.reserving = ReservationBook(
            cluster, running, policy, now, self.usage, self.result.reservations
        )

    def lane_priority(self, lane: list[QueuedJob]) -> tuple[object, ...]:
        """Heads within their quota first (least served first under fair share); then heads
        that must borrow, always by weighted share of what they hold, aged by waiting so a
        light queue is never starved by heavy ones."""
        head = lane[0]
        if self._needs_borrowing(head):
            share = self.book.share(head.queue)
            share -= max(0.0, self.now - head.submitted_at) / self.policy.aging_seconds
            return (True, share, self.policy.order_key(head))
        share = 0.0
        if self.policy.fair_share:
            share = self.usage.get(head.queue, 0) / self.policy.weight(head.queue)
        return (False, share, self.policy.order_key(head))

    def _needs_borrowing(self, job: QueuedJob) -> bool:
        return (
            self._over_quota(job)
            and job.queue in self.policy.queues
            and (self.policy.queues[job.queue].cohort is not None)
        )

    def inadmissible(self, job: QueuedJob) -> str | None:
        """Why waiting cannot help the job (policy or shape, judged once per shape while the
        nodes stand: it depends on what they are, not on what runs there); None."""
        gang = job.gang
        why = self.cluster.kept_for("never-fits", gang, lambda: self._never_fits(gang))
        return policy_refusal(self.policy, job) or why

    def _never_fits(self, gang: GangRequest) -> str | None:
        key = ("never-fits", *gang.fit_shape)
        [why] = self.cluster.kept_while_nodes_stand(key, lambda: [never_fits(self.cluster, gang)])
        return why

    def mark_if_inadmissible(self, job: QueuedJob) -> bool:
        """Record the job as Inadmissible when waiting cannot help it; True if so."""
        reason = self.inadmissible(job)
        if reason is None:
            return False
        self.result.pending.append(Pending(job, reason, PendingKind.INADMISSIBLE))
        return True

    def consider(self, job: QueuedJob) -> bool:
        """Admit the job if it may run now; True when it stays blocked (and blocks its lane).

        A job refused exactly as one alike just was, with nothing changed since, is refused
        with its reason at once: a backlog of jobs alike waiting for a few nodes was each
        judged afresh at every cycle (#39)."""
        kind = self._kind_of(job)
        before = self._state()
        if kind is not None:
            refused = self._refused.get(kind)
            if refused is None or refused[0] != before:
                refused = self._refused.get((*kind[:-1], ANY_RUN_TIME))
            if refused is not None and refused[0] == before:
                self.result.pending.append(Pending(job, refused[2], refused[1]))
                return refused[3]
        waiting = len(self.result.pending)
        self._read_run_time = False
        blocked = self._consider(job)
        # Kept only when judging it changed nothing (no admission, no reservation of its own):
        # the next job alike then finds what it found. A refusal that never read the run
        # time (over quota: waiting for it, or borrowing) holds for jobs alike but for it:
        # 30,000 borrowers of as many run times were each judged at every pass (#39).
        if kind is not None and self._state() == before and len(self.result.pending) == waiting + 1:
            told = self.result.pending[-1]
            self._refused[kind] = (before, told.kind, told.reason, blocked)
            if not self._read_run_time:
                self._refused[(*kind[:-1], ANY_RUN_TIME)] = self._refused[kind]
        return blocked

    def _state(self) -> _State:
        # Within a cycle all that judging a job reads changes with an admission (nodes,
        # usage, borrowing, what reservations leave to spare), a new reservation, or a shape
        # that failed (whose reason later gangs of that shape are told).
        return self.cluster.version, len(self.result.reservations), self._shapes_failed

    def _kind_of(self, job: QueuedJob) -> tuple[object, ...] | None:
        """All of a job that judging it reads, but its name, its run time last; None when how
        long it waited matters too (a topology that relaxes)."""
        gang = job.gang
        if gang.topology.relax_after_seconds is not None:
            return None
        whole = self.cluster.kept_for("kind", gang, lambda: self._kind_token(gang))
        return (whole, job.queue, job.priority, job.pod_priority, job.runtime_estimate)

    def _kind_token(self, gang: GangRequest) -> object:
        key = ("kind", *gang.fit_shape, gang.whole_gpus, gang.worker_set)
        return self.cluster.kept_while_nodes_stand(key, object)

    def _consider(self, job: QueuedJob) -> bool:
        if self.mark_if_inadmissible(job):
            return False
        quota = self._quota_reason(job)
        if quota is not None:
            borrows = self._needs_borrowing(job)
            refusal = self.book.borrow_refusal(job.queue, job.gpus) if borrows else None
            if borrows and refusal is None:
                return self._borrow(job)
            reason = quota if refusal is None else f"{quota}; {refusal}"
            self.result.pending.append(Pending(job, reason, PendingKind.QUOTA))
            # It waits for its queue's quota as a head blocked by GPUs waits for GPUs.
            if self.policy.backfill_of(job.queue):
                self.reserving.reserve_quota_once_per_lane(job)
            return True
        self._read_run_time = True  # backfill asks whether it ends before a reservation
        backfill = self.reserving.refusal(job)
        if backfill is not None and backfill.avoid and self._place_away(job, backfill.avoid):
            return False
        if backfill is not None:
            # Its queue's quota is promised to a head: beyond it, a job may still borrow.
            if (
                backfill.quota_only
                and self._in_cohort(job.queue)
                and self.book.borrow_refusal(job.queue, job.gpus) is None
            ):
                return self._borrow(job)
            self.result.pending.append(Pending(job, backfill.reason, PendingKind.BACKFILL))
            return True
        return not self._place(job, job.gang, borrowed=False)

    def reserve_quota_for_heads(self, lanes: list[list[QueuedJob]]) -> None:
        """Before anything is admitted, every lane head its queue's quota blocks reserves it, so
        the queue's other lanes (small jobs visited first) cannot spend it under the head."""
        for lane in lanes:
            head = lane[0] if lane else None
            if head is None or not self.policy.backfill_of(head.queue):
                continue
            if head.service_class is not ServiceClass.GUARANTEED or not self._over_quota(head):
                continue
            if self._needs_borrowing(head) and not self.book.borrow_refusal(head.queue, head.gpus):
                continue
            if self.inadmissible(head) is None:
                self.reserving.reserve_quota_once_per_lane(head)

    def _borrow(self, job: QueuedJob) -> bool:
        """Beyond its quota a job may still run, as Opportunistic on the cohort's idle quota;
        True when it stays blocked. A gang whose GPU resource is fixed borrows whole idle
        GPUs: still a borrower, reclaimed first, but never squeezed onto share slots."""
        if job.gang.whole_gpus:
            return not self._place(job, job.gang, borrowed=True)
        opportunistic = self.cluster.kept_for(
            "opportunistic",
            job.gang,
            lambda: replace(job.gang, service_class=ServiceClass.OPPORTUNISTIC),
        )
        return not self._place(job, opportunistic, borrowed=True)

    def _in_cohort(self, queue: str) -> bool:
        spec = self.policy.queues.get(queue)
        return spec is not None and spec.cohort is not None

    def _place(self, job: QueuedJob, gang: GangRequest, borrowed: bool) -> bool:
        """Plan and assume the gang; False (with the reason recorded) when it does not fit."""
        plan = self._plan(job, gang)
        if isinstance(plan, str):
            self._block(job, plan, borrowed)
            return False
        self._assume(job, gang, plan, borrowed)
        return True

    def _place_away(self, job: QueuedJob, nodes: frozenset[str]) -> bool:
        """Admit the job on nodes none of the heads it would delay can run on; False (and
        nothing recorded) when it fits on none of them."""
        plan = self._plan(job, self._kept_off(job.gang, nodes))
        if isinstance(plan, str):
            return False
        self._assume(job, job.gang, plan, borrowed=False)
        return True

    def _plan(self, job: QueuedJob, gang: GangRequest) -> GangPlan | str:
        """The gang's plan, or why it does not fit now."""
        waited = max(0.0, self.now - job.submitted_at)
        shape = (self._shape_of(gang), gang.topology.effective(waited))
        known = self.failed_shapes.get(shape)
        if known is not None and gang.workers >= known[0]:
            return known[1] + holding_out(gang, waited)
        plan = plan_gang(self.cluster, gang, waited)
        if isinstance(plan, Unschedulable):
            # The shape's reason is shared; how long each job still holds out is its own.
            if known is None or gang.workers < known[0]:
                self.failed_shapes[shape] = (gang.workers, plan.reason)
                self._shapes_failed += 1
            return plan.reason + holding_out(gang, waited)
        return plan

    def _shape_of(self, gang: GangRequest) -> object:
        """A token for all that decides where a gang's worker fits but the number of workers
        and the topology, one per such shape while the nodes stand: found by the gang's
        identity, as hashing its shape at every visit was a cost (#39). The gangs the cycle
        plans are kept (its jobs', and those made of them by _kept_off and _borrow)."""
        return self.cluster.kept_for("shape", gang, lambda: self._shape_token(gang))

    def _shape_token(self, gang: GangRequest) -> object:
        key = (
            "shape",
            gang.service_class,
            gang.gpus_per_worker,
            gang.gpu_model,
            gang.gpu_memory_mib,
            gang.constraints,
            gang.companions,
        )
        return self.cluster.kept_while_nodes_stand(key, object)

    def _kept_off(self, gang: GangRequest, nodes: frozenset[str]) -> GangRequest:
        """The gang kept off `nodes` (core/held.avoiding), kept while the nodes stand."""
        known: dict[frozenset[str], GangRequest] = self.cluster.kept_for("kept-off", gang, dict)
        found = known.get(nodes)
        if found is None:
            if len(known) >= 16:
                known.clear()  # the heads it avoids come and go
            found = known[nodes] = avoiding(gang, nodes)
        return found

    def _assume(self, job: QueuedJob, gang: GangRequest, plan: GangPlan, borrowed: bool) -> None:
        apply_plan(self.cluster, gang, plan)
        if gang.service_class is ServiceClass.GUARANTEED:
            self.reserving.assumed(job, gpus_by_node(plan), borrowed)
            if not borrowed:
                self.usage[job.queue] = self.usage.get(job.queue, 0) + job.gpus
        if borrowed:
            self.book.borrowed[job.queue] = self.book.borrowed.get(job.queue, 0) + job.gpus
        self.result.admitted.append(Admission(job, plan, gang.service_class, borrowed))

    def _block(self, job: QueuedJob, reason: str, borrowed: bool = False) -> None:
        self.result.pending.append(Pending(job, reason))
        # A borrower runs on share slots or on idle GPUs it may lose: it has nothing to reserve.
        if (
            self.policy.backfill_of(job.queue)
            and job.service_class is ServiceClass.GUARANTEED
            and not borrowed
        ):
            self.reserving.reserve(job)

    def _over_quota(self, job: QueuedJob) -> bool:
        """_quota_reason is not None, without the words (asked for every lane at every pop)."""
        if job.service_class is not ServiceClass.GUARANTEED:
            return False
        quota = self.policy.quota(job.queue)
        return quota is not None and self.usage.get(job.queue, 0) + job.gpus > quota

    def _quota_reason(self, job: QueuedJob) -> str | None:
        if not self._over_quota(job):
            return None
        used, quota = self.usage.get(job.queue, 0), self.policy.quota(job.queue)
        return (
            f"queue {job.queue} guaranteed quota: {used} of {quota} GPUs in use, "
            f"job needs {job.gpus}"
        )
