"""Which open lane a cycle visits next, when lanes compete (fair share, cohorts).

The cycle visits the lane whose head has the best priority (`_Cycle.lane_priority`). A
lane's priority changes when its head does, and every lane's when a job is admitted (its
queue's usage or borrowing moves); nothing else changes one within a cycle. So each is kept
until then: judging every open lane at every pop was a sixth of a backlogged replay (#40).
"""

from __future__ import annotations

from collections.abc import Callable

from gangshare.core.queueing import QueuedJob

Lane = list[QueuedJob]


class LanePicker:
    def __init__(
        self, priority: Callable[[Lane], tuple[object, ...]], admitted: Callable[[], int]
    ) -> None:
        self._priority = priority
        self._admitted = admitted
        self._seen_admitted = 0
        self._kept: dict[int, tuple[object, ...]] = {}

    def pick(self, open_lanes: list[Lane]) -> Lane:
        """The open lane to visit next (the first of equals, in `open_lanes` order); the
        caller pops its head, so its priority is judged again next time."""
        if self._admitted() != self._seen_admitted:
            self._seen_admitted = self._admitted()
            self._kept.clear()
        kept = self._kept
        for lane in open_lanes:
            if id(lane) not in kept:
                kept[id(lane)] = self._priority(lane)
        chosen = min(open_lanes, key=lambda lane: kept[id(lane)])
        del kept[id(chosen)]
        return chosen
