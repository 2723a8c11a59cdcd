"""Node manifests for simulated GPU nodes, with the topology contract the agent publishes."""

from __future__ import annotations

from typing import Any

from gangshare.core.annotations import (
    GPU_COUNT_LABEL,
    GPU_NODE_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    NODE_TOPOLOGY,
    RACK_LABEL,
    SHARE_RESOURCE,
    encode_topology,
)
from gangshare.core.spec import NodeSpec, parse_cluster_spec

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"
MAX_PODS = "110"


def node_manifest(spec: NodeSpec) -> dict[str, Any]:
    gpus = len(spec.gpus)
    resources = {
        "cpu": spec.cpu,
        "memory": spec.memory,
        "pods": MAX_PODS,
        GPU_RESOURCE: str(gpus),
        SHARE_RESOURCE: str(gpus * spec.share_slots),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": {
                "kubernetes.io/hostname": spec.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                RACK_LABEL: spec.rack,
                GPU_NODE_LABEL: "true",
                GPU_PRODUCT_LABEL: spec.gpus[0].model if spec.gpus else "",
                GPU_COUNT_LABEL: str(gpus),
                **spec.labels,
            },
            "annotations": {
                KWOK_NODE_ANNOTATION: KWOK_NODE_VALUE,
                NODE_TOPOLOGY: encode_topology(list(spec.gpus), spec.islands, spec.share_slots),
            },
        },
        "spec": {},
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def ready_node_objects(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Node objects for a cluster spec as the API server shows them once Ready (tests, bench)."""
    result = []
    for node in parse_cluster_spec(doc):
        manifest = node_manifest(node)
        manifest["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        result.append(manifest)
    return result
