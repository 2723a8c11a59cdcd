"""Plain pod groups read into one gang (kube/podgroup.py), pure."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gangshare.kube.claims import worker_identity
from gangshare.kube.podgroup import (
    MEMBER_ANNOTATION,
    PODGROUP,
    complete,
    gated_copy,
    group_object,
    group_uid,
    members,
    stale,
)
from gangshare.kube.queued import workload
from gangshare.kube.scheduling import pin_to_node
from gangshare.kube.trainingjob import InvalidSpec


def pod(name: str, size: int = 3, gpus: int = 2, **extra: Any) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {"requests": {"cpu": "1"}}
    return {
        "metadata": {
            "name": name,
            "namespace": "team",
            "creationTimestamp": extra.pop("created", "2026-11-28T00:00:00Z"),
            "labels": {"gangshare.io/queue": "research", "gangshare.io/pod-group": "g"},
            "annotations": {"gangshare.io/pod-group-size": str(size)},
        },
        "spec": {
            "schedulerName": "gangshare-scheduler",
            "schedulingGates": [{"name": "gangshare.io/gang"}],
            "containers": [{"name": "c", "resources": resources}],
            **extra,
        },
    }


def group(*pods: dict[str, Any]) -> dict[str, Any]:
    found = group_object("team", "g", list(pods))
    assert found is not None
    return found


def test_a_whole_group_is_one_gang_of_its_shapes_ranked_by_name():
    g = group(pod("w-1"), pod("coord", gpus=0), pod("w-0"))
    assert complete(g)
    spec = PODGROUP.parse(g)
    assert (spec.workers, spec.gpus_per_worker) == (2, 2)
    assert [(x.replicas, x.gpus) for x in spec.groups] == [(1, 0)]
    body = workload(spec)
    assert body["metadata"]["name"] == "podgroup-g"
    assert "ownerReferences" not in body["metadata"]  # no object of its own to own it
    assert body["spec"]["jobRef"]["uid"] == group_uid("team", "g")
    ranks = {m["metadata"]["name"]: PODGROUP.pod_rank(m, g) for m in members(g)}
    assert ranks == {"w-0": 0, "w-1": 1, "coord": 2}


def test_an_incomplete_group_waits_and_a_disagreeing_one_is_refused_naming_the_key():
    assert not complete(group(pod("w-0"), pod("w-1")))
    bad = group(pod("a", size=2), pod("b", size=3))
    assert complete(bad)  # queued, to be refused with its reason
    with pytest.raises(InvalidSpec, match=r"pod-group-size\]: the group's pods disagree"):
        PODGROUP.parse(bad)
    with pytest.raises(InvalidSpec, match="states 1 pods but 2 carry"):
        PODGROUP.parse(group(pod("a", size=1), pod("b", size=1)))


def test_opportunistic_pods_make_an_opportunistic_group():
    shares = pod("a", size=1)
    shares["spec"]["containers"][0]["resources"] = {"limits": {"gangshare.io/gpu-share": "1"}}
    assert PODGROUP.parse(group(shares)).service_class.value == "Opportunistic"


def test_a_placed_member_parses_as_it_was_made():
    made = pod("w-0", size=1)
    placed = copy.deepcopy(made)
    placed["spec"]["nodeName"] = "n-1"
    placed["spec"]["affinity"] = pin_to_node(None, "n-1")
    placed["metadata"]["annotations"]["gangshare.io/planned-node"] = "n-1"
    assert PODGROUP.parse(group(placed)) == PODGROUP.parse(group(made))


def test_a_reclaimed_member_is_replaced_by_a_gated_copy_of_itself():
    running = pod("w-0", size=1)
    running["spec"]["nodeName"] = "n-1"
    running["spec"]["affinity"] = pin_to_node(None, "n-1")
    running["spec"]["schedulingGates"] = []
    meta = running["metadata"]
    meta["labels"].update({"gangshare.io/job": "podgroup-g", "gangshare.io/rank": "0"})
    meta["labels"]["gangshare.io/attempt"] = "0"
    meta["annotations"].update(
        {"gangshare.io/planned-node": "n-1", "gangshare.io/attempt": "0", "other": "kept"}
    )
    copy_ = gated_copy(running)
    assert copy_["metadata"]["generateName"] == "w-0-"
    assert copy_["metadata"]["annotations"] == {
        "gangshare.io/pod-group-size": "1",
        "other": "kept",
        MEMBER_ANNOTATION: "w-0",
    }
    assert "gangshare.io/rank" not in copy_["metadata"]["labels"]
    assert copy_["metadata"]["labels"]["gangshare.io/job"] == "podgroup-g"
    assert "nodeName" not in copy_["spec"] and "affinity" not in copy_["spec"]
    assert copy_["spec"]["schedulingGates"] == [{"name": "gangshare.io/gang"}]
    # Both exist a moment: the copy is the member from then on; the group counts as suspended
    # only once the replaced pod is going (a restart between the two writes leaves it stale,
    # and the next reclaim write deletes it).
    made = {**copy_["metadata"], "name": "w-0-abcde", "creationTimestamp": "2026-11-28T00:01:00Z"}
    copied = {**copy_, "metadata": made}
    g = group(running, copied)
    assert [m["metadata"]["name"] for m in members(g)] == ["w-0-abcde"]
    assert [p["metadata"]["name"] for p in stale(g)] == ["w-0"]
    assert not PODGROUP.suspended(g)
    running["metadata"]["deletionTimestamp"] = "2026-11-28T00:01:01Z"
    g = group(running, copied)
    assert PODGROUP.suspended(g) and PODGROUP.may_resume(g, [])


def test_a_members_identity_is_its_groups():
    member = pod("w-0")
    member["metadata"]["labels"].update(
        {"gangshare.io/job": "podgroup-g", "gangshare.io/rank": "1", "gangshare.io/attempt": "2"}
    )
    who = worker_identity(member)
    assert who is not None and who.batch and who.uid == group_uid("team", "g")
    assert (who.job, who.rank, who.attempt) == ("team/podgroup-g", 1, 2)
    # A job label that names another group's TrainingJob makes it no member of either.
    member["metadata"]["labels"]["gangshare.io/job"] = "podgroup-other"
    assert worker_identity(member) is None


def test_a_group_ends_failed_with_its_first_failed_pod_and_succeeds_whole():
    done = [pod(n, size=2) for n in ("a", "b")]
    for p in done:
        p["status"] = {"phase": "Succeeded"}
    assert PODGROUP.finished(group(*done)) == ("Succeeded", "all 2 pods of the group succeeded")
    done[1]["status"] = {"phase": "Failed"}
    assert PODGROUP.finished(group(*done)) == ("Failed", "the pod group failed: pod b failed")
