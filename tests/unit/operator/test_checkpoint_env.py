"""Checkpoint on notice, the operator's side: spec.checkpoint, every attempt's environment, and
a reclaimed attempt whose workers exit on SIGTERM is a requeue, never a failure."""

from __future__ import annotations

from typing import Any

import pytest
from jobs import make_job, pod

from gangshare.kube.trainingjob import InvalidSpec, parse_trainingjob
from gangshare.operator.actions import Displacement
from gangshare.operator.conditions import iso
from gangshare.operator.lifecycle import Observation, detect_actions
from gangshare.operator.manifests import worker_pod
from gangshare.sdk.wire import ATTEMPT_ENV, CHECKPOINT_DIR_ENV, PREEMPT_GRACE_ENV

NOW = 1_800_000_000.0


def template(
    mounts: list[dict[str, Any]] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "trainer", "image": "train:1"}
    if mounts is not None:
        container["volumeMounts"] = mounts
    pod_spec: dict[str, Any] = {"containers": [container], **spec}
    if volumes is not None:
        pod_spec["volumes"] = volumes
    return {"spec": pod_spec}


PVC = template(
    [{"name": "ckpt", "mountPath": "/mnt/ckpt/"}],
    [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "llm-ckpt"}}],
)


def env_of(worker: dict[str, Any], container: int = 0) -> dict[str, str]:
    return {e["name"]: e["value"] for e in worker["spec"]["containers"][container]["env"]}


def test_every_attempt_gets_the_same_folder_its_attempt_and_its_grace() -> None:
    job = parse_trainingjob(
        make_job("llm").spec(template=PVC, checkpoint={"path": "/mnt/ckpt/llm/"}).build()
    )
    assert job.checkpoint_path == "/mnt/ckpt/llm"
    for attempt in (0, 1, 7):
        worker = worker_pod(job, 0, "n-0", [0], attempt)
        env = env_of(worker)
        assert env[CHECKPOINT_DIR_ENV] == "/mnt/ckpt/llm"
        assert env[ATTEMPT_ENV] == worker["metadata"]["labels"]["gangshare.io/attempt"]
        assert env[ATTEMPT_ENV] == str(attempt)
        # No grace in the template: Kubernetes' default, which the deletion will use.
        assert env[PREEMPT_GRACE_ENV] == "30"


def test_the_grace_is_the_pods_own_after_the_opportunistic_clamp() -> None:
    guaranteed = parse_trainingjob(
        make_job("g").spec(template=template(terminationGracePeriodSeconds=120)).build()
    )
    assert env_of(worker_pod(guaranteed, 0, "n-0", [0], 0))[PREEMPT_GRACE_ENV] == "120"
    # A borrower runs as Opportunistic: a grace over the bound is clamped, and so is the env.
    borrowed = parse_trainingjob(
        make_job("b")
        .spec(serviceClass="Opportunistic", template=template(terminationGracePeriodSeconds=90))
        .build()
    )
    worker = worker_pod(borrowed, 0, "n-0", [0], 0)
    assert worker["spec"]["terminationGracePeriodSeconds"] == 30
    assert env_of(worker)[PREEMPT_GRACE_ENV] == "30"
    short = parse_trainingjob(
        make_job("s")
        .spec(serviceClass="Opportunistic", template=template(terminationGracePeriodSeconds=5))
        .build()
    )
    assert env_of(worker_pod(short, 0, "n-0", [0], 0))[PREEMPT_GRACE_ENV] == "5"


def test_without_a_checkpoint_there_is_no_folder_and_the_template_cannot_fake_one() -> None:
    pod_template = template()
    pod_template["spec"]["containers"][0]["env"] = [
        {"name": ATTEMPT_ENV, "value": "99"},
        {"name": "OWN", "value": "kept"},
    ]
    job = parse_trainingjob(make_job("j").spec(template=pod_template).build())
    env = env_of(worker_pod(job, 0, "n-0", [0], 2))
    assert CHECKPOINT_DIR_ENV not in env
    assert env[ATTEMPT_ENV] == "2" and env["OWN"] == "kept"


@pytest.mark.parametrize(
    ("checkpoint", "pod_template", "message"),
    [
        ({"path": "ckpt"}, PVC, "spec.checkpoint.path: must be an absolute path, got 'ckpt'"),
        ({}, PVC, "spec.checkpoint.path: must be an absolute path, got None"),
        ("/mnt/ckpt", PVC, "spec.checkpoint.path: must be an absolute path"),
        (
            {"path": "/data/ckpt"},
            PVC,
            "spec.checkpoint.path: /data/ckpt is on no volume of the first container",
        ),
        (
            {"path": "/mnt/ckpt-other"},
            PVC,
            "spec.checkpoint.path: /mnt/ckpt-other is on no volume of the first container",
        ),
        (
            {"path": "/scratch/x"},
            template([{"name": "s", "mountPath": "/scratch"}], [{"name": "s", "emptyDir": {}}]),
            "spec.checkpoint.path: /scratch/x is on volume 's', which is deleted with the pod",
        ),
        (
            {"path": "/mnt/ckpt"},
            template(
                [{"name": "ckpt", "mountPath": "/mnt/ckpt", "readOnly": True}],
                [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "c"}}],
            ),
            "spec.checkpoint.path: /mnt/ckpt is on volume 'ckpt', which is mounted read-only",
        ),
        (
            {"path": "/etc/cfg"},
            template([{"name": "c", "mountPath": "/etc/cfg"}], [{"name": "c", "configMap": {}}]),
            "spec.checkpoint.path: /etc/cfg is on volume 'c', which is read-only",
        ),
    ],
)
def test_a_checkpoint_no_later_attempt_could_read_is_refused_with_the_field_named(
    checkpoint: Any, pod_template: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidSpec) as refused:
        parse_trainingjob(make_job("j").spec(template=pod_template, checkpoint=checkpoint).build())
    assert str(refused.value).startswith(message), refused.value


def test_the_deepest_mount_decides_and_a_host_path_is_accepted() -> None:
    pod_template = template(
        [{"name": "tmp", "mountPath": "/work"}, {"name": "keep", "mountPath": "/work/ckpt"}],
        [{"name": "tmp", "emptyDir": {}}, {"name": "keep", "hostPath": {"path": "/srv/c"}}],
    )
    job = parse_trainingjob(
        make_job("j").spec(template=pod_template, checkpoint={"path": "/work/ckpt"}).build()
    )
    assert job.checkpoint_path == "/work/ckpt"


def test_a_reclaimed_attempt_whose_workers_exit_143_is_requeued_not_failed() -> None:
    job = (
        make_job("j")
        .spec(template=PVC, checkpoint={"path": "/mnt/ckpt"})
        .status(
            phase="Running",
            attempt=0,
            restarts=0,
            placement=[{"rank": 0, "node": "n-0", "gpus": [0]}],
            serviceClass="Opportunistic",
            borrowed=True,
        )
        .condition("GangScheduled", True)
    )
    running = pod("j", 0, phase="Running", node="n-0")
    reclaim = Displacement(0, "reclaimed: the lender took its quota back", preempted=True)
    actions = detect_actions(
        Observation(job.build(), [running], True, NOW, reclaim), "gangshare-scheduler"
    )
    # Deleted with the pod's grace (no force): the kubelet's SIGTERM is the notice.
    assert actions.delete_pods == ["j-worker-0"] and actions.force_delete_pods == []
    assert (actions.status["phase"], actions.status["attempt"]) == ("Queued", 1)
    assert "restarts" not in actions.status
    # The old worker saves and exits 143 (on_preempt) while it terminates: not this attempt's.
    ended = pod(
        "j",
        0,
        attempt=0,
        phase="Failed",
        node="n-0",
        containerStatuses=[
            {
                "name": "trainer",
                "state": {"terminated": {"exitCode": 143, "reason": "Error"}},
            }
        ],
    )
    ended["metadata"]["deletionTimestamp"] = iso(NOW)
    queued = job.status(**actions.status).build()
    later = detect_actions(Observation(queued, [ended], True, NOW + 5), "gangshare-scheduler")
    assert "restarts" not in later.status and "lastFailure" not in later.status
    assert later.status.get("phase", "Queued") == "Queued"
    # The next attempt's worker: same folder, attempt 1.
    again = job.status(
        phase="Admitted", attempt=1, placement=[{"rank": 0, "node": "n-0", "gpus": [0]}]
    ).build()
    (created,) = detect_actions(
        Observation(again, [], True, NOW + 60), "gangshare-scheduler"
    ).create_pods
    env = env_of(created)
    assert (env[CHECKPOINT_DIR_ENV], env[ATTEMPT_ENV]) == ("/mnt/ckpt", "1")
    assert env[PREEMPT_GRACE_ENV] == "30"
