"""Forecasts made beside the pass: a spawned worker at the lowest CPU priority makes the same
round the pass would; the pass keeps the last forecast while one runs and is never held by
it; a worker that dies costs one round, not the forecasts."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from dataclasses import replace

import pytest
from builders import make_cluster, make_gang

from gangshare.core import ServiceClass
from gangshare.core.cycle import schedule_cycle
from gangshare.core.forecast import ForecastSettings
from gangshare.core.queueing import QueuedJob, QueuePolicy, RunningJob
from gangshare.operator.forecast_worker import ForecastAsk, ForecastWorker, forecast_round
from gangshare.operator.forecasts import ForecastBook

EXACT = ForecastSettings(min_step_seconds=1.0, step_share=0.0)
POLICY = QueuePolicy()


def job(key: str, gpus: int, at: float) -> QueuedJob:
    return QueuedJob(key, make_gang(key).gpus(gpus).build(), at, "default", 0, 300.0)


def scene():  # type: ignore[no-untyped-def]
    cluster = make_cluster().nodes(1, gpus=4).holding("old", "node-0", (0, 1, 2, 3)).build()
    running = [RunningJob("old", "default", 4, ServiceClass.GUARANTEED, 500.0)]
    return cluster, [job("a", 4, 1), job("b", 2, 2)], running


def ask(now: float) -> ForecastAsk:
    cluster, waiting, running = scene()
    return ForecastAsk(cluster, tuple(waiting), tuple(running), POLICY, now, EXACT, None)


class Worker:
    """A real worker, and the event its rounds set when done."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.worker = ForecastWorker(on_ready=self.ready.set)

    def finished(self):  # type: ignore[no-untyped-def]
        assert self.ready.wait(120), "the worker never reported its round"
        self.ready.clear()
        return self.worker.take()

    def pids(self) -> list[int]:
        return list(self.worker._pool._processes)  # type: ignore[union-attr]


@pytest.fixture
def spawned() -> Iterator[Worker]:
    made = Worker()
    try:
        yield made
    finally:
        made.worker.stop()


def test_the_worker_makes_the_round_the_pass_would_at_the_lowest_priority(spawned: Worker):
    spawned.worker.submit(ask(10.0))
    made = spawned.finished()
    assert made is not None
    assert made.forecasts == forecast_round(ask(10.0)).forecasts
    assert made.forecasts["a"].start == 500 and made.forecasts["b"].start == 800
    assert made.waiting == {"a", "b"}
    assert spawned.worker.take() is None  # taken once
    assert [os.getpriority(os.PRIO_PROCESS, pid) for pid in spawned.pids()] == [19]


def test_a_worker_killed_mid_life_costs_one_round_and_the_next_is_made_by_a_new_one(
    spawned: Worker,
):
    spawned.worker.submit(ask(10.0))
    assert spawned.finished() is not None
    for pid in spawned.pids():
        os.kill(pid, signal.SIGKILL)
    spawned.worker.submit(ask(20.0))
    assert spawned.finished() is None  # the broken pool's round: logged, dropped
    spawned.worker.submit(ask(30.0))
    made = spawned.finished()
    assert made is not None and made.forecasts["a"].start == 500


class HeldWorker:
    """A worker whose round finishes only when the test says so."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self.done: object | None = None

    @property
    def busy(self) -> bool:
        return bool(self.asked) and self.done is None

    def submit(self, asked: ForecastAsk) -> None:
        self.asked.append(asked.now)
        self.args = replace(asked, cluster=asked.cluster.copy())

    def finish(self) -> None:
        self.done = forecast_round(self.args)

    def take(self):  # type: ignore[no-untyped-def]
        done, self.done = self.done, None
        if done is not None:
            self.asked.clear()
        return done


def test_the_pass_keeps_the_last_forecast_while_a_round_runs_and_takes_it_when_done():
    cluster, waiting, running = scene()
    book = ForecastBook(period_seconds=30, settings=EXACT)
    worker = HeldWorker()
    book.worker = worker  # type: ignore[assignment]
    result = schedule_cycle(cluster.copy(), waiting, running, POLICY, 10.0)
    assert book.after_cycle(cluster, result, running, POLICY, 10.0) == {}  # asked, not waited for
    assert worker.asked == [10.0]
    assert book.after_cycle(cluster, result, running, POLICY, 12.0) == {}
    assert worker.asked == [10.0]  # one round at a time
    worker.finish()
    out = book.after_cycle(cluster, result, running, POLICY, 13.0)
    assert out["a"].start == 500 and book.rounds == 1
    assert worker.asked == []  # nothing new due within the gap
    assert book.after_cycle(cluster, result, running, POLICY, 41.0) == out
    assert worker.asked == [41.0]  # the period is over: the next round, the last one kept
