"""Run-time prediction for backfill: the user's estimate, else history, else a default.

History is keyed by (queue, GPUs): jobs of one team at one size tend to repeat
(Philly, Helios). The prediction is the median of the most recent runs.
"""

from __future__ import annotations

from collections import deque
from statistics import median

HISTORY_PER_KEY = 50


class RuntimeEstimator:
    def __init__(self, default_seconds: float = 3600.0, history: int = HISTORY_PER_KEY) -> None:
        self.default_seconds = default_seconds
        self._history = history
        self._runs: dict[tuple[str, int], deque[float]] = {}

    def observe(self, queue: str, gpus: int, seconds: float) -> None:
        """Record a finished job's run time (successful runs only: failures say little)."""
        if seconds <= 0:
            return
        self._runs.setdefault((queue, gpus), deque(maxlen=self._history)).append(seconds)

    def predict(self, queue: str, gpus: int, declared: float | None = None) -> float:
        if declared is not None and declared > 0:
            return declared
        runs = self._runs.get((queue, gpus))
        if runs:
            return float(median(runs))
        return self.default_seconds
