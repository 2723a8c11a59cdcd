"""Status conditions the Kubernetes way: type/status/reason/message/lastTransitionTime."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def iso(when: float) -> str:
    return datetime.fromtimestamp(when, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: list[dict[str, Any]] | None,
    kind: str,
    status: bool,
    reason: str,
    message: str,
    now: float,
    generation: int,
) -> list[dict[str, Any]]:
    """A new condition list; lastTransitionTime moves only when the status flips."""
    value = "True" if status else "False"
    result = []
    found = False
    for condition in conditions or []:
        if condition.get("type") != kind:
            result.append(condition)
            continue
        found = True
        changed = condition.get("status") != value
        result.append(
            {
                "type": kind,
                "status": value,
                "reason": reason,
                "message": message,
                "lastTransitionTime": iso(now)
                if changed
                else condition.get("lastTransitionTime", iso(now)),
                "observedGeneration": generation,
            }
        )
    if not found:
        result.append(
            {
                "type": kind,
                "status": value,
                "reason": reason,
                "message": message,
                "lastTransitionTime": iso(now),
                "observedGeneration": generation,
            }
        )
    return result


def condition(conditions: list[dict[str, Any]] | None, kind: str) -> dict[str, Any] | None:
    return next((c for c in conditions or [] if c.get("type") == kind), None)
