"""The context managers `Session.step()` hands out; neither lets an SDK error reach training."""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType

from gangshare.sdk import torch_caps

log = logging.getLogger("gangshare.sdk")


class TimedStep:
    """Times one step and hands it to the session, which reports, polls and paces."""

    __slots__ = ("_clock", "_finish", "_start", "_sync")

    def __init__(
        self, clock: Callable[[], float], finish: Callable[[float, float], None], sync: bool
    ) -> None:
        self._clock, self._finish, self._sync, self._start = clock, finish, sync, 0.0

    def __enter__(self) -> None:
        self._start = self._clock()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if kind is not None:
            return  # a failed step is no step: nothing to count, time or pace
        try:
            if self._sync:
                torch_caps.synchronize()
            end = self._clock()
            self._finish(end - self._start, end)
        except Exception:
            log.exception("gangshare SDK failed after a step; training goes on")


class CountedStep:
    """No agent: only the count, so `with step()` costs little more than any `with`.

    Stateless, so one instance serves every step and thread.
    """

    __slots__ = ("_count_one",)

    def __init__(self, count_one: Callable[[], None]) -> None:
        self._count_one = count_one

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if kind is None:
            self._count_one()
