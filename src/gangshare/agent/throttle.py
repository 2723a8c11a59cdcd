"""The backstop's stop/continue: an uncooperative opportunistic pod runs only its duty's share.

Every process of the pod (found by cgroup) is stopped and continued together, and the core
hands the same duty to every pod of the gang on this node, so ranks stay in step. A pod that
leaves the throttled set, and every pod when the agent stops, is continued: the agent never
leaves anything stopped behind it.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping

from gangshare.agent.cgroups import pids_by_pod
from gangshare.core.enforcement import running_at

log = logging.getLogger("gangshare.agent")
TICK_SECONDS = 0.05


class Throttler:
    def __init__(
        self,
        period: float,
        pids: Callable[[], Mapping[str, list[int]]] = pids_by_pod,
        kill: Callable[[int, int], None] = os.kill,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.period = period
        self.pids = pids
        self.kill = kill
        self.clock = clock
        self._duties: dict[str, float] = {}
        self._stopped: set[str] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.cycles = 0

    def set_duties(self, duties: Mapping[str, float]) -> None:
        with self._lock:
            self._duties = dict(duties)

    def stopped(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._stopped)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="throttle", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.tick(release_all=True)

    def _run(self) -> None:
        while not self._stopping.wait(TICK_SECONDS):
            try:
                self.tick()
            except Exception as err:  # a vanished process must not end throttling
                log.warning("throttle: %s", err)

    def tick(self, release_all: bool = False) -> None:
        now = self.clock()
        with self._lock:
            duties = {} if release_all else dict(self._duties)
            stopped = set(self._stopped)
        want_stopped = {u for u, d in duties.items() if not running_at(d, now, self.period)}
        to_stop, to_continue = want_stopped - stopped, stopped - want_stopped
        if not to_stop and not to_continue:
            return
        pids = self.pids()
        for uid in to_stop:
            self._signal(pids.get(uid, []), signal.SIGSTOP)
        for uid in to_continue:
            self._signal(pids.get(uid, []), signal.SIGCONT)
        self.cycles += len(to_stop)
        with self._lock:
            self._stopped = want_stopped

    def _signal(self, pids: list[int], sig: int) -> None:
        for pid in pids:
            try:
                self.kill(pid, sig)
            except ProcessLookupError:
                continue
