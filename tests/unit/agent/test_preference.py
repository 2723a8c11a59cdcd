"""GetPreferredAllocation: the core's choice, or the recorded plan when one pod matches."""

from __future__ import annotations

from typing import Any

from agent_fakes import make_spec, pod

from gangshare.agent.backend import GpuSample
from gangshare.agent.devices import DeviceMap
from gangshare.agent.plan import Steering, steering_for_request
from gangshare.agent.preference import observed_node, preferred_devices

GPU, SHARE = "nvidia.com/gpu", "gangshare.io/gpu-share"


def _prefer(
    devices: DeviceMap,
    resource: str,
    size: int,
    available: list[str] | None = None,
    must: list[str] | None = None,
    plan: tuple[int, ...] | None = None,
    samples: list[GpuSample] | None = None,
    allocated: dict[str, list[str]] | None = None,
    avoid: frozenset[int] = frozenset(),
) -> tuple[int, ...]:
    node = observed_node("real-0", devices, (), samples or [], allocated or {})
    offered = devices.device_ids(resource) if available is None else available
    plans = () if plan is None else (plan,)
    chosen = preferred_devices(resource, devices, node, offered, must or [], size, plans, avoid)
    assert len(chosen) == size
    assert set(chosen) <= set(offered) | set(must or [])
    return tuple(devices.gpu_of(resource, d).index for d in chosen)


def test_whole_gpus_go_to_the_tightest_nvlink_island_that_holds_them() -> None:
    devices = make_spec().gpus(8).islands([0, 1, 2, 3], [4, 5], [6, 7]).devices()
    uuids = devices.device_ids(GPU)
    assert sorted(_prefer(devices, GPU, 2)) == [4, 5]
    assert sorted(_prefer(devices, GPU, 4)) == [0, 1, 2, 3]
    # GPU 4 is taken: the pair [6, 7] is now the tightest island that holds two.
    assert sorted(_prefer(devices, GPU, 2, available=[u for u in uuids if u != uuids[4]])) == [6, 7]


def test_a_container_that_must_keep_devices_gets_the_rest_chosen() -> None:
    devices = make_spec().gpus(4).islands([0, 1], [2, 3]).devices()
    uuids = devices.device_ids(GPU)
    # GPU 3 is the tightest place left for one more GPU, and it shares GPU 2's island.
    assert _prefer(devices, GPU, 2, must=[uuids[2]]) == (2, 3)


def test_share_slots_go_to_the_least_loaded_gpus_one_slot_each() -> None:
    devices = make_spec().gpus(4).devices(share_slots=2)
    samples = [
        GpuSample(0, 0.9, 1000),
        GpuSample(1, 0.1, 1000),
        GpuSample(2, 0.5, 1000),
        GpuSample(3, 0.05, 1000),
    ]
    assert sorted(_prefer(devices, SHARE, 2, samples=samples)) == [1, 3]


def test_share_slots_fall_back_to_the_same_gpu_only_when_no_other_has_a_slot() -> None:
    devices = make_spec().gpus(2).devices(share_slots=2)
    u = [g.uuid for g in devices.inventory.gpus]
    available = [f"{u[0]}::0", f"{u[0]}::1"]
    assert _prefer(devices, SHARE, 2, available=available) == (0, 0)


def test_a_matching_plan_wins_over_the_core_choice() -> None:
    devices = make_spec().gpus(8).islands([0, 1, 2, 3], [4, 5], [6, 7]).devices()
    assert sorted(_prefer(devices, GPU, 2, plan=(0, 3))) == [0, 3]
    # A plan the kubelet can no longer honour is dropped for the core's choice.
    uuids = devices.device_ids(GPU)
    available = [u for u in uuids if u != uuids[3]]
    assert sorted(_prefer(devices, GPU, 2, available=available, plan=(0, 3))) == [4, 5]


def test_a_plan_for_share_slots_picks_a_free_slot_on_each_planned_gpu() -> None:
    devices = make_spec().gpus(4).devices(share_slots=2)
    u = [g.uuid for g in devices.inventory.gpus]
    allocated = {SHARE: [f"{u[2]}::0"]}
    available = [d for d in devices.device_ids(SHARE) if d not in allocated[SHARE]]
    chosen = _prefer(devices, SHARE, 2, available=available, plan=(2, 3), allocated=allocated)
    assert sorted(chosen) == [2, 3]


def test_the_plan_is_used_only_when_exactly_one_waiting_pod_asks_for_this_much() -> None:
    def plan_for_request(pods, admitted, resource, size):
        return steering_for_request(pods, admitted, resource, size, "real-0").plan

    one = [pod("a", GPU, 2, planned="4,5"), pod("b", GPU, 1, planned="0")]
    assert plan_for_request(one, set(), GPU, 2) == (4, 5)
    assert plan_for_request(one, set(), GPU, 1) == (0,)
    assert plan_for_request(one, set(), SHARE, 2) is None
    two = [*one, pod("c", GPU, 2, planned="6,7")]
    assert plan_for_request(two, set(), GPU, 2) is None
    # A pod the kubelet already admitted, or one running, is not waiting for devices.
    assert plan_for_request(two, {("ns", "c")}, GPU, 2) == (4, 5)
    running = [pod("a", GPU, 2, planned="4,5", phase="Running")]
    assert plan_for_request(running, set(), GPU, 2) is None
    # The only candidate has no plan (a bare pod): nothing to follow.
    assert plan_for_request([pod("d", GPU, 2)], set(), GPU, 2) is None
    assert plan_for_request([pod("e", GPU, 2, planned="1,x")], set(), GPU, 2) is None


def test_gpus_planned_for_other_waiting_pods_are_taken_last() -> None:
    devices = make_spec().gpus(8).islands([0, 1, 2, 3], [4, 5], [6, 7]).devices()
    # The tightest island for two is [4, 5], but a gang worker waits for it.
    assert sorted(_prefer(devices, GPU, 2, avoid=frozenset({4, 5}))) == [6, 7]
    # With nothing else left, a planned GPU is still better than refusing the kubelet.
    uuids = devices.device_ids(GPU)
    available = [uuids[i] for i in (1, 4, 5)]
    chosen = _prefer(devices, GPU, 2, available=available, avoid=frozenset({4, 5}))
    assert 1 in chosen and len(set(chosen)) == 2


def test_steering_names_the_plans_of_every_other_pod_waiting_for_this_node() -> None:
    bare = pod("bare", GPU, 2)
    bound_worker = pod("w0", GPU, 4, planned="0,1,2,3")
    not_bound = pod("w1", GPU, 2, planned="4,5")
    not_bound["spec"]["nodeName"] = None
    not_bound["metadata"]["annotations"]["gangshare.io/planned-node"] = "real-0"
    elsewhere = pod("w2", GPU, 2, planned="6,7")
    elsewhere["spec"]["nodeName"] = None
    elsewhere["metadata"]["annotations"]["gangshare.io/planned-node"] = "real-1"
    running = pod("w3", GPU, 1, planned="7", phase="Running")
    pods = [bare, bound_worker, not_bound, elsewhere, running]
    # For the bare pod (the only one here asking for two): no plan, four planned GPUs to avoid.
    assert steering_for_request(pods, set(), GPU, 2, "real-0") == Steering(
        (), frozenset({0, 1, 2, 3, 4, 5})
    )
    # For the bound worker: its own plan, and the other worker's GPUs to avoid.
    assert steering_for_request(pods, set(), GPU, 4, "real-0") == Steering(
        ((0, 1, 2, 3),), frozenset({4, 5})
    )
    # Admitted by the kubelet, a pod waits for nothing any more.
    admitted = {("ns", "w0")}
    assert steering_for_request(pods, admitted, GPU, 2, "real-0").avoid == frozenset({4, 5})
    assert steering_for_request(pods, set(), SHARE, 1, "real-0") == Steering()


def sibling(rank: int, planned: str, attempt: int = 0, job: str = "llm") -> dict[str, Any]:
    """A gang worker as the operator creates it, bound to real-0 and waiting for devices."""
    worker = pod(f"{job}-worker-{rank}", GPU, 4, planned=planned)
    worker["metadata"]["labels"] = {
        "gangshare.io/job": job,
        "gangshare.io/rank": str(rank),
        "gangshare.io/attempt": str(attempt),
    }
    worker["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "gangshare.io/v1alpha1",
            "kind": "TrainingJob",
            "name": job,
            "uid": f"uid-{job}",
            "controller": True,
        }
    ]
    return worker


def test_identical_siblings_of_one_gang_each_get_a_whole_planned_island() -> None:
    """Two 4-GPU workers of one gang on one 8-GPU node with islands [0-3] and [4-7], GPU 1
    busy: the kubelet cannot say which worker it allocates for, but either may take either
    plan, so each gets a whole island, never [0, 2, 3, 4] by load."""
    devices = make_spec().gpus(8).islands([0, 1, 2, 3], [4, 5, 6, 7]).devices()
    uuids = devices.device_ids(GPU)
    workers = [sibling(0, "0,1,2,3"), sibling(1, "4,5,6,7")]
    steer = steering_for_request(workers, set(), GPU, 4, "real-0")
    assert steer.plans == ((0, 1, 2, 3), (4, 5, 6, 7)) and steer.avoid == frozenset()
    busy = [GpuSample(1, 0.95, 40000)]
    node = observed_node("real-0", devices, (), busy, {})
    first = preferred_devices(GPU, devices, node, uuids, [], 4, steer.plans, steer.avoid)
    assert sorted(devices.gpu_of(GPU, d).index for d in first) == [0, 1, 2, 3]
    # The PodResources read still says neither was admitted; the kubelet's list knows better.
    rest = [u for u in uuids if u not in first]
    node = observed_node("real-0", devices, (), busy, {GPU: first})
    second = preferred_devices(GPU, devices, node, rest, [], 4, steer.plans, steer.avoid)
    assert sorted(devices.gpu_of(GPU, d).index for d in second) == [4, 5, 6, 7]


def test_plans_are_served_only_to_interchangeable_candidates() -> None:
    workers = [sibling(0, "0,1,2,3"), sibling(1, "4,5,6,7")]
    bare = pod("bare", GPU, 4)
    # A bare pod of the same size among them: no telling who is allocated; the plans are
    # only avoided.
    mixed = steering_for_request([*workers, bare], set(), GPU, 4, "real-0")
    assert mixed.plans == () and mixed.avoid == frozenset(range(8))
    # Workers of two attempts (or two jobs) are not interchangeable either.
    other = steering_for_request(
        [workers[0], sibling(1, "4,5,6,7", attempt=1)], set(), GPU, 4, "real-0"
    )
    assert other.plans == ()
    # Once one sibling is admitted, the other is the one candidate, with its own plan.
    admitted = {("ns", "llm-worker-0")}
    assert steering_for_request(workers, admitted, GPU, 4, "real-0").plan == (4, 5, 6, 7)


def test_the_fallback_keeps_a_worker_on_as_few_islands_as_it_can() -> None:
    devices = make_spec().gpus(8).islands([0, 1, 2, 3], [4, 5, 6, 7]).devices()
    # Every free GPU is planned for someone else; the least-loaded-first fallback took
    # [0, 2, 3, 4] with GPU 1 busy; island by island it is one whole island.
    busy = [GpuSample(1, 0.95, 40000)]
    chosen = _prefer(devices, GPU, 4, samples=busy, avoid=frozenset(range(8)))
    assert sorted(chosen) in ([0, 1, 2, 3], [4, 5, 6, 7])
