"""JobSet's controller in the local control plane, as its own chart would run it in a cluster.

scripts/build-k8s.sh builds `jobset-controller` from sigs.k8s.io/jobset and copies its CRD
from the module into the cache (`manifests/`). Here it runs on loopback with the cluster's
admin credentials, its webhook server serving the API server's own certificate (issued for
127.0.0.1 by the cluster's CA), and the API server calls JobSet's defaulting and validating
webhooks by URL. JobSet's pod webhooks (exclusive placement) are not registered: every pod of
the cluster would then wait on this process.
"""

from __future__ import annotations

import base64
import shutil
from pathlib import Path
from typing import Any, cast

import yaml

CRD_FILE = "jobset.x-k8s.io_jobsets.yaml"
BINARY = "jobset-controller"


def crd_path(bins: Path) -> Path:
    return bins.parent / "manifests" / CRD_FILE


def available(bins: Path) -> bool:
    return (bins / BINARY).exists() and crd_path(bins).exists()


def write_config(root: Path, webhook_port: int, health_port: int, cert: Path, key: Path) -> Path:
    """The controller's Configuration and its webhook certificate folder, under `root`."""
    certs = root / "jobset-certs"
    certs.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(cert, certs / "tls.crt")
    shutil.copyfile(key, certs / "tls.key")
    config = {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(certs)},
        # "0" turns its metrics server off (it would want certificates of its own).
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "clientConnection": {"qps": 200, "burst": 400},
    }
    path = root / "jobset-config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def argv(bins: Path, config: Path, kubeconfig: Path) -> list[str]:
    return [str(bins / BINARY), f"--config={config}", f"--kubeconfig={kubeconfig}"]


def webhook_configurations(webhook_port: int, ca_cert: Path) -> list[dict[str, Any]]:
    """JobSet's own webhooks on jobsets (defaulting on create, validation on create and
    update), called by URL on loopback."""
    bundle = base64.b64encode(ca_cert.read_bytes()).decode()

    def hook(name: str, path: str, operations: list[str]) -> dict[str, Any]:
        return {
            "name": name,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "clientConfig": {
                "url": f"https://127.0.0.1:{webhook_port}{path}",
                "caBundle": bundle,
            },
            "rules": [
                {
                    "apiGroups": ["jobset.x-k8s.io"],
                    "apiVersions": ["v1alpha2"],
                    "operations": operations,
                    "resources": ["jobsets"],
                }
            ],
        }

    return [
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "jobset-mutating"},
            "webhooks": [
                hook("mjobset.kb.io", "/mutate-jobset-x-k8s-io-v1alpha2-jobset", ["CREATE"])
            ],
        },
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "jobset-validating"},
            "webhooks": [
                hook(
                    "vjobset.kb.io",
                    "/validate-jobset-x-k8s-io-v1alpha2-jobset",
                    ["CREATE", "UPDATE"],
                )
            ],
        },
    ]


def install_crd(api_client: Any, bins: Path) -> None:
    from kubernetes import client

    crd = yaml.safe_load(crd_path(bins).read_text())
    client.ApiextensionsV1Api(api_client).create_custom_resource_definition(crd)


def install_webhooks(api_client: Any, webhook_port: int, ca_cert: Path) -> None:
    from kubernetes import client

    admission = client.AdmissionregistrationV1Api(api_client)
    mutating, validating = webhook_configurations(webhook_port, ca_cert)
    # Plain dicts: the client serializes them as they are.
    admission.create_mutating_webhook_configuration(cast(Any, mutating))
    admission.create_validating_webhook_configuration(cast(Any, validating))


def established(api_client: Any) -> bool:
    from kubernetes import client

    crd = client.ApiextensionsV1Api(api_client).read_custom_resource_definition(
        "jobsets.jobset.x-k8s.io"
    )
    conditions = (crd.status.conditions if crd.status else None) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)
