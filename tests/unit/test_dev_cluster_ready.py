"""The local control plane counts a node up only once every scheduler would place on it."""

import json
from types import SimpleNamespace

from gangshare.dev.cluster import LocalCluster


def node(name, ready, taints=()):
    return {
        "metadata": {"name": name},
        "spec": {"taints": [{"key": k, "effect": "NoSchedule"} for k in taints]},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


class Nodes:
    def __init__(self, items):
        self.items = items

    def list_node(self, _preload_content=True):
        return SimpleNamespace(data=json.dumps({"items": self.items}).encode())


def test_a_ready_node_still_tainted_not_ready_is_not_counted():
    api = Nodes(
        [
            node("up", True),
            node("tainted", True, ["node.kubernetes.io/not-ready"]),
            node("down", False),
            node("cordoned-by-its-owner", True, ["example.com/dedicated"]),
        ]
    )
    # The owner's own taint is the workload's business, not the control plane's readiness.
    assert LocalCluster._ready_nodes(api) == 2
