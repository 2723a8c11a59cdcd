"""AntMan's local coordinator as a pure control law: caps for the opportunistic tenants of a GPU.

One GPU holds at most one guaranteed pod and any number of opportunistic ones. The law
sets one SM duty cycle (the share of wall time an opportunistic tenant may spend in its
mini-batches) and a memory cap per opportunistic tenant, from the guaranteed pod's step
times against its solo baseline:

- arrival: a guaranteed pod new to a GPU that has opportunistic tenants squeezes them to
  `floor_duty` at once and measures its solo step time (`baseline_steps` steps);
- growth: from `min_duty`, one `step_up` per decision while the guaranteed pod's median
  step time stays within `tolerance` of its baseline;
- a failed probe (a level never held before) steps back to the last level that held and
  waits twice as long before probing again; a violation at a level that held before (the
  neighbours changed) backs off multiplicatively;
- memory: the opportunistic tenants share what the guaranteed pod does not use, less a
  reserve for its peaks; its needs always win.

The guaranteed pod never gets a cap: caps are only ever computed for opportunistic pods.
The simulator runs this same law (`gangshare.core.settle`) against its interference model.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum


@dataclass(frozen=True)
class ControlParams:
    tolerance: float = 0.05
    # How often the agent decides; a squeeze happens on the first decision after arrival.
    period_seconds: float = 2.0
    # Duty while the guaranteed pod's solo step time is measured: opportunistic work paused.
    floor_duty: float = 0.0
    # The lowest duty once a baseline exists; back-off never goes below it.
    min_duty: float = 0.05
    step_up: float = 0.05
    backoff: float = 0.5
    baseline_steps: int = 10
    # ...and up to this many, until the baseline's relative standard error is this small.
    max_baseline_steps: int = 60
    baseline_precision: float = 0.004
    # Solo steps pooled into the baseline (this one and the last measurements).
    solo_window: int = 80
    # Guaranteed steps a decision needs: a median of fewer is mostly noise.
    min_steps: int = 5
    # Steps kept per level; a probe not clearly within tolerance after this many fails.
    max_level_steps: int = 40
    # Decisions held at a learnt ceiling before probing one step above it.
    probe_after: int = 8
    # A baseline is measured again this often, since a job's own step time drifts.
    rebaseline_seconds: float = 600.0
    # Memory kept free beside a guaranteed pod for its peaks.
    memory_reserve_mib: int = 1024

    def __post_init__(self) -> None:
        if not 0.0 < self.tolerance < 1.0:
            raise ValueError("tolerance: must be between 0 and 1")
        if not 0.0 <= self.floor_duty <= self.min_duty <= 1.0:
            raise ValueError("floor_duty, min_duty: need 0 <= floor_duty <= min_duty <= 1")
        if not 0.0 < self.step_up <= 1.0 or not 0.0 < self.backoff < 1.0:
            raise ValueError("step_up in (0, 1], backoff in (0, 1) required")
        if self.baseline_steps < 1 or self.min_steps < 1 or self.probe_after < 1:
            raise ValueError("baseline_steps, min_steps, probe_after: must be at least 1")
        if self.max_level_steps < self.min_steps:
            raise ValueError("max_level_steps: must be at least min_steps")


class Phase(StrEnum):
    # No guaranteed pod, or no opportunistic one: nothing to protect or nothing to cap.
    UNSHARED = "Unshared"
    MEASURING = "Measuring"
    SHARING = "Sharing"


@dataclass(frozen=True)
class GpuObservation:
    """What the agent saw on one GPU since its last decision."""

    guaranteed: str | None
    opportunistic: tuple[str, ...]
    # Step times (seconds) the guaranteed pod reported since the last decision.
    guaranteed_steps: tuple[float, ...]
    total_memory_mib: int
    # The guaranteed pod's memory on this GPU as NVML shows it (its allocator's reservation).
    guaranteed_memory_mib: int = 0


@dataclass(frozen=True)
class GpuControl:
    """The law's state for one GPU; a new one comes out of every decision."""

    guaranteed: str | None = None
    phase: Phase = Phase.UNSHARED
    # The opportunistic pods the current levels were learnt beside.
    tenants: tuple[str, ...] = ()
    duty: float = 1.0
    baseline: float | None = None
    baseline_spread: float = 0.0
    baseline_at: float = 0.0
    # Solo step times the baseline is the median of.
    solo: tuple[float, ...] = ()
    # Steps not yet used: while measuring, the baseline's; while sharing, the current level's.
    pending: tuple[float, ...] = ()
    # Highest duty that held; the level a failed probe returns to.
    last_good: float = 0.0
    # Growth stops here until a probe is due.
    ceiling: float = 1.0
    held: int = 0
    probe_after: int = 0
    # Growth doubles until the first violation on this GPU, then goes one step at a time.
    slow_start: bool = True
    slowdown: float | None = None


@dataclass(frozen=True)
class Caps:
    """What one opportunistic pod may use: SM duty cycle (0..1) and GPU memory."""

    duty: float
    memory_mib: int


@dataclass(frozen=True)
class GpuDecision:
    control: GpuControl
    # Opportunistic pod uid -> its caps on this GPU.
    caps: Mapping[str, Caps] = field(default_factory=dict)
    # A change worth an event, as a CamelCase reason and a message.
    change: tuple[str, str] | None = None


def decide_gpu(
    previous: GpuControl | None, seen: GpuObservation, now: float, params: ControlParams
) -> GpuDecision:
    """One control period on one GPU."""
    state = previous or GpuControl()
    if seen.guaranteed is None:
        return _decision(GpuControl(), seen, params)
    if seen.guaranteed != state.guaranteed:
        state = GpuControl(guaranteed=seen.guaranteed, probe_after=params.probe_after)
        if seen.opportunistic:
            return _squeeze(state, seen, now, params, f"guaranteed pod {seen.guaranteed} arrived")
    if not seen.opportunistic:
        return _decision(_measure_alone(state, seen, now, params), seen, params)
    if state.phase is Phase.UNSHARED and state.baseline is None:
        return _squeeze(state, seen, now, params, "no solo step time yet")
    if state.phase is Phase.UNSHARED or (
        state.phase is Phase.SHARING and seen.opportunistic != state.tenants
    ):
        # New neighbours beside a known baseline: what held for the old ones says nothing
        # about them, so start low and grow again.
        state = replace(
            state,
            phase=Phase.SHARING,
            tenants=seen.opportunistic,
            duty=params.min_duty,
            pending=(),
            last_good=0.0,
            ceiling=1.0,
            held=0,
            probe_after=params.probe_after,
            slow_start=True,
        )
        return _decision(state, seen, params)
    if state.phase is Phase.SHARING and now - state.baseline_at >= params.rebaseline_seconds:
        return _squeeze(state, seen, now, params, "solo step time due to be measured again")
    pending = state.pending + seen.guaranteed_steps
    if state.phase is Phase.MEASURING:
        return _decision(_measured(replace(state, pending=pending), now, params), seen, params)
    state = replace(state, pending=pending[-params.max_level_steps :])
    if len(state.pending) < params.min_steps:
        return _decision(state, seen, params)
    return _steer(state, seen.guaranteed_steps, seen, params)


def _squeeze(
    state: GpuControl, seen: GpuObservation, now: float, params: ControlParams, why: str
) -> GpuDecision:
    state = replace(
        state,
        phase=Phase.MEASURING,
        tenants=seen.opportunistic,
        duty=params.floor_duty,
        pending=(),
    )
    message = (
        f"{why}: opportunistic pods {', '.join(seen.opportunistic)} squeezed to duty "
        f"{params.floor_duty:.2f} while the solo step time is measured"
    )
    return _decision(state, seen, params, ("OpportunisticSqueezed", message))


def _measure_alone(
    state: GpuControl, seen: GpuObservation, now: float, params: ControlParams
) -> GpuControl:
    """Alone on its GPU, every step is a solo step: keep the baseline fresh for free."""
    state = replace(state, phase=Phase.UNSHARED, duty=1.0, pending=())
    return _with_solo_steps(state, seen.guaranteed_steps, now, params)


def _measured(state: GpuControl, now: float, params: ControlParams) -> GpuControl:
    """Done measuring once the baseline is precise enough to judge a 1% change by, or capped."""
    if len(state.pending) < params.baseline_steps:
        return state
    if len(state.pending) < params.max_baseline_steps:
        pooled = (state.solo + state.pending)[-params.solo_window :]
        middle = statistics.median(pooled)
        error = _MEDIAN_EFFICIENCY * _spread(pooled, middle) / math.sqrt(len(pooled))
        if error / middle > params.baseline_precision:
            return state
    # A re-measure resumes where the last good level was; a first one starts from the bottom.
    resume = max(params.min_duty, state.last_good)
    measured = state.pending
    state = replace(state, phase=Phase.SHARING, pending=(), duty=resume, slowdown=None)
    return _with_solo_steps(state, measured, now, params)


def _with_solo_steps(
    state: GpuControl, steps: Sequence[float], now: float, params: ControlParams
) -> GpuControl:
    # The last few measurements are pooled: one short window of noisy steps gives a baseline
    # a few percent off, which would read as a violation at every level.
    solo = (state.solo + tuple(steps))[-params.solo_window :]
    if len(solo) < params.baseline_steps:
        return replace(state, solo=solo)
    middle = statistics.median(solo)
    spread = _spread(solo, middle)
    return replace(state, solo=solo, baseline=middle, baseline_spread=spread, baseline_at=now)


def _steer(
    state: GpuControl, recent: Sequence[float], seen: GpuObservation, params: ControlParams
) -> GpuDecision:
    """Judge the current level by the steps taken at it, and only when the verdict is clear.

    Step times are noisy (jitter, data-loader stalls), so the level's slowdown is a median
    with a standard error; a level is over or within tolerance only when two standard errors
    say so. An unclear probe fails once `max_level_steps` have not settled it; an unclear
    level that held keeps holding. The latest steps are also judged alone, so a neighbour
    that turns heavier is caught in one period rather than when it dominates the window.
    """
    assert state.baseline is not None
    slowdown, error = _slowdown(state.pending, state)
    state = replace(state, slowdown=slowdown)
    limit = 1.0 + params.tolerance
    probing = state.duty > state.last_good
    over = slowdown - 2 * error > limit
    if len(recent) >= params.min_steps and len(recent) < len(state.pending):
        latest, latest_error = _slowdown(recent, state)
        if latest - 3 * latest_error > limit:
            over, slowdown = True, latest
    within = slowdown + 2 * error <= limit
    settled = len(state.pending) >= params.max_level_steps
    if over or (probing and not within and settled):
        state, reason = _after_violation(state, params)
        message = (
            f"guaranteed pod {state.guaranteed} at {slowdown:.3f}x its solo step time "
            f"(tolerance {limit:.2f}x): opportunistic duty now {state.duty:.2f}"
        )
        return _decision(replace(state, pending=()), seen, params, (reason, message))
    if not within:
        return _decision(state, seen, params)
    state = replace(state, last_good=max(state.last_good, state.duty))
    if state.duty < state.ceiling:
        # Doubling until the first violation finds the region fast; then one step at a time.
        grown = state.duty * 2 if state.slow_start else state.duty + params.step_up
        grown = max(grown, params.min_duty)
        duty = round(min(state.ceiling, 1.0, grown), 4)
        state = replace(state, duty=duty, held=0, pending=())
    elif state.duty < 1.0:
        held = state.held + 1
        if held >= state.probe_after:
            above = round(min(1.0, state.ceiling + params.step_up), 4)
            state = replace(state, ceiling=above, duty=above, held=0, pending=())
        else:
            state = replace(state, held=held)
    return _decision(state, seen, params)


def _slowdown(steps: Sequence[float], state: GpuControl) -> tuple[float, float]:
    """Median step time over the baseline, and its standard error (the baseline's included).

    A handful of steps can agree by chance; their spread is taken as at least the solo
    steps' spread, so a tight-looking short window never passes for a confident verdict.
    """
    assert state.baseline is not None
    middle = statistics.median(steps)
    spread = max(_spread(steps, middle), state.baseline_spread)
    error = _MEDIAN_EFFICIENCY * spread / math.sqrt(len(steps))
    base_error = _MEDIAN_EFFICIENCY * state.baseline_spread / math.sqrt(len(state.solo))
    ratio = middle / state.baseline
    return ratio, ratio * math.hypot(error / middle, base_error / state.baseline)


# A median's standard error is about 1.25 times a mean's.
_MEDIAN_EFFICIENCY = 1.25


def _spread(steps: Sequence[float], middle: float) -> float:
    """A standard deviation robust to stragglers: 1.4826 times the median absolute deviation."""
    return 1.4826 * statistics.median(abs(s - middle) for s in steps)


def _after_violation(state: GpuControl, params: ControlParams) -> tuple[GpuControl, str]:
    if state.duty > state.last_good:
        # A probe above anything that held: back to what held, never this high again until
        # a later probe, and that probe comes twice as late.
        ceiling = max(state.last_good, round(state.duty - params.step_up, 4))
        return (
            replace(
                state,
                duty=state.last_good,
                ceiling=ceiling,
                held=0,
                probe_after=state.probe_after * 2,
                slow_start=False,
            ),
            "OpportunisticProbeFailed",
        )
    # A level that held no longer does: the neighbours changed. Below min_duty there is no
    # level worth keeping, and the guaranteed pod's speed comes first: pause them.
    lower = round(state.duty * params.backoff, 4)
    if lower < params.min_duty:
        lower = params.floor_duty
    return (
        replace(
            state,
            duty=lower,
            last_good=lower,
            ceiling=lower,
            held=0,
            probe_after=params.probe_after,
            slow_start=False,
        ),
        "OpportunisticBackedOff",
    )


def _decision(
    state: GpuControl,
    seen: GpuObservation,
    params: ControlParams,
    change: tuple[str, str] | None = None,
) -> GpuDecision:
    return GpuDecision(state, _caps(state, seen, params), change)


def _caps(state: GpuControl, seen: GpuObservation, params: ControlParams) -> dict[str, Caps]:
    if not seen.opportunistic:
        return {}
    free = seen.total_memory_mib
    if seen.guaranteed is not None:
        free -= seen.guaranteed_memory_mib + params.memory_reserve_mib
    each = max(0, free) // len(seen.opportunistic)
    duty = state.duty if seen.guaranteed is not None else 1.0
    return {uid: Caps(round(duty, 4), each) for uid in seen.opportunistic}
