"""A replica group's template is held to the workers' rules, at the real API server.

The operator creates a group's pods from spec.replicaGroups[].template as it does the workers'
from spec.template, under its own account: crds/trainingjob-admission-policy.yaml checks every
template alike, and crds/trainingjob.yaml's replicaGroups schema (with its CEL rules) loads.
"""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml

from kube import Kube, eventually
from tj import get, trainingjob

pytestmark = pytest.mark.integration

LAUNCHER = {
    "name": "launch",
    "image": "example.invalid/launch:1",
    "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}},
}
UNCONFINED = {"type": "Unconfined"}
YEAR = 31536000


def apply(kube: Kube, namespace: str, body: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        kube.kubectl("apply", "-n", namespace, "-f", "-"),
        input=yaml.safe_dump(body),
        capture_output=True,
        text=True,
    )


def with_groups(name: str, *templates: dict[str, Any]) -> dict[str, Any]:
    """A one-worker job with a group per template (`launcher`, then `group-1`, ...)."""
    body = trainingjob(name, 1, 1)
    body["spec"]["replicaGroups"] = [
        {"name": "launcher" if i == 0 else f"group-{i}", "replicas": 1, "template": template}
        for i, template in enumerate(templates)
    ]
    return body


def launcher(meta: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    """A CPU-only launcher's template, with `spec` merged over its PodSpec."""
    return {"metadata": meta or {}, "spec": {"containers": [LAUNCHER], **spec}}


def context(**security: Any) -> list[dict[str, Any]]:
    return [{**LAUNCHER, "securityContext": security}]


PREFIX = "spec.replicaGroups[].template."
REFUSED = [
    (
        "privileged",
        launcher(containers=context(privileged=True)),
        "spec.containers[].securityContext.privileged: privileged containers are not allowed",
    ),
    (
        "hostpath",
        launcher(volumes=[{"name": "root", "hostPath": {"path": "/"}}]),
        "spec.volumes[].hostPath: hostPath volumes are not allowed",
    ),
    (
        "gpu-helper",
        launcher(
            containers=[
                LAUNCHER,
                {"name": "helper", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
            ]
        ),
        "spec.containers[].resources: only the first container gets GPUs "
        "(spec.replicaGroups[].gpus)",
    ),
    (
        "long-grace",
        launcher(terminationGracePeriodSeconds=YEAR),
        "spec.terminationGracePeriodSeconds: at most 300 seconds in this namespace",
    ),
    # The rest of the policy's rules, each as the workers' template is held to them.
    (
        "capabilities",
        launcher(containers=context(capabilities={"add": ["SYS_ADMIN"]})),
        "spec.containers[].securityContext.capabilities.add: only the Pod Security baseline",
    ),
    (
        "hostnet",
        launcher(hostNetwork=True),
        "spec.hostNetwork, hostPID, hostIPC: host namespaces are not allowed",
    ),
    (
        "hostpid",
        launcher(hostPID=True),
        "spec.hostNetwork, hostPID, hostIPC: host namespaces are not allowed",
    ),
    (
        "hostport",
        launcher(containers=[{**LAUNCHER, "ports": [{"containerPort": 80, "hostPort": 80}]}]),
        "spec.containers[].ports[].hostPort: host ports are not allowed",
    ),
    (
        "gpu-sidecar",
        launcher(
            initContainers=[
                {
                    "name": "side",
                    "image": "i",
                    "restartPolicy": "Always",
                    "resources": {"requests": {"gangshare.io/gpu-share": "2"}},
                }
            ]
        ),
        "spec.initContainers[].resources: init containers and sidecars may not ask for GPUs",
    ),
    (
        "seccomp-pod",
        launcher(securityContext={"seccompProfile": UNCONFINED}),
        "spec.securityContext.seccompProfile.type: Unconfined is not allowed",
    ),
    (
        "seccomp",
        launcher(containers=context(seccompProfile=UNCONFINED)),
        "spec.containers[].securityContext.seccompProfile.type: Unconfined is not allowed",
    ),
    (
        "apparmor-pod",
        launcher(securityContext={"appArmorProfile": UNCONFINED}),
        "spec.securityContext.appArmorProfile.type: Unconfined is not allowed",
    ),
    (
        "apparmor",
        launcher(containers=context(appArmorProfile=UNCONFINED)),
        "spec.containers[].securityContext.appArmorProfile.type: Unconfined is not allowed",
    ),
    (
        "apparmor-annotation",
        launcher(
            {"annotations": {"container.apparmor.security.beta.kubernetes.io/launch": "unconfined"}}
        ),
        "metadata.annotations: the AppArmor and seccomp annotations may not say unconfined",
    ),
    (
        "procmount",
        launcher(containers=context(procMount="Unmasked")),
        "spec.containers[].securityContext.procMount: only Default is allowed",
    ),
    (
        "sysctl",
        launcher(securityContext={"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]}),
        "spec.securityContext.sysctls[].name: only Kubernetes' safe sysctls",
    ),
    (
        "system-priority",
        launcher(priorityClassName="system-node-critical"),
        "spec.priorityClassName: the system-* priority classes are reserved",
    ),
]


@pytest.mark.parametrize(
    ("name", "template", "message"), REFUSED, ids=[name for name, _, _ in REFUSED]
)
def test_a_replica_group_template_is_refused_naming_the_field(
    crd: Kube, namespace: str, name: str, template: dict[str, Any], message: str
):
    done = apply(crd, namespace, with_groups(name, template))
    assert done.returncode != 0 and PREFIX + message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_every_group_is_checked_not_only_the_first(crd: Kube, namespace: str):
    body = with_groups("third", launcher(), launcher(), launcher(hostIPC=True))
    done = apply(crd, namespace, body)
    assert done.returncode != 0, done.stdout
    assert PREFIX + "spec.hostNetwork, hostPID, hostIPC: host namespaces" in done.stderr


def test_the_workers_template_is_named_as_before_beside_a_clean_group(crd: Kube, namespace: str):
    body = with_groups("worker-privileged", launcher())
    body["spec"]["template"]["spec"]["containers"] = context(privileged=True)
    done = apply(crd, namespace, body)
    assert done.returncode != 0, done.stdout
    assert "spec.template.spec.containers[].securityContext.privileged:" in done.stderr
    assert "spec.replicaGroups" not in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("meta", "spec", "message"),
    [
        (
            {"labels": {"gangshare.io/job": "someone-else"}},
            {},
            "spec.replicaGroups[].template.metadata.labels: keys under gangshare.io/ are reserved",
        ),
        # A CPU-only group's pod keeps the template's planned GPUs (the operator writes them only
        # for a pod with GPUs): the CRD refuses them, as it does on the workers' template.
        (
            {"annotations": {"gangshare.io/planned-gpus": "0,1"}},
            {},
            "spec.replicaGroups[].template.metadata.annotations: keys under gangshare.io/ are "
            "reserved",
        ),
        (
            {},
            {"nodeName": "h100-0"},
            "spec.replicaGroups[].template.spec.nodeName: gangshare places every pod",
        ),
    ],
    ids=["label", "annotation", "node-name"],
)
def test_the_crd_refuses_a_group_template_naming_the_field(
    crd: Kube, namespace: str, meta: dict[str, Any], spec: dict[str, Any], message: str
):
    done = apply(crd, namespace, with_groups("reserved", launcher(meta, **spec)))
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_a_cpu_only_launcher_group_is_accepted(crd: Kube, namespace: str):
    kwok = {"annotations": {"gangshare.io/kwok-exit-code": "0"}}
    done = apply(crd, namespace, with_groups("with-launcher", launcher(kwok)))
    assert done.returncode == 0, done.stderr
    [group] = get(crd, namespace, "with-launcher")["spec"]["replicaGroups"]
    assert group["gpus"] == 0  # the CRD's default: a CPU-only group
    assert group["template"]["spec"]["containers"] == [LAUNCHER]


def test_a_namespace_a_cluster_admin_opted_in_may_run_privileged_groups(crd: Kube, namespace: str):
    crd.core.patch_namespace(
        namespace, {"metadata": {"labels": {"gangshare.io/privileged-templates": "allowed"}}}
    )
    body = with_groups("privileged", launcher(containers=context(privileged=True)))
    # Admission sees the namespace label through an informer: allow it a moment.
    assert eventually(
        lambda: apply(crd, namespace, body).returncode == 0,
        timeout=20,
        what="the opted-in namespace accepts the group's template",
    )
