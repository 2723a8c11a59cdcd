"""Parts of the Helm chart, rendered by the real helm and applied to the session cluster as a
release would install them, for tests of the chart's admission policies and RBAC."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from kube import Kube

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "gangshare"


def render(kube: Kube, release: str, namespace: str, templates: list[str], *sets: str) -> str:
    """`helm template` of the chart's templates/<name> files, with `--set` values."""
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, **{f"HELM_{k}_HOME": f"{home}/{k}" for k in ("CACHE", "CONFIG")}}
        argv = [str(kube.bins / "helm"), "template", release, str(CHART), "-n", namespace]
        argv += [f"--show-only=templates/{name}" for name in templates]
        argv += [f"--set={value}" for value in sets]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def kubectl(kube: Kube, *args: str, stdin: str) -> None:
    done = subprocess.run(
        kube.kubectl(*args), input=stdin, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def apply(kube: Kube, manifests: str) -> None:
    kubectl(kube, "apply", "-f", "-", stdin=manifests)


def delete(kube: Kube, manifests: str) -> None:
    kubectl(kube, "delete", "--ignore-not-found", "--wait=false", "-f", "-", stdin=manifests)


def policies(manifests: str) -> list[dict[str, Any]]:
    return [
        d for d in yaml.safe_load_all(manifests) if d and d["kind"] == "ValidatingAdmissionPolicy"
    ]


def token_client(kube: Kube, token: str) -> client.ApiClient:
    """An API client that authenticates with this bearer token alone."""
    kubeconfig = yaml.safe_load(Path(kube.state.kubeconfig).read_text())
    for user in kubeconfig["users"]:
        user["user"] = {"token": token}
    return config.new_client_from_config_dict(kubeconfig)


def service_account_token(
    kube: Kube, namespace: str, account: str, pod: client.V1Pod | None = None
) -> str:
    """A TokenRequest token, bound to the pod when one is given (the API server then names the
    pod's node in the token, as in the kubelet's projected tokens)."""
    bound = (
        client.V1BoundObjectReference(
            api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid
        )
        if pod is not None
        else None
    )
    spec = client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600, bound_object_ref=bound)
    answer = kube.core.create_namespaced_service_account_token(
        account, namespace, client.AuthenticationV1TokenRequest(spec=spec)
    )
    return str(answer.status.token)
