"""The module-level API, life without an agent, fork, and the SDK shipped alone."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from sdkkit import FakeTime, StubAgent, agent_env, fake_session, run_steps

import gangshare.sdk as sdk
from gangshare.sdk import Caps, Session
from gangshare.sdk.wire import RESUME_STEP_ENV, SOCKET_ENV

SRC = Path(sdk.__file__).resolve().parents[1]

# A pause that never ends must fail the test, not hang the suite.
pytestmark = pytest.mark.timeout(30)


def test_without_an_agent_nothing_touches_a_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[object] = []

    def no_sockets(*args: object, **kwargs: object) -> socket.socket:
        opened.append(args)
        raise OSError("no sockets in this test")

    monkeypatch.setattr(socket, "socket", no_sockets)
    session = Session({"GANGSHARE_SM_CAP": "0.1", "GANGSHARE_MEMORY_CAP_MIB": "10"})
    for _ in range(1000):
        with session.step():
            pass
    session.mark()
    session.flush()
    assert session.count == 1001
    assert opened == []
    assert not session.agent
    # The static caps are for a session with an agent to move them; alone, nothing is capped.
    assert session.caps() == Caps(1.0, None, 0, False)


def test_a_failed_step_is_not_counted_and_its_error_goes_through(
    sock_path: str, fake: FakeTime
) -> None:
    for session in (fake_session(fake, agent_env(sock_path)), Session({})):
        with pytest.raises(KeyError), session.step():
            raise KeyError("from the training code")
        assert session.count == 0


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, 0), ("120", 120), (" 7 ", 7), ("-3", 0), ("abc", 0), ("1.5", 0), ("", 0)],
)
def test_resume_step(monkeypatch: pytest.MonkeyPatch, raw: str | None, expected: int) -> None:
    if raw is None:
        monkeypatch.delenv(RESUME_STEP_ENV, raising=False)
    else:
        monkeypatch.setenv(RESUME_STEP_ENV, raw)
    assert sdk.resume_step() == expected
    assert Session().count == expected


def test_the_default_session_is_one_and_counts_steps_from_every_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(SOCKET_ENV, raising=False)
    monkeypatch.setenv(RESUME_STEP_ENV, "50")
    monkeypatch.setattr(sdk, "_default", None)
    seen: list[Session] = []

    def train() -> None:
        seen.append(sdk.default_session())
        for _ in range(2000):
            with sdk.step():
                pass

    threads = [threading.Thread(target=train) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(s) for s in seen}) == 1
    assert sdk.default_session().count == 50 + 8 * 2000
    assert sdk.caps() == Caps(1.0, None, 0, False)
    removed = sdk.on_caps(lambda caps: None)
    removed()


def test_a_forked_child_connects_on_its_own(agent: StubAgent) -> None:
    session = Session(agent_env(agent.path), poll_every=0.0)
    with session.step():
        pass
    agent.wait_for(lambda: agent.hellos)
    pid = os.fork()
    if pid == 0:  # the child: only ever leaves through os._exit
        code = 1
        try:
            with session.step():
                pass
            conn = session._conn
            code = 0 if conn is not None and conn.connects == 2 and conn.connected else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    agent.wait_for(lambda: len(agent.hellos) == 2)
    # The parent's connection is untouched by the child's leaving.
    agent.wait_for(lambda: agent.connections == 1)
    agent.push(0.5, generation=4)
    with session.step():
        pass
    assert session.caps() == Caps(0.5, None, 4, True)


def test_the_sdk_works_alone_on_the_standard_library(tmp_path: Path, agent: StubAgent) -> None:
    """Training images get gangshare/__init__.py and gangshare/sdk/ and nothing else."""
    package = tmp_path / "image" / "gangshare"
    shutil.copytree(SRC / "sdk", package / "sdk", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(SRC / "__init__.py", package / "__init__.py")
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(package.parent)!r})
        import gangshare.sdk as gs
        for _ in range(3):
            with gs.step():
                pass
        stdlib = {{*sys.stdlib_module_names, "__main__"}}
        outside = {{m.split(".")[0] for m in sys.modules}} - stdlib
        assert outside == {{"gangshare"}}, outside
        assert gs.caps().connected
        """
    )
    env = {SOCKET_ENV: agent.path, "PATH": os.environ.get("PATH", "")}
    # -I -S: no site-packages, no PYTHONPATH, no user site; only the copied files.
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", script], env=env, capture_output=True, timeout=30
    )
    assert result.returncode == 0, result.stderr.decode()
    # The last steps arrive through the exit-time flush.
    agent.wait_for(lambda: agent.last_count() == 3)


def test_steps_keep_counting_across_many_reconnect_attempts(sock_path: str, fake: FakeTime) -> None:
    session = fake_session(fake, agent_env(sock_path), retry_every=1.0)
    run_steps(session, fake, 100, busy=0.5)
    conn = session._conn
    assert conn is not None
    assert session.count == 100
    assert 49 <= conn.attempts <= 51
    assert not session.caps().connected
