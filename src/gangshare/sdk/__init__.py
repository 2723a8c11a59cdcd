"""The training SDK used inside worker pods: reports step times, obeys memory and SM caps.

    import gangshare.sdk as gs

    for batch in loader:
        with gs.step():
            loss = model(batch).sum()
            loss.backward()
            optimizer.step()

or, with PyTorch, `gs.hook(optimizer)` once and no change to the loop. `gs.on_preempt(save)`
saves before a reclaim or an eviction takes the GPUs (gangshare.sdk.preempt), into
`gs.checkpoint_dir()`, the same folder for every attempt of the job. Standard library only,
and nothing else of gangshare: training images get this package alone. Without an agent
(GANGSHARE_AGENT_SOCKET unset) everything here is a near-free no-op that still counts steps.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from gangshare.sdk.caps import Caps, CapsCallback
from gangshare.sdk.env import read_env
from gangshare.sdk.preempt import DEFAULT_GRACE_SECONDS, PREEMPTED_EXIT_CODE, Preemption
from gangshare.sdk.session import SDK_VERSION, Session

__all__ = [
    "PREEMPTED_EXIT_CODE",
    "SDK_VERSION",
    "Caps",
    "CapsCallback",
    "Hook",
    "Preemption",
    "Session",
    "attempt",
    "caps",
    "checkpoint_dir",
    "default_session",
    "hook",
    "on_caps",
    "on_preempt",
    "preempted",
    "resume_step",
    "step",
]

_default: Session | None = None
_default_lock = threading.Lock()
_preemption: Preemption | None = None


def default_session() -> Session:
    """The process's session, made from the environment on first use."""
    global _default
    current = _default
    if current is None:
        with _default_lock:
            if _default is None:
                _default = Session()
                atexit.register(_default.close)
            current = _default
    return current


def step(sync: bool = True) -> AbstractContextManager[None]:
    """Wrap one mini-batch. `sync` waits for CUDA's queued work before the step's end time
    is read (only where torch has CUDA running), so the time is the GPU's."""
    return default_session().step(sync)


def caps() -> Caps:
    return default_session().caps()


def on_caps(fn: CapsCallback) -> Callable[[], None]:
    """Call `fn(caps)` on every change of caps; returns a function that unregisters it."""
    return default_session().on_caps(fn)


def resume_step() -> int:
    """The step a requeued job resumes from (GANGSHARE_RESUME_STEP), 0 when unset or bad."""
    return read_env(os.environ).resume_step


def checkpoint_dir() -> str | None:
    """The job's checkpoint folder (GANGSHARE_CHECKPOINT_DIR, from spec.checkpoint.path): the
    same for every attempt, on a volume that outlives the pods. None when the job names none."""
    return read_env(os.environ).checkpoint_dir


def attempt() -> int:
    """This run's attempt (GANGSHARE_ATTEMPT): 0 first, one more after every requeue or restart
    (status.attempt, the pods' gangshare.io/attempt label); 0 when unset or bad."""
    return read_env(os.environ).attempt


def on_preempt(
    save: Callable[[], None],
    grace_seconds: float | None = None,
    *,
    session: Session | None = None,
) -> Preemption:
    """Call `save()` once when the job is told to stop (SIGTERM: a reclaim, an eviction for
    memory, any deletion of the pod), at the next step boundary, then exit with 143.

    Call it from the main thread. `grace_seconds` bounds the whole thing (default: the pod's
    grace, GANGSHARE_PREEMPT_GRACE_SECONDS, else 30 s): without a boundary within half of it,
    `save()` runs on a watchdog thread mid-step. A second call replaces the first. Write the
    checkpoint atomically (a temporary file, then os.replace): a save cut short by SIGKILL
    must not leave a torn one behind.
    """
    global _preemption
    if grace_seconds is None:
        found = read_env(os.environ).preempt_grace_seconds
        grace_seconds = DEFAULT_GRACE_SECONDS if found is None else found
    fresh = Preemption(save, grace_seconds, session or default_session())
    if _preemption is not None:
        _preemption.remove()
    _preemption = fresh.install()
    return fresh


def preempted() -> bool:
    """Whether notice has come: the save and the exit follow at the next step boundary."""
    return _preemption is not None and _preemption.noticed


class _RemovableHandle(Protocol):
    def remove(self) -> None: ...


class Hook:
    """A registration of `hook`; `remove()` ends it."""

    def __init__(self, handle: _RemovableHandle) -> None:
        self._handle = handle

    def remove(self) -> None:
        self._handle.remove()


def hook(optimizer: Any, *, sync: bool = True, session: Session | None = None) -> Hook:
    """Mark a step boundary after every `optimizer.step()` (PyTorch 2.0 or later).

    The step time is the time between consecutive optimizer steps less the SDK's own pacing.
    One optimizer per process: two would mark every step twice.
    """
    register = getattr(optimizer, "register_step_post_hook", None)
    if register is None:
        raise TypeError("hook() needs an optimizer with register_step_post_hook (torch>=2.0)")
    target = session or default_session()

    def after_step(_optimizer: Any, _args: Any, _kwargs: Any) -> None:
        target.mark(sync)

    return Hook(register(after_step))
