"""What filter hands a pod stays held until the pod's bind ends, however slow (issue #36)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from helpers import FakeBinder, gpu_pod, node_objects, trainingjob

from gangshare.cli import build_parser
from gangshare.core.clock import ManualClock
from gangshare.extender.app import VerbsApp
from gangshare.extender.cache import DEFAULT_ASSUME_TTL, ClusterCache
from gangshare.extender.metrics import ExtenderMetrics

ONE_NODE = {"nodePools": [{"name": "n", "count": 1, "gpusPerNode": 8}]}
SWEEP = 5.0  # how often the extender's thread calls expire_assumptions


def beside_a_plan() -> tuple[ClusterCache, TestClient]:
    """One 8-GPU node whose GPUs 0-6 an admitted gang's plan holds (its workers do not exist
    yet, so kube-scheduler counts nothing there): GPU 7 is the only one left. The cache keeps
    the extender's default TTL."""
    cache = ClusterCache(ManualClock(1000.0))
    cache.replace_nodes(node_objects(ONE_NODE))
    cache.replace_pods([])
    cache.replace_jobs([trainingjob("big", [("n-0", [0, 1, 2, 3, 4, 5, 6])])])
    app = VerbsApp(cache, FakeBinder({}), ExtenderMetrics())  # type: ignore[arg-type]
    return cache, TestClient(app, client=("127.0.0.1", 50000))


def handed(client: TestClient, pod: dict[str, Any]) -> list[str]:
    answer = client.post("/filter", json={"Pod": pod, "NodeNames": ["n-0"]}).json()
    return list(answer["NodeNames"] or [])


def wait(cache: ClusterCache, seconds: float) -> None:
    """Let `seconds` pass with the expiry thread sweeping every SWEEP seconds."""
    clock = cache.clock
    assert isinstance(clock, ManualClock)
    while seconds > 0:
        step = min(SWEEP, seconds)
        clock.advance(step)
        seconds -= step
        cache.expire_assumptions()


def held_gpus(cache: ClusterCache, owner: str) -> tuple[int, ...] | None:
    with cache.lock:
        return cache.ledger.assumed_gpus(owner, "n-0")


def being_deleted(pod: dict[str, Any]) -> dict[str, Any]:
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return pod


def test_a_slow_bind_keeps_its_gpu_until_the_binding_is_seen():
    """The issue's reproduction: kube-scheduler's PreBind waits for a volume for longer than
    the old 30 s TTL; the last GPU beside the plan must not be handed out a second time."""
    cache, client = beside_a_plan()
    assert handed(client, gpu_pod("a", 1)) == ["n-0"]
    assert held_gpus(cache, "pod:default/a") == (7,)
    wait(cache, 60)  # twice the old TTL, a dozen sweeps, and no sign at all from a
    assert handed(client, gpu_pod("b", 1)) == []
    assert held_gpus(cache, "pod:default/a") == (7,)
    # The binding comes back: the bound pod holds GPU 7 as a fact now.
    cache.upsert_pod(gpu_pod("a", 1, node="n-0"))
    assert cache.assumed_count() == 0
    assert handed(client, gpu_pod("b", 1)) == []
    assert cache.ledger.displaced() == {}


@pytest.mark.parametrize("how", ["deleted", "being-deleted", "terminal", "relisted-without"])
def test_a_pod_that_goes_away_while_binding_releases_its_gpu_at_once(how: str):
    cache, client = beside_a_plan()
    a = gpu_pod("a", 1)
    cache.upsert_pod(a)
    assert handed(client, a) == ["n-0"]
    assert handed(client, gpu_pod("b", 1)) == []
    if how == "deleted":
        cache.delete_pod("default", "a")
    elif how == "being-deleted":
        # The API server refuses to bind a pod being deleted, so its bind can only fail.
        cache.upsert_pod(being_deleted(gpu_pod("a", 1)))
    elif how == "terminal":
        failed = gpu_pod("a", 1)
        failed["status"]["phase"] = "Failed"
        cache.upsert_pod(failed)
    else:
        cache.replace_pods([])  # the watch missed a's deletion; the relist no longer has it
    assert cache.assumed_count() == 0
    assert handed(client, gpu_pod("b", 1)) == ["n-0"]
    assert held_gpus(cache, "pod:default/b") == (7,)


def test_a_relist_older_than_the_filter_keeps_the_hold():
    """kube-scheduler may filter a pod created after the relist's snapshot was taken: that it
    is missing from the list says nothing, until the watch has shown it once."""
    cache, client = beside_a_plan()
    assert handed(client, gpu_pod("a", 1)) == ["n-0"]
    cache.replace_pods([])
    assert held_gpus(cache, "pod:default/a") == (7,)


def test_the_backstop_expires_a_hold_only_after_a_ttl_without_any_sign():
    cache, client = beside_a_plan()
    ttl = cache.assume_ttl
    a = gpu_pod("a", 1)
    assert handed(client, a) == ["n-0"]
    signs = [
        lambda: cache.upsert_pod(gpu_pod("a", 1)),  # a watch update: still unbound, still live
        lambda: client.post("/prioritize", json={"Pod": a, "NodeNames": ["n-0"]}),
    ]
    for sign in signs:
        wait(cache, ttl - 10)
        sign()
    wait(cache, ttl - 10)
    assert held_gpus(cache, "pod:default/a") == (7,)  # 3 TTLs - 30 s after the filter, still held
    wait(cache, 10 + SWEEP)
    assert cache.assumed_count() == 0
    assert handed(client, gpu_pod("b", 1)) == ["n-0"]


def test_the_command_line_default_is_the_caches():
    args = build_parser().parse_args(["extender"])
    # Longer than kube-scheduler's VolumeBinding bindTimeoutSeconds (600 s by default).
    assert args.assume_ttl == DEFAULT_ASSUME_TTL > 600
