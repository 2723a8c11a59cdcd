"""The pass's snapshot kept from the stores' changes: a lost change is drift, which the
audit finds, counts and repairs; what the stores hear is applied without one."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
from jobs import make_job, nodes, pod

from gangshare.operator.informers import Informers
from gangshare.operator.metrics import OperatorMetrics, trainingjob_counts
from gangshare.operator.standing_view import StandingView

SPEC = {"nodePools": [{"name": "n", "count": 2, "gpusPerNode": 4}]}


def admitted(name: str, node: str, gpu: int) -> dict[str, Any]:
    placement = [{"rank": 0, "node": node, "gpus": [gpu]}]
    return make_job(name).status(phase="Admitted", placement=placement).build()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def view_of(*jobs: dict[str, Any]) -> tuple[Informers, StandingView, Clock, OperatorMetrics]:
    informers = Informers()
    informers.nodes.replace(nodes(SPEC))
    informers.pods.replace([])
    informers.jobs.replace(list(jobs))
    metrics, clock = OperatorMetrics(), Clock()
    view = StandingView(informers, 3600.0, metrics, audit_seconds=60.0, clock=clock)
    return informers, view, clock, metrics


def drift_total(metrics: OperatorMetrics) -> float:
    return sum(
        s.value
        for family in metrics.registry.collect()
        if family.name == "gangshare_snapshot_drift"
        for s in family.samples
        if s.name.endswith("_total")
    )


def test_changes_the_stores_hear_reach_the_snapshot_without_an_audit():
    informers, view, _, _ = view_of(admitted("a", "n-0", 0))
    snapshot, jobs = view.snapshot()
    assert snapshot.cluster.node("n-0").free_guaranteed == 3 and len(jobs) == 1
    informers.jobs.apply("ADDED", admitted("b", "n-1", 2))
    informers.pods.apply("ADDED", pod("c", 0, phase="Running", node="n-1"))
    informers.jobs.apply("DELETED", admitted("a", "n-0", 0))
    snapshot, jobs = view.snapshot()
    assert snapshot.cluster.node("n-0").free_guaranteed == 4
    assert snapshot.cluster.node("n-1").free_guaranteed == 2
    assert [j["metadata"]["name"] for j in jobs] == ["b"] and view.audits == 0


def test_a_change_no_watch_told_is_drift_the_audit_counts_and_repairs():
    informers, view, clock, metrics = view_of(admitted("a", "n-0", 0))
    view.snapshot()
    # A job's status changed where no change was recorded (a watch event lost).
    lost = admitted("a", "n-1", 3)
    informers.jobs._objects["team/a"] = lost
    snapshot, _ = view.snapshot()
    assert snapshot.cluster.node("n-0").free_guaranteed == 3  # still the old plan
    clock.now = 61.0
    snapshot, _ = view.snapshot()
    assert view.audits == 1 and view.drift_found > 0
    assert drift_total(metrics) == view.drift_found
    # Repaired: the plan the stores hold.
    assert snapshot.cluster.node("n-0").free_guaranteed == 4
    assert snapshot.cluster.node("n-1").free_guaranteed == 3
    clock.now = 122.0
    view.snapshot()
    assert view.audits == 2 and drift_total(metrics) == view.drift_found  # none new


def test_a_relisted_store_is_a_change_of_everything_it_held_and_holds():
    informers, view, clock, _ = view_of(admitted("a", "n-0", 0), admitted("b", "n-0", 1))
    view.snapshot()
    informers.jobs.replace([admitted("b", "n-0", 1), admitted("c", "n-1", 0)])
    broken = copy.deepcopy(nodes(SPEC)[1])
    broken["spec"]["unschedulable"] = True
    informers.nodes.replace([nodes(SPEC)[0], broken])
    snapshot, _ = view.snapshot()
    assert snapshot.cluster.node("n-0").free_guaranteed == 3
    assert snapshot.cluster.node("n-1").unschedulable_reason == "node is cordoned"
    clock.now = 61.0
    view.snapshot()
    assert view.audits == 1 and view.drift_found == 0


def test_a_pass_whose_changes_fail_to_apply_starts_the_next_from_everything(monkeypatch):
    informers, view, _, _ = view_of(admitted("a", "n-0", 0))
    view.snapshot()
    informers.jobs.apply("ADDED", admitted("b", "n-1", 2))
    standing = view.standing
    assert standing is not None

    def broken(*_: object) -> None:
        raise RuntimeError("a bug while applying")

    monkeypatch.setattr(standing, "apply", broken)
    with pytest.raises(RuntimeError):
        view.snapshot()
    snapshot, jobs = view.snapshot()  # afresh, from everything the stores hold
    assert snapshot.cluster.node("n-0").free_guaranteed == 3
    assert snapshot.cluster.node("n-1").free_guaranteed == 3 and len(jobs) == 2


def counted_afresh(informers: Informers) -> dict[Any, int]:
    return {k: v for k, v in trainingjob_counts(informers.jobs.items()).items() if v}


@pytest.mark.parametrize("seed", range(10))
def test_the_job_counts_kept_from_changes_are_a_count_afresh(seed: int):
    """Through adds, phase moves, deletions, jobs being deleted, relists and a failed apply,
    the counts the metrics report are those counting every job gives."""
    rng = random.Random(seed)
    informers, view, clock, _ = view_of(admitted("a", "n-0", 0))
    names = [f"j{i}" for i in range(12)]
    for step in range(60):
        name, what = rng.choice(names), rng.random()
        job = make_job(name).spec(queue=rng.choice(["q1", "q2"]))
        job = job.status(phase=rng.choice(["Queued", "Running", "Succeeded", None]))
        obj = job.build()
        obj["metadata"]["resourceVersion"] = str(100 + step)
        if what < 0.5:
            informers.jobs.apply("MODIFIED", obj)
        elif what < 0.7:
            informers.jobs.apply("DELETED", obj)
        elif what < 0.8:
            obj["metadata"]["deletionTimestamp"] = "2026-11-29T00:00:00Z"
            informers.jobs.apply("MODIFIED", obj)
        elif what < 0.9:
            informers.jobs.replace([o for o in informers.jobs.items() if rng.random() < 0.7])
        else:
            view.standing = None  # as after a failed apply: afresh from everything
            informers.restart_changes()
        view.snapshot()
        assert view.job_counts.counts() == counted_afresh(informers), step
    clock.now = 61.0
    view.snapshot()
    assert view.audits == 1 and view.drift_found == 0


def test_a_count_no_change_told_is_drift_the_audit_counts_and_repairs():
    informers, view, clock, metrics = view_of(admitted("a", "n-0", 0))
    view.snapshot()
    moved = admitted("a", "n-0", 0)
    moved["status"]["phase"] = "Succeeded"
    informers.jobs._objects["team/a"] = moved  # no change recorded
    view.snapshot()
    assert view.job_counts.counts() != counted_afresh(informers)
    clock.now = 61.0
    view.snapshot()
    assert view.drift_found >= 1 and drift_total(metrics) == view.drift_found
    assert (
        metrics.registry.get_sample_value(
            "gangshare_snapshot_drift_total", {"kind": "trainingjobs"}
        )
        == 1.0
    )
    assert view.job_counts.counts() == counted_afresh(informers)
