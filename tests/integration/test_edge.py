"""Bad and hostile input is refused at the API with the field named, and a hung operator says so.

The CRD's schema and CEL rules (crds/trainingjob.yaml) and the template policy
(crds/trainingjob-admission-policy.yaml) run in the real API server; the operator is real.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException
from test_no_stuck_gangs import reasons_of

from gangshare.core.annotations import POD_EVICTED
from gangshare.kube.snapshot import parse_time
from kube import Kube, NodePool, OperatorProcess, eventually
from tj import GROUP, PLURAL, VERSION, create, job_pods, phase_is, status, trainingjob

pytestmark = pytest.mark.integration


def apply(kube: Kube, namespace: str, body: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        kube.kubectl("apply", "-n", namespace, "-f", "-"),
        input=yaml.safe_dump(body),
        capture_output=True,
        text=True,
    )


def with_template(name: str, meta: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    body = trainingjob(name, 1, 1)
    body["spec"]["template"]["metadata"].update(meta)
    body["spec"]["template"]["spec"].update(spec)
    return body


PRIVILEGED = {"containers": [{"name": "t", "image": "i", "securityContext": {"privileged": True}}]}
FOUR_GPUS = {"limits": {"nvidia.com/gpu": "4"}}
GPU_SIDECAR = {
    "initContainers": [
        {"name": "side", "image": "i", "restartPolicy": "Always", "resources": FOUR_GPUS}
    ]
}


def opportunistic(body: dict[str, Any]) -> dict[str, Any]:
    body["spec"]["serviceClass"] = "Opportunistic"
    return body


def container_context(name: str, **context: Any) -> dict[str, Any]:
    return {"containers": [{"name": name, "image": "i", "securityContext": context}]}


UNCONFINED = {"type": "Unconfined"}
YEAR = 31536000
GPU_SECOND_CONTAINER = {
    "containers": [
        {"name": "t", "image": "i"},
        {
            "name": "helper",
            "image": "i",
            "resources": {"requests": {"gangshare.io/gpu-share": "2"}},
        },
    ]
}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (trainingjob("resnet.v2", 1, 1), "metadata.name: must be a DNS-1035 label"),
        (
            with_template("forged", {"annotations": {"gangshare.io/assigned-gpus": "0,1"}}, {}),
            "spec.template.metadata.annotations: keys under gangshare.io/ are reserved",
        ),
        (
            with_template("planned", {"annotations": {"gangshare.io/planned-node": "h100-0"}}, {}),
            "spec.template.metadata.annotations: keys under gangshare.io/ are reserved",
        ),
        (
            with_template("labelled", {"labels": {"gangshare.io/job": "someone-else"}}, {}),
            "spec.template.metadata.labels: keys under gangshare.io/ are reserved",
        ),
        (
            with_template("pinned", {}, {"nodeName": "h100-0"}),
            "spec.template.spec.nodeName: gangshare places every worker",
        ),
        (
            with_template("privileged", {}, PRIVILEGED),
            "spec.template.spec.containers[].securityContext.privileged: privileged containers "
            "are not allowed in this namespace",
        ),
        (
            with_template("hostnet", {}, {"hostNetwork": True}),
            "spec.template.spec.hostNetwork, hostPID, hostIPC: host namespaces are not allowed",
        ),
        (
            with_template("hostpath", {}, {"volumes": [{"name": "r", "hostPath": {"path": "/"}}]}),
            "spec.template.spec.volumes[].hostPath: hostPath volumes are not allowed",
        ),
        (
            with_template("gpu-sidecar", {}, GPU_SIDECAR),
            "spec.template.spec.initContainers[].resources: init containers and sidecars may not "
            "ask for GPUs",
        ),
        (
            with_template("gpu-helper", {}, GPU_SECOND_CONTAINER),
            "spec.template.spec.containers[].resources: only the first container gets GPUs",
        ),
        (
            with_template("seccomp-pod", {}, {"securityContext": {"seccompProfile": UNCONFINED}}),
            "spec.template.spec.securityContext.seccompProfile.type: Unconfined is not allowed",
        ),
        (
            with_template("seccomp", {}, container_context("t", seccompProfile=UNCONFINED)),
            "spec.template.spec.containers[].securityContext.seccompProfile.type: Unconfined",
        ),
        (
            with_template("apparmor-pod", {}, {"securityContext": {"appArmorProfile": UNCONFINED}}),
            "spec.template.spec.securityContext.appArmorProfile.type: Unconfined is not allowed",
        ),
        (
            with_template("apparmor", {}, container_context("t", appArmorProfile=UNCONFINED)),
            "spec.template.spec.containers[].securityContext.appArmorProfile.type: Unconfined",
        ),
        (
            with_template(
                "apparmor-annotation",
                {"annotations": {"container.apparmor.security.beta.kubernetes.io/t": "unconfined"}},
                {},
            ),
            "spec.template.metadata.annotations: the AppArmor and seccomp annotations may not say "
            "unconfined",
        ),
        (
            with_template("procmount", {}, container_context("t", procMount="Unmasked")),
            "spec.template.spec.containers[].securityContext.procMount: only Default is allowed",
        ),
        (
            with_template(
                "sysctl",
                {},
                {"securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]}},
            ),
            "spec.template.spec.securityContext.sysctls[].name: only Kubernetes' safe sysctls",
        ),
        (
            with_template("long-grace", {}, {"terminationGracePeriodSeconds": YEAR}),
            "spec.template.spec.terminationGracePeriodSeconds: at most 300 seconds",
        ),
        (
            opportunistic(with_template("share-grace", {}, {"terminationGracePeriodSeconds": 60})),
            "spec.template.spec.terminationGracePeriodSeconds: at most 30 seconds for "
            "Opportunistic jobs",
        ),
    ],
    ids=lambda value: value["metadata"]["name"] if isinstance(value, dict) else None,
)
def test_refused_at_the_api_naming_the_field(crd: Kube, namespace: str, body, message):
    done = apply(crd, namespace, body)
    assert done.returncode != 0 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_a_namespace_a_cluster_admin_opted_in_may_run_privileged_templates(
    crd: Kube, namespace: str
):
    crd.core.patch_namespace(
        namespace, {"metadata": {"labels": {"gangshare.io/privileged-templates": "allowed"}}}
    )

    def accepted() -> bool:
        done = apply(crd, namespace, with_template("privileged", {}, PRIVILEGED))
        return done.returncode == 0

    # Admission sees the namespace label through an informer: allow it a moment.
    assert eventually(accepted, timeout=20, what="the opted-in namespace accepts the template")
    # Its privileges are the namespace's; an evicted Opportunistic worker's grace stays bounded.
    long_grace = with_template("share", {}, {"terminationGracePeriodSeconds": 3600})
    done = apply(crd, namespace, opportunistic(long_grace))
    assert done.returncode != 0, done.stdout
    assert "at most 30 seconds for Opportunistic jobs" in done.stderr, done.stderr


def test_queue_and_priority_are_immutable_once_admitted(operator: OperatorProcess, namespace: str):
    kube = operator.kube
    create(kube, namespace, trainingjob("fixed", 1, 1, exit_code=None, priority=5))
    eventually(lambda: phase_is(kube, namespace, "fixed", "Running"), timeout=30)
    for change in ({"priority": 999}, {"queue": "vip"}):
        with pytest.raises(ApiException) as refused:
            kube.custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, "fixed", {"spec": change}
            )
        assert refused.value.status == 422
        assert "spec.queue and spec.priority are immutable once the job is admitted" in str(
            refused.value.body
        )


def test_a_requeued_job_moved_to_another_queue_goes_to_the_back_of_it(
    operator: OperatorProcess, pool: NodePool, namespace: str, queues: Callable[..., str]
):
    kube = operator.kube
    pool.nodes(1, 4)
    first, second = queues("first"), queues("second")

    def job(name: str, queue: str, priority: int = 0) -> dict[str, Any]:
        spec = {"queue": queue, "priority": priority, "gpuModel": pool.model}
        return trainingjob(name, 1, 4, exit_code=None, **spec)

    create(kube, namespace, job("mover", first))
    running = eventually(lambda: phase_is(kube, namespace, "mover", "Running"), timeout=60)
    time.sleep(1.1)  # queuedAt counts whole seconds
    create(kube, namespace, job("waiting", second))  # queued after the mover: behind it
    # Ahead of the mover in its own queue: the GPUs the eviction frees go to it (or to waiting).
    create(kube, namespace, job("jumper", first, priority=10))
    eventually(
        lambda: all(phase_is(kube, namespace, j, "Queued") for j in ("waiting", "jumper")),
        what="waiting and jumper queued",
    )
    # A requeue that keeps the job's place: its worker evicted by a node's coordinator.
    [worker] = job_pods(kube, namespace, "mover")
    evicted = {POD_EVICTED: json.dumps({"message": "over its GPU memory cap"})}
    kube.core.patch_namespaced_pod(
        worker.metadata.name, namespace, {"metadata": {"annotations": evicted}}
    )

    def requeued() -> dict[str, Any] | None:
        now = phase_is(kube, namespace, "mover", "Queued")
        return now if now and now.get("evictions") else None

    before = eventually(requeued, timeout=60, what="the mover evicted and requeued")
    assert before["queuedAt"] == running["queuedAt"] and "admittedAt" not in before
    ahead_of = parse_time(status(kube, namespace, "waiting")["queuedAt"])
    assert parse_time(before["queuedAt"]) < ahead_of
    time.sleep(1.1)
    kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "mover", {"spec": {"queue": second}}
    )

    def moved() -> dict[str, Any] | None:
        now = status(kube, namespace, "mover")
        return now if (now.get("queuedAs") or {}).get("queue") == second else None

    after = eventually(moved, what="the mover's place in line restamped in its new queue")
    assert after["queuedAs"] == {"queue": second, "priority": 0}
    assert after["phase"] == "Queued", after
    assert parse_time(after["queuedAt"]) > ahead_of, (after, ahead_of)
    assert eventually(
        lambda: "Moved" in reasons_of(kube, namespace, "mover") or None, what="the Moved event"
    )


def test_liveness_fails_when_the_scheduling_loop_hangs(crd: Kube, tmp_path: Path):
    hung = OperatorProcess(
        crd, tmp_path, "--stall-seconds", "3", faults=("--hang-after-passes", "4")
    ).start()
    url = f"http://127.0.0.1:{hung.liveness_port}/healthz"

    def health() -> int:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as err:
            return int(err.code)

    try:
        assert eventually(lambda: health() == 200, timeout=30, what="liveness answers")
        # After a few passes the loop hangs for good; kopf re-runs probes at most every 10 s.
        assert eventually(lambda: health() == 500, timeout=40, what="liveness failing")
        assert "no scheduling pass has finished" in hung.logs()
    finally:
        hung.stop()
