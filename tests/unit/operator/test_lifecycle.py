"""The TrainingJob state machine, decided from observations alone (no API server)."""

import json

from jobs import make_job, pod

from gangshare.core.annotations import POD_EVICTED
from gangshare.operator.actions import Displacement
from gangshare.operator.conditions import iso
from gangshare.operator.lifecycle import Limits, Observation, detect_actions

NOW = 1_800_000_000.0
PLACEMENT = [{"rank": 0, "node": "n-0", "gpus": [0, 1]}, {"rank": 1, "node": "n-1", "gpus": [0, 1]}]


def detect(job, pods=(), service=True, now=NOW, **kwargs):
    return detect_actions(
        Observation(job, list(pods), service, now), "gangshare-scheduler", **kwargs
    )


def admitted(phase="Admitted", **status):
    return (
        make_job("j")
        .spec(workers=2, gpusPerWorker=2)
        .status(
            phase=phase, attempt=0, restarts=0, placement=PLACEMENT, observedGeneration=1, **status
        )
    )


def test_a_new_job_is_queued_with_no_event_its_status_says_it():
    actions = detect(make_job("j").build())
    assert actions.status["phase"] == "Queued"
    assert actions.status["queuedAt"] == iso(NOW)
    assert actions.status["message"].startswith("waiting for 1x1 GPUs in queue")
    assert actions.events == []
    assert actions.status["conditions"][0]["type"] == "Admitted"
    assert actions.status["conditions"][0]["status"] == "False"


def test_an_invalid_spec_fails_with_the_field_named():
    job = make_job("j").spec(serviceClass="Opportunistic", gpuMemory="plenty").build()
    actions = detect(job)
    assert actions.status["phase"] == "Failed"
    assert actions.status["message"].startswith("spec.gpuMemory:")
    assert [e.reason for e in actions.events] == ["InvalidSpec"]
    failed = {**job, "status": actions.status}
    assert detect(failed).empty  # no crash loop: a failed invalid job stays quiet


def test_admitted_gang_creates_every_missing_worker_gated_with_its_plan():
    actions = detect(admitted().build(), pods=[pod("j", 0, gated=True)], service=False)
    assert (
        actions.create_service is not None and actions.create_service["spec"]["clusterIP"] == "None"
    )
    assert [p["metadata"]["name"] for p in actions.create_pods] == ["j-worker-1"]
    created = actions.create_pods[0]
    assert created["spec"]["schedulingGates"] == [{"name": "gangshare.io/gang"}]
    assert created["metadata"]["annotations"]["gangshare.io/planned-gpus"] == "0,1"
    pin = created["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert pin["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["n-1"]
    assert actions.lift_gates == []  # not every worker exists yet


def test_gates_are_lifted_only_when_the_whole_gang_exists():
    actions = detect(admitted().build(), pods=[pod("j", 0, gated=True), pod("j", 1, gated=True)])
    assert actions.create_pods == []
    assert sorted(actions.lift_gates) == ["j-worker-0", "j-worker-1"]
    scheduled = [c for c in actions.status["conditions"] if c["type"] == "GangScheduled"]
    assert scheduled[0]["status"] == "True"
    assert [e.reason for e in actions.events] == ["GangScheduled"]


def lone(**status):
    return (
        make_job("j")
        .spec(workers=1, gpusPerWorker=1)
        .status(
            phase="Admitted",
            attempt=0,
            restarts=0,
            placement=[{"rank": 0, "node": "n-0", "gpus": [3]}],
            observedGeneration=1,
            **status,
        )
    )


def test_a_lone_worker_is_created_ungated_with_no_status_write_of_its_own():
    job = lone().build()
    # A template's own gate is no way to hold the planned GPU unused.
    job["spec"]["template"]["spec"]["schedulingGates"] = [{"name": "tenant/hold"}]
    actions = detect(job, service=False)
    assert actions.create_service is None  # its own master: no headless Service
    (created,) = actions.create_pods
    assert "schedulingGates" not in created["spec"]
    assert created["metadata"]["annotations"]["gangshare.io/planned-gpus"] == "3"
    assert actions.lift_gates == [] and actions.status == {} and actions.events == []
    # Created and waiting to run: nothing to write, nothing to lift, nothing to create again.
    assert detect(job, pods=[pod("j", 0)], service=False).empty


def test_a_lone_workers_commit_rides_on_its_running_write():
    actions = detect(lone().build(), pods=[pod("j", 0, phase="Running", node="n-0")])
    assert actions.status["phase"] == "Running"
    conditions = {c["type"]: c["status"] for c in actions.status["conditions"]}
    assert conditions["GangScheduled"] == "True" and conditions["Running"] == "True"
    assert actions.events == []  # the condition and startedAt say it


def test_a_lone_worker_that_vanishes_before_it_runs_is_made_again():
    # Never committed (nothing was written), so a missing worker is one still to create, not
    # a failed gang: no restart is charged.
    actions = detect(lone().build(), service=False)
    assert [p["metadata"]["name"] for p in actions.create_pods] == ["j-worker-0"]
    assert "phase" not in actions.status


def test_a_lone_worker_gated_by_an_earlier_version_is_committed_and_lifted():
    actions = detect(lone().build(), pods=[pod("j", 0, gated=True)])
    assert actions.lift_gates == ["j-worker-0"]
    assert [e.reason for e in actions.events] == ["GangScheduled"]


def test_all_workers_running_moves_the_job_to_running():
    job = admitted().condition("GangScheduled", True).build()
    actions = detect(
        job,
        pods=[pod("j", 0, phase="Running", node="n-0"), pod("j", 1, phase="Running", node="n-1")],
    )
    assert actions.status["phase"] == "Running"
    assert actions.status["startedAt"] == iso(NOW)


def test_all_workers_succeeded_completes_the_job():
    job = admitted(phase="Running").condition("GangScheduled", True).build()
    actions = detect(job, pods=[pod("j", 0, phase="Succeeded"), pod("j", 1, phase="Succeeded")])
    assert actions.status["phase"] == "Succeeded"
    assert [e.reason for e in actions.events] == ["Completed"]


def terminated(code, started="2026-01-01T00:00:00Z", finished="2026-01-01T00:00:05Z"):
    state = {
        "terminated": {
            "exitCode": code,
            "reason": "Error",
            "startedAt": started,
            "finishedAt": finished,
        }
    }
    return {"containerStatuses": [{"name": "trainer", "state": state}]}


def test_an_early_non_zero_exit_is_a_user_error_and_fails_fast():
    job = admitted(phase="Running").condition("GangScheduled", True).build()
    failed = pod("j", 1, phase="Failed", **terminated(1))
    actions = detect(job, pods=[pod("j", 0, phase="Running"), failed])
    assert actions.status["phase"] == "Failed"
    assert actions.status["lastFailure"]["class"] == "User"
    assert actions.status["lastFailure"]["reason"] == "ErrorExitEarly"
    assert "worker 1 container trainer exited with code 1" in actions.status["message"]
    assert sorted(actions.delete_pods) == ["j-worker-0", "j-worker-1"]
    assert actions.status["placement"] is None


def test_an_infrastructure_failure_restarts_the_whole_gang_with_backoff():
    job = admitted(phase="Running").condition("GangScheduled", True).build()
    evicted = pod("j", 0, phase="Failed", reason="Evicted", message="node ran out of memory")
    actions = detect(job, pods=[evicted, pod("j", 1, phase="Running")])
    status = actions.status
    assert (status["phase"], status["restarts"], status["attempt"]) == ("Restarting", 1, 1)
    assert status["lastFailure"] == {
        "reason": "Evicted",
        "class": "Infrastructure",
        "message": "worker 0: node ran out of memory",
        "time": iso(NOW),
    }
    assert status["nextRetryAt"] == iso(NOW + 10)
    assert sorted(actions.delete_pods) == ["j-worker-0", "j-worker-1"]
    assert [e.reason for e in actions.events] == ["GangRestarting"]


def test_a_worker_that_disappears_after_creation_restarts_the_gang():
    job = admitted(phase="Running").condition("GangScheduled", True).build()
    actions = detect(job, pods=[pod("j", 0, phase="Running")])
    assert actions.status["phase"] == "Restarting"
    assert actions.status["lastFailure"]["reason"] == "Deleted"


def test_retries_are_bounded_by_max_retries():
    job = (
        make_job("j")
        .spec(workers=1, maxRetries=2)
        .status(phase="Running", attempt=2, restarts=2, placement=PLACEMENT[:1])
        .condition("GangScheduled", True)
    )
    actions = detect(job.build(), pods=[pod("j", 0, attempt=2, phase="Failed", reason="Evicted")])
    assert actions.status["phase"] == "Failed"
    assert actions.status["message"].startswith("retries exhausted (2 of 2)")


def test_restarting_waits_for_old_pods_and_the_backoff_then_requeues():
    job = make_job("j").status(
        phase="Restarting", attempt=1, restarts=1, nextRetryAt=iso(NOW + 5), observedGeneration=1
    )
    old = pod("j", 0, attempt=0, phase="Running")
    waiting = detect(job.build(), pods=[old])
    assert waiting.delete_pods == ["j-worker-0"] and "phase" not in waiting.status
    early = detect(job.build())
    assert early.requeue_after == 5 and not early.status
    due = detect(job.build(), now=NOW + 5)
    assert due.status["phase"] == "Queued" and due.status["nextRetryAt"] is None
    assert [e.reason for e in due.events] == ["Requeued"]


def test_ttl_deletes_a_finished_job():
    job = (
        make_job("j")
        .spec(ttlSecondsAfterFinished=60)
        .status(phase="Succeeded", completedAt=iso(NOW))
    )
    assert detect(job.build(), now=NOW + 30).requeue_after == 30
    assert detect(job.build(), now=NOW + 60).delete_job


def pulling(message, started_ago):
    return {
        "startTime": iso(NOW - started_ago),
        "containerStatuses": [
            {
                "name": "trainer",
                "state": {"waiting": {"reason": "ImagePullBackOff", "message": message}},
            }
        ],
    }


def test_a_transient_image_pull_error_waits_then_restarts_the_gang_as_infrastructure():
    job = admitted().condition("GangScheduled", True).build()
    timeout = "Back-off pulling image: dial tcp 10.0.0.5:443: i/o timeout"
    young = detect(job, pods=[pod("j", 0, node="n-0", **pulling(timeout, 60)), pod("j", 1)])
    assert "phase" not in young.status  # the kubelet's own retries come first
    old = detect(job, pods=[pod("j", 0, node="n-0", **pulling(timeout, 301)), pod("j", 1)])
    assert (old.status["phase"], old.status["restarts"]) == ("Restarting", 1)
    assert old.status["lastFailure"]["class"] == "Infrastructure"
    assert old.status["lastFailure"]["reason"] == "ImagePullFailing"
    assert old.status["nextRetryAt"] == iso(NOW + 10)


def test_an_image_that_does_not_exist_fails_fast_as_a_user_error():
    job = admitted().condition("GangScheduled", True).build()
    missing = 'failed to pull "r.io/t:9": manifest unknown'
    actions = detect(job, pods=[pod("j", 0, node="n-0", **pulling(missing, 5)), pod("j", 1)])
    assert actions.status["phase"] == "Failed"
    assert actions.status["lastFailure"]["reason"] == "ImageNotPullable"


def test_same_observation_same_decision():
    job, pods = admitted().build(), [pod("j", 0, gated=True)]
    assert detect(job, pods=pods) == detect(job, pods=pods)


# ----- no admitted gang waits forever -------------------------------------------------------


def test_a_gang_not_bound_by_the_start_deadline_is_released_and_requeued_with_backoff():
    job = (
        admitted(admittedAt=iso(NOW - 60), queuedAt=iso(NOW - 500))
        .condition("GangScheduled", True)
        .build()
    )
    stuck = pod("j", 1, node=None)
    stuck["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/6 nodes are available: 1 Insufficient cpu.",
        }
    ]
    workers = [pod("j", 0, node="n-0"), stuck]
    early = detect(job, pods=workers, now=NOW, limits=Limits(start_timeout_seconds=120))
    assert early.empty and early.requeue_after == 60  # looked at again exactly at the deadline
    late = detect(job, pods=workers, now=NOW + 60, limits=Limits(start_timeout_seconds=120))
    status = late.status
    assert (status["phase"], status["attempt"], status["placement"]) == ("Queued", 1, None)
    assert "queuedAt" not in status  # its place in the queue is kept
    assert "restarts" not in status and status["startFailures"] == 1  # no retry is spent
    assert status["nextRetryAt"] == iso(NOW + 60 + 10)
    assert status["message"] == (
        "workers not all bound 120s after admission (worker 1: 0/6 nodes are available: "
        "1 Insufficient cpu.); GPUs released, requeued in 10s"
    )
    assert sorted(late.delete_pods) == ["j-worker-0", "j-worker-1"]
    assert [(e.type, e.reason) for e in late.events] == [("Warning", "GangStartTimeout")]
    again = {**job, "status": {**job["status"], "startFailures": 3}}
    assert detect(
        again, pods=workers, now=NOW + 60, limits=Limits(start_timeout_seconds=120)
    ).status["nextRetryAt"] == iso(NOW + 60 + 80)


def test_a_displaced_gang_is_requeued_at_once_keeping_its_place():
    job = admitted(admittedAt=iso(NOW - 1)).build()
    seen = Observation(
        job,
        [pod("j", 0, gated=True)],
        True,
        NOW,
        Displacement(0, "planned GPU 1 on n-0 is taken by pod:team/bare"),
    )
    actions = detect_actions(seen, "gangshare-scheduler")
    assert (actions.status["phase"], actions.status["attempt"]) == ("Queued", 1)
    assert actions.status["nextRetryAt"] is None and "queuedAt" not in actions.status
    assert actions.status["message"].startswith(
        "the gang's plan broke before it started (planned GPU 1 on n-0 is taken by pod:team/bare)"
    )
    assert [e.reason for e in actions.events] == ["GangDisplaced"]
    # A displacement seen for an earlier attempt is stale and changes nothing.
    stale = Observation(job, [pod("j", 0, gated=True)], True, NOW, Displacement(7, "old"))
    assert detect_actions(stale, "gangshare-scheduler").status.get("phase") is None


def test_a_bound_gang_is_never_released_by_the_start_deadline():
    job = admitted(admittedAt=iso(NOW - 999)).condition("GangScheduled", True).build()
    pods = [pod("j", 0, node="n-0", phase="Pending"), pod("j", 1, node="n-1", phase="Pending")]
    actions = detect(job, pods=pods, limits=Limits(start_timeout_seconds=120))
    assert actions.status.get("phase") is None


def test_pods_stuck_terminating_past_the_bound_are_force_deleted():
    job = make_job("j").status(phase="Restarting", attempt=1, nextRetryAt=iso(NOW))
    dying = pod("j", 0, attempt=0, phase="Running", node="dead")
    dying["metadata"]["deletionTimestamp"] = iso(NOW - 30)
    waiting = detect(job.build(), pods=[dying], limits=Limits(stuck_pod_seconds=60))
    assert waiting.force_delete_pods == [] and waiting.requeue_after == 30
    assert "phase" not in waiting.status  # the restart still waits for it...
    forced = detect(job.build(), pods=[dying], now=NOW + 30, limits=Limits(stuck_pod_seconds=60))
    assert forced.force_delete_pods == ["j-worker-0"]  # ...but never forever
    assert detect(job.build(), pods=[], now=NOW + 31).status["phase"] == "Queued"


def test_pods_the_job_does_not_control_are_never_touched():
    job = admitted(phase="Running").condition("GangScheduled", True).build()
    mine = [pod("j", 0, phase="Running", node="n-0"), pod("j", 1, phase="Running", node="n-1")]
    impostor = pod("j", 1, phase="Failed", node="n-1", reason="Evicted")
    impostor["metadata"]["ownerReferences"][0]["uid"] = "someone-else"
    impostor["metadata"]["name"] = "j-worker-1-copy"
    stale_impostor = pod("j", 0, attempt=9, phase="Running")
    stale_impostor["metadata"]["ownerReferences"] = []
    actions = detect(job, pods=[*mine, impostor, stale_impostor])
    assert actions.empty  # neither a failure of this gang nor a stale pod to delete


def test_a_worker_the_coordinator_evicted_requeues_the_gang_keeping_retries_and_progress():
    job = make_job("j").status(phase="Running", attempt=2, restarts=1).build()
    evicted = pod("j", 0, attempt=2, phase="Running", node="n-0")
    evicted["metadata"]["deletionTimestamp"] = iso(NOW)
    evicted["metadata"].setdefault("annotations", {})[POD_EVICTED] = json.dumps(
        {
            "reason": "GpuMemoryOverCap",
            "message": "uses 9000 MiB against a cap of 4000 MiB",
            "steps": 120,
        }
    )
    actions = detect(job, pods=[evicted])
    status = actions.status
    assert (status["phase"], status["attempt"], status["evictions"]) == ("Queued", 3, 1)
    assert "restarts" not in status and "queuedAt" not in status  # no retry spent, place kept
    assert status["progress"]["steps"] == 120
    assert [e.reason for e in actions.events] == ["OpportunisticEvicted"]
    assert "uses 9000 MiB against a cap of 4000 MiB" in actions.events[0].message
    running = next(c for c in status["conditions"] if c["type"] == "Running")
    assert running["status"] == "False" and running["reason"] == "OpportunisticEvicted"
    # The next attempt's workers start from the reported step.
    again = make_job("j").status(phase="Admitted", attempt=3, progress={"steps": 120})
    again = again.status(placement=[{"rank": 0, "node": "n-0", "gpus": [0]}]).build()
    created = detect(again, pods=[]).create_pods
    env = {e["name"]: e["value"] for e in created[0]["spec"]["containers"][0]["env"]}
    assert env["GANGSHARE_RESUME_STEP"] == "120"


def scheduled(worker: dict, status: str, at: float, message: str = "") -> dict:
    """kube-scheduler's PodScheduled verdict on a worker, as it writes it."""
    reason = "Unschedulable" if status == "False" else None
    worker["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": status,
            "lastTransitionTime": iso(at),
            **({"reason": reason, "message": message} if reason else {}),
        }
    ]
    return worker


BARRIER = "0/8 nodes are available: 1 gang not wholly ungated (refusal 1): worker 0 is still gated"


def test_workers_the_gang_barrier_refused_are_nudged_once_every_gate_is_off():
    job = admitted(admittedAt=iso(NOW - 1)).condition("GangScheduled", True).build()
    refused = scheduled(pod("j", 1), "False", NOW - 1, BARRIER)
    still_gated = [pod("j", 0, gated=True), refused]
    assert detect(job, pods=still_gated).nudge_pods == []  # the lift is not done yet
    lifted = [scheduled(pod("j", 0, node="n-0"), "True", NOW), refused]
    [(name, mark)] = detect(job, pods=lifted).nudge_pods
    assert name == "j-worker-1"
    # Once per refusal: the nudged worker is not nudged again until it is refused anew.
    refused["metadata"]["annotations"]["gangshare.io/gang-ready"] = mark
    assert detect(job, pods=lifted).nudge_pods == []
    scheduled(refused, "False", NOW - 1, BARRIER.replace("refusal 1", "refusal 2"))
    assert [n for n, _ in detect(job, pods=lifted).nudge_pods] == ["j-worker-1"]
    # A refusal of kube-scheduler's own is no barrier's: nothing to nudge.
    scheduled(refused, "False", NOW - 1, "0/8 nodes are available: 1 Insufficient cpu.")
    assert detect(job, pods=lifted).nudge_pods == []


def test_a_partial_gang_whose_sibling_kube_scheduler_refuses_is_released_within_seconds():
    job = (
        admitted(admittedAt=iso(NOW - 4), queuedAt=iso(NOW - 500))
        .condition("GangScheduled", True)
        .build()
    )
    anti = "0/8 nodes are available: 1 node(s) didn't match pod anti-affinity rules."
    workers = [
        scheduled(pod("j", 0, node="n-0", phase="Running"), "True", NOW - 3),
        scheduled(pod("j", 1), "False", NOW - 2, anti),
    ]
    early = detect(job, pods=workers, limits=Limits(unschedulable_seconds=5))
    assert early.empty and early.requeue_after == 2  # 5 s after worker 0 was bound
    late = detect(job, pods=workers, now=NOW + 2, limits=Limits(unschedulable_seconds=5))
    assert (late.status["phase"], late.status["attempt"]) == ("Queued", 1)
    assert late.status["startFailures"] == 1 and "queuedAt" not in late.status
    assert late.status["message"] == (
        f"worker 1 cannot be placed on its planned node ({anti}) while 1 of 2 workers are "
        "bound; GPUs released, requeued in 10s"
    )
    assert sorted(late.delete_pods) == ["j-worker-0", "j-worker-1"]
    assert [(e.type, e.reason) for e in late.events] == [("Warning", "GangUnschedulable")]
    # The barrier's own refusals never count: those workers are nudged instead.
    workers[1] = scheduled(pod("j", 1), "False", NOW - 2, BARRIER)
    assert detect(job, pods=workers, now=NOW + 2).status == {}


def test_a_gang_run_across_islands_it_requires_is_released_even_while_running():
    job = (
        admitted(phase="Running", queuedAt=iso(NOW - 500)).condition("GangScheduled", True).build()
    )
    workers = [pod("j", 0, node="n-0", phase="Running"), pod("j", 1, node="n-1", phase="Running")]
    why = "worker 1 was given GPUs [1, 2] on n-1, across NVLink islands"
    seen = Observation(job, workers, True, NOW, Displacement(0, why, off_island=True))
    actions = detect_actions(seen, "gangshare-scheduler")
    assert (actions.status["phase"], actions.status["attempt"]) == ("Queued", 1)
    assert "restarts" not in actions.status and "queuedAt" not in actions.status
    assert actions.status["startFailures"] == 1 and actions.status["nextRetryAt"] == iso(NOW + 10)
    assert sorted(actions.delete_pods) == ["j-worker-0", "j-worker-1"]
    [event] = actions.events
    assert (event.type, event.reason) == ("Warning", "GangTopologyBroken")
    assert event.message.startswith(why + "; the gang is released and requeued in 10s")
    # A verdict on an earlier attempt does nothing to this one.
    stale = Observation(job, workers, True, NOW, Displacement(1, why, off_island=True))
    assert detect_actions(stale, "gangshare-scheduler").status == {}


def test_a_committed_lift_that_was_interrupted_is_finished():
    """GangScheduled is written before the gates come off: an operator that stopped between
    two lifts leaves a committed gang with a gate on, and the next reconcile lifts it."""
    job = admitted(admittedAt=iso(NOW - 2)).condition("GangScheduled", True).build()
    workers = [pod("j", 0, node="n-0"), pod("j", 1, gated=True)]
    actions = detect(job, pods=workers)
    assert actions.lift_gates == ["j-worker-1"] and actions.status == {}
