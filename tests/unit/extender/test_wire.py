"""The protocol models read what kube-scheduler really sends and answer with Go field names."""

from helpers import recorded

from gangshare.extender.wire import ExtenderArgs, ExtenderBindingArgs, filter_result, priority_list


def test_recorded_filter_and_prioritize_requests_parse():
    for verb in ("filter", "prioritize"):
        args = ExtenderArgs.model_validate(recorded(verb))
        assert args.Nodes is None  # nodeCacheCapable: names only
        assert args.node_names() == ["h100-0", "h100-1"]
        assert args.Pod.metadata.name == "recorded"
        assert args.Pod.spec.containers[0].resources.limits == {"nvidia.com/gpu": "2"}
        assert (
            args.Pod.model_dump()["spec"]["schedulerName"] == "gangshare-scheduler"
        )  # unknown fields kept


def test_recorded_bind_request_parses():
    args = ExtenderBindingArgs.model_validate(recorded("bind"))
    assert (args.PodName, args.PodNamespace, args.Node) == ("recorded", "default", "h100-1")
    assert args.PodUID == recorded("filter")["Pod"]["metadata"]["uid"]


def test_filter_result_uses_go_field_names():
    args = ExtenderArgs.model_validate(recorded("filter"))
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
    args = ExtenderArgs.model_validate(body)
    result = filter_result(args, ["b"], {"a": "full"}, {})
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["b"]
    assert result["NodeNames"] is None


def test_priority_list_shape():
    assert priority_list([("a", 7)]) == [{"Host": "a", "Score": 7}]
