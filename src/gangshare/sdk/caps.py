"""What the agent lets a training process use, and how a duty becomes pacing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Caps:
    """What this process may use now: `duty` is the share of wall time its steps may take."""

    duty: float
    memory_mib: int | None
    generation: int
    # Whether the agent is connected now; caps from an agent that left hold for a while.
    connected: bool


CapsCallback = Callable[[Caps], None]


def idle_for(busy: float, duty: float) -> float:
    """The sleep after `busy` seconds of steps that makes them the share `duty` of wall time.

    AntMan's GPU operator manager throttles an opportunistic job by delaying its GPU work;
    at mini-batch granularity that delay is a sleep after each step.
    """
    if duty >= 1.0 or busy <= 0.0:
        return 0.0
    if duty <= 0.0:
        return float("inf")
    return busy * (1.0 - duty) / duty
