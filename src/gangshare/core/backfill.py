"""Backfill reservations: what a blocked head is promised, and who may start before it.

A head blocked by GPUs or by its queue's quota reserves what it waits for, at the
earliest time the expected ends of running guaranteed jobs free it (EASY backfill on
predicted run times). A later guaranteed job may start only if it ends, by its own
estimate, before a reservation starts or fits in what the reservation leaves to spare:
GPUs for every queue, quota for the head's own queue. A head that has waited past the
policy's starvation bound gets its queue's quota outright: nothing else of its queue
starts guaranteed until it does.

GPUs are reserved only on the nodes the head can run on (core/held.py): a job placed
elsewhere leaves them to the head, so it is never refused for delaying it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# (expected end, GPUs), sorted by end.
Endings = Sequence[tuple[float, int]]


@dataclass
class Reservation:
    """A blocked head's claim: GPUs on `nodes` (the ones it can run on; None: every node)
    expected free at `start`, `extra` of them to spare; and, when it waits for its queue's
    quota, that queue's quota from `quota_start` with `quota_extra` to spare."""

    head: str
    start: float
    extra: int
    gpus: int = 0
    # When the head is expected to end if it starts at `start`.
    until: float = 0.0
    queue: str | None = None
    quota_start: float = 0.0
    quota_extra: int = 0
    nodes: frozenset[str] | None = None

    def gpus_on(self, placed: Mapping[str, int]) -> int:
        """How many of a placement's GPUs (by node) are on nodes the head can run on."""
        if self.nodes is None:
            return sum(placed.values())
        return sum(gpus for node, gpus in placed.items() if node in self.nodes)

    def takes_gpus(self, gpus: int, ends: float) -> bool:
        """A job of `gpus` ending at `ends` would leave the head too few GPUs at its start,
        were they all on the head's nodes."""
        return ends > self.start and gpus > self.extra

    def takes_quota(self, queue: str, gpus: int, ends: float) -> bool:
        """A job of `queue` would spend quota the head is promised."""
        return self.queue == queue and ends > self.quota_start and gpus > self.quota_extra

    def hold(self, queue: str, placed: Mapping[str, int], ends: float) -> None:
        """Count a job admitted beside the reservation against what it leaves to spare: the
        GPUs it holds on the head's nodes, and all of them against its queue's quota."""
        if ends > self.start:
            self.extra -= self.gpus_on(placed)
        if self.queue == queue and ends > self.quota_start:
            self.quota_extra -= sum(placed.values())


@dataclass(frozen=True)
class BackfillRefusal:
    reason: str
    # Only its queue's reserved quota stands in the way: it may still borrow from a cohort.
    quota_only: bool
    # The nodes of the heads it would delay, when none of them may run everywhere: placed
    # on other nodes, it delays none of them and may start.
    avoid: frozenset[str] | None = None


def backfill_refusal(
    reservations: Sequence[Reservation], queue: str, gpus: int, ends: float
) -> BackfillRefusal | None:
    """Why a guaranteed job may not start now beside the reservations, judged as if its GPUs
    all landed on each head's nodes; None when it may. A head's GPUs are named before a
    queue's quota: only the quota may be borrowed around."""
    delayed = _delayed(reservations, gpus, ends)
    if delayed is None:
        return _quota_refusal(reservations, queue, gpus, ends)
    first, avoid = delayed
    reason = (
        f"backfill: would delay {first.head}, which holds a reservation from t={first.start:.0f}s"
    )
    quota = None if avoid is None else _quota_refusal(reservations, queue, gpus, ends)
    if quota is not None:
        # Away from those heads' nodes it would still spend reserved quota: that is what holds
        # it. It may not borrow instead, as a borrower could land on those heads' nodes.
        return BackfillRefusal(quota.reason, quota_only=False)
    return BackfillRefusal(reason, quota_only=False, avoid=avoid)


def _delayed(
    reservations: Sequence[Reservation], gpus: int, ends: float
) -> tuple[Reservation, frozenset[str] | None] | None:
    """The first head a job would delay, were its GPUs on that head's nodes, and the nodes of
    every head it would so delay (None when one of them may run on any node); None when it
    would delay none."""
    first: Reservation | None = None
    # Heads of one shape share one set of nodes: each distinct set is joined once.
    held: set[frozenset[str]] = set()
    for r in reservations:
        if not r.takes_gpus(gpus, ends):
            continue
        first = first or r
        if r.nodes is None:
            return first, None
        held.add(r.nodes)
    return None if first is None else (first, frozenset().union(*held))


def _quota_refusal(
    reservations: Sequence[Reservation], queue: str, gpus: int, ends: float
) -> BackfillRefusal | None:
    for r in reservations:
        if r.takes_quota(queue, gpus, ends):
            reason = (
                f"backfill: would spend queue {queue}'s quota reserved for {r.head} "
                f"from t={r.quota_start:.0f}s"
            )
            return BackfillRefusal(reason, quota_only=True)
    return None


def dominated(reservations: Sequence[Reservation], new: Reservation) -> bool:
    """Whether a reservation on the same nodes, no later and with no more to spare, already
    refuses every job `new` (a GPU reservation, no quota) would, first in the list as it is,
    and stays so: a job held beside both counts against the earlier one whenever against the
    later. Many blocked jobs of one GPU model each reserved the same GPUs, and every later
    job was judged against all of them (#39: a backlog pinned to a rare model)."""
    return any(
        old.nodes == new.nodes and old.start <= new.start and old.extra <= new.extra
        for old in reservations
    )


def hold_all(
    reservations: Sequence[Reservation], queue: str, placed: Mapping[str, int], ends: float
) -> None:
    for reservation in reservations:
        reservation.hold(queue, placed, ends)


def gpus_free_from(free_now: int, endings: Endings, needed: int, now: float) -> float | None:
    """Earliest time `needed` guaranteed GPUs are free; None when nothing running frees them."""
    free, start = free_now, now
    for end, gpus in endings:
        if free >= needed:
            break
        free += gpus
        start = max(start, end)
    return start if free >= needed else None


def free_at(free_now: int, endings: Endings, when: float) -> int:
    """Guaranteed GPUs free at `when`, by the expected ends (sorted: stops at the first later
    one, as a cycle asks this for every blocked job)."""
    free = free_now
    for end, gpus in endings:
        if end > when:
            break
        free += gpus
    return free


def quota_free_from(
    used_now: int, quota: int, endings: Endings, needed: int, now: float
) -> float | None:
    """Earliest time a queue using `used_now` of `quota` has `needed` GPUs of it left, by the
    expected ends of its own guaranteed jobs; None when they never leave enough."""
    if needed > quota:
        return None
    used, start = used_now, now
    for end, gpus in endings:
        if used + needed <= quota:
            break
        used -= gpus
        start = max(start, end)
    return start if used + needed <= quota else None


def used_at(used_now: int, endings: Endings, when: float) -> int:
    return used_now - (free_at(0, endings, when))
