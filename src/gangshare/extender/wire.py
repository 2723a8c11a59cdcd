"""The kube-scheduler extender protocol (k8s.io/kube-scheduler/extender/v1), field for field.

Go's encoding/json writes untagged fields under their Go names, so the wire uses
`Pod`, `NodeNames`, `FailedNodes`, `Host`, `Score`, `PodName` and so on. Requests
are validated for the parts gangshare reads; anything else in the Pod is kept as is.
"""

from __future__ import annotations

from json.encoder import encode_basestring_ascii
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_NODES = 50_000
MAX_EXTENDER_PRIORITY = 10


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ObjectMeta(_Open):
    name: str = Field(min_length=1)
    namespace: str = "default"
    uid: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class Resources(_Open):
    requests: dict[str, str | int | float] = Field(default_factory=dict)
    limits: dict[str, str | int | float] = Field(default_factory=dict)


class Container(_Open):
    name: str
    resources: Resources = Field(default_factory=Resources)


class PodSpec(_Open):
    containers: list[Container] = Field(min_length=1)
    nodeName: str | None = None


class Pod(_Open):
    metadata: ObjectMeta
    spec: PodSpec


class NodeList(_Open):
    items: list[dict[str, Any]] = Field(default_factory=list, max_length=MAX_NODES)


class ExtenderArgs(BaseModel):
    """Sent to filter and prioritize. With nodeCacheCapable, only NodeNames is set."""

    model_config = ConfigDict(extra="ignore")
    Pod: Pod
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = Field(default=None, max_length=MAX_NODES)

    def node_names(self) -> list[str]:
        if self.NodeNames is not None:
            return self.NodeNames
        if self.Nodes is not None:
            return [str((n.get("metadata") or {}).get("name", "")) for n in self.Nodes.items]
        return []


class ExtenderBindingArgs(BaseModel):
    model_config = ConfigDict(extra="ignore")
    PodName: str = Field(min_length=1)
    PodNamespace: str = Field(min_length=1)
    PodUID: str = ""
    Node: str = Field(min_length=1)


def filter_result(
    args: ExtenderArgs,
    passed: list[str],
    failed: dict[str, str],
    unresolvable: dict[str, str],
    error: str = "",
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "FailedNodes": failed,
        "FailedAndUnresolvableNodes": unresolvable,
        "Error": error,
    }
    if args.NodeNames is not None or args.Nodes is None:
        result["NodeNames"] = passed
        result["Nodes"] = None
    else:
        keep = set(passed)
        items = [n for n in args.Nodes.items if (n.get("metadata") or {}).get("name") in keep]
        result["Nodes"] = {"apiVersion": "v1", "kind": "NodeList", "items": items}
        result["NodeNames"] = None
    return result


def priority_list(scores: list[tuple[str, int]]) -> list[dict[str, Any]]:
    return [{"Host": host, "Score": score} for host, score in scores]


def priority_json(scores: list[tuple[str, int]]) -> bytes:
    """priority_list as JSON, written directly: a third of json.dumps's time on 5,000 nodes."""
    items = [
        f'{{"Host":{encode_basestring_ascii(host)},"Score":{int(score)}}}' for host, score in scores
    ]
    return ("[" + ",".join(items) + "]").encode()
