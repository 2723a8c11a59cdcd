"""core/lane_pick.py: a lane's priority is judged again only once its head or the cycle's
admissions changed, and the lane picked is the one judging every lane afresh would pick."""

from __future__ import annotations

from typing import Any

from gangshare.core.lane_pick import LanePicker


def test_priorities_are_kept_until_a_pop_or_an_admission_and_the_best_lane_wins():
    judged: list[str] = []
    admitted = [0]
    rank = {"a1": 2, "a2": 0, "b1": 1, "c1": 1}

    def priority(lane: list[Any]) -> tuple[object, ...]:
        judged.append(lane[0])
        return (rank[lane[0]],)

    a, b, c = ["a1", "a2"], ["b1"], ["c1"]
    picker = LanePicker(priority, lambda: admitted[0])
    lanes = [a, b, c]
    assert picker.pick(lanes) is b  # b and c tie: the first in order
    assert judged == ["a1", "b1", "c1"]
    b.pop(0)
    lanes.remove(b)
    judged.clear()
    assert picker.pick(lanes) is c  # nothing changed but the picked lane: a is not judged again
    assert judged == []
    c.pop(0)
    lanes.remove(c)
    admitted[0] = 1  # an admission moves every lane's priority
    rank["a1"] = 5
    assert picker.pick(lanes) is a
    assert judged == ["a1"]
    a.pop(0)
    judged.clear()
    assert picker.pick(lanes) is a and judged == ["a2"]
