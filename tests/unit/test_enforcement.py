"""The backstop's pure decisions (core/enforcement.py): cooperation, gang throttling, eviction."""

from __future__ import annotations

from gangshare.core.coordinator import Caps
from gangshare.core.enforcement import (
    EnforcementParams,
    SdkReport,
    backstop_duties,
    cooperation,
    duty_overruns,
    memory_overruns,
    running_at,
)

PARAMS = EnforcementParams()


def test_a_pod_cooperates_only_while_its_sdk_reports_and_keeps_its_duty() -> None:
    caps = Caps(0.4, 8000)
    assert cooperation(caps, SdkReport(99.0, 0.38), 100.0, PARAMS) is None
    assert cooperation(caps, None, 100.0, PARAMS) == ("NoSdk", "no training SDK connected")
    silent = cooperation(caps, SdkReport(50.0, 0.3), 100.0, PARAMS)
    assert silent is not None and silent[0] == "SdkSilent" and "not reported for 50s" in silent[1]
    greedy = cooperation(caps, SdkReport(99.0, 0.9), 100.0, PARAMS)
    assert greedy is not None and greedy[0] == "OverDuty"
    assert "busy 90%" in greedy[1] and "duty of 40%" in greedy[1]
    # Capped a moment ago: its SDK gets the report timeout to connect.
    assert cooperation(caps, None, 100.0, PARAMS, capped_since=90.0) is None
    late = cooperation(
        caps, None, 100.0, PARAMS, capped_since=100.0 - PARAMS.report_timeout_seconds
    )
    assert late is not None and late[0] == "NoSdk"
    # Uncapped, nothing to keep.
    assert cooperation(Caps(1.0, 8000), None, 100.0, PARAMS) is None


def test_the_backstop_throttles_a_whole_gang_at_its_lowest_duty_never_one_rank() -> None:
    caps = {"r0": Caps(0.5, 1), "r1": Caps(0.3, 1), "other": Caps(0.6, 1), "fine": Caps(0.2, 1)}
    gangs = {"r0": "a", "r1": "a", "fine": "b"}
    duties = backstop_duties(caps, {"r0", "other"}, gangs)
    assert duties == {"r0": 0.3, "r1": 0.3, "other": 0.6}


def test_a_duty_cycle_runs_the_first_share_of_each_period() -> None:
    ticks = [i / 100 for i in range(300)]
    share = sum(running_at(0.3, t, 1.0) for t in ticks) / len(ticks)
    assert abs(share - 0.3) < 0.02
    assert not any(running_at(0.0, t, 1.0) for t in ticks)
    assert all(running_at(1.0, t, 1.0) for t in ticks)


def test_memory_over_the_cap_past_the_grace_evicts_and_only_then() -> None:
    caps = {"o": Caps(0.5, 10000), "ok": Caps(0.5, 10000)}
    used = {"o": 10000 + PARAMS.memory_grace_mib + 1, "ok": 10000 + PARAMS.memory_grace_mib}
    since, evict = memory_overruns(caps, used, {}, 100.0, PARAMS)
    assert since == {"o": 100.0} and evict == []
    since, evict = memory_overruns(caps, used, since, 100.0 + PARAMS.memory_grace_seconds, PARAMS)
    assert [e.uid for e in evict] == ["o"]
    assert (
        evict[0].reason == "GpuMemoryOverCap" and "against a cap of 10000 MiB" in evict[0].message
    )
    # Back under the cap: the clock starts again.
    since, evict = memory_overruns(caps, {"o": 9000}, since, 200.0, PARAMS)
    assert since == {} and evict == []


def test_a_guaranteed_pod_has_no_caps_so_nothing_here_can_touch_it() -> None:
    since, evict = memory_overruns({}, {"guaranteed": 80000}, {}, 0.0, PARAMS)
    assert since == {} and evict == []
    assert backstop_duties({}, {}, {"guaranteed": "g"}) == {}


def test_a_held_pod_that_stays_over_its_duty_is_removed_after_the_stated_bound() -> None:
    """Freezing stops host processes, not the GPU work they queued: a pod that measures over
    its duty though held is removed once held a full window and over for the overrun time."""
    held, busy = {"o": 0.2, "ok": 0.2}, {"o": 0.9, "ok": 0.25}
    window, overrun = PARAMS.measure_window_seconds, PARAMS.duty_overrun_seconds
    since, over, evict = duty_overruns(held, busy, {}, {}, 0.0, PARAMS)
    assert since == {"o": 0.0, "ok": 0.0} and over == {} and evict == []  # window not full
    since, over, evict = duty_overruns(held, busy, since, over, window, PARAMS)
    assert over == {"o": window} and evict == []  # "ok" is within duty plus the slack
    since, over, evict = duty_overruns(held, busy, since, over, window + overrun - 1, PARAMS)
    assert evict == []
    since, over, evict = duty_overruns(held, busy, since, over, window + overrun, PARAMS)
    assert [(e.uid, e.reason) for e in evict] == [("o", "GpuDutyOverrun")]
    assert "busy 90% of the time while held to a duty of 20%" in evict[0].message
    # Within its duty again: the clock starts over; let go: it is forgotten.
    since, over, evict = duty_overruns(held, {"o": 0.2}, since, over, window + overrun, PARAMS)
    assert over == {} and evict == []
    since, over, evict = duty_overruns({}, busy, since, {"o": 1.0}, 100.0, PARAMS)
    assert since == {} and over == {} and evict == []


def test_a_held_pod_nvml_cannot_measure_is_never_removed_for_its_duty() -> None:
    since, over, evict = {"o": 0.0}, {}, []
    for now in range(0, 120, 2):
        since, over, evict = duty_overruns({"o": 0.0}, {}, since, over, float(now), PARAMS)
        assert evict == []
