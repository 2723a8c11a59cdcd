"""One agent pass, with stand-ins for the API server and PodResources (the e2e tests run it
against the real ones): what it writes, what it asks, and when it stays quiet."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent_fakes import fake_backend, make_spec, pod

from gangshare.agent.agent import RECHECK_SECONDS, Agent, AgentConfig
from gangshare.agent.podresources import PodDevices

GPU = "nvidia.com/gpu"


class Api:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.node: dict[str, Any] = {"metadata": {"labels": {}, "annotations": {}}}
        self.lists = 0
        self.patches: list[dict[str, Any]] = []
        self.recorded: list[tuple[str, str]] = []
        self.events: list[tuple[str, str, str]] = []

    def read_node(self) -> dict[str, Any]:
        return self.node

    def patch_node(self, patch: dict[str, Any]) -> None:
        self.patches.append(patch)
        for key, values in patch["metadata"].items():
            self.node["metadata"][key].update(values)

    def pods_on_node(self, timeout: Any = None) -> list[dict[str, Any]]:
        self.lists += 1
        return self.pods

    def record_assignment(self, namespace: str, name: str, uid: str, indices: str) -> bool:
        self.recorded.append((name, indices))
        for p in self.pods:
            if p["metadata"]["name"] == name:
                p["metadata"]["annotations"]["gangshare.io/assigned-gpus"] = indices
        return True

    def pod_event(self, namespace: str, name: str, uid: str, kind: str, reason: str, msg: str):
        self.events.append((name, reason, msg))


class PodResources:
    def __init__(self) -> None:
        self.held: dict[tuple[str, str], PodDevices] = {}

    def list(self) -> dict[tuple[str, str], PodDevices]:
        return dict(self.held)


def _agent(tmp_path: Path, api: Api, kubelet: PodResources) -> tuple[Agent, list[float]]:
    backend, _ = fake_backend(make_spec().gpus(4).islands([0, 1], [2, 3]), tmp_path / "g.yaml")
    now = [1000.0]
    config = AgentConfig("real-0", tmp_path / "dp", None, 4, 10.0)
    agent = Agent(config, backend, api, kubelet, clock=lambda: now[0])
    agent.plugins = []  # no kubelet to register with here; tests/unit/agent/test_plugin_grpc.py
    return agent, now


def test_a_pass_publishes_the_node_and_writes_what_the_kubelet_assigned(tmp_path: Path) -> None:
    api, kubelet = Api([pod("w", GPU, 2, planned="0,1", phase="Running")]), PodResources()
    agent, now = _agent(tmp_path, api, kubelet)
    agent.step()
    assert "gangshare.io/gpu-topology" in api.node["metadata"]["annotations"]
    assert api.lists == 0  # the kubelet holds nothing yet: no reason to list pods
    uuids = agent.devices.device_ids(GPU)
    kubelet.held[("ns", "w")] = PodDevices("ns", "w", {GPU: (uuids[2], uuids[3])})
    agent.step()
    assert api.recorded == [("w", "2,3")]
    [(name, reason, message)] = api.events
    assert (name, reason) == ("w", "GpuAssignmentDiffersFromPlan")
    assert "the kubelet assigned GPUs 2,3; the plan recorded 0,1" in message
    # Confirmed: later passes neither list pods nor write again, until the periodic re-check.
    lists = api.lists
    now[0] += 5
    agent.step()
    assert api.lists == lists and api.recorded == [("w", "2,3")]
    now[0] += RECHECK_SECONDS
    agent.step()
    assert api.lists == lists + 1 and api.recorded == [("w", "2,3")]


def test_a_topology_someone_removed_is_published_again(tmp_path: Path) -> None:
    api = Api([])
    agent, now = _agent(tmp_path, api, PodResources())
    agent.step()
    topology = api.node["metadata"]["annotations"].pop("gangshare.io/gpu-topology")
    now[0] += 5
    agent.step()
    assert "gangshare.io/gpu-topology" not in api.node["metadata"]["annotations"]
    now[0] += RECHECK_SECONDS
    agent.step()
    assert api.node["metadata"]["annotations"]["gangshare.io/gpu-topology"] == topology


def test_a_reused_name_is_written_again_once_the_kubelet_checkpoints_the_new_pod(
    tmp_path: Path,
) -> None:
    """The name and even the devices can repeat across attempts; the pod UID cannot."""
    api, kubelet = Api([pod("w", GPU, 2, phase="Running")]), PodResources()
    agent, now = _agent(tmp_path, api, kubelet)
    uuids = agent.devices.device_ids(GPU)
    checkpoint = tmp_path / "dp" / "kubelet_internal_checkpoint"
    checkpoint.parent.mkdir(parents=True, exist_ok=True)

    def allocate(uid: str) -> None:
        entry = {"PodUID": uid, "ContainerName": "c", "ResourceName": GPU}
        entry["DeviceIDs"] = {"-1": [uuids[0], uuids[1]]}  # type: ignore[assignment]
        doc = {"Data": {"PodDeviceEntries": [entry], "RegisteredDevices": {}}, "Checksum": 0}
        checkpoint.write_text(json.dumps(doc))

    allocate("uid-w")
    kubelet.held[("ns", "w")] = PodDevices("ns", "w", {GPU: (uuids[0], uuids[1])})
    agent.step()
    assert api.recorded == [("w", "0,1")]
    # The next attempt's worker: same name, same GPUs, a new UID and no annotation yet.
    api.pods = [pod("w", GPU, 2, phase="Running")]
    api.pods[0]["metadata"]["uid"] = "uid-w2"
    now[0] += 5
    agent.step()
    assert api.recorded == [("w", "0,1")]  # the kubelet has not allocated for uid-w2 yet
    allocate("uid-w2")
    now[0] += 5
    agent.step()
    assert api.recorded == [("w", "0,1"), ("w", "0,1")]
