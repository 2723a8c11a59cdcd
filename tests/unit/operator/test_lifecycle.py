"""The TrainingJob state machine, decided from observations alone (no API server)."""

from jobs import make_job, pod

from gangshare.operator.conditions import iso
from gangshare.operator.lifecycle import Observation, detect_actions

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


def test_a_new_job_is_queued_with_an_event():
    actions = detect(make_job("j").build())
    assert actions.status["phase"] == "Queued"
    assert actions.status["queuedAt"] == iso(NOW)
    assert [(e.type, e.reason) for e in actions.events] == [("Normal", "Queued")]
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
    assert created["spec"]["nodeSelector"]["kubernetes.io/hostname"] == "n-1"
    assert actions.lift_gates == []  # not every worker exists yet


def test_gates_are_lifted_only_when_the_whole_gang_exists():
    actions = detect(admitted().build(), pods=[pod("j", 0, gated=True), pod("j", 1, gated=True)])
    assert actions.create_pods == []
    assert sorted(actions.lift_gates) == ["j-worker-0", "j-worker-1"]
    scheduled = [c for c in actions.status["conditions"] if c["type"] == "GangScheduled"]
    assert scheduled[0]["status"] == "True"
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


def test_image_pull_errors_fail_the_job_as_user_errors():
    job = admitted().condition("GangScheduled", True).build()
    waiting = {
        "containerStatuses": [
            {"name": "trainer", "state": {"waiting": {"reason": "ImagePullBackOff"}}}
        ]
    }
    actions = detect(job, pods=[pod("j", 0, **waiting), pod("j", 1)])
    assert actions.status["phase"] == "Failed"
    assert actions.status["lastFailure"]["reason"] == "ImagePullBackOff"


def test_same_observation_same_decision():
    job, pods = admitted().build(), [pod("j", 0, gated=True)]
    assert detect(job, pods=pods) == detect(job, pods=pods)
