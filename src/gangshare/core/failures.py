"""Failure classes and retry decisions (Philly, ATC 2019: ~30% of jobs fail; user errors
fail early and repeat, infrastructure errors fail late and go away on another try).

A GPU out-of-memory error is the job's own, unless an opportunistic tenant shared the GPU
while the worker ran: a tenant over its memory cap is evicted only after a grace
(core/enforcement.py), and a guaranteed job that ran out of memory meanwhile is the
infrastructure's failure, retried and not charged to its user.
"""

from __future__ import annotations

from collections.abc import Iterable
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
# How running out of GPU memory reads in a worker's last words (lower case): PyTorch, the CUDA
# runtime and driver, cuBLAS and cuDNN, NCCL, XLA.
GPU_OUT_OF_MEMORY_MARKERS = (
    "cuda out of memory",
    "outofmemoryerror",
    "cuda error: out of memory",
    "cudaerrormemoryallocation",
    "cuda_error_out_of_memory",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
    "cuda failure 'out of memory'",
    "resource_exhausted: out of memory",
)
# Tenants named in a failure's message, at most.
NAMED_TENANTS = 3


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
    # The container's own last words (its termination message).
    termination_message: str = ""
    # Opportunistic tenants that may have shared the worker's GPUs while it ran.
    shared_with: tuple[str, ...] = ()


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
    if signal.shared_with and gpu_out_of_memory(signal.termination_message):
        return Failure(
            FailureClass.INFRASTRUCTURE,
            "SharedGpuOutOfMemory",
            f"{what}: out of GPU memory while {_named(signal.shared_with)} shared its GPUs; "
            "retried as infrastructure, not charged to the job",
        )
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


def gpu_out_of_memory(text: str) -> bool:
    """Whether a worker's last words say it ran out of GPU memory."""
    lowered = text.lower()
    return any(marker in lowered for marker in GPU_OUT_OF_MEMORY_MARKERS)


@dataclass(frozen=True)
class GpuTenant:
    """An opportunistic pod on a failed worker's node, as far as the failure's class goes."""

    name: str
    gpus: frozenset[int] | None  # the GPU indices it holds; None when not recorded
    started_at: float | None = None  # None when not known


def shared_with(
    worker_gpus: frozenset[int] | None, ended_at: float | None, tenants: Iterable[GpuTenant]
) -> tuple[str, ...]:
    """The tenants that may have shared the worker's GPUs while it ran. Conservative: one on
    the same GPU, or anywhere on the node where either side's GPUs are not known; only a
    tenant that started after the worker ended is ruled out by time."""
    names = []
    for tenant in tenants:
        if ended_at is not None and tenant.started_at is not None and tenant.started_at > ended_at:
            continue
        if worker_gpus is None or tenant.gpus is None or worker_gpus & tenant.gpus:
            names.append(tenant.name)
    return tuple(sorted(names))


def _named(tenants: tuple[str, ...]) -> str:
    shown = ", ".join(tenants[:NAMED_TENANTS])
    more = len(tenants) - NAMED_TENANTS
    return f"{shown} and {more} more" if more > 0 else shown


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
