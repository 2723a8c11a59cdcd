"""AntMan's local coordinator on a real kubelet: a Guaranteed and an Opportunistic TrainingJob
share one GPU, the SDK inside both containers reports steps over the socket Allocate mounted,
the coordinator's caps reach the Opportunistic container, and a GPU memory overrun evicts it,
requeues the job with its progress, and the job later Succeeds from where it was.

The GPU is the fake NVML backend's (no GPU here); the containers run real Python with
`gangshare.sdk` (image gangshare-sdk-test:1, built from this machine's interpreter), and the
process NVML reports for the overrun is the Opportunistic container's real host PID.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from agent_process import (
    AgentProcess,
    allow_privileged_templates,
    real_node_job,
)

from gangshare.agent.cgroups import pids_by_pod
from gangshare.core.annotations import POD_GPU_CAPS
from gangshare.dev.realnode import RealNode
from gangshare.dev.realnode_pyimage import PY_IMAGE
from kube import Kube, OperatorProcess, eventually

pytestmark = pytest.mark.e2e

MODEL = "Fake-GPU-16GB"
GROUP, VERSION, PLURAL = "gangshare.io", "v1alpha1", "trainingjobs"
# A training loop: every mini-batch inside sdk.step(), every cap change printed.
TRAIN = """
import sys, time
import gangshare.sdk as sdk
steps, pause = int(sys.argv[1]), float(sys.argv[2])
sdk.on_caps(lambda c: print(f"caps duty={c.duty} memory={c.memory_mib} agent={c.connected}",
                            flush=True))
start = sdk.resume_step()
print(f"resume={start}", flush=True)
for i in range(start, steps):
    with sdk.step(sync=False):
        time.sleep(pause)
    if i % 50 == 0:
        print(f"step={i}", flush=True)
print("done", flush=True)
"""


def spec(processes: list[dict[str, Any]] | None = None) -> str:
    pool: dict[str, Any] = {
        "name": "real",
        "gpusPerNode": 1,
        "gpuModel": MODEL,
        "gpuMemoryMiB": 16384,
        "fake": {"utilization": [{"at": 0, "gpus": {0: {"sm": 0.5, "memoryUsedMiB": 1024}}}]},
    }
    if processes:
        pool["fake"]["processes"] = processes
    return yaml.safe_dump({"nodePools": [pool]})


def training_job(name: str, service_class: str, steps: int, pause: float) -> dict[str, Any]:
    command = ["python3", "-c", TRAIN, str(steps), str(pause)]
    return real_node_job(name, service_class, MODEL, PY_IMAGE, command)


def job(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    return found


def test_guaranteed_and_opportunistic_share_a_gpu_under_the_coordinator(
    crd: Kube, real_node: RealNode, one_gpu_agent: AgentProcess, namespace: str, tmp_path: Path
):
    kube = crd
    allow_privileged_templates(kube, namespace)
    operator = OperatorProcess(kube, tmp_path).start()
    try:
        create = kube.custom.create_namespaced_custom_object
        create(GROUP, VERSION, namespace, PLURAL, training_job("g", "Guaranteed", 100000, 0.05))
        eventually(
            lambda: "step=0" in real_node.container_log(namespace, "g-worker-0", "main"),
            timeout=90,
            what="the guaranteed job stepping",
        )
        create(GROUP, VERSION, namespace, PLURAL, training_job("o", "Opportunistic", 1500, 0.02))
        pod = "o-worker-0"

        def grown() -> list[float] | None:
            log = real_node.container_log(namespace, pod, "main")
            duties = [
                float(line.split("duty=")[1].split()[0])
                for line in log.splitlines()
                if line.startswith("caps duty=")
            ]
            return duties if duties and duties[-1] == 1.0 else None

        # Beside a baseline measured alone, the neighbour starts low and grows to full duty,
        # since the guaranteed job's (sleeping) steps never slow down.
        duties = eventually(grown, timeout=90, what="the opportunistic caps grown to duty 1")
        # First the share slot's static default from Allocate (1 of 4 slots), then the
        # coordinator's: low, and only ever up.
        assert duties[0] == 0.25, duties
        assert duties[1] < 0.25 and duties[1:] == sorted(duties[1:]), duties
        assert "OpportunisticThrottled" not in one_gpu_agent.logs()
        caps = json.loads(
            kube.core.read_namespaced_pod(pod, namespace).metadata.annotations[POD_GPU_CAPS]
        )
        assert caps["duty"] == 1.0
        # The guaranteed job holds no cap: the annotation is on the opportunistic pod only.
        g_pod = kube.core.read_namespaced_pod("g-worker-0", namespace)
        assert POD_GPU_CAPS not in (g_pod.metadata.annotations or {})

        # NVML now reports the opportunistic container's process holding all of the GPU.
        uid = kube.core.read_namespaced_pod(pod, namespace).metadata.uid
        pids = pids_by_pod().get(uid)
        assert pids, f"no host process of pod {uid}"
        one_gpu_agent.rewrite_spec(spec([{"gpu": 0, "pid": max(pids), "memoryMiB": 16000}]))

        def requeued() -> dict[str, Any] | None:
            status = job(kube, namespace, "o").get("status") or {}
            return status if status.get("evictions") else None

        status = eventually(requeued, timeout=60, what="the opportunistic job evicted and requeued")
        assert status["progress"]["steps"] > 0
        assert status.get("restarts", 0) == 0
        done_at = status["progress"]["steps"]

        def finished() -> str | None:
            phase = (job(kube, namespace, "o").get("status") or {}).get("phase")
            return phase if phase in ("Succeeded", "Failed") else None

        assert eventually(finished, timeout=180, what="the requeued job finished") == "Succeeded"
        log = eventually(
            lambda: real_node.container_log(namespace, pod, "main"), what="the rerun's log"
        )
        assert f"resume={done_at}" in log, log[:2000]
        assert job(kube, namespace, "g")["status"]["phase"] == "Running"
        reasons = {
            e.reason
            for e in kube.core.list_namespaced_event(namespace).items
            if e.involved_object.name == pod
        }
        assert "GpuMemoryOverCap" in reasons
    finally:
        operator.stop()
