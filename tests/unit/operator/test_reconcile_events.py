"""Pod watch events drive reconciles: one per job at a time, whatever the burst."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from gangshare.core.clock import ManualClock
from gangshare.operator import reconcile
from gangshare.operator.handlers import pod_listener
from gangshare.operator.informers import Informers
from gangshare.operator.reconcile import OperatorOptions, Reconciler


class CountingReconciler(Reconciler):
    """The real dispatch and coalescing; each reconcile only counts and waits to be let go."""

    def __init__(self) -> None:
        super().__init__(None, ManualClock(0.0), OperatorOptions())  # type: ignore[arg-type]
        self.runs: list[str] = []
        self.release = threading.Event()
        self.started = threading.Event()

    def _reconcile(
        self, namespace: str, name: str, displaced: Any, event_job: Any = None
    ) -> float | None:
        self.runs.append(f"{namespace}/{name}")
        self.started.set()
        self.release.wait(5)
        return None


def settle(reconciler: CountingReconciler, runs: int) -> None:
    deadline = time.monotonic() + 5
    while len(reconciler.runs) < runs and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_burst_of_events_costs_one_running_and_one_waiting_reconcile_per_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reconcile, "EVENT_GATHER_SECONDS", 0.0)
    reconciler = CountingReconciler()
    reconciler.reconcile_later("team", "big")
    assert reconciler.started.wait(5)
    # 500 events while the first reconcile runs: one more waits; the rest add nothing.
    for _ in range(500):
        reconciler.reconcile_later("team", "big")
    reconciler.reconcile_later("team", "other")
    reconciler.release.set()
    settle(reconciler, 3)
    time.sleep(0.2)
    assert sorted(reconciler.runs) == ["team/big", "team/big", "team/other"]


def test_the_pod_watch_reconciles_gang_workers_jobs_only_while_leading() -> None:
    informers = Informers()
    calls: list[tuple[str, str]] = []
    pokes: list[int] = []
    leading = [True]

    class Recorder:
        def reconcile_later(self, namespace: str, name: str) -> None:
            calls.append((namespace, name))

    class Loop:
        def poke(self) -> None:
            pokes.append(1)

    informers.pod_listener = pod_listener(Recorder(), Loop(), lambda: leading[0])  # type: ignore[arg-type]
    apply = informers._applier(informers.pods)
    worker = {"metadata": {"name": "big-worker-0", "namespace": "team", "labels": {}}}
    worker["metadata"]["labels"]["gangshare.io/job"] = "big"
    bare = {"metadata": {"name": "bare", "namespace": "team", "labels": {}}}
    apply("ADDED", worker)
    apply("ADDED", bare)
    assert [o["metadata"]["name"] for o in informers.pods.items()] == ["big-worker-0", "bare"]
    assert calls == [("team", "big")] and len(pokes) == 1
    leading[0] = False
    apply("DELETED", worker)
    assert calls == [("team", "big")] and informers.pods.items() == [bare]
