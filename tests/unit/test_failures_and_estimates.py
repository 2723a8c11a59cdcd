"""Failure classes, retry decisions, and run-time prediction."""

import pytest

from gangshare.core.estimate import RuntimeEstimator
from gangshare.core.failures import (
    FailureClass,
    FailureSignal,
    GpuTenant,
    RetryPolicy,
    classify_failure,
    classify_image_pull,
    decide_retry,
    shared_with,
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


TORCH_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.10 GiB of which 1.12 GiB is free."
)


@pytest.mark.parametrize(
    "last_words",
    [
        TORCH_OOM,
        "RuntimeError: CUDA error: out of memory",
        "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
        "NCCL WARN Cuda failure 'out of memory'",
        "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to "
        "allocate 4294967296 bytes.",
    ],
)
def test_a_gpu_out_of_memory_beside_an_opportunistic_tenant_is_infrastructure(last_words):
    # Early, so without the tenant it would be the user's (ErrorExitEarly, never retried).
    signal = FailureSignal(
        exit_code=1,
        seconds_since_start=30,
        message="worker 0 container trainer exited with code 1",
        termination_message=last_words,
        shared_with=("lab/opp-0",),
    )
    failure = classify_failure(signal)
    assert (failure.failure_class, failure.reason) == (INFRA, "SharedGpuOutOfMemory")
    assert "lab/opp-0" in failure.message and "not charged" in failure.message
    # Retried with back-off, and not counted against the user's error budget.
    assert decide_retry(failure, 0, 0, RetryPolicy()).retry


@pytest.mark.parametrize(
    ("last_words", "tenants", "reason"),
    [
        (TORCH_OOM, (), "ErrorExitEarly"),  # nobody shared the GPU: the job's own
        ("ValueError: bad learning rate", ("lab/opp-0",), "ErrorExitEarly"),  # not an OOM
        ("", ("lab/opp-0",), "ErrorExitEarly"),  # no last words: nothing says OOM
    ],
)
def test_other_early_failures_stay_the_users(last_words, tenants, reason):
    signal = FailureSignal(
        exit_code=1, seconds_since_start=30, termination_message=last_words, shared_with=tenants
    )
    failure = classify_failure(signal)
    assert (failure.failure_class, failure.reason) == (USER, reason)


def test_a_host_memory_kill_stays_the_users_even_beside_a_tenant():
    # OOMKilled is the container's own memory limit, which no GPU tenant touches.
    signal = FailureSignal(
        exit_code=137,
        terminated_reason="OOMKilled",
        termination_message=TORCH_OOM,
        shared_with=("lab/opp-0",),
    )
    assert classify_failure(signal).failure_class is USER


@pytest.mark.parametrize(
    ("worker_gpus", "tenant", "shared"),
    [
        (frozenset({0, 1}), GpuTenant("lab/a", frozenset({1}), 100.0), True),  # same GPU
        (frozenset({0, 1}), GpuTenant("lab/a", frozenset({2, 3}), 100.0), False),  # others
        # Not known for either side: the same node is enough.
        (None, GpuTenant("lab/a", frozenset({2}), 100.0), True),
        (frozenset({0}), GpuTenant("lab/a", None, 100.0), True),
        # Started after the worker ended (at 200): it cannot have taken its memory.
        (frozenset({0}), GpuTenant("lab/a", frozenset({0}), 200.5), False),
        (frozenset({0}), GpuTenant("lab/a", frozenset({0}), None), True),  # start unknown
    ],
)
def test_who_may_have_shared_the_workers_gpus(worker_gpus, tenant, shared):
    assert shared_with(worker_gpus, 200.0, [tenant]) == (("lab/a",) if shared else ())


def test_the_message_names_a_few_tenants_and_counts_the_rest():
    tenants = [GpuTenant(f"lab/t{i}", None) for i in range(5)]
    names = shared_with(frozenset({0}), None, tenants)
    assert names == ("lab/t0", "lab/t1", "lab/t2", "lab/t3", "lab/t4")
    signal = FailureSignal(exit_code=1, termination_message=TORCH_OOM, shared_with=names)
    assert "lab/t0, lab/t1, lab/t2 and 2 more shared" in classify_failure(signal).message


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
