"""The SDK <-> node agent protocol: newline-delimited JSON over the unix socket Allocate mounts.

Standard library only: both sides import it, and the SDK runs in training images that have
nothing else of gangshare.

Who is speaking is never taken from a message: the agent reads the peer's PID from the
socket (SO_PEERCRED) and maps it through its cgroup to a pod, so a tenant cannot report
steps for, or take caps of, another pod.

SDK -> agent, one object per line:
    {"v": 1, "hello": {"sdk": "<version>", "torch": true|false}}
    {"v": 1, "steps": [<seconds>, ...], "count": <steps completed so far>}
Agent -> SDK:
    {"v": 1, "caps": {"duty": <0..1>, "memoryMiB": <int or null>, "generation": <int>}}
    {"v": 1, "error": "<why the agent will not serve this connection>"}
Unknown keys are ignored on both sides, so either side can be upgraded first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

VERSION = 1
# Env vars Allocate sets in a container that holds share slots.
SOCKET_ENV = "GANGSHARE_AGENT_SOCKET"
MEMORY_CAP_ENV = "GANGSHARE_MEMORY_CAP_MIB"
SM_CAP_ENV = "GANGSHARE_SM_CAP"
# Set by the operator on a requeued job's pods: the steps its last run reported.
RESUME_STEP_ENV = "GANGSHARE_RESUME_STEP"
# Set by the operator on every worker: the job's checkpoint folder (spec.checkpoint.path, the
# same for every attempt), the attempt (status.attempt, 0 first: the pods' gangshare.io/attempt
# label), and the pod's termination grace, which bounds a save on notice (gangshare.sdk.preempt).
CHECKPOINT_DIR_ENV = "GANGSHARE_CHECKPOINT_DIR"
ATTEMPT_ENV = "GANGSHARE_ATTEMPT"
PREEMPT_GRACE_ENV = "GANGSHARE_PREEMPT_GRACE_SECONDS"
# One line never needs more; a longer one is a broken or hostile peer.
MAX_LINE = 64 * 1024
# Step times a single report may carry; the SDK batches, the agent caps what it reads.
MAX_STEPS_PER_REPORT = 256


class WireError(ValueError):
    pass


@dataclass(frozen=True)
class WireCaps:
    duty: float
    memory_mib: int | None
    generation: int


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps({"v": VERSION, **message}, separators=(",", ":")) + "\n").encode()


def decode(line: bytes) -> dict[str, Any]:
    if len(line) > MAX_LINE:
        raise WireError(f"line of {len(line)} bytes is over the {MAX_LINE}-byte limit")
    try:
        message = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise WireError(f"not JSON: {err}") from None
    if not isinstance(message, dict):
        raise WireError("not a JSON object")
    return message


def caps_message(caps: WireCaps) -> bytes:
    return encode(
        {
            "caps": {
                "duty": caps.duty,
                "memoryMiB": caps.memory_mib,
                "generation": caps.generation,
            }
        }
    )


def read_caps(message: dict[str, Any]) -> WireCaps | None:
    raw = message.get("caps")
    if not isinstance(raw, dict):
        return None
    duty = raw.get("duty")
    memory = raw.get("memoryMiB")
    generation = raw.get("generation", 0)
    if not isinstance(duty, int | float) or isinstance(duty, bool) or not 0.0 <= duty <= 1.0:
        raise WireError(f"caps.duty: {duty!r} is not a number between 0 and 1")
    if memory is not None and (
        not isinstance(memory, int) or isinstance(memory, bool) or memory < 0
    ):
        raise WireError(f"caps.memoryMiB: {memory!r} is not a non-negative integer")
    if not isinstance(generation, int) or isinstance(generation, bool):
        raise WireError(f"caps.generation: {generation!r} is not an integer")
    return WireCaps(float(duty), memory, generation)


def read_steps(message: dict[str, Any]) -> tuple[tuple[float, ...], int | None]:
    """Step times and the completed-step count from a report; bad entries are refused."""
    raw = message.get("steps")
    if raw is None:
        return (), None
    if not isinstance(raw, list) or len(raw) > MAX_STEPS_PER_REPORT:
        raise WireError(f"steps: must be a list of at most {MAX_STEPS_PER_REPORT} numbers")
    steps: list[float] = []
    for i, value in enumerate(raw):
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise WireError(f"steps[{i}]: {value!r} is not a positive number of seconds")
        if value > 86400:
            raise WireError(f"steps[{i}]: {value!r} s is longer than a day")
        steps.append(float(value))
    count = message.get("count")
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 0):
        raise WireError(f"count: {count!r} is not a non-negative integer")
    return tuple(steps), count


def hello_message(sdk: str, torch: bool) -> bytes:
    return encode({"hello": {"sdk": sdk, "torch": torch}})


def steps_message(steps: list[float], count: int) -> bytes:
    return encode({"steps": steps[-MAX_STEPS_PER_REPORT:], "count": count})


def read_error(message: dict[str, Any]) -> str | None:
    error = message.get("error")
    return error if isinstance(error, str) else None
