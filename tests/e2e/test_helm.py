"""The Helm chart (deploy/helm/gangshare) with the real helm binary against the real control plane.

Rendering tests need only helm. The install tests put a release into the session cluster, check
its objects through the API, check each service account's RBAC with `kubectl auth can-i` (the API
server runs with --authorization-mode=Node,RBAC), then run the real extender, kube-scheduler and
operator as local processes under those service accounts' tokens, with the chart's own arguments
and scheduler configuration: a TrainingJob and a plain GPU pod go all the way to bound and
finished, so RBAC the code needs but the table forgot would show up as a failure here. The chart's
own pods land on KWOK nodes, where no container really runs; nothing here depends on them.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import ssl
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gangshare.agent.main import add_agent_command
from gangshare.dev import binaries, processes
from gangshare.extender.main import add_extender_command
from gangshare.kube.queue import QUEUE_PLURAL, default_queue_object, parse_queue
from gangshare.operator.main import (
    add_operator_command,
    parse_priority_limits,
    parse_quotas,
)
from kube import Kube, NodePool, eventually, grant_edit

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "gangshare"
CRD_FILE = ROOT / "crds" / "trainingjob.yaml"
SAMPLE_CONFIG = ROOT / "extender" / "scheduler-config.yaml"
POLICY_FILE = ROOT / "crds" / "trainingjob-admission-policy.yaml"
SHARE_POLICY_FILE = ROOT / "crds" / "gpu-share-pod-policy.yaml"
CRD_NAME = "trainingjobs.gangshare.io"
QUEUE_CRD_NAME = "queues.gangshare.io"
TJ = ("gangshare.io", "v1alpha1", "trainingjobs")
GANG_GATE_POLICY = "gangshare-gang-gate"  # crds/gang-gate-policy.yaml's

Manifests = dict[tuple[str, str], dict[str, Any]]


# ----- helm ------------------------------------------------------------------------------------


class Helm:
    def __init__(self, binary: Path, home: Path) -> None:
        self.binary = binary
        # Keep helm's cache, config and data out of the user's home.
        self.env = {
            **os.environ,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.binary), *args], capture_output=True, text=True, env=self.env, timeout=120
        )
        if check and done.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return done

    def render(self, *args: str, namespace: str = "gangshare-system") -> Manifests:
        out = self("template", "gangshare", str(CHART), "-n", namespace, *args).stdout
        return by_kind_and_name(out)


def by_kind_and_name(stream: str) -> Manifests:
    docs = [d for d in yaml.safe_load_all(stream) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(binaries.bin_dir(build=True) / "helm", tmp_path_factory.mktemp("helm-home"))


def containers(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = deployment["spec"]["template"]["spec"]
    return {c["name"]: c for c in [*spec.get("initContainers", []), *spec["containers"]]}


def scheduler_config(manifests: Manifests, fullname: str = "gangshare") -> dict[str, Any]:
    data = manifests[("ConfigMap", f"{fullname}-scheduler-config")]["data"]
    config: dict[str, Any] = yaml.safe_load(data["scheduler-config.yaml"])
    return config


def cli_parser() -> argparse.ArgumentParser:
    """The real `gangshare operator`, `extender` and `agent` argument parsers."""
    parser = argparse.ArgumentParser(prog="gangshare")
    commands = parser.add_subparsers(dest="command", required=True)
    add_operator_command(commands)
    add_extender_command(commands)
    add_agent_command(commands)
    return parser


# ----- rendering -------------------------------------------------------------------------------


def test_chart_lints_with_and_without_the_optional_parts(helm: Helm):
    assert "0 chart(s) failed" in helm("lint", "--strict", str(CHART)).stdout
    everything = [
        *("--set", "metrics.serviceMonitor.enabled=true"),
        *("--set", "networkPolicy.enabled=true"),
        *("--set", "operator.quotas.research=16"),
        *("--set", "operator.smallJobMaxGpus=2"),
        *("--set", "priorityClassName=system-cluster-critical"),
        *("--set", "scheduler.replicas=2", "--set", "agent.namespace=kube-system"),
    ]
    assert "0 chart(s) failed" in helm("lint", "--strict", str(CHART), *everything).stdout
    manifests = helm.render(*everything)
    assert ("ServiceMonitor", "gangshare-extender") in manifests
    assert ("NetworkPolicy", "gangshare-scheduler") in manifests
    assert ("PodDisruptionBudget", "gangshare-scheduler") in manifests
    assert ("DaemonSet", "gangshare-agent") in manifests
    off = ("--set", "agent.enabled=false", "--set", "podDisruptionBudget.enabled=false")
    assert "0 chart(s) failed" in helm("lint", "--strict", str(CHART), *everything, *off).stdout


def test_values_schema_rejects_bad_values_naming_the_key(helm: Helm):
    for setting, key in [
        ("operator.ordering=Fifo", "/operator/ordering"),
        ("operator.quotas.research=-1", "/operator/quotas/research"),
        ("operator.fairshare=true", "fairshare"),
        ("operator.replicas=0", "/operator/replicas"),
        ("operator.leaderElection.leaseName=Not_A_Name", "/operator/leaderElection/leaseName"),
        ("agent.shareSlots=0", "/agent/shareSlots"),
        ("agent.tolerance=1", "/agent/tolerance"),
        ("agent.metricsPort=0", "/agent/metricsPort"),
        ("agent.namespace=Kube_System", "/agent/namespace"),
        ("agent.sharSlots=2", "sharSlots"),
        ("podDisruptionBudget.enable=false", "enable"),
        ("admissionPolicies.shareGraceSeconds=60", "/admissionPolicies/shareGraceSeconds"),
        ("admissionPolicies.templateGraceSeconds=-1", "/admissionPolicies/templateGraceSeconds"),
        ("admissionPolicies.jobControllers={a'b}", "/admissionPolicies/jobControllers/0"),
    ]:
        done = helm("template", "x", str(CHART), "--set", setting, check=False)
        assert done.returncode != 0 and key in done.stderr, (setting, done.stderr)


def test_the_chart_ships_every_crd_of_the_repository():
    shipped = {
        path.name
        for path in (ROOT / "crds").glob("*.yaml")
        if any(
            d and d["kind"] == "CustomResourceDefinition"
            for d in yaml.safe_load_all(path.read_text())
        )
    }
    assert shipped == {"trainingjob.yaml", "queue.yaml"}
    assert {path.name for path in (CHART / "crds").iterdir()} == shipped


@pytest.mark.parametrize("file", ["trainingjob.yaml", "queue.yaml"])
def test_the_crd_is_the_repository_file_through_a_symlink(helm: Helm, tmp_path: Path, file: str):
    source = ROOT / "crds" / file
    link = CHART / "crds" / file
    assert link.is_symlink() and link.resolve() == source.resolve()
    expected = yaml.safe_load(source.read_text())
    rendered = helm("template", "x", str(CHART), "--include-crds").stdout
    crds = [
        d
        for d in yaml.safe_load_all(rendered)
        if d and d["kind"] == expected["kind"] and d["metadata"] == expected["metadata"]
    ]
    assert crds == [expected]
    # The packaged chart carries the file's content, not a link.
    helm("package", str(CHART), "-d", str(tmp_path))
    with tarfile.open(tmp_path / "gangshare-0.1.0.tgz") as tar:
        member = tar.getmember(f"gangshare/crds/{file}")
        packed = tar.extractfile(member)
        assert member.isfile() and packed is not None
        assert packed.read() == source.read_bytes()


def test_dashboards_render_as_labelled_configmaps_of_the_repository_files(helm: Helm):
    grafana = ROOT / "deploy" / "grafana"
    rendered = {
        name[1]: doc
        for name, doc in helm.render(
            "--set", "dashboards.annotations.grafana_folder=gangshare"
        ).items()
        if name[0] == "ConfigMap" and "-dashboard-" in name[1]
    }
    files = sorted(grafana.glob("*.json"))
    assert sorted(rendered) == [
        f"gangshare-dashboard-{path.stem.removeprefix('gangshare-')}" for path in files
    ]
    for path in files:
        config_map = rendered[f"gangshare-dashboard-{path.stem.removeprefix('gangshare-')}"]
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "gangshare"}
        assert json.loads(config_map["data"][path.name]) == json.loads(path.read_text())
    off = helm.render("--set", "dashboards.enabled=false")
    assert not [name for name in off if "-dashboard-" in name[1]]


def test_queues_render_the_default_and_the_extra_ones(helm: Helm, tmp_path: Path):
    default = helm.render()[("Queue", "default")]
    assert default["spec"] == default_queue_object()["spec"]
    assert default["metadata"]["labels"]["app.kubernetes.io/instance"] == "gangshare"
    assert default["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    values = tmp_path / "queues.yaml"
    extra = [
        {"name": "team-a", "spec": {"cohort": "research", "nominalGPUs": 8}},
        {"name": "small", "spec": {"jobSizes": {"maxGPUs": 2}, "ordering": "FIFO"}},
        {"name": "plain"},
    ]
    values.write_text(yaml.safe_dump({"queues": {"extra": extra}}))
    manifests = helm.render("-f", str(values))
    queues = {name: obj for (kind, name), obj in manifests.items() if kind == "Queue"}
    assert set(queues) == {"default", "team-a", "small", "plain"}
    for item in extra:
        assert queues[item["name"]]["spec"] == item.get("spec", {})
        parse_queue(queues[item["name"]])
    assert parse_queue(queues["team-a"]).cohort == "research"
    # An extra `default` is the default Queue, with its spec; createDefault=false makes none.
    values.write_text(
        yaml.safe_dump({"queues": {"extra": [{"name": "default", "spec": {"nominalGPUs": 4}}]}})
    )
    [only] = [obj for (kind, _), obj in helm.render("-f", str(values)).items() if kind == "Queue"]
    assert (only["metadata"]["name"], only["spec"]) == ("default", {"nominalGPUs": 4})
    off = helm.render("--set", "queues.createDefault=false")
    assert not [key for key in off if key[0] == "Queue"]


def test_queue_values_are_checked_naming_the_key(helm: Helm):
    for extra, key in [
        ('[{"name": "Team-A"}]', "/queues/extra/0/name"),
        ('[{"name": "a", "spec": {"nominalGPU": 8}}]', "nominalGPU"),
        ('[{"name": "a", "spec": {"weight": 0}}]', "/queues/extra/0/spec/weight"),
        ('[{"name": "a", "spec": {"ordering": "fifo"}}]', "/queues/extra/0/spec/ordering"),
        ('[{"name": "a"}, {"name": "a"}]', "queues.extra: two queues named a"),
    ]:
        done = helm("template", "x", str(CHART), "--set-json", f"queues.extra={extra}", check=False)
        assert done.returncode != 0 and key in done.stderr, (extra, done.stderr)


def with_grace(spec: dict[str, Any], seconds: int) -> dict[str, Any]:
    """A shipped policy's spec with its maxGraceSeconds variable set as the chart sets it."""
    variables = [
        {**v, "expression": str(seconds)} if v["name"] == "maxGraceSeconds" else v
        for v in spec["variables"]
    ]
    return {**spec, "variables": variables}


def agent_conditions(policy: dict[str, Any]) -> str:
    return " ".join(c["expression"] for c in policy["spec"]["matchConditions"])


@pytest.mark.parametrize(
    ("file", "suffix", "value", "default"),
    [
        (POLICY_FILE, "trainingjob-templates", "templateGraceSeconds", 300),
        (SHARE_POLICY_FILE, "share-pod-grace", "shareGraceSeconds", 30),
    ],
)
def test_the_shipped_policies_are_the_repository_files_with_the_grace_from_values(
    helm: Helm, file: Path, suffix: str, value: str, default: int
):
    shipped = [d for d in yaml.safe_load_all(file.read_text()) if d]
    grace = {v["name"]: v["expression"] for v in shipped[0]["spec"]["variables"]}
    assert grace["maxGraceSeconds"] == str(default)  # the chart's default is the file's
    for seconds, manifests in [
        (default, helm.render(namespace="gs-sys")),
        (12, helm.render("--set", f"admissionPolicies.{value}=12", namespace="gs-sys")),
    ]:
        for original in shipped:
            rendered = manifests[(original["kind"], f"gangshare-{suffix}")]
            assert rendered["metadata"]["labels"]["app.kubernetes.io/instance"] == "gangshare"
            # The same policy as crds/, renamed after the release so both may be installed.
            if original["kind"] == "ValidatingAdmissionPolicyBinding":
                assert rendered["spec"] == {**original["spec"], "policyName": f"gangshare-{suffix}"}
            else:
                assert rendered["spec"] == with_grace(original["spec"], seconds)


def test_the_pod_policies_name_the_release_and_scope_the_agent_to_its_node(helm: Helm):
    manifests = helm.render(namespace="gs-sys")
    pod_policy = manifests[("ValidatingAdmissionPolicy", "gangshare-reserved-pod-keys")]
    allowed = pod_policy["spec"]["matchConditions"][0]["expression"]
    for account in ("gangshare-operator", "gangshare-scheduler"):
        assert f"'system:serviceaccount:gs-sys:{account}'" in allowed
    # The agent is exempt only on pods of the node bound into its token.
    [agent_rule] = [
        c for c in pod_policy["spec"]["matchConditions"] if "gangshare-agent" in c["expression"]
    ]
    assert "'system:serviceaccount:gs-sys:gangshare-agent'" in agent_rule["expression"]
    assert "authentication.kubernetes.io/node-name" in agent_rule["expression"]
    scope = manifests[("ValidatingAdmissionPolicy", "gangshare-agent-node-scope")]
    assert agent_conditions(scope) == (
        "request.userInfo.username == 'system:serviceaccount:gs-sys:gangshare-agent'"
    )
    binding = manifests[("ValidatingAdmissionPolicyBinding", "gangshare-agent-node-scope")]
    assert binding["spec"] == {
        "policyName": "gangshare-agent-node-scope",
        "validationActions": ["Deny"],
    }
    # The agent writes assigned-gpus from its own namespace when it runs elsewhere.
    elsewhere = helm.render("--set", "agent.namespace=kube-system", namespace="gs-sys")
    for name in ("gangshare-reserved-pod-keys", "gangshare-agent-node-scope"):
        conditions = agent_conditions(elsewhere[("ValidatingAdmissionPolicy", name)])
        assert "'system:serviceaccount:kube-system:gangshare-agent'" in conditions
        assert "'system:serviceaccount:gs-sys:gangshare-agent'" not in conditions
    no_agent = helm.render("--set", "agent.enabled=false", namespace="gs-sys")
    pod_policy = no_agent[("ValidatingAdmissionPolicy", "gangshare-reserved-pod-keys")]
    assert "gangshare-agent" not in agent_conditions(pod_policy)
    assert ("ValidatingAdmissionPolicy", "gangshare-agent-node-scope") not in no_agent
    off = helm.render(
        *("--set", "admissionPolicies.templates=false", "--set", "admissionPolicies.podKeys=false"),
        *("--set", "admissionPolicies.shareGrace=false"),
        *("--set", "admissionPolicies.agentNodeScope=false"),
        *("--set", "admissionPolicies.queuedJobs=false"),
        *("--set", "admissionPolicies.ownership=false"),
        *("--set", "admissionPolicies.gangGate=false"),
    )
    assert not [key for key in off if key[0].startswith("ValidatingAdmissionPolicy")]


def test_the_gang_gate_policy_lets_only_the_releases_operator_lift_the_gate(helm: Helm):
    shipped = [d for d in yaml.safe_load_all((ROOT / "crds" / "gang-gate-policy.yaml").read_text())]
    manifests = helm.render(namespace="gs-sys")
    policy = manifests[("ValidatingAdmissionPolicy", "gangshare-gang-gate")]
    lifters = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}["gateLifters"]
    assert lifters == "['system:serviceaccount:gs-sys:gangshare-operator']"
    original = next(d for d in shipped if d and d["kind"] == "ValidatingAdmissionPolicy")
    assert policy["spec"]["validations"] == original["spec"]["validations"]
    assert policy["spec"]["matchConditions"] == original["spec"]["matchConditions"]


@pytest.mark.parametrize(
    ("file", "suffix"),
    [
        (ROOT / "crds" / "job-admission-policy.yaml", "queued-jobs"),
        (ROOT / "crds" / "jobset-admission-policy.yaml", "queued-jobsets"),
        (ROOT / "crds" / "pytorchjob-admission-policy.yaml", "queued-pytorchjobs"),
        (ROOT / "crds" / "trainjob-admission-policy.yaml", "queued-trainjobs"),
        (ROOT / "crds" / "pod-group-policy.yaml", "pod-groups"),
    ],
)
def test_the_queued_job_policies_are_the_repository_files(helm: Helm, file: Path, suffix: str):
    shipped = [d for d in yaml.safe_load_all(file.read_text()) if d]
    manifests = helm.render(namespace="gs-sys")
    for original in shipped:
        rendered = manifests[(original["kind"], f"gangshare-{suffix}")]
        if original["kind"] == "ValidatingAdmissionPolicyBinding":
            assert rendered["spec"] == {**original["spec"], "policyName": f"gangshare-{suffix}"}
        else:
            assert rendered["spec"] == original["spec"]
    off = helm.render("--set", "admissionPolicies.queuedJobs=false", namespace="gs-sys")
    assert ("ValidatingAdmissionPolicy", f"gangshare-{suffix}") not in off


@pytest.mark.parametrize(
    ("file", "suffix", "variable"),
    [
        (ROOT / "crds" / "pod-owner-policy.yaml", "pod-owners", "jobControllers"),
        (ROOT / "crds" / "job-owner-policy.yaml", "job-owners", "jobsetControllers"),
    ],
)
def test_the_ownership_policies_are_the_repository_files_with_the_controllers_from_values(
    helm: Helm, file: Path, suffix: str, variable: str
):
    shipped = [d for d in yaml.safe_load_all(file.read_text()) if d]
    ours = "system:serviceaccount:ops:controllers"
    for users, manifests in [
        (None, helm.render(namespace="gs-sys")),  # the chart's defaults are the file's
        (f"['{ours}']", helm.render("--set", f"admissionPolicies.{variable}={{{ours}}}")),
    ]:
        for original in shipped:
            rendered = manifests[(original["kind"], f"gangshare-{suffix}")]
            expected = copy.deepcopy(original["spec"])
            if original["kind"] == "ValidatingAdmissionPolicyBinding":
                expected["policyName"] = f"gangshare-{suffix}"
            for v in expected.get("variables", []):
                if v["name"] == variable and users is not None:
                    v["expression"] = users
            assert rendered["spec"] == expected
    # The reserved-keys policy lets the same Job controller copy a template's job label.
    keys = helm.render("--set", f"admissionPolicies.jobControllers={{{ours}}}")
    [made] = [
        v
        for v in keys[("ValidatingAdmissionPolicy", "gangshare-reserved-pod-keys")]["spec"][
            "variables"
        ]
        if v["name"] == "madeByAJob"
    ]
    assert f"request.userInfo.username in ['{ours}']" in made["expression"]
    off = helm.render("--set", "admissionPolicies.ownership=false", namespace="gs-sys")
    assert ("ValidatingAdmissionPolicy", f"gangshare-{suffix}") not in off


def test_scheduler_config_has_the_shape_of_the_sample(helm: Helm):
    sample = yaml.safe_load(SAMPLE_CONFIG.read_text())
    config = scheduler_config(helm.render(namespace="gs-sys"))
    assert config.keys() == sample.keys()
    assert (config["apiVersion"], config["kind"]) == (sample["apiVersion"], sample["kind"])
    # Only where-it-runs values differ: in-cluster credentials, the Lease's namespace, loopback.
    assert config["clientConnection"] == {**sample["clientConnection"], "kubeconfig": ""}
    assert config["leaderElection"] == {**sample["leaderElection"], "resourceNamespace": "gs-sys"}
    assert config["profiles"] == sample["profiles"]
    # kube-scheduler's own preemption is off: preemption is the operator's, gang-aware.
    assert sample["profiles"] == [
        {
            "schedulerName": "gangshare-scheduler",
            "plugins": {"postFilter": {"disabled": [{"name": "DefaultPreemption"}]}},
        }
    ]
    [extender] = config["extenders"]
    [sample_extender] = sample["extenders"]
    assert extender == {**sample_extender, "urlPrefix": "http://127.0.0.1:8888/"}
    assert extender["nodeCacheCapable"] is True
    assert [r["name"] for r in extender["managedResources"]] == [
        "nvidia.com/gpu",
        "gangshare.io/gpu-share",
    ]


def test_only_extender_bind_names_the_bind_verb_and_grants_the_extender_bindings(helm: Helm):
    def bind_verb_and_rules(*flags: str) -> tuple[str | None, list[list[str]]]:
        manifests = helm.render(*flags)
        rules = manifests[("ClusterRole", "gangshare-extender")]["rules"]
        [extender] = scheduler_config(manifests)["extenders"]
        return extender.get("bindVerb"), [r["resources"] for r in rules]

    verb, resources = bind_verb_and_rules()
    assert verb is None and ["pods/binding"] not in resources
    verb, resources = bind_verb_and_rules("--set", "extender.bind=true")
    assert verb == "bind" and ["pods/binding"] in resources


def test_scheduler_name_and_extender_port_stay_consistent(helm: Helm):
    manifests = helm.render("--set", "schedulerName=team-gpu", "--set", "extender.port=9000")
    config = scheduler_config(manifests)
    assert [p["schedulerName"] for p in config["profiles"]] == ["team-gpu"]
    assert config["extenders"][0]["urlPrefix"] == "http://127.0.0.1:9000/"
    operator = containers(manifests[("Deployment", "gangshare-operator")])["operator"]
    assert "--scheduler-name=team-gpu" in operator["args"]
    pod = containers(manifests[("Deployment", "gangshare-scheduler")])
    assert "--port=9000" in pod["extender"]["args"]
    assert "--scheduler-name=team-gpu" in pod["extender"]["args"]
    # The verbs stay on loopback; only the metrics port is a container port, and the Service's.
    assert "--host=127.0.0.1" in pod["extender"]["args"]
    assert pod["extender"]["ports"] == [
        {"name": "metrics", "containerPort": 8889, "protocol": "TCP"}
    ]
    service = manifests[("Service", "gangshare-extender")]
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 8889, "targetPort": 8889, "protocol": "TCP"}
    ]


def test_values_become_operator_arguments_the_cli_accepts(helm: Helm, tmp_path: Path):
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "operator": {
                    "ordering": "ShortestFirst",
                    "backfill": True,
                    "fairShare": True,
                    "smallJobMaxGpus": 2,
                    "quotas": {"research": 16, "production": 64},
                    "maxPriority": {"*": 0, "research": 100},
                    "cycleInterval": 0.5,
                    "startTimeoutSeconds": 300,
                    "starvationSeconds": 86400,
                    "reclaimMinRuntimeSeconds": 600,
                    "maxEvictions": 3,
                }
            }
        )
    )
    manifests = helm.render("-f", str(values))
    args = containers(manifests[("Deployment", "gangshare-operator")])["operator"]["args"]
    assert args == [
        "operator",
        "--liveness=http://0.0.0.0:8080/healthz",
        "--metrics-address=0.0.0.0:8081",
        "--leader-elect",
        "--lease-name=gangshare-operator",
        "--lease-namespace=gangshare-system",
        "--scheduler-name=gangshare-scheduler",
        "--ordering=ShortestFirst",
        "--cycle-interval=0.5",
        "--forecast-period=30",
        "--backfill",
        "--fair-share",
        "--small-job-max-gpus=2",
        "--starvation-seconds=86400",
        "--reclaim-min-runtime=600",
        "--max-evictions=3",
        "--quota=production=64",
        "--quota=research=16",
        "--max-priority=*=0",
        "--max-priority=research=100",
        "--user-error-retries=0",
        "--backoff-base-seconds=10",
        "--start-timeout=300",
        "--unschedulable-release=5",
        "--stuck-pod-seconds=60",
        "--image-pull-grace=300",
        "--stall-seconds=120",
    ]
    parsed = cli_parser().parse_args(args)
    assert parse_quotas(parsed.quota) == {"research": 16, "production": 64}
    assert parse_priority_limits(parsed.max_priority) == {"*": 0, "research": 100}
    assert parsed.start_timeout == 300
    assert (parsed.ordering, parsed.small_job_max_gpus, parsed.cycle_interval) == (
        "ShortestFirst",
        2,
        0.5,
    )
    assert parsed.backfill and parsed.fair_share
    assert (parsed.starvation_seconds, parsed.reclaim_min_runtime, parsed.max_evictions) == (
        86400,
        600,
        3,
    )

    defaults = helm.render()
    args = containers(defaults[("Deployment", "gangshare-operator")])["operator"]["args"]
    # The default stack is the best measured in docs/results.md.
    assert [a for a in args if a.startswith(("--backfill", "--fair-share", "--small"))] == [
        "--backfill",
        "--fair-share",
        "--small-job-max-gpus=2",
    ]
    assert not any(a.startswith(("--quota", "--max-evictions")) for a in args)
    parsed = cli_parser().parse_args(args)
    assert (parsed.starvation_seconds, parsed.reclaim_min_runtime, parsed.max_evictions) == (
        604800,
        1800,
        None,
    )
    assert (parsed.ordering, parsed.quota, parsed.liveness) == (
        "Priority",
        [],
        "http://0.0.0.0:8080/healthz",
    )
    assert (parsed.metrics_address, parsed.leader_elect) == ("0.0.0.0:8081", True)
    assert (parsed.lease_name, parsed.lease_namespace) == ("gangshare-operator", "gangshare-system")
    extender = containers(defaults[("Deployment", "gangshare-scheduler")])["extender"]
    parsed = cli_parser().parse_args(extender["args"])
    assert (parsed.host, parsed.port, parsed.metrics_port) == ("127.0.0.1", 8888, 8889)


def test_pods_are_locked_down_and_the_operator_replicas_elect_a_leader(helm: Helm):
    manifests = helm.render("--set", "image.repository=registry.example/gangshare")
    operator = manifests[("Deployment", "gangshare-operator")]
    # Two replicas, one acting: a rolling update may overlap them, the Lease decides.
    assert operator["spec"]["replicas"] == 2
    assert operator["spec"]["strategy"] == {"type": "RollingUpdate"}
    assert "--leader-elect" in containers(operator)["operator"]["args"]
    assert ("Role", "gangshare-operator-leader-election") in manifests
    probe = containers(operator)["operator"]["livenessProbe"]["httpGet"]
    assert (probe["path"], probe["port"]) == ("/healthz", "healthz")
    assert containers(operator)["operator"]["ports"] == [
        {"name": "healthz", "containerPort": 8080, "protocol": "TCP"},
        {"name": "metrics", "containerPort": 8081, "protocol": "TCP"},
    ]
    # Without leader election: one replica, never two at once, and no Lease Role.
    single = helm.render(
        "--set", "operator.leaderElection.enabled=false", "--set", "operator.replicas=1"
    )
    alone = single[("Deployment", "gangshare-operator")]
    assert (alone["spec"]["replicas"], alone["spec"]["strategy"]) == (1, {"type": "Recreate"})
    assert "--no-leader-elect" in containers(alone)["operator"]["args"]
    assert ("Role", "gangshare-operator-leader-election") not in single
    refused = helm(
        *("template", "x", str(CHART), "--set", "operator.leaderElection.enabled=false"),
        check=False,
    )
    assert refused.returncode != 0 and "operator.leaderElection.enabled" in refused.stderr
    for name in ("gangshare-operator", "gangshare-scheduler"):
        pod = manifests[("Deployment", name)]["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in containers(manifests[("Deployment", name)]).values():
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True
            assert security["allowPrivilegeEscalation"] is False
            assert security["capabilities"] == {"drop": ["ALL"]}
    pod = containers(manifests[("Deployment", "gangshare-scheduler")])
    # The extender is a native sidecar: started, and startup-probed, before kube-scheduler.
    assert pod["extender"]["restartPolicy"] == "Always"
    assert pod["extender"]["image"] == "registry.example/gangshare:0.1.0"
    assert pod["extender"]["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert pod["kube-scheduler"]["image"] == "registry.k8s.io/kube-scheduler:v1.35.4"
    assert "--config=/etc/gangshare/scheduler-config.yaml" in pod["kube-scheduler"]["command"]


AGENT_RUNTIME_CLASS = "nvidia"
AGENT_HOST_PATHS = {
    "/var/lib/kubelet/device-plugins": ("Directory", False),
    "/var/lib/kubelet/pod-resources": ("Directory", True),
    "/var/run/gangshare": ("DirectoryOrCreate", False),
    # The pods it may have stopped, for the next agent should this one be killed (#25).
    "/var/run/gangshare-agent": ("DirectoryOrCreate", False),
    # The MPS control daemon's pipes, at the host's path: Allocate names it in host mounts.
    "/tmp/nvidia-mps": ("DirectoryOrCreate", True),
    # Writable: a throttled pod is frozen whole through its cgroup (#36).
    "/sys/fs/cgroup": ("Directory", False),
}


def host_paths(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    """host path -> (hostPath type, mounted read-only) for one container of a pod spec."""
    volumes = {v["name"]: v["hostPath"] for v in pod.get("volumes", []) if "hostPath" in v}
    mounts = {m["name"]: m for m in container.get("volumeMounts", [])}
    assert set(volumes) <= set(mounts), (volumes, mounts)
    return {
        volumes[name]["path"]: (volumes[name]["type"], bool(mounts[name].get("readOnly")))
        for name in volumes
    }


def test_the_agent_daemonset_is_root_with_only_kill_and_six_host_paths(helm: Helm):
    manifests = helm.render("--set", "image.repository=registry.example/gangshare")
    daemonset = manifests[("DaemonSet", "gangshare-agent")]
    assert daemonset["metadata"]["namespace"] == "gangshare-system"
    pod = daemonset["spec"]["template"]["spec"]
    [agent] = pod["containers"]
    assert "initContainers" not in pod
    assert agent["image"] == "registry.example/gangshare:0.1.0"
    # Root for the kubelet's sockets, but nothing beyond CAP_KILL: no privileged mode, no
    # escalation, a read-only root file system, the runtime's default seccomp profile.
    assert pod["securityContext"]["runAsUser"] == 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = agent["securityContext"]
    assert security.get("privileged", False) is False
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["KILL"]}
    assert pod["hostPID"] is True
    assert not pod.get("hostNetwork") and not pod.get("hostIPC")
    # Exactly the device-plugin README's six host paths (plus the /tmp emptyDir).
    assert host_paths(pod, agent) == AGENT_HOST_PATHS
    assert [v["name"] for v in pod["volumes"] if "emptyDir" in v] == ["tmp"]
    # Placement: GPU nodes, through their GPU taint, never preempted for ordinary pods.
    assert pod["nodeSelector"] == {"gangshare.io/gpu-node": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["serviceAccountName"] == "gangshare-agent"
    env = {e["name"]: e for e in agent["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert agent["ports"] == [{"name": "metrics", "containerPort": 9402, "protocol": "TCP"}]
    # The arguments are the real CLI's, and the values reach it.
    parsed = cli_parser().parse_args(agent["args"])
    assert (parsed.share_slots, parsed.tolerance, parsed.control_period) == (4, 0.05, 2.0)
    assert (parsed.metrics_port, str(parsed.socket_dir)) == (9402, "/var/run/gangshare")
    assert str(parsed.state_dir) == "/var/run/gangshare-agent"
    assert str(parsed.cgroup_root) == "/host/sys/fs/cgroup"
    assert str(parsed.device_plugin_dir) == "/var/lib/kubelet/device-plugins"
    assert str(parsed.pod_resources_socket) == "/var/lib/kubelet/pod-resources/kubelet.sock"
    assert (str(parsed.mps_pipe_dir), parsed.nvml, parsed.fake_spec) == (
        "/tmp/nvidia-mps",
        "nvml",
        None,
    )
    values = [
        # --set reads 0.1 as a string; the schema wants numbers (as from a values file).
        *("--set", "agent.shareSlots=8", "--set-json", "agent.tolerance=0.1"),
        *("--set-json", "agent.controlPeriod=0.5", "--set", "agent.metricsPort=9500"),
        *("--set", "agent.runtimeClassName=", "--set", "agent.namespace=kube-system"),
        *("--set", "agent.kubeletRootDir=/var/lib/k0s/kubelet"),
        *("--set-json", 'agent.extraArgs=["--publish-interval=5"]'),
    ]
    changed = helm.render(*values)
    daemonset = changed[("DaemonSet", "gangshare-agent")]
    assert daemonset["metadata"]["namespace"] == "kube-system"
    pod = daemonset["spec"]["template"]["spec"]
    [agent] = pod["containers"]
    assert "runtimeClassName" not in pod
    parsed = cli_parser().parse_args(agent["args"])
    assert (parsed.share_slots, parsed.tolerance, parsed.control_period) == (8, 0.1, 0.5)
    assert (parsed.metrics_port, parsed.publish_interval) == (9500, 5.0)
    assert agent["ports"][0]["containerPort"] == 9500
    # Another kubelet root moves the host side only; the agent's own paths stay.
    assert set(host_paths(pod, agent)) == {
        "/var/lib/k0s/kubelet/device-plugins",
        "/var/lib/k0s/kubelet/pod-resources",
        "/var/run/gangshare",
        "/var/run/gangshare-agent",
        "/tmp/nvidia-mps",
        "/sys/fs/cgroup",
    }
    assert str(parsed.device_plugin_dir) == "/var/lib/kubelet/device-plugins"
    account = changed[("ServiceAccount", "gangshare-agent")]
    assert account["metadata"]["namespace"] == "kube-system"
    binding = changed[("ClusterRoleBinding", "gangshare-agent")]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gangshare-agent", "namespace": "kube-system"}
    ]
    assert changed[("Service", "gangshare-agent")]["metadata"]["namespace"] == "kube-system"


def test_the_agent_role_is_exactly_the_readme_list_and_agent_disabled_renders_none(helm: Helm):
    manifests = helm.render()
    rules = manifests[("ClusterRole", "gangshare-agent")]["rules"]
    granted = {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == {
        ("", "nodes", "get"),
        ("", "nodes", "patch"),
        ("", "pods", "list"),
        ("", "pods", "patch"),
        ("", "pods", "delete"),
        ("events.k8s.io", "events", "create"),
    }
    assert not any("resourceNames" in rule for rule in rules)
    off = helm.render(
        "--set", "agent.enabled=false", "--set", "metrics.serviceMonitor.enabled=true"
    )
    assert [key for key in off if "agent" in key[1]] == []
    assert not [key for key in off if key[0] == "DaemonSet"]


def test_disruption_budgets_keep_an_operator_and_spare_a_lone_scheduler(helm: Helm):
    manifests = helm.render()
    operator = manifests[("PodDisruptionBudget", "gangshare-operator")]
    assert operator["spec"]["maxUnavailable"] == 1
    deployment = manifests[("Deployment", "gangshare-operator")]
    assert operator["spec"]["selector"] == deployment["spec"]["selector"]
    # One scheduler replica: a budget could only block drains.
    assert ("PodDisruptionBudget", "gangshare-scheduler") not in manifests
    two = helm.render("--set", "scheduler.replicas=2")
    scheduler = two[("PodDisruptionBudget", "gangshare-scheduler")]
    assert scheduler["spec"]["maxUnavailable"] == 1
    assert (
        scheduler["spec"]["selector"]
        == (two[("Deployment", "gangshare-scheduler")]["spec"]["selector"])
    )
    off = helm.render("--set", "podDisruptionBudget.enabled=false", "--set", "scheduler.replicas=2")
    assert not [key for key in off if key[0] == "PodDisruptionBudget"]


def test_operator_and_agent_metrics_services_and_their_service_monitors(helm: Helm):
    manifests = helm.render("--set", "agent.namespace=gpu-system", namespace="gs-sys")
    operator = manifests[("Service", "gangshare-operator")]
    assert operator["spec"]["ports"] == [
        {"name": "metrics", "port": 8081, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert (
        operator["spec"]["selector"]
        == (manifests[("Deployment", "gangshare-operator")]["spec"]["selector"]["matchLabels"])
    )
    agent = manifests[("Service", "gangshare-agent")]
    assert agent["metadata"]["namespace"] == "gpu-system"
    assert agent["spec"]["clusterIP"] == "None"  # headless: every agent pod is a target
    assert agent["spec"]["ports"] == [
        {"name": "metrics", "port": 9402, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert (
        agent["spec"]["selector"]
        == (manifests[("DaemonSet", "gangshare-agent")]["spec"]["selector"]["matchLabels"])
    )
    assert not [key for key in manifests if key[0] == "ServiceMonitor"]
    monitored = helm.render(
        *("--set", "metrics.serviceMonitor.enabled=true", "--set", "agent.namespace=gpu-system"),
        *("--set", "metrics.serviceMonitor.labels.release=prometheus"),
        namespace="gs-sys",
    )
    services = {name: obj for (kind, name), obj in monitored.items() if kind == "Service"}
    monitors = {name: obj for (kind, name), obj in monitored.items() if kind == "ServiceMonitor"}
    assert set(monitors) == {"gangshare-operator", "gangshare-extender", "gangshare-agent"}
    for name, monitor in monitors.items():
        service = services[name]
        assert monitor["metadata"]["namespace"] == "gs-sys"
        assert monitor["metadata"]["labels"]["release"] == "prometheus"
        # Each selects exactly its Service, by labels and namespace, on the port named metrics.
        labels = service["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
        others = [s for n, s in services.items() if n != name]
        assert not any(
            monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
            for s in others
        )
        assert monitor["spec"]["namespaceSelector"] == {
            "matchNames": [service["metadata"]["namespace"]]
        }
        [endpoint] = monitor["spec"]["endpoints"]
        assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
        # The agent's series carry the GPU pod's namespace and pod labels: kept as they are.
        assert endpoint.get("honorLabels", False) == (name == "gangshare-agent")


# ----- a release in the session cluster --------------------------------------------------------


@dataclass
class Release:
    name: str
    namespace: str
    # agent.namespace: the agent cannot meet the release namespace's "restricted" level.
    agent_namespace: str
    scheduler_name: str
    manifests: Manifests
    # A `default` Queue made outside the release (by an operator of another test) is left alone.
    default_queue_was_there: bool = False

    def namespace_of(self, who: str) -> str:
        return self.agent_namespace if who == "agent" else self.namespace

    def sa(self, who: str) -> str:
        return f"system:serviceaccount:{self.namespace_of(who)}:{self.name}-{who}"


def crd_exists(kube: Kube, name: str = CRD_NAME) -> bool:
    try:
        kube.extensions.read_custom_resource_definition(name)
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


def default_queue(kube: Kube) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = kube.custom.get_cluster_custom_object(
            *TJ[:2], QUEUE_PLURAL, "default"
        )
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    return found


@pytest.fixture(scope="module")
def release(crd: Kube, helm: Helm) -> Iterator[Release]:
    """The chart installed beside what `kubectl apply -f crds/` installed (the session's `crd`,
    always, so a module run alone sees what the whole suite does): the CRDs, and the shipped
    policies, whose gang gate names another operator's account than this release's."""
    kube = crd
    suffix = uuid.uuid4().hex[:6]
    name, namespace = f"gangshare-{suffix}", f"gs-{suffix}"
    scheduler_name = f"gs-helm-{suffix}"  # not the session's own gangshare-scheduler
    kubeconfig = f"--kubeconfig={kube.state.kubeconfig}"
    crds_were_there = {crd: crd_exists(kube, crd) for crd in (CRD_NAME, QUEUE_CRD_NAME)}
    default_was_there = crds_were_there[QUEUE_CRD_NAME] and default_queue(kube) is not None
    # Users pass --create-namespace; this namespace is made first to enforce the "restricted" Pod
    # Security Standard, so the chart's pods are only created if every container complies.
    restricted = {f"pod-security.kubernetes.io/{k}": "restricted" for k in ("enforce", "warn")}
    kube.core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace, labels=restricted))
    )
    # The agent needs host paths and the host PID namespace, which "restricted" refuses: it goes
    # into a namespace of its own without that label (as kube-system would be on a real cluster).
    agent_namespace = f"{namespace}-agent"
    kube.core.create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=agent_namespace))
    )
    # The RuntimeClass the NVIDIA container toolkit installs; without it the RuntimeClass
    # admission plugin refuses the agent's pods (KWOK ignores the handler).
    node_api = client.NodeV1Api(kube.api_client)
    runtime_class_was_there = AGENT_RUNTIME_CLASS in {
        r.metadata.name for r in node_api.list_runtime_class().items
    }
    if not runtime_class_was_there:
        node_api.create_runtime_class(
            client.V1RuntimeClass(
                metadata=client.V1ObjectMeta(name=AGENT_RUNTIME_CLASS), handler="nvidia"
            )
        )
    try:
        helm(
            *("install", name, str(CHART), "-n", namespace, "--wait=false"),
            *("--set", f"schedulerName={scheduler_name}", kubeconfig),
            *("--set", f"agent.namespace={agent_namespace}"),
        )
        manifest = helm("get", "manifest", name, "-n", namespace, kubeconfig).stdout
        yield Release(
            name,
            namespace,
            agent_namespace,
            scheduler_name,
            by_kind_and_name(manifest),
            default_was_there,
        )
    finally:
        # The last test uninstalls; this is for a run that stopped before it.
        helm("uninstall", name, "-n", namespace, "--wait", kubeconfig, check=False)
        # Helm created the CRDs that were missing, and Helm never deletes CRDs: this test does,
        # leaving the session cluster as it found it (the integration tests install them
        # themselves). The chart keeps its `default` Queue on uninstall too.
        delete_crds = [
            crd for crd, there in crds_were_there.items() if not there and crd_exists(kube, crd)
        ]
        if QUEUE_CRD_NAME not in delete_crds and not default_was_there:
            with contextlib.suppress(ApiException):
                kube.custom.delete_cluster_custom_object(*TJ[:2], QUEUE_PLURAL, "default")
        for ns in (namespace, agent_namespace):
            with contextlib.suppress(ApiException):
                # Pods first, without grace: the namespace controller would otherwise wait out
                # their 30 s termination grace period (KWOK pods have nothing to shut down).
                kube.core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
                kube.core.delete_namespace(ns)
        for crd in delete_crds:
            kube.extensions.delete_custom_resource_definition(crd)
        if not runtime_class_was_there:
            with contextlib.suppress(ApiException):
                node_api.delete_runtime_class(AGENT_RUNTIME_CLASS)

        def cleaned_up() -> bool:
            namespaces = {n.metadata.name for n in kube.core.list_namespace().items}
            return not {namespace, agent_namespace} & namespaces and not any(
                crd_exists(kube, c) for c in delete_crds
            )

        eventually(
            cleaned_up,
            timeout=90,
            what=f"namespaces {namespace}, {agent_namespace} (and the CRDs) deleted",
        )


def test_install_creates_every_object_and_the_crd(kube: Kube, release: Release):
    name, ns = release.name, release.namespace
    apps = client.AppsV1Api(kube.api_client)
    rbac = client.RbacAuthorizationV1Api(kube.api_client)
    operator = apps.read_namespaced_deployment(f"{name}-operator", ns)
    assert operator.spec.replicas == 2
    scheduler = apps.read_namespaced_deployment(f"{name}-scheduler", ns)
    # The API server kept the extender as a native sidecar beside kube-scheduler.
    [sidecar] = scheduler.spec.template.spec.init_containers
    assert (sidecar.name, sidecar.restart_policy) == ("extender", "Always")
    assert [c.name for c in scheduler.spec.template.spec.containers] == ["kube-scheduler"]
    for who in ("operator", "scheduler", "agent"):
        kube.core.read_namespaced_service_account(f"{name}-{who}", release.namespace_of(who))
    for cluster_role in (f"{name}-operator", f"{name}-extender", f"{name}-agent"):
        rbac.read_cluster_role(cluster_role)
    agent_binding = rbac.read_cluster_role_binding(f"{name}-agent")
    assert [(s.name, s.namespace) for s in agent_binding.subjects] == [
        (f"{name}-agent", release.agent_namespace)
    ]
    bindings = {
        f"{name}-operator": f"{name}-operator",
        f"{name}-extender": f"{name}-extender",
        f"{name}-agent": f"{name}-agent",
        f"{name}-scheduler-as-kube-scheduler": "system:kube-scheduler",
        f"{name}-scheduler-as-volume-scheduler": "system:volume-scheduler",
    }
    for binding, role in bindings.items():
        assert rbac.read_cluster_role_binding(binding).role_ref.name == role
    for who in ("scheduler", "operator"):
        rbac.read_namespaced_role(f"{name}-{who}-leader-election", ns)
        rbac.read_namespaced_role_binding(f"{name}-{who}-leader-election", ns)
    reader = rbac.read_namespaced_role_binding(f"{name}-{ns}-scheduler-auth-reader", "kube-system")
    assert reader.role_ref.name == "extension-apiserver-authentication-reader"
    service = kube.core.read_namespaced_service(f"{name}-extender", ns)
    assert [(p.name, p.port) for p in service.spec.ports] == [("metrics", 8889)]
    assert service.spec.selector == scheduler.spec.selector.match_labels
    operator_metrics = kube.core.read_namespaced_service(f"{name}-operator", ns)
    assert [(p.name, p.port) for p in operator_metrics.spec.ports] == [("metrics", 8081)]
    assert operator_metrics.spec.selector == operator.spec.selector.match_labels
    agent = apps.read_namespaced_daemon_set(f"{name}-agent", release.agent_namespace)
    agent_metrics = kube.core.read_namespaced_service(f"{name}-agent", release.agent_namespace)
    assert agent_metrics.spec.cluster_ip == "None"
    assert agent_metrics.spec.selector == agent.spec.selector.match_labels
    budget = client.PolicyV1Api(kube.api_client).read_namespaced_pod_disruption_budget(
        f"{name}-operator", ns
    )
    assert budget.spec.max_unavailable == 1
    config = kube.core.read_namespaced_config_map(f"{name}-scheduler-config", ns)
    profiles = yaml.safe_load(config.data["scheduler-config.yaml"])["profiles"]
    assert [p["schedulerName"] for p in profiles] == [release.scheduler_name]
    # What the Grafana sidecar looks for (the content is checked when rendering).
    dashboard = kube.core.read_namespaced_config_map(f"{name}-dashboard-overview", ns)
    assert dashboard.metadata.labels["grafana_dashboard"] == "1"
    assert list(dashboard.data) == ["gangshare-overview.json"]
    for obj in (operator, scheduler, service, config, dashboard, agent, agent_metrics):
        assert obj.metadata.labels["app.kubernetes.io/instance"] == name
        assert obj.metadata.labels["app.kubernetes.io/managed-by"] == "Helm"

    def established() -> bool:
        crd = kube.extensions.read_custom_resource_definition(CRD_NAME)
        return any(
            c.type == "Established" and c.status == "True" for c in crd.status.conditions or []
        )

    eventually(established, what="TrainingJob CRD established")
    queues = kube.extensions.read_custom_resource_definition(QUEUE_CRD_NAME)
    assert queues.spec.scope == "Cluster"
    # The release made the default Queue unless one was there already (then it leaves it be).
    assert (("Queue", "default") in release.manifests) == (not release.default_queue_was_there)
    default = default_queue(kube)
    assert default is not None
    if not release.default_queue_was_there:
        assert default["metadata"]["labels"]["app.kubernetes.io/instance"] == name

    def pods_admitted() -> bool:
        pods = kube.core.list_namespaced_pod(
            ns, label_selector=f"app.kubernetes.io/instance={name}"
        )
        components = {p.metadata.labels["app.kubernetes.io/component"] for p in pods.items}
        return components == {"operator", "scheduler"}

    # Admitted by Pod Security "restricted" (the ReplicaSets could not create them otherwise).
    eventually(pods_admitted, what="operator and scheduler pods created")


def tolerated(node: client.V1Node, tolerations: list[dict[str, Any]]) -> bool:
    """Whether a DaemonSet pod with these tolerations may run on the node. The DaemonSet
    controller adds tolerations for the node.kubernetes.io/ conditions itself."""

    def tolerates(taint: client.V1Taint) -> bool:
        return any(
            t.get("key") in (None, taint.key)
            and t.get("effect") in (None, taint.effect)
            and (t.get("operator") == "Exists" or t.get("value") == taint.value)
            for t in tolerations
        )

    return all(
        taint.effect == "PreferNoSchedule"
        or taint.key.startswith("node.kubernetes.io/")
        or tolerates(taint)
        for taint in node.spec.taints or []
    )


def test_helm_install_brings_every_deployment_and_the_daemonset_up(kube: Kube, release: Release):
    """On KWOK nodes, which mark bound pods Running and Ready: the Deployments' replicas are
    admitted (Pod Security "restricted" in the release namespace), scheduled and available, and
    the agent has one Ready pod on every GPU node it selects."""
    apps = client.AppsV1Api(kube.api_client)
    name = release.name
    for deployment in (f"{name}-operator", f"{name}-scheduler"):

        def available(d: str = deployment) -> bool:
            found = apps.read_namespaced_deployment(d, release.namespace)
            wanted = found.spec.replicas
            status = found.status
            conditions = {c.type: c.status for c in status.conditions or []}
            # Raised, not returned: `eventually` then reports the last status it saw.
            assert (
                status.available_replicas == wanted
                and status.ready_replicas == wanted
                and conditions.get("Available") == "True"
            ), status
            return True

        eventually(available, timeout=90, what=f"Deployment {deployment} available")
    daemonset = release.manifests[("DaemonSet", f"{name}-agent")]
    pod = daemonset["spec"]["template"]["spec"]
    selector = ",".join(f"{k}={v}" for k, v in pod["nodeSelector"].items())
    gpu_nodes = {
        n.metadata.name
        for n in kube.core.list_node(label_selector=selector).items
        if tolerated(n, pod["tolerations"])
    }
    assert gpu_nodes, f"no node matches {selector}"

    def all_ready() -> bool:
        status = apps.read_namespaced_daemon_set(f"{name}-agent", release.agent_namespace).status
        assert (
            status.desired_number_scheduled == len(gpu_nodes)
            and status.current_number_scheduled == len(gpu_nodes)
            and status.number_ready == len(gpu_nodes)
            and status.number_available == len(gpu_nodes)
        ), status
        return True

    eventually(all_ready, timeout=90, what=f"an agent Ready on each of {sorted(gpu_nodes)}")
    pods = kube.core.list_namespaced_pod(
        release.agent_namespace, label_selector="app.kubernetes.io/component=agent"
    ).items
    assert {p.spec.node_name for p in pods} == gpu_nodes
    for agent in pods:
        assert agent.spec.host_pid is True
        assert agent.spec.runtime_class_name == AGENT_RUNTIME_CLASS
        assert agent.spec.priority_class_name == "system-node-critical"
        assert agent.spec.service_account_name == f"{name}-agent"


def test_another_release_leaves_the_default_queue_to_its_owner(
    kube: Kube, helm: Helm, release: Release
):
    def render(name: str) -> Manifests:
        # --dry-run=server lets the chart's lookup see the cluster, as install and upgrade do.
        out = helm(
            *("template", name, str(CHART), "-n", release.namespace, "--dry-run=server"),
            f"--kubeconfig={kube.state.kubeconfig}",
        ).stdout
        return by_kind_and_name(out)

    assert ("Queue", "default") not in render(f"{release.name}-other")
    # The owner keeps rendering it, so an upgrade does not drop it from the release.
    owned = ("Queue", "default") in render(release.name)
    assert owned == (not release.default_queue_was_there)


# Every API call the components make, as `kubectl auth can-i` checks of their service accounts,
# and a few they must not be able to make.
#   (account, verb, resource, subresource, namespace, allowed)
# account: "operator", "scheduler" (the extender and kube-scheduler share the scheduler pod's) or
# "agent" (its account lives in agent.namespace);
# namespace: "*" all namespaces, "release" the release namespace, or a namespace's name.
RBAC_TABLE: list[tuple[str, str, str, str, str, bool]] = [
    # operator: kopf's watches and src/gangshare/operator/kubeapi.py
    ("operator", "list", "trainingjobs.gangshare.io", "", "*", True),
    ("operator", "watch", "trainingjobs.gangshare.io", "", "*", True),
    ("operator", "get", "trainingjobs.gangshare.io", "", "*", True),
    ("operator", "delete", "trainingjobs.gangshare.io", "", "*", True),
    ("operator", "patch", "trainingjobs.gangshare.io", "status", "*", True),
    ("operator", "update", "trainingjobs.gangshare.io", "finalizers", "*", True),
    ("operator", "list", "queues.gangshare.io", "", "", True),
    ("operator", "watch", "queues.gangshare.io", "", "", True),
    ("operator", "get", "queues.gangshare.io", "", "", True),
    ("operator", "create", "queues.gangshare.io", "", "", True),
    ("operator", "patch", "queues.gangshare.io", "status", "", True),
    ("operator", "get", "pods", "", "*", True),
    ("operator", "list", "pods", "", "*", True),
    ("operator", "watch", "pods", "", "*", True),
    ("operator", "create", "pods", "", "*", True),
    ("operator", "patch", "pods", "", "*", True),
    ("operator", "delete", "pods", "", "*", True),
    ("operator", "get", "services", "", "*", True),
    ("operator", "create", "services", "", "*", True),
    ("operator", "list", "nodes", "", "", True),
    ("operator", "watch", "nodes", "", "", True),
    ("operator", "create", "events.events.k8s.io", "", "*", True),
    ("operator", "list", "customresourcedefinitions.apiextensions.k8s.io", "", "", True),
    ("operator", "watch", "customresourcedefinitions.apiextensions.k8s.io", "", "", True),
    # operator: its leader Lease (src/gangshare/operator/leader.py), in the release namespace only
    ("operator", "create", "leases.coordination.k8s.io", "", "release", True),
    ("operator", "get", "leases.coordination.k8s.io/gangshare-operator", "", "release", True),
    ("operator", "update", "leases.coordination.k8s.io/gangshare-operator", "", "release", True),
    ("operator", "update", "leases.coordination.k8s.io/gangshare-scheduler", "", "release", False),
    ("operator", "update", "leases.coordination.k8s.io/gangshare-operator", "", "default", False),
    ("operator", "update", "trainingjobs.gangshare.io", "", "*", False),
    # Queues are the cluster admin's: the operator writes only their status (and `default`).
    ("operator", "patch", "queues.gangshare.io", "", "", False),
    ("operator", "delete", "queues.gangshare.io", "", "", False),
    ("operator", "patch", "nodes", "", "", False),
    ("operator", "create", "pods", "binding", "*", False),
    ("operator", "get", "secrets", "", "*", False),
    ("operator", "delete", "services", "", "*", False),
    # extender: src/gangshare/extender/watch.py and binder.py
    ("scheduler", "list", "nodes", "", "", True),
    ("scheduler", "watch", "nodes", "", "", True),
    ("scheduler", "list", "pods", "", "*", True),
    ("scheduler", "watch", "pods", "", "*", True),
    ("scheduler", "get", "pods", "", "*", True),
    ("scheduler", "create", "pods", "binding", "*", True),
    ("scheduler", "list", "trainingjobs.gangshare.io", "", "*", True),
    ("scheduler", "watch", "trainingjobs.gangshare.io", "", "*", True),
    ("scheduler", "get", "trainingjobs.gangshare.io", "", "*", True),
    # kube-scheduler: its Lease, delegated authentication, events
    ("scheduler", "create", "leases.coordination.k8s.io", "", "release", True),
    ("scheduler", "get", "leases.coordination.k8s.io/gangshare-scheduler", "", "release", True),
    ("scheduler", "update", "leases.coordination.k8s.io/gangshare-scheduler", "", "release", True),
    (
        "scheduler",
        "get",
        "configmaps/extension-apiserver-authentication",
        "",
        "kube-system",
        True,
    ),
    ("scheduler", "create", "events.events.k8s.io", "", "*", True),
    ("scheduler", "create", "tokenreviews.authentication.k8s.io", "", "", True),
    ("scheduler", "create", "subjectaccessreviews.authorization.k8s.io", "", "", True),
    ("scheduler", "update", "leases.coordination.k8s.io/someone-else", "", "release", False),
    ("scheduler", "get", "configmaps/kube-root-ca.crt", "", "kube-system", False),
    ("scheduler", "create", "pods", "", "*", False),
    ("scheduler", "patch", "pods", "", "*", False),  # the Binding carries the GPU annotations
    ("scheduler", "delete", "trainingjobs.gangshare.io", "", "*", False),
    ("scheduler", "get", "secrets", "", "*", False),
    # agent: src/gangshare/agent/nodeapi.py (device-plugin/README.md's list), in agent.namespace
    ("agent", "get", "nodes", "", "", True),
    ("agent", "patch", "nodes", "", "", True),
    ("agent", "list", "pods", "", "*", True),
    ("agent", "patch", "pods", "", "*", True),
    # An over-cap opportunistic pod is deleted; the node-scope policy keeps it to its own node.
    ("agent", "delete", "pods", "", "*", True),
    ("agent", "create", "pods", "eviction", "*", False),
    ("agent", "create", "events.events.k8s.io", "", "*", True),
    ("agent", "list", "nodes", "", "", False),
    ("agent", "delete", "nodes", "", "", False),
    ("agent", "patch", "nodes", "status", "", False),
    ("agent", "create", "pods", "", "*", False),
    ("agent", "watch", "pods", "", "*", False),
    ("agent", "create", "pods", "binding", "*", False),
    ("agent", "get", "secrets", "", "*", False),
    ("agent", "get", "configmaps", "", "release", False),
    ("agent", "update", "trainingjobs.gangshare.io", "", "*", False),
    ("agent", "list", "trainingjobs.gangshare.io", "", "*", False),
    ("agent", "update", "leases.coordination.k8s.io/gangshare-operator", "", "release", False),
]


def test_service_accounts_may_do_exactly_what_the_code_does(kube: Kube, release: Release):
    def check(row: tuple[str, str, str, str, str, bool]) -> str | None:
        who, verb, resource, subresource, namespace, allowed = row
        scope = {"*": ["-A"], "": [], "release": ["-n", release.namespace]}.get(
            namespace, ["-n", namespace]
        )
        extra = [f"--subresource={subresource}"] if subresource else []
        argv = ["auth", "can-i", verb, resource, *extra, *scope, f"--as={release.sa(who)}"]
        done = subprocess.run(kube.kubectl(*argv), capture_output=True, text=True, timeout=30)
        answer = done.stdout.strip()
        if answer not in ("yes", "no"):
            return f"{row}: kubectl said {done.stdout!r} {done.stderr!r}"
        return None if (answer == "yes") == allowed else f"{row}: got {answer!r}"

    with ThreadPoolExecutor(max_workers=8) as pool:
        wrong = [problem for problem in pool.map(check, RBAC_TABLE) if problem]
    assert wrong == [], "\n".join(wrong)


def test_the_release_keeps_gangshare_keys_on_pods_its_own(
    kube: Kube, release: Release, namespace: str
):
    grant_edit(kube, namespace)
    forged = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "forged",
            "annotations": {"gangshare.io/assigned-gpus": "0,1,2,3"},
        },
        "spec": {"containers": [{"name": "c", "image": "example.invalid/t:1"}]},
    }

    attempts = iter(range(1000))

    def refused() -> str | None:
        # A new name each try: a pod created before the policy took effect is not a refusal.
        forged["metadata"]["name"] = f"forged-{next(attempts)}"
        done = subprocess.run(
            kube.kubectl("apply", "-n", namespace, "--as=tenant", "-f", "-"),
            input=yaml.safe_dump(forged),
            capture_output=True,
            text=True,
        )
        return done.stderr if done.returncode != 0 else None

    message = eventually(refused, timeout=20, what="the forged pod refused")
    assert "metadata.annotations: keys under gangshare.io/" in message, message
    # The same pod without the forged key is the tenant's to create.
    del forged["metadata"]["annotations"]
    allowed = subprocess.run(
        kube.kubectl("apply", "-n", namespace, "--as=tenant", "-f", "-"),
        input=yaml.safe_dump(forged),
        capture_output=True,
        text=True,
    )
    assert allowed.returncode == 0, allowed.stderr


def sa_kubeconfig(
    kube: Kube, release: Release, who: str, folder: Path, pod: str | None = None
) -> Path:
    """A kubeconfig that authenticates with a fresh token of one of the chart's accounts, bound
    to `pod` (of that account, in its namespace) when given, as the kubelet's projected tokens
    are: the API server then names the pod's node in the token."""
    bound = ["--bound-object-kind=Pod", f"--bound-object-name={pod}"] if pod else []
    token = subprocess.run(
        kube.kubectl(
            *("create", "token", f"{release.name}-{who}"),
            *("-n", release.namespace_of(who), "--duration=1h", *bound),
        ),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    config = yaml.safe_load(Path(kube.state.kubeconfig).read_text())
    for user in config["users"]:
        user["user"] = {"token": token}
    path = folder / f"{who}.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def with_flags(argv: list[str], **flags: str) -> list[str]:
    """argv with `--flag=value` entries replaced (or added); underscores become dashes."""
    wanted = {f"--{k.replace('_', '-')}": v for k, v in flags.items()}
    kept = [a for a in argv if a.split("=", 1)[0] not in wanted]
    return kept + [f"{k}={v}" for k, v in wanted.items()]


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


def https_ok(url: str) -> bool:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # kube-scheduler's self-signed serving cert, on loopback
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def test_components_run_under_their_service_accounts(
    kube: Kube, release: Release, namespace: str, tmp_path: Path
):
    name = release.name
    operator_args = containers(release.manifests[("Deployment", f"{name}-operator")])["operator"][
        "args"
    ]
    pod = containers(release.manifests[("Deployment", f"{name}-scheduler")])
    config = scheduler_config(release.manifests, name)
    scheduler_kubeconfig = sa_kubeconfig(kube, release, "scheduler", tmp_path)
    operator_kubeconfig = sa_kubeconfig(kube, release, "operator", tmp_path)
    extender_port, metrics_port, scheduler_port, liveness_port, operator_metrics_port = (
        processes.free_port() for _ in range(5)
    )
    # The chart's configuration; only what differs outside a pod is rewritten.
    config["clientConnection"]["kubeconfig"] = str(scheduler_kubeconfig)
    config["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{extender_port}/"
    config_file = tmp_path / "scheduler-config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    logs = tmp_path / "logs"
    extender_args = with_flags(
        pod["extender"]["args"],
        port=str(extender_port),
        metrics_host="127.0.0.1",
        metrics_port=str(metrics_port),
        kubeconfig=str(scheduler_kubeconfig),
    )
    scheduler_args = with_flags(
        pod["kube-scheduler"]["command"][1:],
        config=str(config_file),
        secure_port=str(scheduler_port),
        bind_address="127.0.0.1",
        authentication_kubeconfig=str(scheduler_kubeconfig),
        authorization_kubeconfig=str(scheduler_kubeconfig),
    )
    operator_args = with_flags(
        operator_args,
        liveness=f"http://127.0.0.1:{liveness_port}/healthz",
        metrics_address=f"127.0.0.1:{operator_metrics_port}",
        kubeconfig=str(operator_kubeconfig),
    )
    # The agent for a KWOK node of its own, with fake GPUs: no kubelet, so its device plugins
    # never register (it logs that and goes on), but it reads and patches its Node and lists the
    # pods bound to it under the chart's agent account, with the chart's arguments.
    pool = NodePool(kube, namespace)
    [agent_node] = pool.nodes(1, 4)
    fake_gpus = tmp_path / "gpus.yaml"
    fake_gpus.write_text(
        yaml.safe_dump(
            {
                "nodePools": [
                    {"name": pool.label, "count": 1, "gpusPerNode": 4, "gpuModel": pool.model}
                ]
            }
        )
    )
    agent_metrics_port = processes.free_port()
    # Its credentials are bound to a pod of its account on that node, as a DaemonSet pod's are:
    # the chart's node-scope policy refuses the agent's writes under any other token.
    agent_pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name=f"agent-{agent_node}"),
        spec=client.V1PodSpec(
            node_name=agent_node,
            service_account_name=f"{name}-agent",
            containers=[client.V1Container(name="agent", image="example.invalid/agent:1")],
        ),
    )
    kube.core.create_namespaced_pod(release.agent_namespace, agent_pod)
    agent_kubeconfig = sa_kubeconfig(kube, release, "agent", tmp_path, pod=f"agent-{agent_node}")
    agent_args = with_flags(
        containers(release.manifests[("DaemonSet", f"{name}-agent")])["agent"]["args"],
        node_name=agent_node,
        kubeconfig=str(agent_kubeconfig),
        nvml="fake",
        fake_spec=str(fake_gpus),
        device_plugin_dir=str(tmp_path / "device-plugins"),
        pod_resources_socket=str(tmp_path / "no-kubelet.sock"),
        socket_dir=str(tmp_path / "sdk"),
        mps_pipe_dir=str(tmp_path / "mps"),
        metrics_port=str(agent_metrics_port),
        publish_interval="1",
    )
    python = [sys.executable, "-m", "gangshare.cli"]
    argvs = {
        "extender": [*python, *extender_args],
        "kube-scheduler": [str(kube.bins / "kube-scheduler"), *scheduler_args],
        "operator": [*python, *operator_args],
        "agent": [*python, *agent_args],
    }
    started: list[processes.Child] = []

    def start(component: str, ready: Callable[[], bool]) -> None:
        started.append(processes.start(component, argvs[component], logs, attached=True))
        eventually(ready, timeout=30, what=f"{component} ready; log in {logs}")

    try:
        start("extender", lambda: http_status(f"http://127.0.0.1:{metrics_port}/readyz") == 200)
        start("kube-scheduler", lambda: https_ok(f"https://127.0.0.1:{scheduler_port}/healthz"))
        start("operator", lambda: http_status(f"http://127.0.0.1:{liveness_port}/healthz") == 200)
        start("agent", lambda: http_status(f"http://127.0.0.1:{agent_metrics_port}/metrics") == 200)
        coordination = client.CoordinationV1Api(kube.api_client)
        lease = "gangshare-scheduler"
        eventually(
            lambda: (
                coordination.read_namespaced_lease(lease, release.namespace).spec.holder_identity
            ),
            what=f"kube-scheduler holds the Lease {lease} in the release namespace",
        )
        # The operator elects itself on the chart's Lease, under the chart's Role.
        eventually(
            lambda: (
                coordination.read_namespaced_lease(
                    "gangshare-operator", release.namespace
                ).spec.holder_identity
            ),
            what="the operator holds the Lease gangshare-operator in the release namespace",
        )
        run_a_gang_and_a_gpu_pod(kube, release, namespace)
        # The operator's /metrics: the job in the pass's snapshot (once a pass has seen it
        # finished; other tests' jobs may be counted too) and its admission. (Not its start:
        # a 1 s worker may finish before any reconcile sees the gang Running.)
        succeeded = (
            'gangshare_trainingjobs{kind="TrainingJob",phase="Succeeded",queue="default",'
            'service_class="Guaranteed"}'
        )

        def scrape() -> str | None:
            url = f"http://127.0.0.1:{operator_metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as response:
                text: str = response.read().decode()
            return text if succeeded in text and f"{succeeded} 0.0" not in text else None

        # A pass's snapshot: on two busy cores the next pass may come well after the job ends.
        text = eventually(scrape, timeout=90, what="the finished job in the operator's metrics")
        for series in (
            "gangshare_operator_leader 1.0",
            'gangshare_admissions_total{borrowed="false",kind="TrainingJob",queue="default",'
            'service_class="Guaranteed"} 1.0',
        ):
            assert series in text, text

        # The agent, under its account, published on its Node (read, then merge-patched).
        def published() -> dict[str, str] | None:
            annotations = kube.core.read_node(agent_node).metadata.annotations or {}
            wanted = ("gangshare.io/gpu-utilization", "gangshare.io/gpu-enforcement")
            return annotations if all(k in annotations for k in wanted) else None

        eventually(published, what=f"the agent's annotations on {agent_node}")
        url = f"http://127.0.0.1:{agent_metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            agent_metrics = response.read().decode()
        sm = [line for line in agent_metrics.splitlines() if line.startswith("gangshare_gpu_sm_")]
        assert sm and all(f'node="{agent_node}"' in line for line in sm), agent_metrics
    finally:
        survivors = processes.stop(started)
        # Without grace: the namespace fixture then need not wait out 30 s per pod.
        kube.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
        kube.core.delete_namespaced_pod(
            f"agent-{agent_node}", release.agent_namespace, grace_period_seconds=0
        )
        pool.cleanup()
    assert survivors == []
    for child in started:
        # The gate lifts the shipped policy refused (above) are the one 403 expected.
        lines = child.log.read_text(errors="replace").splitlines()
        text = "\n".join(line for line in lines if "gate could not be lifted" not in line)
        for bad in ("forbidden", "not enough permissions", "scheduling pass failed"):
            assert bad not in text.lower(), f"{child.name}: {bad!r} in\n{text[-4000:]}"


def run_a_gang_and_a_gpu_pod(kube: Kube, release: Release, namespace: str) -> None:
    """A 2-worker TrainingJob (operator) and a bare GPU pod (extender's own GPU choice)."""
    finish = {"gangshare.io/kwok-exit-code": "0", "gangshare.io/kwok-run-for": "1s"}
    job = {
        "apiVersion": "gangshare.io/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": "pair"},
        "spec": {
            "workers": 2,
            "gpusPerWorker": 1,
            "template": {
                "metadata": {"annotations": finish},
                "spec": {"containers": [{"name": "trainer", "image": "example.invalid/t:1"}]},
            },
        },
    }
    kube.custom.create_namespaced_custom_object(*TJ[:2], namespace, TJ[2], job)
    gpu = {"nvidia.com/gpu": "1"}
    kube.core.create_namespaced_pod(
        namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name="solo"),
            spec=client.V1PodSpec(
                scheduler_name=release.scheduler_name,
                restart_policy="Never",
                containers=[
                    client.V1Container(
                        name="c",
                        image="example.invalid/t:1",
                        resources=client.V1ResourceRequirements(requests=gpu, limits=gpu),
                    )
                ],
            ),
        ),
    )

    def job_phase() -> str | None:
        status = kube.custom.get_namespaced_custom_object(*TJ[:2], namespace, TJ[2], "pair")
        phase = (status.get("status") or {}).get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    # crds/gang-gate-policy.yaml, installed too, lets only gangshare-system's operator lift the
    # gate: this release's operator is refused, and says so on the job instead of failing its
    # pass; once the admin names it there too, the same gang goes on.
    refusal = eventually(
        lambda: gate_lift_refusal(kube, namespace, "pair"), what="GateLiftRefused on pair"
    )
    assert "ValidatingAdmissionPolicy 'gangshare-gang-gate'" in refusal, refusal
    with gate_lifters_also(
        kube, f"system:serviceaccount:{release.namespace}:{release.name}-operator"
    ):
        assert eventually(job_phase, timeout=120, what="TrainingJob finished") == "Succeeded"

    def solo_bound() -> client.V1Pod | None:
        pod = kube.core.read_namespaced_pod("solo", namespace)
        return pod if pod.spec.node_name else None

    # Filtered by the extender and bound by kube-scheduler itself (no bindVerb by default), both
    # under the chart's account: the Scheduled events below are kube-scheduler's.
    solo = eventually(solo_bound, what="solo pod bound")
    assert "gangshare.io/planned-gpus" not in (solo.metadata.annotations or {})
    workers = kube.core.list_namespaced_pod(namespace, label_selector="gangshare.io/job=pair")
    assert {p.spec.scheduler_name for p in workers.items} == {release.scheduler_name}
    # kube-scheduler, under the chart's account, reports Scheduled under its profile name.
    scheduled = {
        e.involved_object.name
        for e in kube.core.list_namespaced_event(namespace).items
        if e.reason == "Scheduled" and e.reporting_component == release.scheduler_name
    }
    assert {"pair-worker-0", "pair-worker-1", "solo"} <= scheduled, scheduled


def gate_lift_refusal(kube: Kube, namespace: str, job: str) -> str | None:
    for event in kube.core.list_namespaced_event(namespace).items:
        if event.reason == "GateLiftRefused" and event.involved_object.name == job:
            return str(event.message)
    return None


@contextlib.contextmanager
def gate_lifters_also(kube: Kube, account: str) -> Iterator[None]:
    """The shipped gang-gate policy's gateLifters with `account` added while inside."""
    admission = client.AdmissionregistrationV1Api(kube.api_client)
    policy = admission.read_validating_admission_policy(GANG_GATE_POLICY)
    [lifters] = [v for v in policy.spec.variables if v.name == "gateLifters"]
    shipped = lifters.expression
    lifters.expression = f"{shipped[:-1]}, '{account}']"
    admission.replace_validating_admission_policy(GANG_GATE_POLICY, policy)
    try:
        yield
    finally:
        policy = admission.read_validating_admission_policy(GANG_GATE_POLICY)
        for variable in policy.spec.variables:
            if variable.name == "gateLifters":
                variable.expression = shipped
        admission.replace_validating_admission_policy(GANG_GATE_POLICY, policy)


def test_uninstall_removes_the_release_but_keeps_the_crd(kube: Kube, helm: Helm, release: Release):
    helm(
        *("uninstall", release.name, "-n", release.namespace, "--wait"),
        f"--kubeconfig={kube.state.kubeconfig}",
    )
    selector = f"app.kubernetes.io/instance={release.name}"
    apps = client.AppsV1Api(kube.api_client)
    rbac = client.RbacAuthorizationV1Api(kube.api_client)
    ns = release.namespace

    def leftovers() -> list[str]:
        agents = release.agent_namespace
        found = [
            *apps.list_namespaced_deployment(ns, label_selector=selector).items,
            *apps.list_namespaced_daemon_set(agents, label_selector=selector).items,
            *kube.core.list_namespaced_service_account(agents, label_selector=selector).items,
            *kube.core.list_namespaced_service(agents, label_selector=selector).items,
            *client.PolicyV1Api(kube.api_client)
            .list_namespaced_pod_disruption_budget(ns, label_selector=selector)
            .items,
            *kube.core.list_namespaced_service_account(ns, label_selector=selector).items,
            *kube.core.list_namespaced_service(ns, label_selector=selector).items,
            *kube.core.list_namespaced_config_map(ns, label_selector=selector).items,
            *rbac.list_namespaced_role(ns, label_selector=selector).items,
            *rbac.list_namespaced_role_binding(ns, label_selector=selector).items,
            *rbac.list_namespaced_role_binding("kube-system", label_selector=selector).items,
            *rbac.list_cluster_role(label_selector=selector).items,
            *rbac.list_cluster_role_binding(label_selector=selector).items,
        ]
        return [f"{o.kind or type(o).__name__}/{o.metadata.name}" for o in found]

    def all_gone() -> bool:
        left = leftovers()
        assert not left, left
        return True

    eventually(all_gone, timeout=30, what="release objects deleted")
    # Helm never deletes CRDs (nor the TrainingJobs they hold): that is the user's decision.
    assert crd_exists(kube) and crd_exists(kube, QUEUE_CRD_NAME)
    # Nor the default Queue those TrainingJobs name.
    assert default_queue(kube) is not None


def test_the_ci_values_change_only_images_and_the_fake_gpus(helm: Helm):
    """deploy/helm/gangshare/ci/real-node-values.yaml (the install test's) overrides only image
    references and agent.fakeGpus, which becomes the agent's --nvml fake and a mounted spec."""
    ci_values = CHART / "ci" / "real-node-values.yaml"
    overrides = yaml.safe_load(ci_values.read_text())
    assert overrides == {
        "image": {"repository": "gangshare.local/gangshare", "tag": "dev"},
        "scheduler": {"image": {"repository": "gangshare.local/kube-scheduler"}},
        "agent": {"fakeGpus": overrides["agent"]["fakeGpus"]},
    }
    manifests = helm.render("-f", str(ci_values))
    pod = manifests[("DaemonSet", "gangshare-agent")]["spec"]["template"]["spec"]
    [agent] = pod["containers"]
    parsed = cli_parser().parse_args(agent["args"])
    assert (parsed.nvml, str(parsed.fake_spec)) == ("fake", "/etc/gangshare/fake-gpus/spec.yaml")
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    assert mounts["fake-gpus"] == {
        "name": "fake-gpus",
        "mountPath": "/etc/gangshare/fake-gpus",
        "readOnly": True,
    }
    spec = manifests[("ConfigMap", "gangshare-agent-fake-gpus")]["data"]["spec.yaml"]
    assert yaml.safe_load(spec) == overrides["agent"]["fakeGpus"]
    assert agent["image"] == "gangshare.local/gangshare:dev"
    scheduler = containers(manifests[("Deployment", "gangshare-scheduler")])
    assert scheduler["kube-scheduler"]["image"] == "gangshare.local/kube-scheduler:v1.35.4"


def test_no_pod_of_the_chart_gets_service_link_variables(helm: Helm):
    """A Service `<release>-extender` would put GANGSHARE_EXTENDER_PORT=tcp://... into every pod
    of the namespace, and the CLI reads that variable (the install on a real kubelet crashed on
    it)."""
    manifests = helm.render()
    workloads = [m for (kind, _), m in manifests.items() if kind in ("Deployment", "DaemonSet")]
    assert len(workloads) == 3
    for workload in workloads:
        assert workload["spec"]["template"]["spec"]["enableServiceLinks"] is False
