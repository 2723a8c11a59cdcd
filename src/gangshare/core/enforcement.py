"""From caps to enforcement: one cap per opportunistic pod, and the backstop that holds it.

The law (coordinator.py) decides per GPU. Here:
- a pod gets the tightest caps of its GPUs, and a gang one duty (its slowest rank's);
- a pod is judged by what it cannot forge where the node can measure it: NVML's per-process
  SM samples, summed over the pod's processes (found by cgroup). A pod busier than its duty
  is duty-cycled by stop/continue, together with the rest of its gang on the node, never one
  rank alone, whatever its SDK says. Only where NVML has no per-process samples does the
  judgement fall back to the SDK's reports (advisory: a tenant can lie to its own SDK);
- a pod whose GPU memory stays over its cap past a grace is removed (and requeued by the
  operator), within a bounded grace of its own;
- so is a pod held by stop/continue whose measured SM share stays over its duty: freezing a
  pod stops its host processes, not the GPU work they queued or a kernel that runs for long.
  Guaranteed pods never get caps, so they are never throttled or removed here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from gangshare.core.coordinator import Caps, GpuDecision


@dataclass(frozen=True)
class EnforcementParams:
    # Over its memory cap by more than this, for longer than that, a pod is evicted.
    memory_grace_mib: int = 256
    memory_grace_seconds: float = 10.0
    # How far a pod's reported busy share may exceed its duty before it counts as ignoring it.
    busy_slack: float = 0.1
    # An SDK that has not reported for this long is not cooperating.
    report_timeout_seconds: float = 30.0
    # One stop/continue cycle of the backstop.
    throttle_period_seconds: float = 1.0
    # A pod's measured busy share is its NVML samples' mean over this window, judged once
    # they span at least `measure_min_seconds` (one sample says little; a short window lets a
    # flat-out pod be stopped soon).
    measure_window_seconds: float = 10.0
    measure_min_seconds: float = 3.0
    # The longest a removed pod may take to stop (its own grace, if shorter, holds); its
    # processes are killed by the agent if they still hold GPU memory this long after.
    removal_grace_seconds: float = 30.0
    # A pod held by stop/continue for a full measure window that still measures over its duty
    # for this long is removed: held at most window + this (+ one control period) in vain.
    duty_overrun_seconds: float = 20.0


@dataclass(frozen=True)
class SdkReport:
    """What a pod's SDK said lately: when it last reported, and its busy share of wall time."""

    last_at: float
    busy_share: float | None


@dataclass(frozen=True)
class Eviction:
    uid: str
    reason: str
    message: str


def pod_caps(decisions: Mapping[int, GpuDecision], gangs: Mapping[str, str]) -> dict[str, Caps]:
    """Each opportunistic pod's caps: the tightest of its GPUs, and one duty for its gang.

    A gang's ranks wait for each other at every step, so a duty below the others' for one
    rank slows all of them; giving the whole gang the lowest duty costs nothing more and keeps
    the ranks in step. `gangs` maps pod uid -> gang key (pods without one are their own).
    """
    tightest: dict[str, Caps] = {}
    for decision in decisions.values():
        for uid, caps in decision.caps.items():
            had = tightest.get(uid)
            tightest[uid] = caps if had is None else _tighter(had, caps)
    gang_duty: dict[str, float] = {}
    for uid, caps in tightest.items():
        key = gangs.get(uid, uid)
        gang_duty[key] = min(gang_duty.get(key, 1.0), caps.duty)
    return {
        uid: replace(caps, duty=gang_duty[gangs.get(uid, uid)]) for uid, caps in tightest.items()
    }


def _tighter(a: Caps, b: Caps) -> Caps:
    return Caps(min(a.duty, b.duty), min(a.memory_mib, b.memory_mib))


def cooperation(
    caps: Caps,
    report: SdkReport | None,
    now: float,
    params: EnforcementParams,
    capped_since: float | None = None,
    measured: float | None = None,
) -> tuple[str, str] | None:
    """Why a capped pod does not keep its duty by itself (a CamelCase cause and a message),
    or None when it does.

    `measured` is the pod's busy share from NVML's per-process samples over the window
    (None where the GPU gives none): when there is one, it decides, whatever the SDK says,
    so a pod that reports fake step times and runs flat out is caught, and one that keeps its
    duty needs no SDK. Otherwise the SDK's reports are all there is: a pod capped only lately
    gets the report timeout to start its SDK (a container imports its framework first)."""
    if caps.duty >= 1.0:
        return None
    if measured is not None:
        if measured > caps.duty + params.busy_slack:
            return (
                "OverDutyMeasured",
                f"NVML measured its processes busy {measured:.0%} of the time against a duty "
                f"of {caps.duty:.0%}",
            )
        return None
    if report is None:
        if capped_since is not None and now - capped_since < params.report_timeout_seconds:
            return None
        return "NoSdk", "no training SDK connected"
    if now - report.last_at > params.report_timeout_seconds:
        return "SdkSilent", f"its SDK has not reported for {now - report.last_at:.0f}s"
    if report.busy_share is not None and report.busy_share > caps.duty + params.busy_slack:
        return (
            "OverDuty",
            f"busy {report.busy_share:.0%} of the time against a duty of {caps.duty:.0%}",
        )
    return None


def backstop_duties(
    caps: Mapping[str, Caps], uncooperative: Iterable[str], gangs: Mapping[str, str]
) -> dict[str, float]:
    """Duties to hold by stop/continue: each uncooperative pod's, and all of its gang's pods."""
    throttled = {gangs.get(uid, uid) for uid in uncooperative}
    gang_duty: dict[str, float] = {}
    for uid, cap in caps.items():
        key = gangs.get(uid, uid)
        if key in throttled:
            gang_duty[key] = min(gang_duty.get(key, 1.0), cap.duty)
    return {uid: gang_duty[gangs.get(uid, uid)] for uid in caps if gangs.get(uid, uid) in gang_duty}


def measured_share(
    samples: Iterable[tuple[float, float]], now: float, params: EnforcementParams
) -> float | None:
    """A pod's busy share from (at, share) samples: their mean over the window, or None while
    they span less than `measure_min_seconds` of it."""
    recent = [(at, share) for at, share in samples if at > now - params.measure_window_seconds]
    if not recent or now - recent[0][0] < params.measure_min_seconds:
        return None
    return sum(share for _, share in recent) / len(recent)


def running_at(duty: float, now: float, period: float) -> bool:
    """Whether a duty-cycled pod may run at `now`: the first `duty` of every period."""
    if duty >= 1.0:
        return True
    if duty <= 0.0:
        return False
    return (now % period) < duty * period


def memory_overruns(
    caps: Mapping[str, Caps],
    used_mib: Mapping[str, int],
    over_since: Mapping[str, float],
    now: float,
    params: EnforcementParams,
) -> tuple[dict[str, float], list[Eviction]]:
    """Pods over their memory cap, since when, and those over it past the grace.

    `used_mib` is a pod's largest use on any one of its GPUs, as NVML reports it per process:
    what the pod really holds, whatever its SDK says.
    """
    still: dict[str, float] = {}
    evict: list[Eviction] = []
    for uid, cap in caps.items():
        used = used_mib.get(uid, 0)
        if used <= cap.memory_mib + params.memory_grace_mib:
            continue
        since = over_since.get(uid, now)
        still[uid] = since
        if now - since >= params.memory_grace_seconds:
            evict.append(
                Eviction(
                    uid,
                    "GpuMemoryOverCap",
                    f"uses {used} MiB of GPU memory against a cap of {cap.memory_mib} MiB "
                    f"for {now - since:.0f}s; removed to give a guaranteed job its memory, "
                    "and requeued",
                )
            )
    return still, evict


def duty_overruns(
    held: Mapping[str, float],
    measured: Mapping[str, float],
    held_since: Mapping[str, float],
    over_since: Mapping[str, float],
    now: float,
    params: EnforcementParams,
) -> tuple[dict[str, float], dict[str, float], list[Eviction]]:
    """Pods the backstop holds (`held`: uid -> duty) that go on measuring over their duty.

    A pod is judged once it has been held a whole measure window, so the window holds only
    samples taken while held; then, over its duty (plus the slack) for `duty_overrun_seconds`,
    it is removed. Returns when each held pod was first held, since when each is over, and
    the removals. A pod with no NVML measure is never judged here (nothing it cannot forge).
    """
    since = {uid: held_since.get(uid, now) for uid in held}
    still: dict[str, float] = {}
    evict: list[Eviction] = []
    for uid, duty in held.items():
        share = measured.get(uid)
        if share is None or now - since[uid] < params.measure_window_seconds:
            continue
        if share <= duty + params.busy_slack:
            continue
        still[uid] = over_since.get(uid, now)
        over_for = now - still[uid]
        if over_for >= params.duty_overrun_seconds:
            evict.append(
                Eviction(
                    uid,
                    "GpuDutyOverrun",
                    f"NVML measured its processes busy {share:.0%} of the time while held to "
                    f"a duty of {duty:.0%} by stop/continue, for {over_for:.0f}s (GPU work "
                    "runs on while its processes are frozen); removed to give a guaranteed "
                    "job its GPU, and requeued",
                )
            )
    return since, still, evict
