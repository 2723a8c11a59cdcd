"""Forecasts made beside the scheduling pass, in a child process at the lowest CPU priority.

A forecast replays the whole backlog forward (seconds at 5,000 queued jobs, bench/forecast.py).
Made inside the pass it held admissions back for that long, and on a busy machine (2 cores
shared with the API server, bench/scale.py) any CPU it takes is CPU the admissions lack. So
the operator hands each round to one spawned worker process running at nice 19: it gets
only what admissions leave, the pass never waits for it, and its result is taken by the
first pass after it is ready (a pass is woken for that). A forecast is a report, never a
decision: a round that fails, or a worker that dies, leaves the last forecast standing.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

from gangshare.core.cluster import Cluster
from gangshare.core.forecast import Forecast, ForecastSettings, forecast_starts
from gangshare.core.queueing import QueuedJob, QueuePolicy, RunningJob
from gangshare.core.shape_advice import AdviceRound, advise_shapes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ForecastRound:
    """One forecast of the waiting jobs and the round of shape advice made with it."""

    forecasts: dict[str, Forecast]
    advice: AdviceRound
    # The jobs it was made for (advice standing for the others is kept until their turn).
    waiting: frozenset[str]
    seconds: float


@dataclass(frozen=True)
class ForecastAsk:
    """What a round is made from: the snapshot as the pass's admissions left it, and the job
    after which shape advice goes on."""

    cluster: Cluster
    waiting: tuple[QueuedJob, ...]
    running: tuple[RunningJob, ...]
    policy: QueuePolicy
    now: float
    settings: ForecastSettings
    advised_after: str | None


def forecast_round(ask: ForecastAsk) -> ForecastRound:
    """A forecast and a round of shape advice (pure: the worker process runs it as the pass
    would)."""
    began = time.perf_counter()
    args = (ask.cluster, ask.waiting, ask.running, ask.policy, ask.now)
    forecasts = forecast_starts(*args, ask.settings)
    found = advise_shapes(*args, forecasts, ask.settings, after=ask.advised_after)
    seconds = time.perf_counter() - began
    return ForecastRound(forecasts, found, frozenset(job.key for job in ask.waiting), seconds)


def _forecast_pickled(payload: bytes) -> ForecastRound:
    return forecast_round(pickle.loads(payload))


def _lowest_priority() -> None:
    os.nice(19)


class ForecastWorker:
    """One forecast round at a time in a spawned child process."""

    def __init__(self, on_ready: Callable[[], None] = lambda: None) -> None:
        self.on_ready = on_ready
        self._pool: ProcessPoolExecutor | None = None
        self._running: Future[ForecastRound] | None = None

    @property
    def busy(self) -> bool:
        return self._running is not None and not self._running.done()

    def submit(self, ask: ForecastAsk) -> None:
        self._restart_if_broken()
        if self._pool is None:
            # spawn, not fork: the operator runs threads (watches, kopf's loop), and a fork
            # would copy their locks mid-use.
            self._pool = ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn"), initializer=_lowest_priority
            )
        # Pickled here, not in the pool's feeder thread: the pass goes on meanwhile, and the
        # worker must see the snapshot as it was when the round was asked for.
        payload = pickle.dumps(ask, protocol=pickle.HIGHEST_PROTOCOL)
        self._running = self._pool.submit(_forecast_pickled, payload)
        self._running.add_done_callback(lambda _: self.on_ready())

    def take(self) -> ForecastRound | None:
        """The finished round, once (None while one runs or none was asked for); a round that
        failed is logged and dropped, and a dead worker is replaced by the next submit."""
        running = self._running
        if running is None or not running.done():
            return None
        self._running = None
        try:
            return running.result()
        except Exception:
            log.exception("start-time forecast failed; keeping the last one")
            self._restart_if_broken()
            return None

    def _restart_if_broken(self) -> None:
        if self._pool is not None and getattr(self._pool, "_broken", False):
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
