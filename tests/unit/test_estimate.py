"""Run-time prediction: fallback order, robustness of the quantile, job-name groups."""

import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gangshare.core.estimate import Prediction, RuntimeEstimator, Source, name_group, quantile

runs = st.lists(st.floats(min_value=1.0, max_value=1e7), min_size=1, max_size=60)


def test_each_rule_applies_only_when_the_ones_before_it_have_nothing():
    est = RuntimeEstimator(default_seconds=100, queue_defaults={"q": 600}, min_samples=3)
    assert est.prediction("q", 4) == Prediction(600, Source.DEFAULT)
    assert est.prediction("other", 4) == Prediction(100, Source.DEFAULT)
    assert est.prediction("q", 4, 50, group="bert") == Prediction(50, Source.DECLARED)

    est.observe("q", 4, 1000, group="gpt")
    # Another group's runs of the same queue and size beat the declaration.
    assert est.prediction("q", 4, 50, group="bert") == Prediction(1000, Source.HISTORY_QUEUE, 1)

    for seconds in (10, 30):
        est.observe("q", 4, seconds, group="bert")
    # Two runs of its own group are too few: the queue's history (1000, 10, 30) still speaks.
    assert est.prediction("q", 4, group="bert").source is Source.HISTORY_QUEUE
    assert est.predict("q", 4, group="bert") == 30
    est.observe("q", 4, 20, group="bert")
    assert est.prediction("q", 4, 50, group="bert") == Prediction(20, Source.HISTORY, 3)

    # History is per GPU count and per queue.
    assert est.prediction("q", 8, group="bert").source is Source.DEFAULT
    assert est.prediction("r", 4, group="bert").source is Source.DEFAULT


def test_without_a_group_it_predicts_what_the_median_of_the_last_runs_did():
    # The simulator and the operator call it without groups; q=0.5 must stay the old median.
    est = RuntimeEstimator(history=4)
    for seconds in (5, 1, 9, 7, 3, 2):
        est.observe("q", 1, seconds)
    assert est.predict("q", 1) == statistics.median([9, 7, 3, 2])


def test_failed_or_nonsense_runs_are_not_history():
    est = RuntimeEstimator(default_seconds=100)
    for seconds in (0, -5, float("nan"), float("inf")):
        est.observe("q", 1, seconds, group="g")
    assert est.prediction("q", 1, group="g").source is Source.DEFAULT


def test_one_runaway_run_barely_moves_the_prediction():
    est = RuntimeEstimator(min_samples=1)
    for seconds in (100, 110, 90, 105, 95):
        est.observe("q", 1, seconds, group="g")
    before = est.predict("q", 1, group="g")
    est.observe("q", 1, 1e7, group="g")
    assert before == 100
    assert est.predict("q", 1, group="g") == 102.5  # the mean would be ~1.7e6


def test_a_higher_quantile_predicts_longer():
    low, high = RuntimeEstimator(quantile=0.5), RuntimeEstimator(quantile=0.9)
    for seconds in range(1, 11):
        low.observe("q", 1, seconds)
        high.observe("q", 1, seconds)
    assert low.predict("q", 1) == 5.5
    assert high.predict("q", 1) == pytest.approx(9.1)
    explained = high.prediction("q", 1).explain()
    assert explained == "p90 of 10 finished runs of its queue at this GPU count"
    assert low.prediction("q", 1).explain().startswith("median of 10")


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="quantile"):
        RuntimeEstimator(quantile=1.5)
    with pytest.raises(ValueError, match="at least 1"):
        RuntimeEstimator(min_samples=0)


@given(runs, st.floats(min_value=0.0, max_value=1.0))
def test_the_prediction_lies_within_the_recent_runs(values, q):
    est = RuntimeEstimator(quantile=q, history=50, min_samples=1)
    for seconds in values:
        est.observe("q", 2, seconds, group="g")
    recent = values[-50:]
    got = est.prediction("q", 2, group="g")
    assert got.source is Source.HISTORY and got.samples == len(recent)
    assert min(recent) <= got.seconds <= max(recent)


@given(runs, st.floats(min_value=0.0, max_value=1.0), st.floats(min_value=0.0, max_value=1.0))
def test_quantiles_are_monotone_and_match_the_median(values, q1, q2):
    ordered = sorted(values)
    low, high = sorted((q1, q2))
    assert quantile(ordered, low) <= quantile(ordered, high)
    assert quantile(ordered, 0.5) == statistics.median(values)


@pytest.mark.parametrize(
    ("name", "group"),
    [
        ("bert-finetune-42", "bert-finetune"),
        ("Bert-Finetune-42", "bert-finetune"),
        ("gpt2-7f3a9c", "gpt2"),
        ("mnist-worker-0", "mnist"),
        ("mnist-ps-1", "mnist"),
        ("llama2-x7k2p", "llama2"),  # generateName
        ("sweep-5d8f7c9b6-x7k2p", "sweep"),  # pod-template-hash, then generateName
        ("exp_2024-01-05", "exp"),
        ("run.3", "run"),
        ("train-resnet50", "train-resnet50"),  # a model, not a counter
        ("train-a100", "train-a100"),  # a GPU, not a hash
        ("data-master", "data-master"),  # a role only counts before an index
        ("bert-beef", "bert-beef"),  # hex letters alone are a word
        ("12345", ""),
        ("", ""),
    ],
)
def test_name_group_strips_generated_suffixes(name, group):
    assert name_group(name) == group


@given(
    st.from_regex(r"[a-z][a-z-]{0,12}[a-z]", fullmatch=True),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
)
def test_a_counter_suffix_never_splits_a_group(stem, first, second):
    group = name_group(f"{stem}-{first}")
    assert group == name_group(f"{stem}-{second}")
    assert stem.startswith(group)
