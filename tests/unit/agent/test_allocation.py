"""Device IDs and Allocate: answered from the device IDs the kubelet passes, nothing else."""

from __future__ import annotations

import pytest
from agent_fakes import make_spec

from gangshare.agent.allocation import allocate_container
from gangshare.agent.backend import GpuInfo, Inventory
from gangshare.agent.devices import DeviceError, DeviceMap, check_resource

GPU, SHARE = "nvidia.com/gpu", "gangshare.io/gpu-share"


def test_one_device_per_gpu_and_a_fixed_number_of_share_slots() -> None:
    devices = make_spec().gpus(2).devices(share_slots=3)
    uuids = [g.uuid for g in devices.inventory.gpus]
    assert devices.device_ids(GPU) == uuids
    assert devices.device_ids(SHARE) == [f"{u}::{s}" for u in uuids for s in range(3)]
    assert devices.gpu_of(SHARE, f"{uuids[1]}::2").index == 1


@pytest.mark.parametrize(
    ("resource", "device_id", "message"),
    [
        (GPU, "GPU-not-here", "nvidia.com/gpu: device ID 'GPU-not-here' was never offered"),
        (SHARE, "{u0}::7", "gangshare.io/gpu-share: device ID '{u0}::7' was never offered"),
        (SHARE, "{u0}", "gangshare.io/gpu-share: device ID '{u0}' was never offered"),
        (GPU, "{u0}::0", "nvidia.com/gpu: device ID '{u0}::0' was never offered"),
    ],
)
def test_a_device_id_the_agent_never_offered_is_refused_by_name(
    resource: str, device_id: str, message: str
) -> None:
    devices = make_spec().gpus(2).devices(share_slots=4)
    u0 = devices.inventory.gpus[0].uuid
    with pytest.raises(DeviceError) as caught:
        allocate_container(resource, devices, [device_id.format(u0=u0)], None)
    assert message.format(u0=u0) in str(caught.value)


def test_an_unknown_resource_is_refused_by_name() -> None:
    with pytest.raises(DeviceError, match=r"unknown resource 'example\.com/tpu'"):
        check_resource("example.com/tpu")


def test_whole_gpus_get_their_uuids_as_visible_devices_and_the_sdk_socket() -> None:
    devices = make_spec().gpus(4).devices()
    uuids = [g.uuid for g in devices.inventory.gpus]
    answer = allocate_container(GPU, devices, [uuids[3], uuids[1]], "/var/run/gangshare")
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == f"{uuids[1]},{uuids[3]}"
    assert answer.envs["GANGSHARE_NODE_GPUS"] == "1,3"
    assert answer.envs["GANGSHARE_AGENT_SOCKET"] == "/var/run/gangshare/agent.sock"
    assert answer.mounts == [("/var/run/gangshare", "/var/run/gangshare", True)]
    assert "GANGSHARE_MEMORY_CAP_MIB" not in answer.envs
    assert answer.devices == []  # the fake has no device files


def test_share_slots_get_default_caps_by_slot() -> None:
    devices = make_spec().gpus(2, memory_mib=40000).devices(share_slots=4)
    u = [g.uuid for g in devices.inventory.gpus]
    answer = allocate_container(SHARE, devices, [f"{u[0]}::2", f"{u[1]}::0"], None)
    assert answer.envs["NVIDIA_VISIBLE_DEVICES"] == f"{u[0]},{u[1]}"
    assert answer.envs["GANGSHARE_MEMORY_CAP_MIB"] == "10000"
    assert answer.envs["GANGSHARE_SM_CAP"] == "0.2500"
    assert answer.mounts == []


def test_a_real_node_passes_the_gpus_device_files_and_the_control_devices() -> None:
    inventory = Inventory(
        (
            GpuInfo(0, "GPU-a", "H100", 80000, ("/dev/nvidia0",)),
            GpuInfo(1, "GPU-b", "H100", 80000, ("/dev/nvidia1",)),
        ),
        ((0, 1), (1, 0)),
        ("/dev/nvidiactl", "/dev/nvidia-uvm"),
    )
    answer = allocate_container(GPU, DeviceMap(inventory, 4), ["GPU-b"], None)
    assert [host for _, host, _ in answer.devices] == [
        "/dev/nvidia1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
    ]


def test_share_slots_must_be_positive() -> None:
    with pytest.raises(DeviceError, match="share slots: must be at least 1"):
        make_spec().gpus(1).devices(share_slots=0)


def test_on_an_mps_node_share_slots_get_the_slots_threads_and_memory() -> None:
    inventory = Inventory(
        (GpuInfo(0, "GPU-a", "M", 16384), GpuInfo(1, "GPU-b", "M", 16384)), ((0, 0), (0, 0))
    )
    devices = DeviceMap(inventory, 4)
    share = allocate_container(SHARE, devices, ["GPU-b::1", "GPU-a::0"], None, "/tmp/nvidia-mps")
    assert share.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/var/run/nvidia-mps"
    assert share.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert share.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M,1=4096M"
    # Read-only: clients connect, no tenant replaces or removes the shared pipes.
    assert ("/var/run/nvidia-mps", "/tmp/nvidia-mps", True) in share.mounts
    whole = allocate_container(GPU, devices, ["GPU-a"], None, "/tmp/nvidia-mps")
    assert whole.envs["CUDA_MPS_PIPE_DIRECTORY"] == "/var/run/nvidia-mps"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in whole.envs
    without = allocate_container(SHARE, devices, ["GPU-a::0"], None)
    assert not any(k.startswith("CUDA_MPS") for k in without.envs)
