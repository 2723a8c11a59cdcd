"""Failure classes and retry decisions (Philly, ATC 2019: ~30% of jobs fail; user errors
fail early and repeat, infrastructure errors fail late and go away on another try)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# Reasons that do not change when the same spec runs again.
USER_WAITING_REASONS = frozenset(
    {
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
# The kubelet could not pull the image. Usually the registry or the network (timeouts, 5xx,
# rate limits): the kubelet retries on its own, and a gang that still cannot pull is restarted
# as an infrastructure failure with back-off. Only an image that does not exist or may not be
# pulled repeats identically, and fails fast as the user's error.
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff"})
IMAGE_PULL_USER_MARKERS = (
    "not found",
    "manifest unknown",
    "name unknown",
    "repository does not exist",
    "does not exist or may require",
    "pull access denied",
    "unauthorized",
    "authentication required",
    "denied",
    "invalid reference format",
)
# How long the kubelet's own pull retries get before the gang is restarted elsewhere.
DEFAULT_IMAGE_PULL_GRACE_SECONDS = 300.0
# The pod went away under the job: node, eviction, preemption, kubelet admission.
INFRA_POD_REASONS = frozenset(
    {
        "Evicted",
        "NodeLost",
        "Preempting",
        "Terminated",
        "NodeShutdown",
        "UnexpectedAdmissionError",
        "Deleted",
    }
)
SIGNAL_EXIT_CODES = frozenset({137, 143})
# A non-zero exit this soon after start is the user's code or config, not the machine.
EARLY_FAILURE_SECONDS = 600.0


class FailureClass(StrEnum):
    USER = "User"
    INFRASTRUCTURE = "Infrastructure"


@dataclass(frozen=True)
class FailureSignal:
    """What Kubernetes said about a worker that stopped without succeeding."""

    exit_code: int | None = None
    terminated_reason: str | None = None  # container state, e.g. "Error", "OOMKilled"
    waiting_reason: str | None = None  # container state, e.g. "ImagePullBackOff"
    pod_reason: str | None = None  # pod status, e.g. "Evicted"
    seconds_since_start: float | None = None
    message: str = ""


@dataclass(frozen=True)
class Failure:
    failure_class: FailureClass
    reason: str  # CamelCase, for events and status.lastFailure.reason
    message: str


def classify_failure(signal: FailureSignal) -> Failure:
    if signal.pod_reason in INFRA_POD_REASONS:
        return Failure(
            FailureClass.INFRASTRUCTURE,
            signal.pod_reason or "PodLost",
            signal.message or f"worker pod {signal.pod_reason}",
        )
    if signal.waiting_reason in USER_WAITING_REASONS:
        return Failure(
            FailureClass.USER,
            signal.waiting_reason or "ConfigError",
            signal.message or f"container cannot start: {signal.waiting_reason}",
        )
    if signal.terminated_reason == "OOMKilled":
        return Failure(FailureClass.USER, "OOMKilled", "worker exceeded its memory limit")
    code = signal.exit_code
    what = signal.message or f"worker exited with code {code}"
    if code in SIGNAL_EXIT_CODES:
        return Failure(
            FailureClass.INFRASTRUCTURE, "KilledBySignal", f"{what} (killed by a signal)"
        )
    ran = signal.seconds_since_start
    if ran is not None and ran < EARLY_FAILURE_SECONDS:
        return Failure(FailureClass.USER, "ErrorExitEarly", f"{what} after {ran:.0f}s")
    after = "" if ran is None else f" after {ran:.0f}s"
    return Failure(
        FailureClass.INFRASTRUCTURE,
        "ErrorExitLate",
        f"{what}{after}; a late failure is retried as infrastructure",
    )


def classify_image_pull(
    reason: str, message: str, waited_seconds: float, grace_seconds: float, worker: str
) -> Failure | None:
    """A failure for a worker stuck pulling its image, or None while the kubelet may still
    succeed (a transient error inside its grace)."""
    text = message.lower()
    if any(marker in text for marker in IMAGE_PULL_USER_MARKERS):
        return Failure(
            FailureClass.USER,
            "ImageNotPullable",
            f"{worker}: {reason}: {message}".rstrip(": ")
            + " (the image does not exist or may not be pulled)",
        )
    if waited_seconds < grace_seconds:
        return None
    return Failure(
        FailureClass.INFRASTRUCTURE,
        "ImagePullFailing",
        f"{worker}: {reason} for {waited_seconds:.0f}s: {message}".rstrip(": "),
    )


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 3
    # User errors repeat: by default the first one fails the job.
    user_error_retries: int = 0
    backoff_base_seconds: float = 10.0
    backoff_cap_seconds: float = 600.0


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    delay_seconds: float
    reason: str


def decide_retry(
    failure: Failure, restarts: int, user_failures: int, policy: RetryPolicy
) -> RetryDecision:
    """restarts: gang restarts so far; user_failures: user-class failures, this one included."""
    if failure.failure_class is FailureClass.USER and user_failures > policy.user_error_retries:
        return RetryDecision(False, 0.0, f"user error, not retried: {failure.message}")
    if restarts >= policy.max_retries:
        return RetryDecision(
            False, 0.0, f"retries exhausted ({restarts} of {policy.max_retries}): {failure.message}"
        )
    delay = min(policy.backoff_cap_seconds, policy.backoff_base_seconds * 2**restarts)
    return RetryDecision(
        True,
        delay,
        f"restart {restarts + 1} of {policy.max_retries} in {delay:.0f}s: {failure.message}",
    )
