"""The control law run to rest against a model: what the simulator applies per shared GPU."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from gangshare.core.coordinator import (
    ControlParams,
    GpuControl,
    GpuObservation,
    Phase,
    decide_gpu,
)


@dataclass(frozen=True)
class Settled:
    duty: float
    # Decisions it took to get there, from the guaranteed pod's arrival.
    periods: int
    slowdown: float


def settle(
    slowdown_at: Callable[[float], float],
    params: ControlParams,
    max_periods: int = 400,
) -> Settled:
    """Run the law against a noiseless response until the duty stops moving.

    `slowdown_at(duty)` is the guaranteed pod's step time relative to solo when its
    opportunistic neighbours run at `duty`. Used by the simulator: the duty it applies is the
    one this law reaches, not a formula of its own.
    """
    seen = GpuObservation("g", ("o",), (), total_memory_mib=0)
    control: GpuControl | None = None
    now = 0.0
    history: list[float] = []
    for _period in range(1, max_periods + 1):
        duty = params.floor_duty if control is None else control.duty
        steps = (slowdown_at(duty),) * params.min_steps
        control = decide_gpu(control, replace(seen, guaranteed_steps=steps), now, params).control
        now += params.period_seconds
        history.append(control.duty)
        if _stopped_moving(history, control, params):
            return Settled(control.duty, _reached(history), slowdown_at(control.duty))
    assert control is not None
    return Settled(control.duty, max_periods, slowdown_at(control.duty))


def _reached(history: Sequence[float]) -> int:
    """The decision after which the duty stayed where it ended."""
    at = len(history)
    while at > 1 and history[at - 2] == history[-1]:
        at -= 1
    return at


def _stopped_moving(history: Sequence[float], control: GpuControl, params: ControlParams) -> bool:
    if control.phase is not Phase.SHARING:
        return False
    if control.duty > control.last_good:
        return False  # a probe, judged next period
    if control.duty >= 1.0:
        return True
    # Held at its ceiling long enough that only a probe could move it.
    window = control.probe_after
    return len(history) > window and len(set(history[-window:])) == 1
