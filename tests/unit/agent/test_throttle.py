"""The backstop's stop/continue (agent/throttle.py): whole pods, on the duty's schedule, and
nothing left stopped when a pod leaves the set or the agent stops."""

from __future__ import annotations

import signal

from gangshare.agent.freezer import SignalStopper
from gangshare.agent.throttle import Throttler
from gangshare.core.clock import ManualClock


def test_a_throttled_pod_is_stopped_and_continued_whole_and_released_at_the_end() -> None:
    clock = ManualClock(0.0)
    sent: list[tuple[int, int]] = []
    pids = {"o": [10, 11], "g": [20]}
    stopper = SignalStopper(lambda: pids, lambda pid, sig: sent.append((pid, sig)))
    throttler = Throttler(1.0, stopper, clock.now)
    throttler.set_duties({"o": 0.25})
    throttler.tick()  # 0.00: inside its quarter
    assert sent == [] and throttler.stopped() == frozenset()
    clock.advance(0.5)
    throttler.tick()
    assert sent == [(10, signal.SIGSTOP), (11, signal.SIGSTOP)]
    clock.advance(0.6)  # 1.1: a new period, running again
    throttler.tick()
    assert sent[2:] == [(10, signal.SIGCONT), (11, signal.SIGCONT)]
    clock.advance(0.4)
    throttler.tick()
    assert throttler.stopped() == {"o"}
    throttler.set_duties({})  # the pod cooperates again, or left
    throttler.tick()
    assert sent[-2:] == [(10, signal.SIGCONT), (11, signal.SIGCONT)]
    assert all(pid != 20 for pid, _ in sent)  # the guaranteed pod is never signalled
    throttler.set_duties({"o": 0.0})
    throttler.tick()
    assert throttler.stopped() == {"o"}
    throttler.stop()
    assert sent[-2:] == [(10, signal.SIGCONT), (11, signal.SIGCONT)]
    assert throttler.stopped() == frozenset()
