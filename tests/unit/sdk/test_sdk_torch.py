"""The SDK's PyTorch side, against a stand-in `torch` module: memory caps, sync, the hook."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

import pytest
from sdkkit import FakeTime, StubAgent, agent_env, fake_session, run_steps

import gangshare.sdk as sdk

GIB = 1 << 30

# A pause that never ends must fail the test, not hang the suite.
pytestmark = pytest.mark.timeout(30)


class FakeCuda:
    def __init__(self, devices: int = 2, total: int = 16 * GIB) -> None:
        self.devices, self.total = devices, total
        self.initialized = True
        self.calls: list[tuple[Any, ...]] = []
        self.fail: Exception | None = None

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return self.initialized

    def device_count(self) -> int:
        return self.devices

    def get_device_properties(self, device: int) -> types.SimpleNamespace:
        return types.SimpleNamespace(total_memory=self.total)

    def set_per_process_memory_fraction(self, fraction: float, device: int) -> None:
        if self.fail is not None:
            raise self.fail
        self.calls.append(("fraction", fraction, device))

    def empty_cache(self) -> None:
        self.calls.append(("empty_cache",))

    def synchronize(self) -> None:
        self.calls.append(("synchronize",))

    def take(self) -> list[tuple[Any, ...]]:
        calls, self.calls = self.calls, []
        return calls


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    fake_cuda = FakeCuda()
    torch = types.ModuleType("torch")
    torch.cuda = fake_cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    return fake_cuda


def fractions(*values: float) -> list[tuple[Any, ...]]:
    return [("fraction", v, d) for v in values for d in (0, 1)]


def test_memory_caps_set_the_allocator_share_and_empty_the_cache_only_when_lowered(
    agent: StubAgent, fake: FakeTime, cuda: FakeCuda
) -> None:
    session = fake_session(fake, agent_env(agent.path, memory="4096"))
    with session.step(sync=False):
        pass
    # The static cap from the environment, before the agent says anything: a first cap
    # lowers the limit from none, so cached blocks go back.
    assert cuda.take() == [*fractions(0.25), ("empty_cache",)]
    agent.wait_for(lambda: agent.hellos)
    assert agent.hellos[0]["hello"]["torch"] is True
    for memory, expected in [
        (8192, fractions(0.5)),
        (2048, [*fractions(0.125), ("empty_cache",)]),
        (2048, []),
        (None, fractions(1.0)),
    ]:
        agent.push(1.0, memory, generation=2)
        with session.step(sync=False):
            pass
        assert cuda.take() == expected, memory
        assert session.caps().memory_mib == memory


def test_without_torch_the_cap_is_recorded_and_applied_once_torch_is_there(
    agent: StubAgent, fake: FakeTime, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    session = fake_session(fake, agent_env(agent.path))
    run_steps(session, fake, 1, busy=0.0)
    agent.wait_for(lambda: agent.hellos)
    agent.push(1.0, 1024, generation=1)
    run_steps(session, fake, 1, busy=0.0)
    assert session.caps().memory_mib == 1024
    late = FakeCuda(devices=1, total=8 * GIB)
    torch = types.ModuleType("torch")
    torch.cuda = late  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    with session.step(sync=False):
        pass
    assert late.calls == [("fraction", 0.125, 0), ("empty_cache",)]


def test_a_failing_torch_never_stops_training(
    sock_path: str, fake: FakeTime, cuda: FakeCuda
) -> None:
    cuda.fail = RuntimeError("CUDA error: out of memory")
    session = fake_session(fake, agent_env(sock_path, memory="100"))
    run_steps(session, fake, 3, busy=0.01)
    assert session.count == 3
    assert session.caps().memory_mib == 100


def test_sync_waits_for_cuda_only_when_asked_and_cuda_runs(
    sock_path: str, fake: FakeTime, cuda: FakeCuda
) -> None:
    session = fake_session(fake, agent_env(sock_path))
    for sync in (True, False, True):
        with session.step(sync=sync):
            pass
    assert cuda.take().count(("synchronize",)) == 2
    cuda.initialized = False  # synchronize() would start CUDA in a job that never used it
    with session.step():
        pass
    assert cuda.take() == []
    idle = fake_session(fake, {})
    with idle.step():
        pass
    assert cuda.take() == []


class FakeOptimizer:
    """The slice of torch.optim.Optimizer the hook uses."""

    def __init__(self) -> None:
        self.hooks: dict[int, Callable[..., None]] = {}

    def register_step_post_hook(self, fn: Callable[..., None]) -> types.SimpleNamespace:
        key = len(self.hooks)
        self.hooks[key] = fn
        return types.SimpleNamespace(remove=lambda: self.hooks.pop(key))

    def step(self) -> None:
        for fn in list(self.hooks.values()):
            fn(self, (), {})


def test_the_hook_times_optimizer_steps_less_its_own_pacing(
    agent: StubAgent, fake: FakeTime
) -> None:
    session = fake_session(fake, agent_env(agent.path, sm="0.5"), report_every=0.0)
    optimizer = FakeOptimizer()
    handle = sdk.hook(optimizer, session=session)
    for _ in range(5):
        fake.advance(0.125)
        optimizer.step()
    # The first boundary only starts the clock: what came before it was setup.
    assert fake.sleeps == [0.125] * 4
    agent.wait_for(lambda: agent.last_count() == 5)
    assert agent.steps() == [0.125] * 4
    handle.remove()
    optimizer.step()
    assert session.count == 5
    assert optimizer.hooks == {}


def test_the_hook_refuses_an_optimizer_without_step_hooks() -> None:
    with pytest.raises(TypeError, match="register_step_post_hook"):
        sdk.hook(object(), session=sdk.Session({}))
