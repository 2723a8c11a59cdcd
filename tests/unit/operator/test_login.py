"""The operator's kopf login in a pod: the API server where the kubelet says it is."""

from __future__ import annotations

import kopf

from gangshare.operator.handlers import in_cluster_server

ACCOUNT = kopf.ConnectionInfo(
    server="https://kubernetes.default.svc",
    ca_path="/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
    token="t",
    default_namespace="gangshare-system",
)


def test_the_service_environment_names_the_server_not_cluster_dns():
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    info = in_cluster_server(ACCOUNT, env)
    assert info.server == "https://10.96.0.1:443"
    # Everything else is the service account's: its token, CA and namespace.
    assert (info.token, info.ca_path, info.default_namespace) == (
        "t",
        ACCOUNT.ca_path,
        "gangshare-system",
    )


def test_an_ipv6_service_address_is_bracketed():
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"}
    assert in_cluster_server(ACCOUNT, env).server == "https://[fd00::1]:6443"


def test_without_the_service_environment_kopfs_default_stays():
    assert in_cluster_server(ACCOUNT, {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}) == ACCOUNT
    assert in_cluster_server(ACCOUNT, {}) == ACCOUNT
