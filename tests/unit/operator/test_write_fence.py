"""A leader deposed in the middle of a reconcile or a pass makes no further write.

The real Reconciler, SchedulerLoop and KubeApi (its write fence wired as the operator wires
it), the real LeaderElector on an in-memory Lease, and an API server answered from memory
(fake_apiserver.py) whose calls can take as long as a test says.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fake_apiserver import FakeApiServer
from jobs import make_job, nodes, pod
from lease_fakes import NOW, Clock, FakeLeases, elector

from gangshare.core.clock import ManualClock
from gangshare.core.queueing import QueuePolicy
from gangshare.kube.batchjob import JOB as BATCH_JOB
from gangshare.kube.queue import default_queue_object
from gangshare.operator.batchapi import BatchApi
from gangshare.operator.informers import Informers
from gangshare.operator.kubeapi import KubeApi, LeadershipLost
from gangshare.operator.leader import LEASE_DURATION_SECONDS, LeaderElector
from gangshare.operator.reconcile import OperatorOptions, Reconciler
from gangshare.operator.scheduler import SchedulerLoop

ME, OTHER = "op-a-123456", "op-b-654321"
PLACEMENT = [{"rank": 0, "node": "n-0", "gpus": [0]}, {"rank": 1, "node": "n-1", "gpus": [0]}]
STATUS_WRITE = "patch_namespaced_custom_object_status"


def leader_and_standby() -> tuple[Clock, LeaderElector, LeaderElector]:
    leases, clock, lost = FakeLeases(), Clock(), []
    leader, standby = elector(leases, clock, ME, lost), elector(leases, clock, OTHER, lost)
    assert leader.try_once() and not standby.try_once()
    return clock, leader, standby


def stall_and_take_over(clock: Clock, leader: LeaderElector, standby: LeaderElector) -> Any:
    """What happens while a call hangs: the leader's process stalls (a pause, a starved CPU,
    a slow answer) past the Lease's duration; its renewals do not run and the standby takes
    the Lease."""

    def stall() -> None:
        clock.t = LEASE_DURATION_SECONDS + 1
        assert standby.try_once()
        assert not leader.is_leader()

    return stall


def two_workers(phase: str, **status: Any) -> dict[str, Any]:
    return (
        make_job("j")
        .spec(workers=2)
        .status(phase=phase, attempt=0, restarts=0, placement=PLACEMENT, observedGeneration=1)
        .status(**status)
        .build()
    )


def restart_after_an_eviction() -> FakeApiServer:
    """A running gang one of whose workers was evicted: the reconcile writes Restarting,
    posts an event, then deletes both workers."""
    evicted = pod("j", 0, phase="Failed", node="n-0", reason="Evicted", message="node drained")
    running = pod("j", 1, phase="Running", node="n-1")
    return FakeApiServer(two_workers("Running"), [evicted, running])


def start_a_whole_gang() -> FakeApiServer:
    """An admitted gang whose workers all exist, gated: the reconcile writes GangScheduled,
    then lifts both gates."""
    gated = [pod("j", rank, gated=True) for rank in (0, 1)]
    return FakeApiServer(two_workers("Admitted", admittedAt="2027-01-15T08:00:00Z"), gated)


@pytest.mark.parametrize("scenario", [restart_after_an_eviction, start_a_whole_gang])
@pytest.mark.parametrize(
    ("stalled_in", "written"),
    [
        # Lost while reading: the decision is made, but not one write of it.
        ("list_namespaced_pod", []),
        # Lost while the status write was in flight (it had passed the fence): the pod
        # deletions or gate lifts that follow it are not made.
        (STATUS_WRITE, [(STATUS_WRITE, "j")]),
    ],
)
def test_a_leader_deposed_mid_reconcile_makes_no_further_write(
    scenario: Any, stalled_in: str, written: list[tuple[str, str]], caplog: pytest.LogCaptureFixture
) -> None:
    clock, leader, standby = leader_and_standby()
    server = scenario()
    api = server.kube_api()
    api.fence = leader.is_leader  # as operator/main.py wires it
    reconciler = Reconciler(api, ManualClock(NOW), OperatorOptions())
    server.during[stalled_in] = stall_and_take_over(clock, leader, standby)
    with caplog.at_level(logging.INFO, logger="gangshare.operator"):
        assert reconciler.reconcile("team", "j") is None
    assert stalled_in not in server.during  # the stall did happen
    assert server.writes() == written
    # Abandoned quietly: no traceback, and no wake-up asked for (no requeue storm).
    assert not [r for r in caplog.records if r.exc_info]
    assert any("abandoned" in r.getMessage() for r in caplog.records)
    assert reconciler.due(NOW + 10**6) == []


def test_the_same_reconcile_by_a_leader_that_keeps_its_lease_writes_everything() -> None:
    # The scenarios above, undisturbed: the writes the fence cut off are really there.
    _, leader, _ = leader_and_standby()
    server = restart_after_an_eviction()
    api = server.kube_api()
    api.fence = leader.is_leader
    Reconciler(api, ManualClock(NOW), OperatorOptions()).reconcile("team", "j")
    kinds = [name for name, _ in server.writes()]
    assert kinds[0] == STATUS_WRITE and kinds.count("delete_namespaced_pod") == 2
    server = start_a_whole_gang()
    api = server.kube_api()
    api.fence = leader.is_leader
    Reconciler(api, ManualClock(NOW), OperatorOptions()).reconcile("team", "j")
    assert [name for name, _ in server.writes()].count("patch_namespaced_pod") == 2


def test_a_pass_that_loses_the_lead_writes_no_queue_status_and_logs_no_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, leader, standby = leader_and_standby()
    queued = make_job("q").status(phase="Queued", queuedAt="2027-01-15T07:59:00Z").build()
    server = FakeApiServer(queued, [], queues=[default_queue_object()])
    api = server.kube_api()
    api.fence = leader.is_leader
    informers = Informers()
    informers.nodes.replace(nodes({"nodePools": [{"name": "n", "count": 1, "gpusPerNode": 2}]}))
    informers.pods.replace([])
    informers.jobs.replace([queued])
    loop = SchedulerLoop(
        api,
        Reconciler(api, ManualClock(NOW), OperatorOptions()),
        QueuePolicy(),
        ManualClock(NOW),
        interval=0.0,
        leading=leader.is_leader,
        informers=informers,
    )
    stall = stall_and_take_over(clock, leader, standby)

    def stall_then_stop() -> None:
        stall()
        loop.stop()  # one pass is all this test needs

    # Lost while the pass read the cluster: it decides an admission and the default Queue's
    # first status, and writes neither.
    server.during["list_priority_class"] = stall_then_stop
    with caplog.at_level(logging.INFO, logger="gangshare.operator"):
        loop.run_forever()
    assert "list_priority_class" not in server.during
    assert server.writes() == []
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


JOB = {"metadata": {"name": "j", "namespace": "team", "resourceVersion": "1", "uid": "u"}}
POD = {"metadata": {"name": "j-worker-0"}, "spec": {}}
EVERY_WRITE: list[tuple[str, Any]] = [
    ("patch_job_status", lambda api: api.patch_job_status(JOB, {"phase": "Running"})),
    ("create pod", lambda api: api.create("Pod", "team", POD)),
    ("create service", lambda api: api.create("Service", "team", POD)),
    ("lift_gate", lambda api: api.lift_gate("team", "j-worker-0")),
    ("nudge_pod", lambda api: api.nudge_pod("team", "j-worker-0", "mark")),
    ("delete_pod", lambda api: api.delete_pod("team", "j-worker-0")),
    ("force delete_pod", lambda api: api.delete_pod("team", "j-worker-0", force=True)),
    ("delete_job", lambda api: api.delete_job("team", "j")),
    ("create_queue", lambda api: api.create_queue({"metadata": {"name": "default"}})),
    ("patch_queue_status", lambda api: api.patch_queue_status("default", {"pending": 0})),
    # A queued batch/v1 Job's writes (operator/batchapi.py).
    ("patch batch job", lambda api: BatchApi(api).patch(BATCH_JOB, "team", "train", {"spec": {}})),
    ("patch pod", lambda api: BatchApi(api).patch_pod("team", "train-0-x", {"metadata": {}})),
    (
        "create workload",
        lambda api: BatchApi(api).create_workload({"metadata": {"name": "j", "namespace": "t"}}),
    ),
    ("patch workload", lambda api: BatchApi(api).patch_workload_spec("team", "j", {"queue": "q"})),
]


@pytest.mark.parametrize(("what", "write"), EVERY_WRITE, ids=[w for w, _ in EVERY_WRITE])
def test_every_write_of_the_kube_api_is_fenced(what: str, write: Any) -> None:
    server = FakeApiServer(make_job("j").build(), [pod("j", 0)])
    api: KubeApi = server.kube_api()
    api.fence = lambda: False
    with pytest.raises(LeadershipLost, match="not made"):
        write(api)
    assert server.calls == []


def test_an_event_of_a_replica_that_lost_the_lead_is_dropped_quietly() -> None:
    server = FakeApiServer(make_job("j").build(), [])
    api = server.kube_api()
    api.fence = lambda: False
    api.post_event(JOB, "Normal", "Admitted", "admitted", action="Schedule")
    assert server.calls == []
    api.fence = lambda: True
    api.post_event(JOB, "Normal", "Admitted", "admitted", action="Schedule")
    assert server.calls == [("create_namespaced_event", "Admitted")]
