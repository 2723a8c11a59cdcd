"""What the node agent's Allocate and the operator put in a training container's environment.

Anything malformed reads as unset: a typo in a pod spec must not stop training.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gangshare.sdk.wire import (
    ATTEMPT_ENV,
    CHECKPOINT_DIR_ENV,
    MEMORY_CAP_ENV,
    PREEMPT_GRACE_ENV,
    RESUME_STEP_ENV,
    SM_CAP_ENV,
    SOCKET_ENV,
)


@dataclass(frozen=True)
class EnvSettings:
    socket_path: str | None
    # The static caps of the share slots held: what applies until the agent says otherwise,
    # and again once it has been gone too long.
    duty: float
    memory_mib: int | None
    resume_step: int
    checkpoint_dir: str | None = None
    attempt: int = 0
    preempt_grace_seconds: float | None = None


def read_env(env: Mapping[str, str]) -> EnvSettings:
    return EnvSettings(
        socket_path=env.get(SOCKET_ENV) or None,
        duty=_duty(env.get(SM_CAP_ENV)),
        memory_mib=_non_negative(env.get(MEMORY_CAP_ENV)),
        resume_step=_non_negative(env.get(RESUME_STEP_ENV)) or 0,
        checkpoint_dir=env.get(CHECKPOINT_DIR_ENV) or None,
        attempt=_non_negative(env.get(ATTEMPT_ENV)) or 0,
        preempt_grace_seconds=_seconds(env.get(PREEMPT_GRACE_ENV)),
    )


def _duty(raw: str | None) -> float:
    # Allocate writes the SM share as a fraction ("0.2500"). Zero would pause a job that has
    # no agent to resume it, so it counts as malformed too.
    try:
        value = float(raw) if raw is not None else 1.0
    except ValueError:
        return 1.0
    return value if 0.0 < value <= 1.0 else 1.0


def _non_negative(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        return None
    return value if value >= 0 else None


def _seconds(raw: str | None) -> float | None:
    try:
        value = float(raw) if raw is not None else None
    except ValueError:
        return None
    return value if value is not None and 0.0 <= value < float("inf") else None
