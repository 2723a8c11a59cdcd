"""The fake GPU backend: the same interface as NVML, from the dev cluster's spec format."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from agent_fakes import fake_backend, make_spec

from gangshare.agent.backend import BackendError, GpuProcess, GpuSample, HealthEvent
from gangshare.agent.fake_nvml import load_fake_node


def test_inventory_and_islands_come_from_the_cluster_spec(tmp_path: Path) -> None:
    spec = make_spec().gpus(8, memory_mib=40960).islands([0, 1, 2, 3], [4, 5])
    backend, _ = fake_backend(spec, tmp_path / "gpus.yaml")
    inventory = backend.inventory()
    assert [g.index for g in inventory.gpus] == list(range(8))
    assert {g.memory_mib for g in inventory.gpus} == {40960}
    assert len({g.uuid for g in inventory.gpus}) == 8
    assert inventory.links[0][3] == 1 and inventory.links[0][4] == 0
    assert inventory.islands() == ((0, 1, 2, 3), (4, 5), (6,), (7,))


def test_utilization_and_processes_follow_their_timeline(tmp_path: Path) -> None:
    spec = (
        make_spec()
        .gpus(2)
        .utilization(0, gpu0=(0.2, 1000))
        .utilization(10, gpu0=(0.9, 5000), gpu1=(0.5, 100))
        .process(gpu=1, pid=4242, memory_mib=512, at=5, until=20)
    )
    backend, clock = fake_backend(spec, tmp_path / "gpus.yaml")
    assert backend.samples() == [GpuSample(0, 0.2, 1000), GpuSample(1, 0.0, 0)]
    assert backend.processes() == []
    clock.now += 12
    assert backend.samples() == [GpuSample(0, 0.9, 5000), GpuSample(1, 0.5, 100)]
    assert backend.processes() == [GpuProcess(1, 4242, 512)]
    clock.now += 10
    assert backend.processes() == []


def test_a_failure_is_reported_once_when_its_time_comes(tmp_path: Path) -> None:
    spec = make_spec().gpus(4).failure(gpu=2, at=5, xid=79).failure(gpu=3, at=7, lost=True)
    backend, _ = fake_backend(spec, tmp_path / "gpus.yaml")
    assert backend.health_events(1.0) == []
    assert backend.health_events(5.0) == [HealthEvent(2, "XID 79")]
    assert backend.health_events(5.0) == [HealthEvent(3, "GPU is lost")]
    assert backend.health_events(1.0) == []


def test_a_rewritten_spec_injects_a_failure_into_a_running_backend(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    backend, _ = fake_backend(make_spec().gpus(2), path)
    assert backend.health_events(0) == []
    make_spec().gpus(2).failure(gpu=1, xid=48).write(path)
    os.utime(path, ns=(1, os.stat(path).st_mtime_ns + 10**9))
    assert backend.health_events(0) == [HealthEvent(1, "XID 48")]


def test_a_broken_rewrite_keeps_the_last_good_spec(tmp_path: Path) -> None:
    path = tmp_path / "gpus.yaml"
    backend, _ = fake_backend(make_spec().gpus(2).utilization(0, gpu1=(0.5, 10)), path)
    path.write_text("nodePools: [")
    os.utime(path, ns=(1, os.stat(path).st_mtime_ns + 10**9))
    assert backend.samples()[1] == GpuSample(1, 0.5, 10)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nodePools: [", "not valid YAML"),
        ("nodePools: []", "nodePools: must be a non-empty list"),
        (
            "nodePools: [{name: real, gpusPerNode: many}]",
            "nodePools[0].gpusPerNode: must be an integer",
        ),
        (
            "nodePools: [{name: real, gpusPerNode: 2, fake: {failures: [{gpu: 5, xid: 79}]}}]",
            "nodePools[0].fake.failures[0].gpu: no GPU 5 on a node with 2 GPUs",
        ),
        (
            "nodePools: [{name: real, gpusPerNode: 2, fake: {failures: [{gpu: 0, xid: 13}]}}]",
            "nodePools[0].fake.failures[0].xid: XID 13 is an application error",
        ),
        (
            "nodePools: [{name: r, gpusPerNode: 2, fake: {utilization: [{gpus: {0: {sm: 3}}}]}}]",
            "nodePools[0].fake.utilization[0].gpus.0.sm: must be between 0 and 1",
        ),
        (
            "nodePools: [{name: r, gpusPerNode: 2, fake: {processes: [{gpu: 0, pid: 7, sm: 2}]}}]",
            "nodePools[0].fake.processes[0].sm: must be between 0 and 1",
        ),
        (
            "nodePools: [{name: r, gpusPerNode: 2, fake: {processes: [{gpu: 0, pid: 7, mps: 1}]}}]",
            "nodePools[0].fake.processes[0].mps: must be true or false",
        ),
        (
            "nodePools: [{name: real, gpusPerNode: 2, fake: {procs: []}}]",
            "nodePools[0].fake.procs: unknown field",
        ),
        (
            "nodePools: [{name: a, count: 2, gpusPerNode: 2}]",
            "no node named real-0 (the spec has a-0, a-1)",
        ),
    ],
)
def test_a_malformed_spec_is_an_error_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(BackendError, match=r"^fake spec: ") as caught:
        load_fake_node(text, "real-0")
    assert message in str(caught.value)


def test_an_unreadable_spec_file_is_a_clear_error(tmp_path: Path) -> None:
    from gangshare.agent.fake_nvml import FakeBackend

    with pytest.raises(BackendError, match=r"gone\.yaml: cannot read"):
        FakeBackend(tmp_path / "gone.yaml", "real-0")
