"""The training SDK used inside worker pods: reports step times, obeys memory and SM caps.

    import gangshare.sdk as gs

    for batch in loader:
        with gs.step():
            loss = model(batch).sum()
            loss.backward()
            optimizer.step()

or, with PyTorch, `gs.hook(optimizer)` once and no change to the loop. Standard library only,
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
from gangshare.sdk.session import SDK_VERSION, Session

__all__ = [
    "SDK_VERSION",
    "Caps",
    "CapsCallback",
    "Hook",
    "Session",
    "caps",
    "default_session",
    "hook",
    "on_caps",
    "resume_step",
    "step",
]

_default: Session | None = None
_default_lock = threading.Lock()


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
