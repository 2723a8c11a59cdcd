"""Checkpoint on notice (gangshare.sdk.on_preempt): real processes get a real SIGTERM mid-loop,
save at a step boundary, exit 143, and the next attempt resumes from what they saved."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from sdkkit import StubAgent, agent_env

import gangshare.sdk as sdk
from gangshare.sdk import PREEMPTED_EXIT_CODE, Preemption, Session
from gangshare.sdk.env import read_env
from gangshare.sdk.wire import ATTEMPT_ENV, CHECKPOINT_DIR_ENV, PREEMPT_GRACE_ENV

SRC = Path(sdk.__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(60)

# A training loop that counts steps in a checkpoint. `mid_step` is True only inside a step, so
# a save shows whether it ran at a boundary.
TRAIN = textwrap.dedent(
    """
    import json, os, signal, sys, time
    import gangshare.sdk as gs
    total, pause = int(sys.argv[1]), float(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else ""
    path = os.path.join(gs.checkpoint_dir(), "counter.json")
    step, mid_step = 0, False
    if os.path.exists(path):
        with open(path) as f:
            step = json.load(f)["step"]
    print(f"attempt={gs.attempt()} resume={step}", flush=True)

    def save():
        if mode == "failing-save":
            raise RuntimeError("the disk is full")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"step": step, "attempt": gs.attempt(), "mid_step": mid_step}, f)
        os.replace(tmp, path)
        print(f"saved={step}", flush=True)

    if mode == "previous-handler":
        signal.signal(signal.SIGTERM, lambda s, f: print("previous handler", flush=True))
    gs.on_preempt(save)
    while step < total:
        with gs.step(sync=False):
            mid_step = True
            time.sleep(pause)
            step += 1
            mid_step = False
        if step == 5:
            print("running", flush=True)
    print(f"done={step}", flush=True)
    """
)


def start(folder: Path, attempt: int, *args: str, grace: str = "10") -> subprocess.Popen[str]:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(SRC),
        CHECKPOINT_DIR_ENV: str(folder),
        ATTEMPT_ENV: str(attempt),
        PREEMPT_GRACE_ENV: grace,
    }
    return subprocess.Popen(
        [sys.executable, "-c", TRAIN, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_line(proc: subprocess.Popen[str], wanted: str) -> list[str]:
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line.strip())
        if line.strip() == wanted:
            return lines
    raise AssertionError(f"{wanted!r} never came: {lines}, {proc.stderr and proc.stderr.read()}")


def preempt(proc: subprocess.Popen[str], after: str = "running") -> tuple[int, str, str, float]:
    """SIGTERM once `after` is printed; exit code, the rest of stdout and stderr, and how long
    the exit took."""
    wait_for_line(proc, after)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    return proc.returncode, out, err, time.monotonic() - sent


def checkpoint(folder: Path) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((folder / "counter.json").read_text())
    return loaded


def test_sigterm_mid_loop_saves_at_a_step_boundary_and_the_next_attempt_resumes(
    tmp_path: Path,
) -> None:
    code, out, err, took = preempt(start(tmp_path, 0, "100000", "0.01"))
    assert code == PREEMPTED_EXIT_CODE == 143, err
    saved = checkpoint(tmp_path)
    assert saved["attempt"] == 0 and saved["mid_step"] is False
    step = saved["step"]
    assert isinstance(step, int) and step >= 5
    assert out.splitlines() == [f"saved={step}"], out
    assert "notice of preemption" in err and took < 5
    assert not (tmp_path / "counter.json.tmp").exists()

    second = start(tmp_path, 1, str(step + 20), "0.001")
    out, err = second.communicate(timeout=30)
    assert second.returncode == 0, err
    assert out.splitlines()[0] == f"attempt=1 resume={step}"
    assert out.splitlines()[-1] == f"done={step + 20}"


def test_without_a_boundary_within_half_the_grace_the_watchdog_saves_mid_step(
    tmp_path: Path,
) -> None:
    # One step lasts 60 s; the grace is 1 s: the save comes from the watchdog after 0.5 s.
    proc = start(tmp_path, 0, "100", "60", grace="1")
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "attempt=0 resume=0"
    time.sleep(0.3)  # into the first step
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    took = time.monotonic() - sent
    assert proc.returncode == 143, err
    assert checkpoint(tmp_path) == {"step": 0, "attempt": 0, "mid_step": True}
    assert out.strip() == "saved=0"
    assert "no step boundary within 0.5s" in err
    assert 0.4 <= took < 5


def test_a_failing_save_is_reported_and_still_exits_as_preempted(tmp_path: Path) -> None:
    code, out, err, _ = preempt(start(tmp_path, 0, "100000", "0.01", "failing-save"))
    assert code == 143
    assert "the save on preemption failed" in err
    assert "RuntimeError: the disk is full" in err  # the traceback, not just a line
    assert not (tmp_path / "counter.json").exists() and "saved=" not in out


def test_the_handler_it_replaced_runs_after_the_save(tmp_path: Path) -> None:
    code, out, err, _ = preempt(start(tmp_path, 0, "100000", "0.01", "previous-handler"))
    assert code == 143, err
    lines = out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("saved=") and lines[1] == "previous handler"


def test_a_forked_child_does_not_save_on_its_own_sigterm(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import os, signal, sys, time
        import gangshare.sdk as gs
        gs.on_preempt(lambda: print(f"saved in {os.getpid()}", flush=True))
        child = os.fork()
        if child == 0:
            while True:
                time.sleep(0.05)
        time.sleep(0.2)
        os.kill(child, signal.SIGTERM)
        _, status = os.waitpid(child, 0)
        print(f"child ended by signal {os.WTERMSIG(status)}", flush=True)
        """
    )
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(SRC)}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"child ended by signal {int(signal.SIGTERM)}"


class Exits:
    def __init__(self) -> None:
        self.codes: list[int] = []

    def __call__(self, code: int) -> None:
        self.codes.append(code)


class Gate:
    """The watchdog's sleep: over only when the test opens the gate."""

    def __init__(self) -> None:
        self.open = threading.Event()

    def __call__(self, seconds: float) -> None:
        self.open.wait(10)


def test_the_save_runs_once_at_the_next_step_and_the_step_raises_system_exit() -> None:
    session = Session({})
    saves: list[int] = []
    exits, gate = Exits(), Gate()
    notice = Preemption(
        lambda: saves.append(session.count), 60.0, session, sleep=gate, hard_exit=exits
    )
    for _ in range(3):
        with session.step():
            pass
    assert saves == [] and not notice.noticed
    notice.notice()
    notice.notice()  # a second SIGTERM changes nothing
    assert notice.noticed
    with pytest.raises(SystemExit) as ended, session.step():
        pass
    assert ended.value.code == 143
    assert saves == [4] and notice.saved and notice.saved_by == "boundary"
    with session.step():  # nothing is due any more
        pass
    assert saves == [4] and exits.codes == []
    gate.open.set()  # the grace runs out
    deadline = time.monotonic() + 5
    while not exits.codes and time.monotonic() < deadline:
        time.sleep(0.01)
    # The watchdog ends whatever still runs at the end of the grace, and saves no more.
    assert exits.codes == [143] and saves == [4]


def test_a_step_on_another_thread_saves_there_and_ends_the_process() -> None:
    session = Session({})
    exits = Exits()
    saved_on: list[str] = []
    notice = Preemption(
        lambda: saved_on.append(threading.current_thread().name),
        60.0,
        session,
        sleep=Gate(),  # the watchdog's own exit comes too late to count
        hard_exit=exits,
    )
    notice.notice()

    def train() -> None:
        # The fake exit returns; a real one would not get this far.
        with contextlib.suppress(SystemExit), session.step():
            pass

    worker = threading.Thread(target=train, name="trainer")
    worker.start()
    worker.join(5)
    # SystemExit would end only that thread: the process is ended outright instead.
    assert saved_on == ["trainer"] and exits.codes == [143]


def test_a_notice_ends_a_pause_the_agent_imposed(agent: StubAgent) -> None:
    session = Session(agent_env(agent.path), poll_every=0.0, retry_every=0.1)
    saves: list[int] = []
    notice = Preemption(
        lambda: saves.append(session.count), 60.0, session, sleep=Gate(), hard_exit=Exits()
    )
    with session.step():
        pass
    agent.wait_for(lambda: agent.hellos)
    agent.push(0.0, generation=1)  # paused until the agent says otherwise, which it never does
    threading.Timer(0.3, notice.notice).start()
    started = time.monotonic()
    with pytest.raises(SystemExit), session.step():
        pass
    assert time.monotonic() - started < 3
    assert saves == [2]


def test_on_preempt_takes_sigterm_and_gives_it_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PREEMPT_GRACE_ENV, "12")
    monkeypatch.setattr(sdk, "_preemption", None)
    before = signal.getsignal(signal.SIGTERM)
    first = sdk.on_preempt(lambda: None, session=Session({}))
    try:
        assert first.grace_seconds == 12.0
        assert signal.getsignal(signal.SIGTERM) == first._handle
        second = sdk.on_preempt(lambda: None, 3, session=Session({}))
        assert second.grace_seconds == 3.0
        assert signal.getsignal(signal.SIGTERM) == second._handle
        assert not sdk.preempted()
        second.remove()
        assert signal.getsignal(signal.SIGTERM) == before
    finally:
        signal.signal(signal.SIGTERM, before)
    with pytest.raises(ValueError, match="grace_seconds"):
        Preemption(lambda: None, -1.0, Session({}))
    failed: list[BaseException] = []

    def elsewhere() -> None:
        try:
            sdk.on_preempt(lambda: None, session=Session({}))
        except RuntimeError as err:
            failed.append(err)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert failed and "main thread" in str(failed[0])


@pytest.mark.parametrize(
    ("env", "folder", "attempt", "grace"),
    [
        ({}, None, 0, None),
        ({CHECKPOINT_DIR_ENV: "/ckpt", ATTEMPT_ENV: "3", PREEMPT_GRACE_ENV: "30"}, "/ckpt", 3, 30),
        ({CHECKPOINT_DIR_ENV: "", ATTEMPT_ENV: "-1", PREEMPT_GRACE_ENV: "soon"}, None, 0, None),
        ({ATTEMPT_ENV: "x", PREEMPT_GRACE_ENV: "nan"}, None, 0, None),
        ({PREEMPT_GRACE_ENV: "2.5"}, None, 0, 2.5),
    ],
)
def test_the_environment_of_an_attempt(
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    folder: str | None,
    attempt: int,
    grace: float | None,
) -> None:
    for name in (CHECKPOINT_DIR_ENV, ATTEMPT_ENV, PREEMPT_GRACE_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert (sdk.checkpoint_dir(), sdk.attempt()) == (folder, attempt)
    assert read_env(os.environ).preempt_grace_seconds == grace
