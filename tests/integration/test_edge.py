"""Bad and hostile input is refused at the API with the field named, and a hung operator says so.

The CRD's schema and CEL rules (crds/trainingjob.yaml) and the template policy
(crds/trainingjob-admission-policy.yaml) run in the real API server; the operator is real.
"""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from kube import Kube, OperatorProcess, eventually
from tj import GROUP, PLURAL, VERSION, create, phase_is, trainingjob

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
