"""A hostile Opportunistic tenant on a real kubelet (issue #25, items 1 and 4).

The tenant tells the agent's socket it is nearly idle (tiny fake step times, sent by hand past
the SDK) and runs flat out. Both containers are pinned to one CPU, so its work really slows the
Guaranteed job's CPU-bound steps; NVML (the fake backend) reports the tenant's real host PID
busy. The agent must duty-cycle the tenant's real processes whatever it says, and an agent
SIGKILLed while it holds them stopped must not leave them stopped: the next one continues them.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from agent_process import (
    AgentProcess,
    allow_privileged_templates,
    real_node_job,
)
from test_coordinator import MODEL, spec

from gangshare.agent.cgroups import pids_by_pod
from gangshare.dev.realnode import RealNode
from gangshare.dev.realnode_pyimage import PY_IMAGE
from kube import Kube, OperatorProcess, eventually

pytestmark = pytest.mark.e2e

GROUP, VERSION, PLURAL = "gangshare.io", "v1alpha1", "trainingjobs"
PIN = "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
# Fixed CPU work per step: slower whenever something else runs on the same CPU.
GUARANTEED = (
    PIN
    + """
import gangshare.sdk as sdk
i = 0
while True:
    with sdk.step(sync=False):
        x = 0
        for _ in range(150000):
            x += 1
    if i % 50 == 0:
        print(f"step={i}", flush=True)
    i += 1
"""
)
# Says it is idle, straight onto the agent's socket, and burns the CPU.
LIAR = (
    PIN
    + """
import os, socket, threading, time
from gangshare.sdk.wire import encode
def lie():
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["GANGSHARE_AGENT_SOCKET"])
    s.sendall(encode({"hello": {"sdk": "liar"}}))
    n = 0
    while True:
        n += 100
        s.sendall(encode({"steps": [0.0001] * 100, "count": n}))
        time.sleep(0.5)
threading.Thread(target=lie, daemon=True).start()
print("running", flush=True)
x = 0
while True:
    x += 1
"""
)


def process_state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "gone"
    return stat.rsplit(")", 1)[1].split()[0]


def host_pid(kube: Kube, namespace: str, pod: str) -> int:
    uid = kube.core.read_namespaced_pod(pod, namespace).metadata.uid
    pids = pids_by_pod().get(uid)
    assert pids, f"no host process of pod {namespace}/{pod}"
    return max(pids)  # the container's process started after the sandbox's pause


def test_a_liar_running_flat_out_is_held_and_a_killed_agent_leaves_it_running(
    crd: Kube, real_node: RealNode, one_gpu_agent: AgentProcess, namespace: str, tmp_path: Path
) -> None:
    kube = crd
    allow_privileged_templates(kube, namespace)
    operator = OperatorProcess(kube, tmp_path).start()
    create = kube.custom.create_namespaced_custom_object
    try:
        g = real_node_job("g", "Guaranteed", MODEL, PY_IMAGE, ["python3", "-c", GUARANTEED])
        create(GROUP, VERSION, namespace, PLURAL, g)
        eventually(
            lambda: "step=50" in real_node.container_log(namespace, "g-worker-0", "main"),
            timeout=90,
            what="the guaranteed job stepping alone",
        )
        o = real_node_job("o", "Opportunistic", MODEL, PY_IMAGE, ["python3", "-c", LIAR])
        create(GROUP, VERSION, namespace, PLURAL, o)
        eventually(
            lambda: "running" in real_node.container_log(namespace, "o-worker-0", "main"),
            timeout=90,
            what="the tenant running",
        )
        liar = host_pid(kube, namespace, "o-worker-0")
        guaranteed = host_pid(kube, namespace, "g-worker-0")
        processes = [
            {"gpu": 0, "pid": guaranteed, "memoryMiB": 2000, "sm": 0.5},
            {"gpu": 0, "pid": liar, "memoryMiB": 1000, "sm": 1.0},
        ]
        one_gpu_agent.rewrite_spec(spec(processes))

        def throttled_by_measure() -> str | None:
            for event in kube.core.list_namespaced_event(namespace).items:
                if event.involved_object.name == "o-worker-0" and "NVML measured" in (
                    event.message or ""
                ):
                    return str(event.message)
            return None

        message = eventually(throttled_by_measure, timeout=60, what="the liar throttled")
        assert event_reason(kube, namespace, "o-worker-0") >= {"OpportunisticThrottled"}, message

        # SIGKILL the agent while it holds the liar stopped: nothing continues it then.
        for _ in range(5):
            eventually(lambda: process_state(liar) == "T", timeout=30, what="the liar stopped")
            one_gpu_agent.kill()
            if process_state(liar) == "T":
                break
            one_gpu_agent.start()  # killed just after a continue: try again
            eventually(one_gpu_agent.registered, timeout=30, what="the agent registered again")
        assert process_state(liar) == "T"
        time.sleep(3)
        assert process_state(liar) == "T", "something else continued the liar"

        one_gpu_agent.start()
        seen: list[str] = []

        def continued() -> bool:
            seen.append(process_state(liar))
            return seen[-1] not in ("T", "gone")

        eventually(continued, timeout=30, interval=0.02, what="the liar continued")
        assert "continued pods a previous agent may have left stopped" in one_gpu_agent.logs()
    finally:
        operator.stop()


def event_reason(kube: Kube, namespace: str, pod: str) -> set[str]:
    return {
        str(e.reason)
        for e in kube.core.list_namespaced_event(namespace).items
        if e.involved_object.name == pod
    }
