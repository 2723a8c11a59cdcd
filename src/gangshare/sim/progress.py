"""A small stderr progress bar for long replays (redrawn at most a few times a second)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    def __init__(
        self,
        total: int,
        label: str,
        stream: TextIO | None = None,
        width: int = 30,
        every_seconds: float = 0.25,
    ) -> None:
        self.total = max(1, total)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.every = every_seconds
        self._began = time.monotonic()
        self._drawn = 0.0
        self._done = 0

    def __call__(self, done: int) -> None:
        self._done = done
        now = time.monotonic()
        if now - self._drawn >= self.every:
            self._drawn = now
            self._draw(now)

    def render(self, done: int, elapsed: float) -> str:
        share = min(1.0, done / self.total)
        filled = int(share * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        return f"{self.label} [{bar}] {share:4.0%} {done}/{self.total} jobs {elapsed:5.1f}s"

    def _draw(self, now: float) -> None:
        self.stream.write("\r" + self.render(self._done, now - self._began))
        self.stream.flush()

    def close(self) -> None:
        self._draw(time.monotonic())
        self.stream.write("\n")
        self.stream.flush()
