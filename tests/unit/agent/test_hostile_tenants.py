"""Tenants who do not cooperate, against the agent's enforcement (issue #25, items 1-4).

Each test plays the tenant: one that lies to its SDK and runs flat out, one whose entrypoint
unset the MPS limits and never loads the SDK, one with a year-long grace that ignores SIGTERM
(and a PodDisruptionBudget over it), and an agent SIGKILLed while it held a pod stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from agent_fakes import FakeSpec, fake_backend, make_spec

from gangshare.agent.control_loop import KILL_SLACK_SECONDS, ControlLoop
from gangshare.agent.coordinator import Coordinator
from gangshare.agent.freezer import SignalStopper
from gangshare.agent.metrics import AgentMetrics
from gangshare.agent.podresources import PodDevices
from gangshare.agent.throttle import Throttler
from gangshare.core.clock import ManualClock
from gangshare.core.enforcement import EnforcementParams

GPU, SHARE = "nvidia.com/gpu", "gangshare.io/gpu-share"
PARAMS = EnforcementParams()


@pytest.fixture
def pids() -> Iterator[tuple[int, int]]:
    """Two live host processes (guaranteed, tenant) that NVML's (fake) list names: PIDs are
    checked against the kernel's process table (start time), as on a node."""
    live = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
    yield live[0].pid, live[1].pid
    for process in live:
        process.kill()
        process.wait(timeout=10)


class Api:
    """The agent's NodeApi as far as the control loop uses it; no Eviction API on purpose."""

    def __init__(self, grace: int | None = None) -> None:
        self.grace = grace
        self.annotated: list[dict[str, str]] = []
        self.deleted: list[tuple[str, int]] = []
        self.events: list[str] = []

    def pods_on_node(self, timeout: Any = None) -> list[dict[str, Any]]:
        tenant: dict[str, Any] = {"nodeName": "real-0"}
        if self.grace is not None:
            tenant["terminationGracePeriodSeconds"] = self.grace
        return [
            {"metadata": {"namespace": "t", "name": "g", "uid": "uid-g"}, "spec": {}},
            {"metadata": {"namespace": "t", "name": "o", "uid": "uid-o"}, "spec": tenant},
        ]

    def annotate_pod(self, namespace: str, name: str, uid: str, ann: dict[str, str]) -> bool:
        self.annotated.append(ann)
        return True

    def delete_pod(self, namespace: str, name: str, uid: str, grace_seconds: int) -> str | None:
        self.deleted.append((uid, grace_seconds))
        return None

    def pod_event(self, namespace: str, name: str, uid: str, kind: str, reason: str, *_: Any):
        self.events.append(reason)


SPEC = make_spec().gpus(1, memory_mib=16384)
UUID = SPEC.devices().inventory.gpus[0].uuid


def kubelet() -> dict[tuple[str, str], PodDevices]:
    return {
        ("t", "g"): PodDevices("t", "g", {GPU: (UUID,)}),
        ("t", "o"): PodDevices("t", "o", {SHARE: (f"{UUID}::1",)}),
    }


@dataclass
class World:
    """One 16 GiB GPU: a guaranteed pod and an opportunistic tenant NVML samples at `sm`."""

    loop: ControlLoop
    coordinator: Coordinator
    api: Api
    clock: ManualClock
    sm: float
    killed: list[str] = field(default_factory=list)

    def run(self, seconds: int, lie: bool) -> list[Any]:
        """The guaranteed job's steps take 0.1 s alone and slow down by what the tenant really
        runs: flat out unless the backstop holds it to its duty (it ignores its caps)."""
        outcomes: list[Any] = []
        for _ in range(seconds):
            held = outcomes[-1].backstop.get("uid-o") if outcomes else None
            runs = self.sm if held is None else min(self.sm, held)
            self.coordinator.record_steps("uid-g", (0.1 * (1 + runs),) * 10, None)
            if lie:  # tiny fake steps: by its own word it is nearly idle
                self.coordinator.record_steps("uid-o", (0.0001,) * 10, None)
            outcomes.append(self.loop.once())
            self.clock.advance(1.0)
        return outcomes


def fake_gpu(
    pids: tuple[int, int], tenant_sm: float, tenant_mib: int, mps: bool = False
) -> FakeSpec:
    spec = make_spec().gpus(1, memory_mib=16384).process(0, pids[0], 6000, sm=0.6)
    return spec.process(0, pids[1], tenant_mib, sm=tenant_sm, mps=mps)


def world(
    tmp_path: Path,
    pids: tuple[int, int],
    tenant_sm: float,
    tenant_mib: int = 1000,
    grace: int | None = None,
    mps: bool = False,
) -> World:
    spec = fake_gpu(pids, tenant_sm, tenant_mib, mps)
    backend, _ = fake_backend(spec, tmp_path / "fake.yaml")
    clock = ManualClock(100.0)
    coordinator = Coordinator(spec.devices(), clock=clock.now)
    api = Api(grace)
    killed: list[str] = []
    loop = ControlLoop(
        coordinator,
        backend,
        api,  # type: ignore[arg-type]
        kubelet,
        None,
        None,
        AgentMetrics("real-0"),
        pod_of_pid={pids[0]: "uid-g", pids[1]: "uid-o"}.get,
        clock=clock.now,
        kill_pod=lambda uid: killed.append(uid) or 1,
    )
    return World(loop, coordinator, api, clock, tenant_sm, killed)


@pytest.mark.parametrize("lie", [True, False], ids=["lies-to-its-sdk", "mps-unset-no-sdk"])
def test_a_tenant_running_flat_out_is_duty_cycled_within_a_bounded_time(
    tmp_path: Path, pids: tuple[int, int], lie: bool
) -> None:
    """Whatever its SDK says (or whether it has one), NVML's samples catch it: within
    `measure_min_seconds` of being capped and one period."""
    outcomes = world(tmp_path, pids, tenant_sm=1.0).run(10, lie)
    capped_at = next(i for i, o in enumerate(outcomes) if o.caps.get("uid-o"))
    caught_at = next(i for i, o in enumerate(outcomes) if "uid-o" in o.throttled)
    assert caught_at - capped_at <= PARAMS.measure_min_seconds + 1
    outcome = outcomes[caught_at]
    assert outcome.throttled["uid-o"][0] == "OverDutyMeasured"
    assert "NVML measured its processes busy 100%" in outcome.throttled["uid-o"][1]
    assert outcome.backstop["uid-o"] == outcome.caps["uid-o"].duty < 1.0
    assert "uid-g" not in outcome.backstop  # the guaranteed job is never held


def test_a_caught_tenant_stays_duty_cycled_while_capped_though_it_then_measures_within(
    tmp_path: Path, pids: tuple[int, int]
) -> None:
    held = world(tmp_path, pids, tenant_sm=1.0)
    held.run(8, lie=True)
    # Held by stop/continue it measures within its duty; let go, it would run flat out again.
    fake_gpu(pids, 0.0, 1000).write(tmp_path / "fake.yaml")
    os.utime(tmp_path / "fake.yaml", ns=(time.time_ns() + 10**9,) * 2)
    later = held.run(40, lie=True)
    assert all(o.throttled["uid-o"][0] == "OverDutyMeasured" for o in later)
    assert not any(o.evictions for o in later) and held.api.deleted == []


def test_a_held_tenant_whose_gpu_work_runs_on_is_removed_within_a_stated_time(
    tmp_path: Path, pids: tuple[int, int]
) -> None:
    """Frozen host processes, but NVML still measures it flat out (kernels it queued, or one
    long kernel): duty-cycling it for ever would not protect the guaranteed job."""
    held = world(tmp_path, pids, tenant_sm=1.0)
    bound = (
        PARAMS.measure_min_seconds
        + PARAMS.measure_window_seconds
        + PARAMS.duty_overrun_seconds
        + 3  # control periods: capped, caught, judged
    )
    outcomes = held.run(int(bound), lie=True)
    removals = [e for o in outcomes for e in o.evictions]
    assert [(e.uid, e.reason) for e in removals][:1] == [("uid-o", "GpuDutyOverrun")]
    assert held.api.deleted == [("uid-o", int(PARAMS.removal_grace_seconds))]
    assert "GpuDutyOverrun" in held.api.events and "gangshare.io/evicted" in held.api.annotated[-1]
    assert held.loop._throttled == set()  # let go, so it can act on its SIGTERM


def test_an_mps_client_listed_only_by_nvmls_mps_list_is_judged_and_held(
    tmp_path: Path, pids: tuple[int, int]
) -> None:
    spec = make_spec().gpus(1, memory_mib=16384).process(0, pids[0], 6000, sm=0.6)
    spec = spec.process(0, pids[1], 1000, sm=1.0, mps=True)
    backend, _ = fake_backend(spec, tmp_path / "fake.yaml")
    assert [(p.pid, p.sm) for p in backend.processes()] == [(pids[0], 0.6), (pids[1], 1.0)]
    outcomes = world(tmp_path, pids, tenant_sm=1.0, mps=True).run(10, lie=True)
    assert any(o.throttled.get("uid-o", ("",))[0] == "OverDutyMeasured" for o in outcomes)


def test_a_tenant_without_an_sdk_that_keeps_its_duty_by_measure_is_left_alone(
    tmp_path: Path, pids: tuple[int, int]
) -> None:
    """Judged by what it does: no SDK, but idle by NVML's samples, so nothing to hold."""
    idle = world(tmp_path, pids, tenant_sm=0.0)
    outcomes = idle.run(int(PARAMS.report_timeout_seconds) + 5, lie=False)
    assert any(o.caps.get("uid-o") for o in outcomes)
    assert all("uid-o" not in o.throttled for o in outcomes)


def test_an_over_cap_tenant_with_a_year_long_grace_is_removed_within_a_stated_time(
    tmp_path: Path, pids: tuple[int, int]
) -> None:
    """DELETE with the agent's bounded grace (no Eviction API, so no PodDisruptionBudget can
    block it), then its processes killed by the agent if they still hold GPU memory."""
    year = 31_536_000
    over = world(tmp_path, pids, 0.0, tenant_mib=12000, grace=year)
    api = over.api
    bound = PARAMS.memory_grace_seconds + PARAMS.removal_grace_seconds + KILL_SLACK_SECONDS
    over.run(int(PARAMS.memory_grace_seconds) + 2, lie=False)
    assert api.deleted == [("uid-o", int(PARAMS.removal_grace_seconds))]
    assert "GpuMemoryOverCap" in api.events
    assert "gangshare.io/evicted" in api.annotated[-1]
    # It ignores SIGTERM: still holding its memory when the grace and the slack are spent.
    over.run(int(bound), lie=False)
    assert over.killed and set(over.killed) == {"uid-o"}
    assert api.deleted == [("uid-o", int(PARAMS.removal_grace_seconds))]  # once


def test_a_removed_tenant_is_let_go_of_stop_continue_so_it_can_act_on_its_sigterm(
    tmp_path: Path, pids: tuple[int, int]
) -> None:
    removed = world(tmp_path, pids, 1.0, tenant_mib=12000)
    outcomes = removed.run(int(PARAMS.memory_grace_seconds) + 3, lie=True)
    assert removed.api.deleted and "uid-o" in outcomes[-1].backstop
    assert removed.loop._throttled == set()


AGENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from gangshare.agent.freezer import SignalStopper
    from gangshare.agent.throttle import Throttler
    child = int(sys.argv[2])
    stopper = SignalStopper(lambda: {"uid-o": [child]})
    throttler = Throttler(1.0, stopper, state_file=Path(sys.argv[1]))
    throttler.set_duties({"uid-o": 0.0})  # duty 0: held stopped
    throttler.tick()
    print("stopped", flush=True)
    time.sleep(600)
    """
)


def process_state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def settled_state(pid: int, wanted: str, seconds: float = 5.0) -> str:
    """The process's state once it reads `wanted` or `seconds` pass: a SIGSTOP or SIGCONT
    takes effect when the target is next scheduled, which on a loaded machine is not at once
    (CI read "R" right after the stop)."""
    deadline = time.monotonic() + seconds
    while (state := process_state(pid)) != wanted and time.monotonic() < deadline:
        time.sleep(0.05)
    return state


def test_a_sigkilled_agent_leaves_no_pod_stopped_once_the_next_agent_starts(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state" / "throttled.json"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(state), str(child.pid)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert agent.stdout is not None and agent.stdout.readline().strip() == "stopped"
        assert settled_state(child.pid, "T") == "T"
        agent.send_signal(signal.SIGKILL)  # no chance to continue anything
        agent.wait(timeout=10)
        assert process_state(child.pid) == "T"
        stopper = SignalStopper(lambda: {"uid-o": [child.pid]})
        restarted = Throttler(1.0, stopper, state_file=state)
        assert restarted.resume_left_stopped() == ["uid-o"]
        assert settled_state(child.pid, "S") != "T"
    finally:
        for process in (agent, child):
            process.kill()
            process.wait(timeout=10)


def test_the_state_names_a_pod_before_it_is_ever_stopped_and_none_after_a_clean_stop(
    tmp_path: Path,
) -> None:
    state = tmp_path / "throttled.json"
    sent: list[tuple[int, int]] = []
    clock = ManualClock(0.5)
    stopper = SignalStopper(lambda: {"o": [10]}, lambda p, s: sent.append((p, s)))
    throttler = Throttler(1.0, stopper, clock.now, state)
    throttler.set_duties({"o": 0.25})
    assert '"o"' in state.read_text() and sent == []  # written ahead of the first SIGSTOP
    throttler.tick()
    assert sent == [(10, signal.SIGSTOP)]
    throttler.stop()
    assert sent[-1] == (10, signal.SIGCONT)
    assert '"mayBeStopped": []' in state.read_text()
