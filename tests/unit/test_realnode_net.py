"""The real node's pod network config, without a host to apply it to (tests/e2e runs it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gangshare.dev import realnode_net
from gangshare.dev.realnode_net import BRIDGE, POD_CIDR, NetError


def kubeconfig(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "clusters": [
                    {"name": "other", "cluster": {"server": "https://10.0.0.9:6443"}},
                    {"name": "dev", "cluster": {"server": server}},
                ],
                "contexts": [{"name": "ctx", "context": {"cluster": "dev", "user": "u"}}],
                "current-context": "ctx",
            }
        )
    )
    return path


def test_the_api_server_endpoint_is_the_current_contexts_loopback_address(tmp_path: Path):
    path = kubeconfig(tmp_path, "https://127.0.0.1:41234")
    assert realnode_net.apiserver_endpoint(path) == ("127.0.0.1", 41234)


@pytest.mark.parametrize("server", ["https://10.1.2.3:6443", "https://localhost:6443"])
def test_an_api_server_off_ipv4_loopback_is_refused(tmp_path: Path, server: str):
    with pytest.raises(NetError, match="not on IPv4 loopback"):
        realnode_net.apiserver_endpoint(kubeconfig(tmp_path, server))


def test_the_service_ip_is_the_first_address_of_the_service_range():
    assert realnode_net.service_ip() == "10.96.0.1"


def test_the_cni_config_keeps_addresses_under_the_node_and_leaves_forwarding_alone(
    tmp_path: Path,
):
    config = json.loads(realnode_net.cni_conflist(tmp_path / "ipam"))
    bridge = config["plugins"][0]
    assert [p["type"] for p in config["plugins"]] == ["bridge", "loopback"]
    assert (bridge["bridge"], bridge["isGateway"], bridge["ipMasq"]) == (BRIDGE, False, False)
    assert bridge["ipam"]["dataDir"] == str(tmp_path / "ipam")
    assert bridge["ipam"]["ranges"] == [[{"subnet": POD_CIDR, "gateway": "10.244.0.1"}]]
    assert len(BRIDGE) <= 15


def test_the_ruleset_dnats_only_the_kubernetes_service_from_the_bridge():
    rules = realnode_net.nft_ruleset(("127.0.0.1", 41234))
    assert (
        f'iifname "{BRIDGE}" ip daddr 10.96.0.1 tcp dport 443 dnat ip to 127.0.0.1:41234' in rules
    )
    assert rules.count("dnat ip to") == 1
    assert "delete table inet gangshare_realnode" in rules
