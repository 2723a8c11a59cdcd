"""Backfill reservations: what a blocked head is promised, and who may start before it.

A head blocked by GPUs or by its queue's quota reserves what it waits for, at the
earliest time the expected ends of running guaranteed jobs free it (EASY backfill on
predicted run times). A later guaranteed job may start only if it ends, by its own
estimate, before a reservation starts or fits in what the reservation leaves to spare:
GPUs for every queue, quota for the head's own queue. A head that has waited past the
policy's starvation bound gets its queue's quota outright: nothing else of its queue
starts guaranteed until it does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# (expected end, GPUs), sorted by end.
Endings = Sequence[tuple[float, int]]


@dataclass
class Reservation:
    """A blocked head's claim: GPUs expected free at `start`, `extra` of them to spare; and,
    when it waits for its queue's quota, that queue's quota from `quota_start` with
    `quota_extra` to spare."""

    head: str
    start: float
    extra: int
    gpus: int = 0
    # When the head is expected to end if it starts at `start`.
    until: float = 0.0
    queue: str | None = None
    quota_start: float = 0.0
    quota_extra: int = 0

    def takes_gpus(self, gpus: int, ends: float) -> bool:
        """A job of `gpus` ending at `ends` would leave the head too few GPUs at its start."""
        return ends > self.start and gpus > self.extra

    def takes_quota(self, queue: str, gpus: int, ends: float) -> bool:
        """A job of `queue` would spend quota the head is promised."""
        return self.queue == queue and ends > self.quota_start and gpus > self.quota_extra

    def hold(self, queue: str, gpus: int, ends: float) -> None:
        """Count a job admitted beside the reservation against what it leaves to spare."""
        if ends > self.start:
            self.extra -= gpus
        if self.queue == queue and ends > self.quota_start:
            self.quota_extra -= gpus


@dataclass(frozen=True)
class BackfillRefusal:
    reason: str
    # Only its queue's reserved quota stands in the way: it may still borrow from a cohort.
    quota_only: bool


def backfill_refusal(
    reservations: Sequence[Reservation], queue: str, gpus: int, ends: float
) -> BackfillRefusal | None:
    """Why a guaranteed job may not start now beside the reservations; None when it may.
    A head's GPUs are named before a queue's quota: only the quota may be borrowed around."""
    for r in reservations:
        if r.takes_gpus(gpus, ends):
            reason = (
                f"backfill: would delay {r.head}, which holds a reservation from t={r.start:.0f}s"
            )
            return BackfillRefusal(reason, quota_only=False)
    for r in reservations:
        if r.takes_quota(queue, gpus, ends):
            reason = (
                f"backfill: would spend queue {queue}'s quota reserved for {r.head} "
                f"from t={r.quota_start:.0f}s"
            )
            return BackfillRefusal(reason, quota_only=True)
    return None


def hold_all(reservations: Sequence[Reservation], queue: str, gpus: int, ends: float) -> None:
    for reservation in reservations:
        reservation.hold(queue, gpus, ends)


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
