"""Checkpoint on notice: save before a reclaim or an eviction takes the GPUs away.

gangshare gives notice the way Kubernetes does: it deletes the worker pods with a grace period
(the operator when a cohort's lender reclaims borrowed GPUs, the node agent when an
Opportunistic worker overruns its GPU memory cap), and the kubelet sends SIGTERM, then SIGKILL
once the grace is over. `on_preempt(save)` turns that SIGTERM into:

1. a flag: the training loop runs on to the end of the step it is in;
2. at the next step boundary (the end of `step()`, `mark()`, a hooked optimizer step) `save()`
   runs once, on the thread that trains, with the model between steps;
3. the process exits with 143 (128 + SIGTERM, what SIGTERM's default action reports), which
   the operator counts as the infrastructure's, never as the job's failure.

If no boundary comes within half the grace, `save()` runs on a watchdog thread instead, with
the training thread wherever it is, and the process exits right after. The grace is
GANGSHARE_PREEMPT_GRACE_SECONDS (the operator sets the pod's terminationGracePeriodSeconds), 30 s
(Kubernetes' default) without it, or what `on_preempt` is given. Whatever still runs at the end
of the grace is ended with 143 by the watchdog (the kubelet's SIGKILL would come then anyway).

A failing `save()` is logged with its traceback (logger `gangshare.sdk`, on stderr without
logging set up) and kept in `Preemption.error`; the process still exits with 143.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any, Protocol

log = logging.getLogger("gangshare.sdk")

PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM  # 143
DEFAULT_GRACE_SECONDS = 30.0
# What the watchdog keeps back from the grace for its own exit, so it beats the SIGKILL.
EXIT_MARGIN_SECONDS = 1.0
_ARMED, _NOTICED, _SAVING, _SAVED = "armed", "noticed", "saving", "saved"


class BoundarySource(Protocol):
    """What the session offers: call a function once at its next step boundary."""

    def at_next_boundary(self, fn: Callable[[], None] | None) -> None: ...


class Preemption:
    """SIGTERM turned into one save and an exit; see the module's docstring.

    `clock`, `sleep` and `hard_exit` are injectable for tests; `hard_exit` ends the process
    without unwinding (os._exit), which the watchdog needs: it is not the main thread.
    """

    def __init__(
        self,
        save: Callable[[], None],
        grace_seconds: float,
        session: BoundarySource,
        *,
        exit_code: int = PREEMPTED_EXIT_CODE,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        hard_exit: Callable[[int], Any] = os._exit,
    ) -> None:
        if not callable(save):
            raise TypeError(f"on_preempt needs a callable save, got {save!r}")
        if not grace_seconds >= 0.0:  # NaN too
            raise ValueError(f"grace_seconds: must be 0 or more, got {grace_seconds!r}")
        self._save = save
        self.grace_seconds = float(grace_seconds)
        self.exit_code = exit_code
        self._session = session
        self._clock, self._sleep, self._hard_exit = clock, sleep, hard_exit
        # Re-entrant: the handler runs on the main thread, which may hold it at that moment.
        self._lock = threading.RLock()
        self._state = _ARMED
        self._started = threading.Event()
        self._done = threading.Event()
        self.noticed_at: float | None = None
        self.saved = False
        self.error: BaseException | None = None
        self.saved_by: str | None = None  # "boundary" or "watchdog"
        self._previous: Any = None
        self._installed = False
        self._pid = os.getpid()

    @property
    def noticed(self) -> bool:
        return self._state != _ARMED

    def install(self) -> Preemption:
        """Take SIGTERM over (from the main thread, as Python requires of signal handlers);
        the handler it replaces is called after the save, on the main thread."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("on_preempt: call it from the main thread (handlers run there)")
        self._previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, self._handle)
        self._installed = True
        return self

    def remove(self) -> None:
        """Give SIGTERM back to the handler found at install (from the main thread). A notice
        already taken goes on: the save and the exit still come."""
        if self._installed and signal.getsignal(signal.SIGTERM) == self._handle:
            previous = self._previous if self._previous is not None else signal.SIG_DFL
            signal.signal(signal.SIGTERM, previous)
        self._installed = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            # A forked child (a DataLoader worker) inherited the handler: not its save to make.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        self.notice()

    def notice(self) -> None:
        """What SIGTERM does: ask for the save at the next boundary and start the watchdog.
        A second notice changes nothing."""
        with self._lock:
            if self._state != _ARMED:
                return
            self._state = _NOTICED
            self.noticed_at = self._clock()
            self._session.at_next_boundary(self.at_boundary)
        threading.Thread(target=self._watch, name="gangshare-preempt", daemon=True).start()

    def at_boundary(self) -> None:
        """Save (or wait for the watchdog's save) and leave: SystemExit on the main thread, so
        `finally` blocks and atexit handlers (the SDK's last report) run; a hard exit on any
        other, where SystemExit would end only that thread."""
        log.warning(
            "gangshare: notice of preemption (SIGTERM): saving at a step boundary, then exiting"
        )
        self._run_save("boundary")
        if threading.current_thread() is not threading.main_thread():
            self._exit()
        previous = self._previous
        if callable(previous):
            previous(signal.SIGTERM, None)  # it may exit in its own way
        raise SystemExit(self.exit_code)

    def _run_save(self, by: str) -> None:
        with self._lock:
            mine = self._state in (_ARMED, _NOTICED)
            if mine:
                self._state = _SAVING
                self._started.set()
        if not mine:
            self._done.wait()  # the other thread's save: wait for its end
            return
        try:
            self._save()
            self.saved, self.saved_by = True, by
        except Exception as err:
            self.error = err
            log.exception("gangshare: the save on preemption failed; the process exits without it")
        finally:
            with self._lock:
                self._state = _SAVED
            self._done.set()

    def _watch(self) -> None:
        # Plain sleeps, no waits on the events: the main thread's save must not wake this
        # thread while the interpreter shuts down (a daemon thread taking the GIL back then
        # ends through pthread_exit, which aborts where libgcc_s is missing).
        noticed = self.noticed_at if self.noticed_at is not None else self._clock()
        half = self.grace_seconds / 2.0
        self._sleep(max(0.0, noticed + half - self._clock()))
        if not self._started.is_set():
            log.warning(
                "gangshare: no step boundary within %.1fs of the notice: saving from the "
                "watchdog thread, the training thread is mid-step",
                half,
            )
            self._run_save("watchdog")
            self._exit()
            return
        deadline = noticed + max(self.grace_seconds - EXIT_MARGIN_SECONDS, half)
        self._sleep(max(0.0, deadline - self._clock()))
        if not self._done.is_set():
            log.error("gangshare: the save on preemption did not end within the grace")
        self._exit()

    def _exit(self) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()
            except Exception:  # a closed or broken stream: nothing left to flush to
                pass
        self._hard_exit(self.exit_code)
