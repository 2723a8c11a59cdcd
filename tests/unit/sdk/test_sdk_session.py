"""The SDK against a stand-in agent on a real unix socket: reports, caps, pacing, agent loss."""

from __future__ import annotations

import json
import threading
import time

import pytest
from sdkkit import FakeTime, StubAgent, agent_env, fake_session, run_steps

from gangshare.sdk import Caps, Session
from gangshare.sdk.wire import MAX_LINE, WireCaps

# A pause that never ends must fail the test, not hang the suite.
pytestmark = pytest.mark.timeout(30)


def test_reports_carry_the_step_times_and_the_count_batched(
    agent: StubAgent, fake: FakeTime
) -> None:
    env = {**agent_env(agent.path), "GANGSHARE_RESUME_STEP": "100"}
    session = fake_session(fake, env, report_every=0.25)
    run_steps(session, fake, 20, busy=0.0625)
    session.flush()
    agent.wait_for(lambda: agent.last_count() == 120)
    assert [h["hello"]["torch"] for h in agent.hellos] == [False]
    assert agent.steps() == [0.0625] * 20
    # One report per 0.25 s of steps (4 steps), not one per step.
    assert len(agent.reports) == 5
    assert [r["count"] for r in agent.reports] == [104, 108, 112, 116, 120]
    assert session.count == 120


def test_caps_reach_caps_and_the_callback(agent: StubAgent, fake: FakeTime) -> None:
    session = fake_session(fake, agent_env(agent.path, sm="0.2500", memory="4000"))
    seen: list[Caps] = []
    session.on_caps(seen.append)
    assert session.caps() == Caps(0.25, 4000, 0, False)
    run_steps(session, fake, 1, busy=0.0)
    agent.wait_for(lambda: agent.hellos)
    agent.push(0.75, 2048, generation=3)
    run_steps(session, fake, 1, busy=0.0)
    assert session.caps() == Caps(0.75, 2048, 3, True)
    assert seen == [Caps(0.25, 4000, 0, True), Caps(0.75, 2048, 3, True)]


def test_an_unregistered_callback_hears_nothing(agent: StubAgent, fake: FakeTime) -> None:
    session = fake_session(fake, agent_env(agent.path))
    seen: list[Caps] = []
    session.on_caps(seen.append)()
    run_steps(session, fake, 1, busy=0.0)
    agent.wait_for(lambda: agent.hellos)
    agent.push(0.5)
    run_steps(session, fake, 1, busy=0.0)
    assert session.caps().duty == 0.5
    assert seen == []


@pytest.mark.parametrize(("duty", "ratio"), [("0.5", 1.0), ("0.25", 3.0), ("1", 0.0)])
def test_pacing_makes_busy_time_the_duty_share_of_wall_time(
    sock_path: str, fake: FakeTime, duty: str, ratio: float
) -> None:
    # No agent listening: the static duty from the environment applies.
    session = fake_session(fake, agent_env(sock_path, sm=duty))
    start = fake.now
    run_steps(session, fake, 10, busy=0.1)
    assert sum(fake.sleeps) == pytest.approx(10 * 0.1 * ratio)
    assert 1.0 / (fake.now - start) == pytest.approx(float(duty))


def test_duty_from_the_agent_paces_and_long_sleeps_end_when_it_is_raised(
    agent: StubAgent, fake: FakeTime
) -> None:
    session = fake_session(fake, agent_env(agent.path))
    run_steps(session, fake, 1, busy=0.0)
    agent.wait_for(lambda: agent.hellos)
    agent.push(0.5, generation=1)
    run_steps(session, fake, 1, busy=0.2)
    assert fake.sleeps == pytest.approx([0.2])
    agent.push(0.1, generation=2)
    fake.sleeps.clear()
    real_sleep = fake.sleep

    def sleep_then_raise(seconds: float) -> None:
        real_sleep(seconds)
        if len(fake.sleeps) == 2:
            agent.push(1.0, generation=3)

    session._sleep = sleep_then_raise
    # 1 s at duty 0.1 asks for 9 s of sleep; the raise after the second slice ends it there.
    run_steps(session, fake, 1, busy=1.0)
    assert fake.sleeps == pytest.approx([0.5, 0.5])
    assert session.caps().duty == 1.0


def test_duty_zero_blocks_until_the_agent_raises_it(agent: StubAgent) -> None:
    # A connected agent is never stale, however long the pause.
    session = Session(agent_env(agent.path), poll_every=0.0, stale_after=0.05)
    seen: list[float] = []
    session.on_caps(lambda caps: seen.append(caps.duty))
    with session.step():
        pass
    agent.wait_for(lambda: agent.hellos)
    agent.push(0.0, generation=1)
    threading.Timer(0.3, agent.push, args=(1.0, None, 2)).start()
    started = time.monotonic()
    with session.step():
        pass
    assert time.monotonic() - started >= 0.25
    assert seen == [1.0, 0.0, 1.0]
    assert session.caps() == Caps(1.0, None, 2, True)


def test_training_goes_on_without_the_agent_and_reconnects_when_it_returns(
    agent: StubAgent, fake: FakeTime
) -> None:
    agent.greet = WireCaps(0.5, 1000, 1)
    session = fake_session(fake, agent_env(agent.path))
    run_steps(session, fake, 1, busy=0.01)
    agent.wait_for(lambda: agent.hellos)
    run_steps(session, fake, 1, busy=0.01)
    assert session.caps() == Caps(0.5, 1000, 1, True)
    agent.stop()
    run_steps(session, fake, 1, busy=0.01)
    # Gone, not stale yet: the last caps hold.
    assert session.caps() == Caps(0.5, 1000, 1, False)
    conn = session._conn
    assert conn is not None
    tries = conn.attempts
    run_steps(session, fake, 30, busy=0.1)  # 3 s of steps and 3 s of pacing
    assert conn.attempts - tries in (6, 7)  # once a second, not once a step
    agent.greet = WireCaps(0.75, 2000, 1)
    agent.start()
    run_steps(session, fake, 10, busy=0.1)
    agent.wait_for(lambda: len(agent.hellos) == 2)
    run_steps(session, fake, 1, busy=0.01)
    assert session.caps() == Caps(0.75, 2000, 1, True)
    assert conn.connects == 2
    session.flush()
    agent.wait_for(lambda: agent.last_count() == session.count)


def test_gone_longer_than_stale_after_falls_back_to_the_env_defaults(
    agent: StubAgent, fake: FakeTime
) -> None:
    session = fake_session(fake, agent_env(agent.path, sm="0.2500", memory="4000"))
    run_steps(session, fake, 1, busy=0.0)
    agent.wait_for(lambda: agent.hellos)
    run_steps(session, fake, 1, busy=0.0)
    agent.push(0.0, 1000, generation=5)
    agent.stop()
    started = fake.now
    # Paused by the agent, which then died: the step waits out stale_after, then goes on.
    run_steps(session, fake, 1, busy=0.0)
    assert session.caps() == Caps(0.25, 4000, 0, False)
    assert 30.0 <= fake.now - started <= 31.0


def test_malformed_lines_are_ignored(agent: StubAgent, fake: FakeTime) -> None:
    session = fake_session(fake, agent_env(agent.path))
    run_steps(session, fake, 1, busy=0.0)
    agent.wait_for(lambda: agent.hellos)
    agent.send_raw(
        b"not json\n[1, 2]\n\n"
        b'{"v": 1, "caps": {"duty": 7}}\n'
        b'{"v": 1, "caps": {"duty": 0.5, "memoryMiB": true}}\n'
        b'{"v": 1, "caps": {"duty": 0.5, "generation": "x"}}\n'
        b'{"v": 1, "error": "no pod holds this process"}\n' + b"x" * (MAX_LINE + 10) + b"\n"
    )
    run_steps(session, fake, 1, busy=0.0)
    assert session.caps() == Caps(1.0, None, 0, True)
    agent.push(0.5, generation=9)
    run_steps(session, fake, 1, busy=0.0)
    assert session.caps() == Caps(0.5, None, 9, True)
    conn = session._conn
    assert conn is not None and conn.connects == 1


def test_a_stuck_agent_makes_reports_drop_not_block(agent: StubAgent, fake: FakeTime) -> None:
    session = fake_session(fake, agent_env(agent.path), report_every=0.0)
    run_steps(session, fake, 1, busy=0.001)
    agent.wait_for(lambda: agent.hellos)
    agent.holding = True
    started = time.monotonic()
    run_steps(session, fake, 20000, busy=0.001)
    assert time.monotonic() - started < 5.0
    agent.holding = False

    def flushed() -> bool:
        session.flush()
        return agent.last_count() == 20001

    agent.wait_for(flushed)
    assert len(agent.reports) < 20000  # some were dropped...
    assert agent.bad_lines == []  # ...but never half of one
    assert session.caps().connected


def test_report_lines_are_wire_format(agent: StubAgent, fake: FakeTime) -> None:
    session = fake_session(fake, agent_env(agent.path), report_every=0.0)
    run_steps(session, fake, 3, busy=0.25)
    agent.wait_for(lambda: agent.last_count() == 3)
    assert {"v": 1, "steps": [0.25], "count": 3} in agent.reports
    assert json.loads(json.dumps(agent.hellos[0]))["hello"]["sdk"]
