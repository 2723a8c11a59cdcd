"""Shape advice: the same forecast replayed with one waiting gang in another allowed shape."""

from dataclasses import replace

import pytest
from builders import make_cluster, make_gang

from gangshare.core import ServiceClass
from gangshare.core.forecast import ForecastSettings, forecast_starts
from gangshare.core.queueing import QueuedJob, QueuePolicy, RunningJob
from gangshare.core.shape_advice import advise_shapes, much_sooner, wait_in_words

EXACT = ForecastSettings(min_step_seconds=1.0, step_share=0.0)
HOURS_4 = 4 * 3600.0


def job(key, workers, gpus, shapes=(), queue="default", at=0.0, runtime=600.0):
    gang = replace(make_gang(key).workers(workers).gpus(gpus).build(), alternative_shapes=shapes)
    return QueuedJob(key, gang, at, queue, 0, runtime)


def half_held(nodes=2, end=HOURS_4, queue="default"):
    """`nodes` 8-GPU nodes, each with half its GPUs held by a job that ends at `end`."""
    builder = make_cluster().nodes(nodes, gpus=8)
    running = []
    for i in range(nodes):
        builder = builder.holding(f"long-{i}", f"node-{i}", (0, 1, 2, 3))
        running.append(RunningJob(f"long-{i}", queue, 4, ServiceClass.GUARANTEED, end))
    return builder.build(), running


def advise(cluster, pending, running, policy=None, now=0.0, **kw):
    policy = policy or QueuePolicy()
    forecasts = forecast_starts(cluster, pending, running, policy, now, EXACT)
    found = advise_shapes(cluster, pending, running, policy, now, forecasts, EXACT, **kw)
    return forecasts, found.advice


def test_a_whole_node_gang_is_told_it_would_start_now_as_two_half_nodes():
    cluster, running = half_held()
    wide = job("wide", 1, 8, shapes=((2, 4), (8, 1)))
    forecasts, advice = advise(cluster, [wide], running)
    assert forecasts["wide"].start == HOURS_4
    told = advice["wide"]
    # Both allowed shapes start now; the first tried is kept.
    assert (told.workers, told.gpus_per_worker, told.start, told.instead) == (2, 4, 0.0, HOURS_4)
    assert told.message(0.0) == "as 2x4 it would start now instead of in about 4 h"
    # The snapshot is untouched and the advice changed nothing of the job.
    assert cluster.owners() == ["long-0", "long-1"]
    assert wide.gang.workers == 1 and wide.gpus == 8


def test_no_advice_without_the_authors_shapes_or_when_its_own_shape_starts_soon():
    cluster, running = half_held()
    assert advise(cluster, [job("fixed", 1, 8)], running)[1] == {}
    soon_cluster, soon_running = half_held(end=300.0)
    assert advise(soon_cluster, [job("soon", 1, 8, shapes=((2, 4),))], soon_running)[1] == {}


def test_a_shape_that_saves_too_little_is_not_advised():
    # Its own shape waits an hour; the other waits 40 minutes behind a job ahead of it.
    cluster, running = half_held(end=3600.0)
    ahead = job("ahead", 2, 4, runtime=2400.0, at=0.0)
    mine = job("mine", 1, 8, shapes=((2, 4),), at=1.0)
    forecasts, advice = advise(cluster, [ahead, mine], running)
    assert forecasts["mine"].start == 3600.0
    assert advice == {}
    assert not much_sooner(3600.0, 2400.0) and much_sooner(3600.0, 1200.0)
    assert much_sooner(None, 5 * 86400.0)


def test_no_shape_dodges_a_quota():
    cluster, running = half_held(queue="team")
    policy = QueuePolicy(quotas={"team": 8})
    forecasts, advice = advise(cluster, [job("t", 1, 8, ((2, 4),), "team")], running, policy)
    assert forecasts["t"].start == HOURS_4 and "quota" in forecasts["t"].blocked_by
    assert advice == {}


def test_a_round_tries_shapes_within_its_budget_and_the_next_goes_on_from_there():
    cluster, running = half_held(nodes=4)
    pending = [job(f"j{i}", 1, 8, shapes=((2, 4), (4, 2)), at=float(i)) for i in range(3)]
    forecasts = forecast_starts(cluster, pending, running, QueuePolicy(), 0.0, EXACT)
    rounds = []
    after = None
    for _ in range(3):
        found = advise_shapes(
            cluster, pending, running, QueuePolicy(), 0.0, forecasts, EXACT, trials=3, after=after
        )
        rounds.append(found.tried)
        after = found.tried[-1]
    # Two shapes a job: a budget of three replays tries one job a round, round the queue.
    assert rounds == [["j0"], ["j1"], ["j2"]]
    # A job with more shapes than the budget is still tried, alone.
    alone = advise_shapes(cluster, pending, running, QueuePolicy(), 0.0, forecasts, EXACT, trials=1)
    assert alone.tried == ["j0"]


def test_an_allowed_shape_must_hold_the_same_gpus():
    with pytest.raises(ValueError, match="shapes: 3x4 must hold the same 8 GPUs"):
        job("bad", 1, 8, shapes=((3, 4),))


def test_waits_in_words():
    assert [wait_in_words(s) for s in (10, 240, 3 * 3600, 3 * 86400)] == [
        "now",
        "in about 4 min",
        "in about 3 h",
        "in about 3 d",
    ]
