"""A hostile Opportunistic tenant on a real kubelet (issue #25, items 1 and 4; #36 item 1).

The tenant tells the agent's socket it is nearly idle (tiny fake step times, sent by hand past
the SDK) and runs flat out. Both containers are pinned to one CPU, so its work really slows the
Guaranteed job's CPU-bound steps; NVML (the fake backend) reports the tenant's real host PID
busy. The agent must duty-cycle the tenant whatever it says, by freezing its pod's cgroup, and
an agent SIGKILLed while it holds it frozen must not leave it frozen: the next one thaws it.

A tenant that keeps forking and exiting escaped the old PID-by-PID SIGSTOP (a child born after
the /proc scan ran on): a frozen cgroup holds it whole.
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
from test_real_node import real_pod

from gangshare.agent.cgroups import pids_by_pod
from gangshare.agent.freezer import CGROUP_ROOT, CgroupFreezer, SignalStopper, find_pod_cgroup
from gangshare.agent.throttle import Throttler
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

        # SIGKILL the agent while it holds the liar frozen: nothing thaws it then.
        uid = kube.core.read_namespaced_pod("o-worker-0", namespace).metadata.uid
        freezer = CgroupFreezer()
        for _ in range(5):
            eventually(lambda: freezer.frozen(uid), timeout=30, what="the liar frozen")
            one_gpu_agent.kill()
            if freezer.frozen(uid):
                break
            one_gpu_agent.start()  # killed just after a thaw: try again
            eventually(one_gpu_agent.registered, timeout=30, what="the agent registered again")
        assert freezer.frozen(uid) is True
        before = pod_cpu_seconds(uid)
        time.sleep(3)
        assert freezer.frozen(uid) is True, "something else thawed the liar"
        assert pod_cpu_seconds(uid) - before < 0.05, "a process of the frozen pod ran"

        one_gpu_agent.start()
        seen: list[bool | None] = []

        def thawed() -> bool:
            seen.append(freezer.frozen(uid))
            return seen[-1] is False

        eventually(thawed, timeout=30, interval=0.02, what="the liar thawed")
        # The thaw comes first, its log line just after: a read in between sees none yet.
        eventually(
            lambda: "continued pods a previous agent may have left stopped" in one_gpu_agent.logs(),
            timeout=10,
            what="the new agent saying what it continued",
        )
        assert process_state(liar) not in ("T", "gone")
    finally:
        operator.stop()


def event_reason(kube: Kube, namespace: str, pod: str) -> set[str]:
    return {
        str(e.reason)
        for e in kube.core.list_namespaced_event(namespace).items
        if e.involved_object.name == pod
    }


# Each process burns a little CPU, forks, and exits: its PIDs are never the same for long.
# PID 1 only reaps the orphans.
FORK_WALKER = """
import os, time
if os.fork() == 0:
    while True:
        end = time.monotonic() + 0.002
        while time.monotonic() < end:
            pass
        if os.fork():
            os._exit(0)
print("walking", flush=True)
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.1)
"""


def pod_cpu_seconds(uid: str) -> float:
    """CPU time the pod's cgroup has used, exited processes included (the kernel's count)."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        folder = find_pod_cgroup(CGROUP_ROOT, uid)
        assert folder is not None, f"no cgroup for pod {uid}"
        stat = dict(line.split() for line in (folder / "cpu.stat").read_text().splitlines())
        return int(stat["usage_usec"]) / 1e6
    folder = find_pod_cgroup(CGROUP_ROOT / "cpuacct", uid)
    assert folder is not None, f"no cpuacct cgroup for pod {uid}"
    return int((folder / "cpuacct.usage").read_text()) / 1e9


def pod_processes(uid: str) -> set[int]:
    return set(pids_by_pod().get(uid, []))


def cpu_share_held(throttler: Throttler, uid: str, duty: float, seconds: float) -> float:
    throttler.set_duties({uid: duty})
    throttler.start()
    try:
        time.sleep(1.0)  # into the duty cycle
        before = pod_cpu_seconds(uid)
        time.sleep(seconds)
        return (pod_cpu_seconds(uid) - before) / seconds
    finally:
        throttler.stop()  # continues everything


def test_a_tenant_that_keeps_forking_is_held_whole_by_its_frozen_cgroup(
    kube: Kube, real_node: RealNode, namespace: str, tmp_path: Path
) -> None:
    walker = real_pod("walker", ["python3", "-c", FORK_WALKER], image=PY_IMAGE)
    kube.core.create_namespaced_pod(namespace, walker)
    eventually(
        lambda: "walking" in real_node.container_log(namespace, "walker", "main"),
        timeout=90,
        what="the fork-walker running",
    )
    uid = kube.core.read_namespaced_pod("walker", namespace).metadata.uid
    freezer = CgroupFreezer()
    alone = (pod_cpu_seconds(uid), time.monotonic())
    time.sleep(3)
    free_share = (pod_cpu_seconds(uid) - alone[0]) / (time.monotonic() - alone[1])
    assert free_share > 0.5, f"the walker ran only {free_share:.2f} of a CPU unthrottled"

    # Held at duty 0: frozen all along. Not one process of the pod runs, and none is born.
    throttler = Throttler(1.0, freezer, state_file=tmp_path / "throttled.json")
    throttler.set_duties({uid: 0.0})
    throttler.tick()
    eventually(lambda: freezer.frozen(uid), timeout=10, what="the walker frozen")
    frozen_pids, frozen_cpu = pod_processes(uid), pod_cpu_seconds(uid)
    time.sleep(3)
    assert pod_cpu_seconds(uid) - frozen_cpu < 0.01, "a process of the frozen pod ran"
    assert pod_processes(uid) == frozen_pids, "the frozen pod forked"
    throttler.stop()
    eventually(lambda: freezer.frozen(uid) is False, timeout=10, what="the walker thawed")
    thawed = pod_cpu_seconds(uid)
    eventually(lambda: pod_cpu_seconds(uid) > thawed + 0.1, timeout=10, what="the walker on")

    # At duty 0.2, frozen, it gets its duty; stopped PID by PID, as before, it escaped.
    frozen_share = cpu_share_held(Throttler(1.0, freezer), uid, 0.2, 6.0)
    signalled_share = cpu_share_held(Throttler(1.0, SignalStopper()), uid, 0.2, 6.0)
    print(
        f"fork-walker CPU share: free {free_share:.2f}, duty 0.2 frozen {frozen_share:.2f}, "
        f"duty 0.2 by signals {signalled_share:.2f}"
    )
    assert frozen_share <= 0.2 + 0.1, f"frozen at duty 0.2 it still ran {frozen_share:.2f}"
