"""A Guaranteed and an Opportunistic training loop on one GPU under the local coordinator.

The agent's own coordinator code runs here (gangshare.agent.coordinator, its SDK socket server
and the core's control law), without a kubelet: the two workers are this script's children,
so their PIDs name the "pods", and GPU 0 is held whole by the guaranteed worker and by one
share slot of the opportunistic one. Both workers are PyTorch loops with `gangshare.sdk.step()`.

Measured side by side in one run, each phase `--seconds` long:
1. guaranteed alone: its step time, and SM utilization (NVML);
2. opportunistic alone: its throughput;
3. shared: the opportunistic worker runs first, then the guaranteed one arrives; reported:
   the guaranteed step time against alone (goal <= 1.05x), the opportunistic throughput
   against alone (goal >= 40%), SM utilization against the guaranteed alone (goal >= 1.5x), and
   the reaction time from the guaranteed worker's first report to the opportunistic worker
   holding its squeezed caps.

    .venv/bin/python bench/gpu_sharing.py [--seconds 60] [--tolerance 0.05] [--batch 64]
    .venv/bin/python bench/gpu_sharing.py --cpu   # no GPU: both loops busy one CPU core

`--cpu` checks the plumbing and the control loop where there is no GPU: both workers spin on
CPU 0 (taskset), so the opportunistic one's duty really slows the guaranteed one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def worker(role: str, seconds: float, cpu: bool, batch: int) -> None:
    import gangshare.sdk as sdk

    started = time.time()
    sdk.on_caps(lambda c: print(json.dumps({"caps": c.duty, "at": time.time()}), flush=True))
    step = _cpu_step() if cpu else _gpu_step(batch)
    while time.time() - started < seconds:
        begin = time.perf_counter()
        with sdk.step():
            step()
        end = time.time()
        print(json.dumps({"step": time.perf_counter() - begin, "at": end}), flush=True)


def _cpu_step() -> Any:
    def step() -> None:
        total = 0
        for i in range(200_000):
            total += i * i

    return step


def _gpu_step(batch: int) -> Any:
    import torch

    model = torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU())] * 8,
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 10),
    ).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(batch, 64, 64, 64, device="cuda")
    labels = torch.randint(0, 10, (batch,), device="cuda")

    def step() -> None:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(data), labels)
        loss.backward()
        optimizer.step()

    return step


class Run:
    """Workers as children, the agent's coordinator in this process."""

    def __init__(self, cpu: bool, tolerance: float, batch: int, workdir: Path) -> None:
        from gangshare.agent.coordinator import Coordinator
        from gangshare.agent.devices import DeviceMap
        from gangshare.agent.sdkserver import SdkServer
        from gangshare.core.coordinator import ControlParams

        self.cpu, self.batch = cpu, batch
        self.backend = None if cpu else _nvml()
        inventory = _cpu_inventory() if self.backend is None else self.backend.inventory()
        self.uuid = inventory.gpus[0].uuid
        self.coordinator = Coordinator(DeviceMap(inventory, 4), ControlParams(tolerance))
        self.pids: dict[int, str] = {}
        self.socket = workdir / "agent.sock"
        self.server = SdkServer(
            self.socket, self.pids.get, self.coordinator.record_steps, self.coordinator.caps_of
        )
        self.server.start()
        self.stop = threading.Event()
        self.util: list[tuple[float, float]] = []
        self.first_report: dict[str, float] = {}
        self.thread = threading.Thread(target=self._control, daemon=True)
        self.thread.start()

    def start(self, role: str, seconds: float) -> subprocess.Popen[str]:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT / "src"),
            "GANGSHARE_AGENT_SOCKET": str(self.socket),
        }
        argv = [sys.executable, __file__, "worker", role, str(seconds), str(self.batch)]
        if self.cpu:
            argv = ["taskset", "-c", "0", *argv, "--cpu"]
        child = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True)
        self.pids[child.pid] = role
        return child

    def _control(self) -> None:
        from gangshare.agent.coordinator import PodInfo, memory_by_pod
        from gangshare.agent.podresources import PodDevices

        while not self.stop.wait(self.coordinator.params.period_seconds):
            roles = set(self.pids.values())
            kubelet, pods = {}, {}
            for role in roles:
                resource = "nvidia.com/gpu" if role == "g" else "gangshare.io/gpu-share"
                device = self.uuid if role == "g" else f"{self.uuid}::0"
                kubelet[("bench", role)] = PodDevices("bench", role, {resource: (device,)})
                pods[("bench", role)] = PodInfo(role, "bench", role, role)
            processes = [] if self.backend is None else self.backend.processes()
            outcome = self.coordinator.decide(
                kubelet, pods, memory_by_pod(processes, self.pids.get)
            )
            for uid, caps in outcome.changed.items():
                self.server.push(uid, caps)
            if self.backend is not None:
                sample = self.backend.samples()[0]
                self.util.append((time.time(), sample.sm))

    def close(self) -> None:
        self.stop.set()
        self.server.stop()


def _nvml() -> Any:
    from gangshare.agent.nvml import NvmlBackend

    return NvmlBackend()


def _cpu_inventory() -> Any:
    from gangshare.agent.backend import GpuInfo, Inventory

    return Inventory((GpuInfo(0, "CPU-0", "cpu", 16384),), ((0,),))


def read(child: subprocess.Popen[str]) -> list[dict[str, float]]:
    assert child.stdout is not None
    out = [json.loads(line) for line in child.stdout if line.startswith("{")]
    child.wait()
    return out


def steps(lines: list[dict[str, float]], after: float = 0.0) -> list[float]:
    return [x["step"] for x in lines if "step" in x and x["at"] >= after]


def mean_util(run: Run, start: float, end: float) -> float | None:
    values = [u for t, u in run.util if start <= t <= end]
    return statistics.mean(values) if values else None


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        worker(sys.argv[2], float(sys.argv[3]), "--cpu" in sys.argv, int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        run = Run(args.cpu, args.tolerance, args.batch, Path(workdir))
        try:
            t0 = time.time()
            g_alone = read(run.start("g", args.seconds))
            util_g = mean_util(run, t0 + 5, time.time())
            run.pids.clear()
            o_alone = read(run.start("o", args.seconds))
            run.pids.clear()
            run.coordinator = type(run.coordinator)(run.coordinator.devices, run.coordinator.params)
            run.server.caps_of = run.coordinator.caps_of
            run.server.on_steps = run.coordinator.record_steps
            o = run.start("o", args.seconds * 2)
            time.sleep(args.seconds / 4)
            arrival = time.time()
            g = read(run.start("g", args.seconds))
            shared_end = time.time()
            o_lines = read(o)
        finally:
            run.close()
    settle_from = arrival + args.seconds / 3
    g_solo = statistics.median(steps(g_alone))
    g_shared = statistics.median(steps(g, settle_from))
    o_rate_alone = len(steps(o_alone)) / args.seconds
    o_rate_shared = len(steps(o_lines, settle_from)) / max(1e-9, shared_end - settle_from)
    g_first = min(x["at"] for x in g if "step" in x)
    squeezed = [x["at"] for x in o_lines if "caps" in x and x["at"] >= g_first and x["caps"] < 1]
    print(f"mode: {'cpu (taskset -c 0)' if args.cpu else 'gpu'}, {args.seconds:.0f} s phases")
    print(
        f"guaranteed step: alone {g_solo * 1000:.1f} ms, shared {g_shared * 1000:.1f} ms, "
        f"ratio {g_shared / g_solo:.3f} (goal <= {1 + args.tolerance:.2f})"
    )
    print(
        f"opportunistic throughput: alone {o_rate_alone:.2f}/s, shared {o_rate_shared:.2f}/s, "
        f"ratio {o_rate_shared / o_rate_alone:.2f} (goal >= 0.40)"
    )
    if squeezed:
        print(
            f"reaction to the guaranteed arrival: {squeezed[0] - g_first:.2f} s "
            "(first guaranteed step to squeezed caps in the opportunistic worker)"
        )
    else:
        print("reaction: the opportunistic worker was never squeezed")
    shared_util = mean_util(run, settle_from, shared_end)
    if util_g and shared_util:
        print(
            f"SM utilization: guaranteed alone {util_g:.0%}, shared {shared_util:.0%}, "
            f"ratio {shared_util / util_g:.2f} (goal >= 1.5)"
        )


if __name__ == "__main__":
    main()
