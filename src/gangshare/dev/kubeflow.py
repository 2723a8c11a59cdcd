"""Kubeflow's training controllers in the local control plane, beside JobSet's (dev/jobset.py).

scripts/build-k8s.sh builds `trainer-controller-manager` from github.com/kubeflow/trainer/v2
(TrainJob, TrainingRuntime, ClusterTrainingRuntime; a TrainJob runs as a JobSet, so JobSet's
controller must run first) and `training-operator` from github.com/kubeflow/training-operator
(PyTorchJob, kubeflow.org/v1; only that scheme is enabled, no gang scheduler), and copies their
CRDs from the modules into the cache (`manifests/`). Like JobSet's, each runs on loopback with
the cluster's admin credentials, leader election and metrics off, and the API server calls its
validating webhooks (upstream has no defaulting ones) by URL, served with the API server's own
certificate (issued for 127.0.0.1 by the cluster's CA). Only their webhooks on their own kinds
are registered, never one on pods.

Neither takes a config file, a certificate folder or a listen host for its webhook server (it
listens on every interface at its port), and both mains always start cert-controller's rotator,
which is made harmless here rather than patched out:
- it needs the Secret it keeps a CA in, in the namespace upstream falls back to outside a pod:
  created here empty; it fills it with a CA and certificate of its own that nothing uses;
- it injects that CA into a ValidatingWebhookConfiguration of a fixed name: ours are named
  otherwise, so the API server keeps trusting the cluster's CA;
- it holds the controllers back until `/tmp/k8s-webhook-server/serving-certs/tls.crt` exists
  (where a pod mounts that Secret; the path is a constant). The webhook servers themselves read
  controller-runtime's default, `$TMPDIR/k8s-webhook-server/serving-certs`, so each process gets
  a TMPDIR of its own in the cluster's folder holding the real certificate, and the fixed path
  only needs to exist: when it does not, the cluster's public certificate is put there.
"""

from __future__ import annotations

import base64
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import yaml

ROTATOR_CERT = Path("/tmp/k8s-webhook-server/serving-certs/tls.crt")


@dataclass(frozen=True)
class Webhook:
    name: str
    path: str
    group: str
    version: str
    resource: str


@dataclass(frozen=True)
class Controller:
    name: str  # binary, process and log name
    crds: tuple[str, ...]  # files in manifests/
    crd_names: tuple[str, ...]  # their metadata.name, to wait for Established
    secret: str  # the rotator's Secret
    namespace: Callable[[], str]  # where upstream looks for it
    namespace_env: dict[str, str]  # what makes it look there
    webhooks: tuple[Webhook, ...]
    flags: tuple[str, ...]  # beyond kubeconfig, ports, secret
    needs_jobset: bool = False  # runs its jobs as JobSets: starts only where JobSet's does

    def crd_paths(self, bins: Path) -> list[Path]:
        return [bins.parent / "manifests" / f for f in self.crds]

    def available(self, bins: Path) -> bool:
        return (bins / self.name).exists() and all(p.exists() for p in self.crd_paths(bins))

    def argv(self, bins: Path, kubeconfig: Path, webhook_port: int, health_port: int) -> list[str]:
        return [
            str(bins / self.name),
            f"--kubeconfig={kubeconfig}",
            "--leader-elect=false",
            # "0" turns the metrics server off.
            "--metrics-bind-address=0",
            f"--health-probe-bind-address=127.0.0.1:{health_port}",
            f"--webhook-server-port={webhook_port}",
            f"--webhook-secret-name={self.secret}",
            *self.flags,
        ]

    def prepare(self, root: Path, cert: Path, key: Path) -> dict[str, str]:
        """The process's TMPDIR, holding its webhook certificate where controller-runtime
        looks by default; returns the environment to start it with."""
        tmp = root / f"{self.name}-tmp"
        certs = tmp / "k8s-webhook-server" / "serving-certs"
        certs.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(cert, certs / "tls.crt")
        shutil.copyfile(key, certs / "tls.key")
        if not ROTATOR_CERT.exists():
            ROTATOR_CERT.parent.mkdir(parents=True, exist_ok=True)
            # Public only (no key): the rotator waits for the file to exist and never reads it.
            shutil.copyfile(cert, ROTATOR_CERT)
        return {"TMPDIR": str(tmp), **self.namespace_env}

    def webhook_configuration(self, webhook_port: int, ca_cert: Path) -> dict[str, Any]:
        bundle = base64.b64encode(ca_cert.read_bytes()).decode()
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            # Not upstream's name: its rotator would put its own CA in.
            "metadata": {"name": f"gangshare-dev-{self.name}"},
            "webhooks": [
                {
                    "name": hook.name,
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{webhook_port}{hook.path}",
                        "caBundle": bundle,
                    },
                    "rules": [
                        {
                            "apiGroups": [hook.group],
                            "apiVersions": [hook.version],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": [hook.resource],
                        }
                    ],
                }
                for hook in self.webhooks
            ],
        }


def _trainer_namespace() -> str:
    # Upstream's rule (pkg/util/cert): the pod's own namespace, else kubeflow-system.
    mounted = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    try:
        return mounted.read_text().strip() or "kubeflow-system"
    except OSError:
        return "kubeflow-system"


def _trainer_hook(kind: str, resource: str) -> Webhook:
    return Webhook(
        f"validator.{kind}.trainer.kubeflow.org",
        f"/validate-trainer-kubeflow-org-v1alpha1-{kind}",
        "trainer.kubeflow.org",
        "v1alpha1",
        resource,
    )


TRAINER = Controller(
    name="trainer-controller-manager",
    crds=tuple(
        f"trainer.kubeflow.org_{r}.yaml"
        for r in ("trainjobs", "trainingruntimes", "clustertrainingruntimes")
    ),
    crd_names=tuple(
        f"{r}.trainer.kubeflow.org"
        for r in ("trainjobs", "trainingruntimes", "clustertrainingruntimes")
    ),
    secret="kubeflow-trainer-webhook-cert",
    namespace=_trainer_namespace,
    namespace_env={},
    webhooks=(
        _trainer_hook("trainjob", "trainjobs"),
        _trainer_hook("trainingruntime", "trainingruntimes"),
        _trainer_hook("clustertrainingruntime", "clustertrainingruntimes"),
    ),
    flags=(),
    needs_jobset=True,
)

TRAINING_OPERATOR_NAMESPACE = "kubeflow"
TRAINING_OPERATOR = Controller(
    name="training-operator",
    # Only PyTorchJob's, the one scheme enabled (the cache holds every v1 kind's).
    crds=("kubeflow.org_pytorchjobs.yaml",),
    crd_names=("pytorchjobs.kubeflow.org",),
    secret="training-operator-webhook-cert",
    namespace=lambda: TRAINING_OPERATOR_NAMESPACE,
    namespace_env={"MY_POD_NAMESPACE": TRAINING_OPERATOR_NAMESPACE},
    webhooks=(
        Webhook(
            "validator.pytorchjob.training-operator.kubeflow.org",
            "/validate-kubeflow-org-v1-pytorchjob",
            "kubeflow.org",
            "v1",
            "pytorchjobs",
        ),
    ),
    # No --gang-scheduler-name: pods go to whichever scheduler their template names.
    flags=("--enable-scheme=pytorchjob",),
)

CONTROLLERS = (TRAINER, TRAINING_OPERATOR)


def install_crds(api_client: Any, bins: Path, controller: Controller) -> None:
    from kubernetes import client

    api = client.ApiextensionsV1Api(api_client)
    for path in controller.crd_paths(bins):
        api.create_custom_resource_definition(yaml.safe_load(path.read_text()))


def established(api_client: Any, controller: Controller) -> bool:
    from kubernetes import client

    api = client.ApiextensionsV1Api(api_client)
    for name in controller.crd_names:
        crd = api.read_custom_resource_definition(name)
        conditions = (crd.status.conditions if crd.status else None) or []
        if not any(c.type == "Established" and c.status == "True" for c in conditions):
            return False
    return True


def create_rotator_secret(api_client: Any, controller: Controller) -> None:
    """The namespace and empty Secret upstream's certificate rotator insists on."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api_client)
    namespace = controller.namespace()
    for create in (
        lambda: core.create_namespace(cast(Any, {"metadata": {"name": namespace}})),
        lambda: core.create_namespaced_secret(
            namespace, cast(Any, {"metadata": {"name": controller.secret}, "type": "Opaque"})
        ),
    ):
        try:
            create()
        except ApiException as err:
            if err.status != 409:  # already there: a second controller, or a restart
                raise


def install_webhooks(
    api_client: Any, controller: Controller, webhook_port: int, ca_cert: Path
) -> None:
    from kubernetes import client

    client.AdmissionregistrationV1Api(api_client).create_validating_webhook_configuration(
        cast(Any, controller.webhook_configuration(webhook_port, ca_cert))
    )
