"""Cluster spec files and the annotation codecs: round trips, and errors that name the field."""

import pytest

from gangshare.core import Cluster
from gangshare.core.annotations import (
    NODE_TOPOLOGY,
    NODE_UTILIZATION,
    RACK_LABEL,
    AnnotationError,
    decode_gpu_indices,
    decode_node,
    encode_gpu_indices,
    encode_topology,
    encode_utilization,
)
from gangshare.core.spec import SpecError, parse_cluster_spec
from gangshare.core.topology import islands_from_link_matrix

DGX = {
    "name": "dgx",
    "count": 3,
    "racks": ["r1", "r2"],
    "gpusPerNode": 8,
    "gpuMemoryMiB": 81559,
    "nvlinkIslands": [[0, 1, 2, 3], [4, 5, 6, 7]],
}


def test_pools_expand_to_named_nodes_round_robin_over_racks():
    nodes = parse_cluster_spec({"nodePools": [DGX, {"name": "t4", "gpusPerNode": 1}]})
    assert [(n.name, n.rack) for n in nodes] == [
        ("dgx-0", "r1"),
        ("dgx-1", "r2"),
        ("dgx-2", "r1"),
        ("t4-0", "rack-0"),
    ]
    assert nodes[0].islands == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert nodes[0].gpus[0].uuid != nodes[1].gpus[0].uuid
    cluster = Cluster(n.to_state() for n in nodes)
    assert cluster.count_with_free_at_least(8) == 3


@pytest.mark.parametrize(
    ("pool", "message"),
    [
        ({**DGX, "gpusPerNode": 0}, "nodePools[0].gpusPerNode: must be between 1 and 64, got 0"),
        ({**DGX, "count": "two"}, "nodePools[0].count: must be an integer"),
        ({**DGX, "nvlinkIslands": [[0, 9]]}, "nodePools[0].nvlinkIslands[0]: no GPU with index 9"),
        (
            {**DGX, "nvlinkIslands": [[0, 1], [1, 2]]},
            "nodePools[0].nvlinkIslands[1]: GPU 1 is already",
        ),
        ({**DGX, "linkMatrix": [[0]]}, "nodePools[0]: give nvlinkIslands or linkMatrix, not both"),
        ({"count": 1, "gpusPerNode": 1}, "nodePools[0].name: required"),
        ({**DGX, "racks": []}, "nodePools[0].racks: must be a non-empty list"),
    ],
)
def test_spec_errors_name_the_field(pool, message):
    with pytest.raises(SpecError) as err:
        parse_cluster_spec({"nodePools": [pool]})
    assert str(err.value).startswith(message)


def test_missing_pools_are_reported():
    with pytest.raises(SpecError, match=r"^nodePools: must be a non-empty list"):
        parse_cluster_spec({})


def test_link_matrix_becomes_islands():
    ring = [[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]]
    assert islands_from_link_matrix(ring) == ((0, 1), (2, 3))
    nodes = parse_cluster_spec({"nodePools": [{"name": "p", "gpusPerNode": 4, "linkMatrix": ring}]})
    assert nodes[0].islands == ((0, 1), (2, 3))


def test_node_annotations_round_trip():
    spec = parse_cluster_spec({"nodePools": [DGX]})[0]
    annotations = {
        NODE_TOPOLOGY: encode_topology(list(spec.gpus), spec.islands, 4),
        NODE_UTILIZATION: encode_utilization({0: (0.5, 1000), 3: (1.7, 2000)}, reported_at=1.0),
    }
    node = decode_node("dgx-0", {RACK_LABEL: "r1"}, annotations)
    assert node is not None
    assert node.rack == "r1" and node.islands == spec.islands
    assert [g.gpu for g in node.gpus] == list(spec.gpus)
    assert node.gpus[0].utilization == 0.5 and node.gpus[3].utilization == 1.0
    assert node.gpus[3].memory_used_mib == 2000


def test_nodes_without_topology_are_not_gpu_nodes():
    assert decode_node("cpu-0", {}, {}) is None


@pytest.mark.parametrize(
    ("annotations", "key"),
    [
        ({NODE_TOPOLOGY: "{not json"}, NODE_TOPOLOGY),
        ({NODE_TOPOLOGY: '{"gpus": [{"index": 0}]}'}, NODE_TOPOLOGY),
    ],
)
def test_bad_node_annotations_name_the_key(annotations, key):
    with pytest.raises(AnnotationError) as err:
        decode_node("n", {}, annotations)
    assert str(err.value).startswith(key)


def test_gpu_index_lists():
    assert decode_gpu_indices("k", encode_gpu_indices((0, 3, 5))) == (0, 3, 5)
    assert decode_gpu_indices("k", "") == ()
    for bad in ("a,b", "1,1", "-1"):
        with pytest.raises(AnnotationError, match=r"^k: "):
            decode_gpu_indices("k", bad)
