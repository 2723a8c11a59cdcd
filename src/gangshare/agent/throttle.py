"""The backstop's stop/continue: an uncooperative opportunistic pod runs only its duty's share.

The pod is stopped whole, by freezing its cgroup (agent/freezer.py), and the core
hands the same duty to every pod of the gang on this node, so ranks stay in step. A pod that
leaves the throttled set, and every pod when the agent stops, is continued: the agent never
leaves anything stopped behind it.

An agent that is SIGKILLed or OOM-killed cannot continue anything, so the pods it may stop
are written to a state file on the node before it ever stops one (write-ahead), and the next
agent to start continues every process of every pod named there before it does anything else.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from gangshare.agent.freezer import CgroupFreezer, PodStopper
from gangshare.core.enforcement import running_at

log = logging.getLogger("gangshare.agent")
TICK_SECONDS = 0.05


class Throttler:
    def __init__(
        self,
        period: float,
        stopper: PodStopper | None = None,
        clock: Callable[[], float] = time.monotonic,
        state_file: Path | None = None,
    ) -> None:
        self.period = period
        self.state_file = state_file
        self._recorded: frozenset[str] = frozenset()
        self.stopper: PodStopper = stopper if stopper is not None else CgroupFreezer()
        self.clock = clock
        self._duties: dict[str, float] = {}
        self._stopped: set[str] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.cycles = 0

    def set_duties(self, duties: Mapping[str, float]) -> None:
        with self._lock:
            may_stop = frozenset(duties) | self._stopped
            if may_stop - self._recorded:
                self._record(may_stop)  # before the tick can stop any of them
            self._duties = dict(duties)

    def _record(self, uids: frozenset[str]) -> None:
        if self.state_file is not None:
            write_state(self.state_file, uids)
        self._recorded = uids

    def resume_left_stopped(self) -> list[str]:
        """Thaw and continue the pods a previous agent may have left stopped."""
        if self.state_file is None:
            return []
        uids = read_state(self.state_file)
        if uids:
            self.stopper.resume(uids)
            log.warning("continued pods a previous agent may have left stopped: %s", uids)
        with self._lock:
            self._record(frozenset(self._duties) | self._stopped)
        return uids

    def stopped(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._stopped)

    def start(self) -> None:
        self.resume_left_stopped()
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
        self.stopper.stop(to_stop)
        self.stopper.resume(to_continue)
        self.cycles += len(to_stop)
        with self._lock:
            self._stopped = want_stopped
            if release_all:
                self._record(frozenset())


def write_state(path: Path, uids: frozenset[str]) -> None:
    """Atomically (rename), so a kill mid-write leaves the old list, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"mayBeStopped": sorted(uids)}))
    os.replace(tmp, path)


def read_state(path: Path) -> list[str]:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as err:
        log.error("throttle state %s unreadable (%s): nothing to continue from it", path, err)
        return []
    uids = doc.get("mayBeStopped") if isinstance(doc, dict) else None
    return [u for u in uids if isinstance(u, str)] if isinstance(uids, list) else []
