"""Failure classes, retry decisions, and run-time prediction."""

import pytest

from gangshare.core.estimate import RuntimeEstimator
from gangshare.core.failures import (
    FailureClass,
    FailureSignal,
    RetryPolicy,
    classify_failure,
    classify_image_pull,
    decide_retry,
)

USER, INFRA = FailureClass.USER, FailureClass.INFRASTRUCTURE


@pytest.mark.parametrize(
    ("signal", "cls", "reason"),
    [
        (FailureSignal(pod_reason="Evicted"), INFRA, "Evicted"),
        (FailureSignal(pod_reason="NodeLost"), INFRA, "NodeLost"),
        (FailureSignal(waiting_reason="InvalidImageName"), USER, "InvalidImageName"),
        (
            FailureSignal(waiting_reason="CreateContainerConfigError"),
            USER,
            "CreateContainerConfigError",
        ),
        (FailureSignal(exit_code=137, terminated_reason="OOMKilled"), USER, "OOMKilled"),
        (FailureSignal(exit_code=137, seconds_since_start=5000), INFRA, "KilledBySignal"),
        (FailureSignal(exit_code=1, seconds_since_start=30), USER, "ErrorExitEarly"),
        (FailureSignal(exit_code=1, seconds_since_start=7200), INFRA, "ErrorExitLate"),
    ],
)
def test_failures_are_classified(signal, cls, reason):
    failure = classify_failure(signal)
    assert (failure.failure_class, failure.reason) == (cls, reason)
    assert failure.message


def test_infrastructure_failures_retry_with_exponential_backoff_until_exhausted():
    failure = classify_failure(FailureSignal(pod_reason="NodeLost"))
    policy = RetryPolicy(max_retries=3, backoff_base_seconds=10, backoff_cap_seconds=25)
    decisions = [decide_retry(failure, restarts, 0, policy) for restarts in range(4)]
    assert [d.retry for d in decisions] == [True, True, True, False]
    assert [d.delay_seconds for d in decisions[:3]] == [10, 20, 25]
    assert decisions[3].reason.startswith("retries exhausted (3 of 3)")


def test_user_errors_fail_fast_unless_policy_allows_a_retry():
    failure = classify_failure(FailureSignal(exit_code=2, seconds_since_start=3))
    assert not decide_retry(failure, 0, 1, RetryPolicy()).retry
    lenient = RetryPolicy(user_error_retries=1)
    assert decide_retry(failure, 0, 1, lenient).retry
    assert not decide_retry(failure, 1, 2, lenient).retry


def test_estimator_prefers_history_then_declared_then_default():
    # More cases in test_estimate.py.
    estimator = RuntimeEstimator(default_seconds=100)
    assert estimator.predict("q", 4) == 100
    for seconds in (10, 30, 20):
        estimator.observe("q", 4, seconds)
    assert estimator.predict("q", 4) == 20
    assert estimator.predict("q", 8) == 100
    assert estimator.predict("q", 8, declared=7) == 7
    assert estimator.predict("q", 4, declared=7) == 20  # measured history beats a declaration


@pytest.mark.parametrize(
    ("message", "waited", "expected"),
    [
        # Transient registry trouble: the kubelet retries first, then the gang restarts.
        ("dial tcp 10.0.0.5:443: i/o timeout", 30, None),
        ("dial tcp 10.0.0.5:443: i/o timeout", 300, (INFRA, "ImagePullFailing")),
        (
            "received unexpected HTTP status: 503 Service Unavailable",
            400,
            (INFRA, "ImagePullFailing"),
        ),
        ("toomanyrequests: You have reached your pull rate limit", 10, None),
        ("", 299, None),
        # The image does not exist or may not be pulled: it repeats, so it fails fast.
        (
            'failed to resolve reference "r.io/t:9": r.io/t:9: not found',
            1,
            (USER, "ImageNotPullable"),
        ),
        (
            "pull access denied, repository does not exist or may require authorization",
            1,
            (USER, "ImageNotPullable"),
        ),
        ("unexpected status from HEAD request: 401 Unauthorized", 1, (USER, "ImageNotPullable")),
    ],
)
def test_image_pull_errors_are_classified_by_what_the_registry_said(message, waited, expected):
    failure = classify_image_pull("ErrImagePull", message, waited, 300, "worker 0")
    assert (None if failure is None else (failure.failure_class, failure.reason)) == expected
