"""Time enters the core only through a Clock, so the simulator can drive it virtually."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch (or since the start of a simulation)."""
        ...


class WallClock:
    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that only moves when told to: for tests and the simulator."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock never runs backwards")
        self._now += seconds

    def set(self, when: float) -> None:
        if when < self._now:
            raise ValueError("a clock never runs backwards")
        self._now = when
