"""A worker's name passes from one attempt to the next as soon as the old pod is gone.

Worker names are the same in every attempt, so a requeued gang's worker can be created only
once the old attempt's pod has been deleted for good. A kubelet ends an evicted pod in two
steps: its final phase (Failed, exit 143), then the deletion. The operator's pod watch follows
live pods only, so the final phase is the last event it hears of that pod: the job must look
again by itself, shortly, and create the worker then (not at the backstop resync).
"""

from __future__ import annotations

from typing import Any

from fake_apiserver import FakeApiServer
from jobs import make_job, pod

from gangshare.core.clock import ManualClock
from gangshare.operator.conditions import iso
from gangshare.operator.lifecycle import Limits, Observation, detect_actions
from gangshare.operator.reconcile import OperatorOptions, Reconciler

NOW = 1_800_000_000.0
PLACEMENT = [{"rank": 0, "node": "n-2", "gpus": [0]}, {"rank": 1, "node": "n-3", "gpus": [0]}]


def next_attempt() -> dict[str, Any]:
    """A gang requeued after an eviction and admitted again: attempt 1, no worker created."""
    return (
        make_job("j")
        .spec(workers=2)
        .status(
            phase="Admitted",
            attempt=1,
            restarts=0,
            evictions=1,
            placement=PLACEMENT,
            admittedAt=iso(NOW - 1),
            observedGeneration=1,
        )
        .build()
    )


def old_worker(phase: str, deadline: float | None) -> dict[str, Any]:
    """Attempt 0's worker 0, on its way out (deletionTimestamp: its grace's deadline)."""
    old = pod("j", 0, attempt=0, phase=phase, node="n-0")
    if deadline is not None:
        old["metadata"]["deletionTimestamp"] = iso(deadline)
    return old


def created(server: FakeApiServer) -> list[str]:
    return [name for call, name in server.writes() if call == "create_namespaced_pod"]


def test_a_worker_is_created_shortly_after_the_final_phase_pod_holding_its_name_is_gone() -> None:
    server = FakeApiServer(next_attempt(), [old_worker("Failed", deadline=NOW + 20)])
    clock = ManualClock(NOW)
    reconciler = Reconciler(server.kube_api(), clock, OperatorOptions())
    again = reconciler.reconcile("team", "j")
    # The free name is taken at once; the held one is not asked for (a create is refused).
    assert created(server) == ["j-worker-1"]
    # No event will say when the old pod is gone: the job asks to be looked at again shortly.
    assert again is not None and again <= 1.0
    assert reconciler.due(NOW + again) == ["team/j"]
    # The kubelet deletes it for good (no watch event); the next look creates the worker.
    del server.pods["j-worker-0"]
    clock.advance(again)
    reconciler.reconcile("team", "j")
    assert created(server) == ["j-worker-1", "j-worker-0"]
    worker = server.pods["j-worker-0"]
    assert worker["metadata"]["labels"]["gangshare.io/attempt"] == "1"
    assert worker["spec"]["affinity"]["nodeAffinity"]  # this attempt's plan, not the old one's
    assert server.job["status"]["conditions"][-1]["type"] == "GangScheduled"


def detect(pods: list[dict[str, Any]], now: float = NOW) -> Any:
    seen = Observation(next_attempt(), pods, True, now)
    return detect_actions(seen, "gangshare-scheduler", limits=Limits(stuck_pod_seconds=60))


def test_a_live_pod_holding_the_name_is_waited_for_on_its_own_events() -> None:
    # Still running out its grace: its final phase or its deletion is a watch event.
    actions = detect([old_worker("Running", deadline=NOW + 20)])
    assert [p["metadata"]["name"] for p in actions.create_pods] == ["j-worker-1"]
    assert actions.requeue_after == 80  # only the stuck-pod deadline: no polling


def test_the_look_again_slows_down_the_longer_the_old_pod_outlives_its_deadline() -> None:
    fresh = detect([old_worker("Failed", deadline=NOW + 20)])
    assert fresh.requeue_after == 0.5  # worker_pods.NAME_POLL_SECONDS
    overdue = detect([old_worker("Failed", deadline=NOW - 8)])
    assert overdue.requeue_after == 2.0  # a quarter of the time it is overdue
    long_overdue = detect([old_worker("Succeeded", deadline=NOW - 50)])
    assert long_overdue.requeue_after == 5.0  # worker_pods.NAME_POLL_MAX_SECONDS
    # One not yet deleted is deleted now (a pod whose phase is final goes at once).
    leftover = detect([old_worker("Succeeded", deadline=None)])
    assert leftover.delete_pods == ["j-worker-0"]
    assert leftover.requeue_after == 0.5
    assert [p["metadata"]["name"] for p in leftover.create_pods] == ["j-worker-1"]
