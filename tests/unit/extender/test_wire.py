"""The protocol reads what kube-scheduler really sends and answers with Go field names."""

import json

import pytest
from helpers import recorded

from gangshare.extender.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    WireError,
    filter_result,
    priority_json,
)


def test_recorded_filter_and_prioritize_requests_parse():
    for verb in ("filter", "prioritize"):
        args = ExtenderArgs.parse(recorded(verb))
        assert args.Nodes is None  # nodeCacheCapable: names only
        assert args.node_names() == ["h100-0", "h100-1"]
        assert args.pod_name == "default/recorded"
        assert args.Pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
        assert args.Pod["spec"]["schedulerName"] == "gangshare-scheduler"  # the rest kept


def test_recorded_bind_request_parses():
    args = ExtenderBindingArgs.parse(recorded("bind"))
    assert (args.PodName, args.PodNamespace, args.Node) == ("recorded", "default", "h100-1")
    assert args.PodUID == recorded("filter")["Pod"]["metadata"]["uid"]


def test_filter_result_uses_go_field_names():
    args = ExtenderArgs.parse(recorded("filter"))
    result = filter_result(args, ["h100-1"], {"h100-0": "no room"}, {})
    assert result == {
        "NodeNames": ["h100-1"],
        "Nodes": None,
        "FailedNodes": {"h100-0": "no room"},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


def test_filter_result_echoes_nodes_when_the_scheduler_sent_full_objects():
    body = recorded("filter")
    body["NodeNames"] = None
    body["Nodes"] = {"items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]}
    args = ExtenderArgs.parse(body)
    result = filter_result(args, ["b"], {"a": "full"}, {})
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["b"]
    assert result["NodeNames"] is None


def test_priority_answer_shape():
    assert json.loads(priority_json([("a", 7)])) == [{"Host": "a", "Score": 7}]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: b.pop("Pod"), "Pod: required"),
        (lambda b: b.update(Pod=[]), "Pod: must be an object"),
        (lambda b: b["Pod"]["metadata"].update(name=""), "Pod.metadata.name: must not be empty"),
        (lambda b: b["Pod"]["metadata"].update(name=7), "Pod.metadata.name: must be a string"),
        (
            lambda b: b["Pod"]["metadata"]["annotations"].update(x=1),
            "Pod.metadata.annotations.x: must be a string",
        ),
        (
            lambda b: b["Pod"]["spec"].update(containers=[]),
            "Pod.spec.containers: needs at least one container",
        ),
        (
            lambda b: b["Pod"]["spec"]["containers"][0]["resources"].update(limits=[1]),
            "Pod.spec.containers.0.resources.limits: must be an object",
        ),
        (
            lambda b: b["Pod"]["spec"]["containers"][0]["resources"]["limits"].update(
                {"nvidia.com/gpu": None}
            ),
            "Pod.spec.containers.0.resources.limits.nvidia.com/gpu: must be a quantity",
        ),
        (lambda b: b.update(NodeNames="a,b"), "NodeNames: must be a list of node names"),
        (lambda b: b.update(NodeNames=[1]), "NodeNames: must be a list of node names"),
        (lambda b: b.update(NodeNames=["n"] * 50_001), "NodeNames: 50001 names, more than 50000"),
    ],
)
def test_a_malformed_filter_request_is_refused_naming_the_field(change, message):
    body = recorded("filter")
    change(body)
    with pytest.raises(WireError) as refused:
        ExtenderArgs.parse(body)
    assert str(refused.value).startswith(message)


def test_a_malformed_bind_request_is_refused_naming_the_field():
    for field, value, message in [
        ("PodName", "", "PodName: must not be empty"),
        ("Node", None, "Node: required"),
        ("PodUID", 3, "PodUID: must be a string"),
    ]:
        body = {**recorded("bind"), field: value}
        with pytest.raises(WireError, match=message):
            ExtenderBindingArgs.parse(body)
    with pytest.raises(WireError, match="body: must be an object"):
        ExtenderBindingArgs.parse([])
