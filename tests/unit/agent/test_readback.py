"""The truth read back from PodResources, and what the agent publishes on its Node."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from agent_fakes import make_spec, pod

from gangshare.agent.assignments import detect_assignments
from gangshare.agent.backend import GpuSample
from gangshare.agent.checkpoint import CheckpointError, parse_device_checkpoint
from gangshare.agent.podresources import PodDevices, allocated_devices, devices_by_pod
from gangshare.agent.publish import UtilizationGate, topology_patch
from gangshare.core.annotations import NODE_TOPOLOGY, NODE_UTILIZATION, decode_node

GPU, SHARE = "nvidia.com/gpu", "gangshare.io/gpu-share"


def _container(name: str, *devices: tuple[str, list[str]]) -> SimpleNamespace:
    return SimpleNamespace(
        name=name,
        devices=[SimpleNamespace(resource_name=r, device_ids=ids) for r, ids in devices],
    )


def test_podresources_are_read_per_pod_for_gangshares_resources_only() -> None:
    listed = [
        SimpleNamespace(
            namespace="ns",
            name="a",
            containers=[
                _container("init", (GPU, ["GPU-1"])),
                _container("main", (GPU, ["GPU-2"]), ("example.com/nic", ["nic0"])),
            ],
        ),
        SimpleNamespace(namespace="ns", name="cpu-only", containers=[_container("c")]),
    ]
    pods = devices_by_pod(listed)
    assert pods == {("ns", "a"): PodDevices("ns", "a", {GPU: ("GPU-1", "GPU-2")})}
    assert allocated_devices(pods.values()) == {GPU: ["GPU-1", "GPU-2"]}


def test_the_kubelets_assignment_is_written_and_a_difference_from_the_plan_is_named() -> None:
    devices = make_spec().gpus(4).devices(share_slots=2)
    u = [g.uuid for g in devices.inventory.gpus]
    kubelet = {
        ("ns", "as-planned"): PodDevices("ns", "as-planned", {GPU: (u[1], u[0])}),
        ("ns", "moved"): PodDevices("ns", "moved", {GPU: (u[2], u[3])}),
        ("ns", "share"): PodDevices("ns", "share", {SHARE: (f"{u[3]}::1",)}),
        ("ns", "done"): PodDevices("ns", "done", {GPU: (u[0],)}),
        ("ns", "bogus"): PodDevices("ns", "bogus", {GPU: ("GPU-gone",)}),
    }
    pods = [
        pod("as-planned", GPU, 2, planned="0,1", phase="Running"),
        pod("moved", GPU, 2, planned="0,1", phase="Running"),
        pod("share", SHARE, 1, phase="Running"),
        pod("done", GPU, 1, assigned="0", phase="Running"),
        pod("bogus", GPU, 1, phase="Running"),
        pod("not-admitted", GPU, 1),
    ]
    changes = {c.name: c for c in detect_assignments(devices, kubelet, pods, None)}
    assert set(changes) == {"as-planned", "moved", "share"}
    assert changes["as-planned"].indices == (0, 1) and not changes["as-planned"].differs_from_plan
    assert changes["moved"].indices == (2, 3) and changes["moved"].differs_from_plan
    assert (
        changes["moved"]
        .event_message()
        .startswith("the kubelet assigned GPUs 2,3; the plan recorded 0,1")
    )
    assert changes["share"].indices == (3,) and changes["share"].planned is None


def _checkpoint(*entries: tuple[str, str, str, list[str]]) -> str:
    """The kubelet's device checkpoint as kubelet 1.35 writes it (DeviceIDs per NUMA node)."""
    return json.dumps(
        {
            "Data": {
                "PodDeviceEntries": [
                    {
                        "PodUID": uid,
                        "ContainerName": container,
                        "ResourceName": resource,
                        "DeviceIDs": {"-1": ids},
                        "AllocResp": "",
                    }
                    for uid, container, resource, ids in entries
                ],
                "RegisteredDevices": {},
            },
            "Checksum": 1,
        }
    )


def test_the_checkpoint_is_read_per_pod_uid_for_gangshares_resources_only() -> None:
    raw = _checkpoint(
        ("u1", "sidecar", GPU, ["GPU-a"]),
        ("u1", "main", GPU, ["GPU-b"]),
        ("u1", "main", "example.com/nic", ["nic0"]),
        ("u2", "main", SHARE, ["GPU-c::1"]),
    )
    assert parse_device_checkpoint(raw) == {
        "u1": {GPU: frozenset({"GPU-a", "GPU-b"})},
        "u2": {SHARE: frozenset({"GPU-c::1"})},
    }
    legacy = json.loads(raw)
    legacy["Data"]["PodDeviceEntries"][0]["DeviceIDs"] = ["GPU-a"]  # kubelets before 1.20
    assert parse_device_checkpoint(json.dumps(legacy))["u1"][GPU] == {"GPU-a", "GPU-b"}
    with pytest.raises(CheckpointError, match="not a device manager checkpoint"):
        parse_device_checkpoint('{"Data": 3}')


def test_a_new_pod_of_a_reused_name_is_never_recorded_with_its_predecessors_gpus() -> None:
    devices = make_spec().gpus(4).devices()
    u = [g.uuid for g in devices.inventory.gpus]
    # The new attempt's worker (uid-w) exists in the API server while PodResources still lists
    # the old one under the same name, on GPUs 0 and 1.
    kubelet = {("ns", "w"): PodDevices("ns", "w", {GPU: (u[0], u[1])})}
    new = pod("w", GPU, 2, planned="2,3")
    old_only = parse_device_checkpoint(_checkpoint(("uid-old", "c", GPU, [u[0], u[1]])))
    assert detect_assignments(devices, kubelet, [new], old_only) == []
    # By name alone (no checkpoint) the old GPUs would be written on the new pod.
    assert [c.indices for c in detect_assignments(devices, kubelet, [new], None)] == [(0, 1)]
    # Once the kubelet has allocated for the new UID and lists it, its own GPUs are written.
    both = parse_device_checkpoint(
        _checkpoint(("uid-old", "c", GPU, [u[0], u[1]]), ("uid-w", "c", GPU, [u[2], u[3]]))
    )
    assert detect_assignments(devices, kubelet, [new], both) == []  # the listing is still old
    kubelet = {("ns", "w"): PodDevices("ns", "w", {GPU: (u[3], u[2])})}
    [change] = detect_assignments(devices, kubelet, [new], both)
    assert (change.uid, change.indices, change.differs_from_plan) == ("uid-w", (2, 3), False)


def test_the_topology_is_patched_only_when_the_node_says_something_else() -> None:
    inventory = make_spec().gpus(4).islands([0, 1], [2, 3]).devices().inventory
    patch = topology_patch(inventory, frozenset({2}), 4, {}, {})
    assert patch is not None
    labels, annotations = patch["metadata"]["labels"], patch["metadata"]["annotations"]
    assert labels["nvidia.com/gpu.count"] == "4" and labels["gangshare.io/gpu-node"] == "true"
    node = decode_node("real-0", labels, annotations)
    assert node is not None and node.islands == ((0, 1), (2, 3))
    assert [g.gpu.healthy for g in node.gpus] == [True, True, False, True]
    assert topology_patch(inventory, frozenset({2}), 4, labels, annotations) is None
    again = topology_patch(inventory, frozenset(), 4, labels, annotations)
    assert again is not None and set(again["metadata"]) == {"annotations"}
    assert NODE_TOPOLOGY in again["metadata"]["annotations"]


def test_utilization_is_rate_limited_and_sent_only_when_it_moved_or_grew_old() -> None:
    gate = UtilizationGate(interval=10)
    first = gate.patch_if_due(1000, [GpuSample(0, 0.5, 1000)])
    assert first is not None
    doc = json.loads(first["metadata"]["annotations"][NODE_UTILIZATION])
    assert doc["gpus"]["0"] == {"sm": 0.5, "memoryUsedMiB": 1000}
    assert gate.patch_if_due(1005, [GpuSample(0, 0.9, 1000)]) is None  # too soon
    assert gate.patch_if_due(1011, [GpuSample(0, 0.52, 1100)]) is None  # within the noise
    assert gate.patch_if_due(1012, [GpuSample(0, 0.9, 1100)]) is not None  # moved
    assert gate.patch_if_due(1030, [GpuSample(0, 0.9, 1100)]) is None
    assert gate.patch_if_due(1072, [GpuSample(0, 0.9, 1100)]) is not None  # grew old
