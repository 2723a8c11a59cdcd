"""One training process's side of AntMan's GPU sharing: step times out, caps in, pacing.

Duty 0 pauses the job until the agent raises it, unless the agent has been gone for
`stale_after` seconds: then the static caps Allocate put in the environment apply again, so
a job never waits on a dead agent.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from gangshare.sdk import torch_caps
from gangshare.sdk.caps import Caps, CapsCallback, idle_for
from gangshare.sdk.connection import AgentConnection
from gangshare.sdk.env import read_env
from gangshare.sdk.steps import CountedStep, TimedStep
from gangshare.sdk.wire import (
    MAX_STEPS_PER_REPORT,
    WireError,
    hello_message,
    read_caps,
    read_error,
    steps_message,
)

log = logging.getLogger("gangshare.sdk")

SDK_VERSION = "0.1.0"
# The agent refuses a whole report over one step time outside (0, a day].
_LONGEST_STEP = 86400.0
# Every live session, for the fork handler at the bottom.
_SESSIONS: weakref.WeakSet[Session] = weakref.WeakSet()


class Session:
    """The SDK's state in one process; `gangshare.sdk`'s functions use a default one.

    `env` defaults to os.environ. `clock` and `sleep` are injectable so tests need not wait;
    the other knobs are seconds: how often reports go out, how often the socket is polled
    for caps, how long a lost agent's caps hold, how often a lost agent is retried, and the
    longest single pacing sleep (raised caps take effect within one).
    """

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
        report_every: float = 0.2,
        poll_every: float = 0.02,
        stale_after: float = 30.0,
        retry_every: float = 1.0,
        pace_slice: float = 0.5,
    ) -> None:
        settings = read_env(os.environ if env is None else env)
        self._clock, self._sleep = clock, sleep
        self._report_every, self._poll_every = report_every, poll_every
        self._stale_after, self._retry_every = stale_after, retry_every
        self._pace_slice = pace_slice
        self._lock = threading.Lock()
        self._count = settings.resume_step
        self._defaults = Caps(settings.duty, settings.memory_mib, 0, False)
        self._conn = (
            AgentConnection(settings.socket_path, self._hello, retry_every)
            if settings.socket_path
            else None
        )
        self._caps = self._defaults if self._conn else Caps(1.0, None, 0, False)
        self._callbacks: list[CapsCallback] = []
        self._steps: deque[float] = deque(maxlen=MAX_STEPS_PER_REPORT)
        now = clock()
        self._last_report, self._last_service = now, -math.inf
        self._reported = self._count
        self._lost_at: float | None = now
        self._memory_applied: int | None = None
        self._mark_start: float | None = None
        self._last_error: str | None = None
        self._idle = CountedStep(self._count_one)
        # Set by a notice of preemption (gangshare.sdk.preempt): run once at the next boundary.
        self._at_boundary: Callable[[], None] | None = None
        _SESSIONS.add(self)

    @property
    def agent(self) -> bool:
        """Whether the environment names an agent socket (else every call is a cheap no-op)."""
        return self._conn is not None

    @property
    def count(self) -> int:
        return self._count

    def caps(self) -> Caps:
        return self._caps

    def on_caps(self, fn: CapsCallback) -> Callable[[], None]:
        """Call `fn(caps)` after every change of caps; returns a function that unregisters it."""
        with self._lock:
            self._callbacks.append(fn)

        def remove() -> None:
            with self._lock:
                if fn in self._callbacks:
                    self._callbacks.remove(fn)

        return remove

    def step(self, sync: bool = True) -> AbstractContextManager[None]:
        """Context manager around one mini-batch; see the module's docstring."""
        return TimedStep(self._clock, self._finish, sync) if self._conn is not None else self._idle

    def mark(self, sync: bool = True) -> None:
        """A step boundary (an optimizer step ended): the step is the time since the last one."""
        try:
            if self._conn is None:
                self._count_one()
                return
            if sync:
                torch_caps.synchronize()
            end = self._clock()
            start = self._mark_start
            # The first boundary has no start: the time before it is setup, not a step.
            self._finish(0.0 if start is None else end - start, end)
            self._mark_start = self._clock()
        except Exception:
            log.exception("gangshare SDK failed at a step boundary; training goes on")

    def at_next_boundary(self, fn: Callable[[], None] | None) -> None:
        """Call `fn` once at the end of the next step (`on_preempt`'s save and exit); None
        cancels. Takes no lock: a signal handler calls it."""
        self._at_boundary = fn

    def flush(self) -> None:
        """Send what is waiting now (a last report before exit), if the agent is there."""
        if self._conn is None:
            return
        with self._lock:
            self._last_report = -math.inf
            changes = self._service(self._clock())
        self._notify(changes)

    def close(self) -> None:
        try:
            self.flush()
        except Exception:
            log.debug("final report failed", exc_info=True)
        if self._conn is not None:
            with self._lock:
                self._conn.close()

    def _count_one(self) -> None:
        # acquire/release, not `with`: a third cheaper on the no-agent path, and `+= 1`
        # cannot raise between them.
        lock = self._lock
        lock.acquire()
        self._count += 1
        lock.release()
        if self._at_boundary is not None:
            self._boundary()

    def _boundary(self) -> None:
        fn, self._at_boundary = self._at_boundary, None
        if fn is not None:
            fn()

    def _finish(self, seconds: float, now: float) -> None:
        with self._lock:
            self._count += 1
            if 0.0 < seconds <= _LONGEST_STEP:
                self._steps.append(seconds)
            changes = self._service(now) if now - self._last_service >= self._poll_every else None
            duty = self._caps.duty
        self._notify(changes)
        if duty < 1.0:
            self._pace(seconds)
        if self._at_boundary is not None:
            self._boundary()

    def _pace(self, seconds: float) -> None:
        slept = 0.0
        while True:
            conn = self._conn
            assert conn is not None
            duty, connected = self._caps.duty, conn.connected
            # A notice of preemption ends a pause: the save is due at this boundary.
            if duty >= 1.0 or self._at_boundary is not None:
                return
            if duty > 0.0:
                want = idle_for(seconds, duty) - slept
                if want <= 0.0:
                    return
                chunk = min(want, self._pace_slice)
                self._sleep(chunk)
                slept += chunk
                force = False
            else:
                started = self._clock()
                if connected:
                    conn.wait(self._retry_every)
                else:
                    self._sleep(min(self._retry_every, self._stale_after))
                # A pause is idle time: it counts towards the sleep the duty asks for after it.
                slept += self._clock() - started
                force = True
            with self._lock:
                now = self._clock()
                due = force or now - self._last_service >= self._poll_every
                changes = self._service(now) if due else None
            self._notify(changes)

    def _service(self, now: float) -> Caps | None:
        """Talk to the agent; the new caps if they changed. Called with the lock held."""
        conn = self._conn
        assert conn is not None
        self._last_service = now
        before = self._caps
        conn.ensure(now)
        for message in conn.poll():
            self._take(message)
        if conn.connected:
            self._lost_at = None
        elif self._lost_at is None:
            self._lost_at = now
        elif now - self._lost_at >= self._stale_after and self._caps != self._defaults:
            self._caps = self._defaults
        if self._caps.connected != conn.connected:
            self._caps = replace(self._caps, connected=conn.connected)
        if (
            conn.connected
            and self._count != self._reported
            and now - self._last_report >= self._report_every
        ):
            # A full socket drops the report, not the steps: the next one carries them (the
            # latest MAX_STEPS_PER_REPORT), so a final flush still gets the count through.
            self._last_report = now
            if conn.ready() and conn.send(steps_message(list(self._steps), self._count)):
                self._steps.clear()
                self._reported = self._count
        memory = self._caps.memory_mib
        if memory != self._memory_applied and torch_caps.apply_memory_cap(
            memory, self._memory_applied
        ):
            self._memory_applied = memory
        return self._caps if self._caps != before else None

    def _take(self, message: dict[str, Any]) -> None:
        try:
            caps = read_caps(message)
        except WireError as err:
            log.debug("ignored caps from the agent: %s", err)
            caps = None
        if caps is not None:
            self._caps = Caps(caps.duty, caps.memory_mib, caps.generation, True)
        error = read_error(message)
        if error is not None and error != self._last_error:
            log.warning("the gangshare agent refused this process: %s", error)
        self._last_error = error or self._last_error

    def _notify(self, caps: Caps | None) -> None:
        if caps is None:
            return
        for fn in list(self._callbacks):
            try:
                fn(caps)
            except Exception:
                log.exception("an on_caps callback failed")

    def _hello(self) -> bytes:
        return hello_message(SDK_VERSION, torch_caps.loaded_torch() is not None)

    def _after_fork(self) -> None:
        # Another thread may have held the lock at fork time; in the child it never returns.
        self._lock = threading.Lock()
        self._steps.clear()


def _after_fork_in_child() -> None:
    for session in list(_SESSIONS):
        session._after_fork()


if hasattr(os, "register_at_fork"):  # POSIX only
    os.register_at_fork(after_in_child=_after_fork_in_child)
