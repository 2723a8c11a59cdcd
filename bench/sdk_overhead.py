"""Per-step cost of the training SDK's `with step():`, against a bare loop in the same run.

Loops over an empty body: bare; `with nullcontext()` (what any `with` costs); `with step()`
with no agent configured (the SDK's no-op path, which still counts steps); and `with step()`
connected to a stand-in agent on a real unix socket that keeps duty 1 (so no pacing: what is
left is timing, batching, polling and reports). No torch is loaded, so `sync` costs one
dictionary lookup. The median of `--repeats` runs of `--steps` steps each, in ns per step.

    .venv/bin/python bench/sdk_overhead.py [--steps 200000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable

from gangshare.sdk import Session
from gangshare.sdk.wire import SOCKET_ENV, WireCaps, caps_message


class DrainingAgent:
    """Accepts the SDK, answers its hello with duty 1, reads and counts everything it sends."""

    def __init__(self, path: str) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(1)
        self.received = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        conn.sendall(caps_message(WireCaps(1.0, None, 1)))
        with conn:
            while chunk := conn.recv(65536):
                self.received += chunk.count(b"\n")


def per_step_ns(loop: Callable[[int], None], steps: int, repeats: int) -> float:
    loop(steps // 10)  # warm up outside the measurement
    samples = []
    for _ in range(repeats):
        start = time.perf_counter_ns()
        loop(steps)
        samples.append((time.perf_counter_ns() - start) / steps)
    return statistics.median(samples)


def bare(steps: int) -> None:
    for _ in range(steps):
        pass


def null(steps: int) -> None:
    nothing = contextlib.nullcontext()
    for _ in range(steps):
        with nothing:
            pass


def with_session(session: Session) -> Callable[[int], None]:
    def loop(steps: int) -> None:
        step = session.step
        for _ in range(steps):
            with step():
                pass

    return loop


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "agent.sock")
        agent = DrainingAgent(path)
        connected = Session({SOCKET_ENV: path})
        with connected.step():
            pass
        deadline = time.monotonic() + 5
        while connected.caps().generation != 1 and time.monotonic() < deadline:
            with connected.step():
                pass
        assert connected.caps().connected, "the stand-in agent never answered"
        rows = [
            ("bare loop", bare),
            ("with nullcontext() (any with's floor)", null),
            ("with step(), no agent", with_session(Session({}))),
            ("with step(), agent connected, duty 1", with_session(connected)),
        ]
        results = {label: per_step_ns(loop, args.steps, args.repeats) for label, loop in rows}
        connected.close()
        with contextlib.suppress(OSError):
            agent.listener.close()
    base = results["bare loop"]
    print(f"{'loop':<40} {'ns/step':>9} {'over bare':>10} {'x bare':>8}")
    for label, ns in results.items():
        print(f"{label:<40} {ns:>9.0f} {ns - base:>10.0f} {ns / base:>8.1f}")
    for label, ns in list(results.items())[2:]:
        of_1ms = (ns - base) / 1e6 * 100
        print(f"{label}: {of_1ms:.4f}% of a 1 ms step, {of_1ms / 100:.6f}% of a 100 ms step")
    print(f"reports the agent read: {agent.received}, steps counted: {connected.count}")


if __name__ == "__main__":
    main()
