"""`helm install` of the chart as a platform team runs it, on a real kubelet, with nothing else.

The cluster is bare (install_env.py): no operator, extender or gangshare-scheduler of the
test's own, so whatever admits, filters, binds and assigns GPUs below is the release's own pods,
running the images `make image` built as real containers under the chart's defaults; only the
image references and a fake GPU backend come from deploy/helm/gangshare/ci/real-node-values.yaml.
The tests run in order on one release: install, jobs, day-2 operations, uninstall, bad input.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from install_env import (
    CAP_KILL,
    CHART,
    CI_VALUES,
    NAMESPACE,
    RELEASE,
    InstallEnv,
    bare_world,
    labelled_job,
    metric_total,
    pod_processes,
    rollout_done,
    trainingjob,
)
from kubernetes import client

import tj
from gangshare.core.annotations import POD_ASSIGNED_GPUS
from kube import eventually

pytestmark = pytest.mark.e2e

JOBS = "team-a"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InstallEnv]:
    world = bare_world(tmp_path_factory.mktemp("install"))
    installed = next(world)
    try:
        yield installed
    finally:
        for name, seconds in installed.figures.items():
            print(f"[install figures] {name}: {seconds:.1f} s")
        for _ in world:
            pass


def submit(env: InstallEnv, body: dict[str, Any]) -> None:
    tj.create(env.kube, JOBS, body)


def phase(env: InstallEnv, name: str, *phases: str) -> str | None:
    current = tj.phase_is(env.kube, JOBS, name, *phases)
    return None if current is None else str(current["phase"])


def finished(env: InstallEnv, name: str, timeout: float = 120) -> str:
    done: str = eventually(
        lambda: phase(env, name, "Succeeded", "Failed"), timeout=timeout, what=f"{name} finished"
    )
    return done


def job_pods(env: InstallEnv, label: str) -> list[client.V1Pod]:
    pods: list[client.V1Pod] = env.kube.core.list_namespaced_pod(JOBS, label_selector=label).items
    return pods


# ----- install ---------------------------------------------------------------------------------


def test_install_brings_every_pod_ready_and_runs_a_first_job(env: InstallEnv):
    """`helm install` with the chart's defaults; a job submitted as soon as the CRD is served.
    Measures the README's figures: install to every pod Ready, install to first job Running."""
    env.kube.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=JOBS)))
    started = time.monotonic()
    env.helm_release("install", RELEASE, str(CHART), "--create-namespace", "-f", str(CI_VALUES))

    def submitted() -> bool:
        submit(env, trainingjob("first", 1, 1, 1))
        return True

    eventually(submitted, timeout=60, what="the TrainingJob CRD served and the first job made")
    eventually(lambda: rollout_done(env), timeout=300, what="every release pod Ready")
    env.figures["helm install -> every pod Ready"] = time.monotonic() - started

    def running() -> bool:
        return phase(env, "first", "Running", "Succeeded") is not None

    eventually(running, timeout=180, what="the first job Running")
    env.figures["helm install -> first job Running"] = time.monotonic() - started
    assert finished(env, "first") == "Succeeded"


def test_every_component_is_a_real_container_under_the_charts_security_context(env: InstallEnv):
    pods = env.release_pods()
    by_component = {p.metadata.labels["app.kubernetes.io/component"] for p in pods}
    assert by_component == {"operator", "scheduler", "agent"}
    for pod in pods:
        component = pod.metadata.labels["app.kubernetes.io/component"]
        assert pod.spec.node_name == env.node.name, pod.metadata.name
        statuses = [*(pod.status.init_container_statuses or []), *pod.status.container_statuses]
        assert all(s.ready and s.state.running for s in statuses), (pod.metadata.name, statuses)
        processes = pod_processes(pod.metadata.uid)
        # Each container's main process, as the kernel runs it: one per container.
        assert len({p.argv[0] for p in processes}) >= len(statuses), processes
        for process in processes:
            where = (pod.metadata.name, process.argv)
            assert process.no_new_privs, where
            assert process.root_read_only, where
            if component == "agent":
                # Root for the kubelet's sockets, with CAP_KILL and nothing else.
                assert (process.uid, process.cap_eff) == (0, CAP_KILL), where
            else:
                assert (process.uid, process.cap_eff) == (65532, 0), where
    roles = {
        p.argv[2] if p.argv[1].endswith("gangshare") else p.argv[0].rsplit("/", 1)[-1]
        for pod in pods
        for p in pod_processes(pod.metadata.uid)
    }
    assert {"operator", "extender", "agent", "kube-scheduler"} <= roles, roles


def test_the_agent_registers_its_device_plugin_and_publishes_the_gpus(env: InstallEnv):
    def published() -> Any:
        node = env.kube.core.read_node(env.node.name)
        return node if "nvidia.com/gpu" in (node.status.allocatable or {}) else None

    # The kubelet reports a registered plugin's devices with its next node status (10 s).
    node = eventually(published, timeout=60, what="the agent's GPUs on the node")
    allocatable = node.status.allocatable
    # The fake backend's four GPUs, four share slots each (the chart's agent.shareSlots).
    assert (allocatable["nvidia.com/gpu"], allocatable["gangshare.io/gpu-share"]) == ("4", "16")
    assert "gangshare.io/gpu-topology" in node.metadata.annotations
    sockets = {p.name for p in env.node.device_plugin_dir.glob("*.sock")}
    assert "kubelet.sock" in sockets and len(sockets) >= 2, sockets
    # The backstop freezes a throttled pod through the host's cgroups, mounted by the chart.
    [agent] = env.kube.core.list_namespaced_pod(
        NAMESPACE, label_selector="app.kubernetes.io/component=agent"
    ).items
    # Read on the node: the API server cannot reach this kubelet by its name.
    logs = env.node.container_log(NAMESPACE, agent.metadata.name, "agent")
    assert "throttled pods are frozen through cgroup v" in logs, logs[-2000:]
    assert "at /host/sys/fs/cgroup" in logs and "no cgroup freezer" not in logs


def proxy_get(env: InstallEnv, service: str, path: str) -> str:
    """GET through the API server's service proxy: the Service's endpoints, as any in-cluster
    scraper reaches them."""
    text: str = env.kube.core.connect_get_namespaced_service_proxy_with_path(
        f"{service}:metrics", NAMESPACE, path
    )
    return text


def test_the_metrics_services_answer(env: InstallEnv):
    operator = proxy_get(env, f"{RELEASE}-operator", "metrics")
    assert "gangshare_operator_leader" in operator
    extender = proxy_get(env, f"{RELEASE}-extender", "metrics")
    assert "gangshare_extender_requests_total" in extender
    agent = proxy_get(env, f"{RELEASE}-agent", "metrics")
    assert f'node="{env.node.name}"' in agent and "gangshare_gpu_" in agent


# ----- jobs through the release only ------------------------------------------------------------


def reported_gpus(env: InstallEnv, pod: client.V1Pod) -> tuple[int, ...]:
    """The GPU indices the container's environment named (from the kubelet's Allocate)."""
    log = env.node.container_log(JOBS, pod.metadata.name, pod.spec.containers[0].name)
    line = next(w for w in log.split() if w.startswith("node-gpus="))
    return tuple(sorted(int(i) for i in line.removeprefix("node-gpus=").split(",") if i))


def test_a_trainingjob_and_a_labelled_job_run_through_the_release(env: InstallEnv):
    filters_before = metric_total(
        proxy_get(env, f"{RELEASE}-extender", "metrics"),
        "gangshare_extender_requests_total",
        verb="filter",
    )
    submit(env, trainingjob("pair", 2, 1, 3))
    batch = client.BatchV1Api(env.kube.api_client)
    batch.create_namespaced_job(JOBS, labelled_job("sweep", 3))
    assert finished(env, "pair") == "Succeeded"

    def complete() -> bool:
        job = batch.read_namespaced_job("sweep", JOBS)
        return any(c.type == "Complete" and c.status == "True" for c in job.status.conditions or [])

    eventually(complete, timeout=120, what="Job sweep Complete")
    workers = job_pods(env, "gangshare.io/job=pair") + job_pods(env, "job-name=sweep")
    assert len(workers) == 4, [p.metadata.name for p in workers]
    for pod in workers:
        assert pod.spec.node_name == env.node.name
        assert pod.spec.scheduler_name == "gangshare-scheduler"
        # The agent's record on the pod is what the container really got.
        recorded = pod.metadata.annotations[POD_ASSIGNED_GPUS].split(",")
        assert reported_gpus(env, pod) == tuple(sorted(map(int, recorded))), pod.metadata.name
    # The release's kube-scheduler (its profile name) bound them, through its extender's filter.
    scheduled = {
        e.involved_object.name
        for e in env.kube.core.list_namespaced_event(JOBS).items
        if e.reason == "Scheduled" and e.reporting_component == "gangshare-scheduler"
    }
    assert {p.metadata.name for p in workers} <= scheduled
    filters_after = metric_total(
        proxy_get(env, f"{RELEASE}-extender", "metrics"),
        "gangshare_extender_requests_total",
        verb="filter",
    )
    assert filters_after >= filters_before + 4
    # The cluster has no gangshare process of its own: only the release could have done this.
    assert not {"gangshare-extender", "gangshare-scheduler"} & set(env.kube.state.pids)


# ----- day 2 -----------------------------------------------------------------------------------


def running_workers(env: InstallEnv, job: str, count: int) -> list[client.V1Pod]:
    def up() -> list[client.V1Pod] | None:
        pods = job_pods(env, f"gangshare.io/job={job}")
        live = [p for p in pods if p.status.phase == "Running"]
        annotated = [p for p in live if POD_ASSIGNED_GPUS in (p.metadata.annotations or {})]
        return annotated if len(annotated) == count else None

    pods: list[client.V1Pod] = eventually(up, timeout=120, what=f"{job}'s workers running")
    return pods


def test_restarting_the_agent_keeps_a_running_jobs_gpus_and_stops_nothing(env: InstallEnv):
    submit(env, trainingjob("steady", 1, 2, 30))
    [worker] = running_workers(env, "steady", 1)
    gpus = worker.metadata.annotations[POD_ASSIGNED_GPUS]
    [old] = env.component_pods("agent")
    env.kube.core.delete_namespaced_pod(old.metadata.name, NAMESPACE)

    def replaced() -> bool:
        pods = env.component_pods("agent")
        return (
            len(pods) == 1
            and pods[0].metadata.uid != old.metadata.uid
            and all(s.ready for s in pods[0].status.container_statuses or [])
        )

    eventually(replaced, timeout=90, what="a new agent pod Ready")
    after = env.kube.core.read_namespaced_pod(worker.metadata.name, JOBS)
    assert after.metadata.uid == worker.metadata.uid
    assert after.metadata.annotations[POD_ASSIGNED_GPUS] == gpus
    processes = pod_processes(worker.metadata.uid)
    assert processes and all(p.state != "T" for p in processes), processes
    assert finished(env, "steady") == "Succeeded"


def lease_holder(env: InstallEnv) -> str:
    lease = client.CoordinationV1Api(env.kube.api_client).read_namespaced_lease(
        "gangshare-operator", NAMESPACE
    )
    return str(lease.spec.holder_identity or "")


def leader_pod(env: InstallEnv) -> client.V1Pod:
    holder = lease_holder(env)
    [pod] = [p for p in env.component_pods("operator") if holder.startswith(p.metadata.name + "-")]
    return pod


def both_operators_ready(env: InstallEnv) -> bool:
    pods = env.component_pods("operator")
    return len(pods) == 2 and all(
        s.ready for p in pods for s in (p.status.container_statuses or [])
    )


@pytest.mark.parametrize("loss", ["delete", "sigkill"])
def test_a_standby_takes_over_when_the_leader_is_lost(env: InstallEnv, loss: str):
    eventually(lambda: both_operators_ready(env), timeout=120, what="two operators Ready")
    holder = lease_holder(env)
    leader = leader_pod(env)
    started = time.monotonic()
    if loss == "delete":
        env.kube.core.delete_namespaced_pod(leader.metadata.name, NAMESPACE)
    else:
        [main] = [p for p in pod_processes(leader.metadata.uid) if "operator" in p.argv]
        os.kill(main.pid, signal.SIGKILL)

    def taken_over() -> bool:
        current = lease_holder(env)
        return bool(current) and current != holder

    eventually(taken_over, timeout=60, what="another replica holds the Lease")
    env.figures[f"leader lost ({loss}) -> Lease taken over"] = time.monotonic() - started
    submit(env, trainingjob(f"after-{loss}", 1, 1, 1))
    assert finished(env, f"after-{loss}") == "Succeeded"


def test_an_upgrade_rolls_the_pods_and_loses_or_doubles_no_job(env: InstallEnv):
    eventually(lambda: both_operators_ready(env), timeout=120, what="two operators Ready")
    submit(env, trainingjob("long", 1, 4, 45))
    [running] = running_workers(env, "long", 1)
    submit(env, trainingjob("waiting", 1, 4, 1))
    eventually(lambda: phase(env, "waiting", "Queued"), timeout=30, what="waiting Queued")
    before = {p.metadata.uid for p in env.release_pods() if "operator" in p.metadata.name}
    env.helm_release(
        "upgrade",
        RELEASE,
        str(CHART),
        "-f",
        str(CI_VALUES),
        "--set-json",
        "operator.cycleInterval=0.5",
        "--wait",
        "--timeout=5m",
    )
    eventually(lambda: rollout_done(env), timeout=180, what="the upgrade rolled out")
    now = {p.metadata.uid for p in env.component_pods("operator")}
    assert now and not now & before, "the operator pods were not replaced"
    args = env.component_pods("operator")[0].spec.containers[0].args
    assert "--cycle-interval=0.5" in args, args
    assert finished(env, "long") == "Succeeded"
    assert finished(env, "waiting") == "Succeeded"
    # Neither ran twice: one worker pod each, and the running one is the pod from before.
    long_pods = job_pods(env, "gangshare.io/job=long")
    assert [p.metadata.uid for p in long_pods] == [running.metadata.uid]
    assert len(job_pods(env, "gangshare.io/job=waiting")) == 1
    assert tj.status(env.kube, JOBS, "long").get("restarts", 0) == 0


def test_uninstall_removes_every_pod_and_keeps_the_crds_and_jobs(env: InstallEnv):
    env.helm_release("uninstall", RELEASE, "--wait", "--timeout=3m")
    eventually(lambda: env.release_pods() == [], timeout=120, what="no release pod left")
    crds = client.ApiextensionsV1Api(env.kube.api_client)
    for crd in ("trainingjobs.gangshare.io", "queues.gangshare.io"):
        crds.read_custom_resource_definition(crd)
    kept = env.kube.custom.list_namespaced_custom_object(tj.GROUP, tj.VERSION, JOBS, tj.PLURAL)[
        "items"
    ]
    assert {"first", "pair", "steady", "long", "waiting"} <= {j["metadata"]["name"] for j in kept}


# ----- bad input at install --------------------------------------------------------------------


def test_a_values_file_with_a_wrong_type_or_unknown_key_is_refused_naming_it(
    env: InstallEnv, tmp_path: Path
):
    for values, key in [
        ({"operator": {"replicas": "two"}}, "/operator/replicas"),
        ({"agent": {"fakeGPUs": {}}}, "fakeGPUs"),
    ]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(yaml.safe_dump(values))
        done = env.helm_release(
            "install", RELEASE, str(CHART), "-f", str(CI_VALUES), "-f", str(bad), check=False
        )
        assert done.returncode != 0 and key in done.stderr, (values, done.stderr)
        listed = env.helm_release("list", "-a", "-q").stdout.split()
        assert RELEASE not in listed


def test_an_image_that_does_not_exist_fails_the_install_visibly(env: InstallEnv):
    """A wrong image never passes for a healthy release: `helm install --wait` fails, `helm
    status` says so, and the pods say why. (localhost:1 refuses at once: no pull leaves this
    machine.)"""
    done = env.helm_release(
        "install",
        RELEASE,
        str(CHART),
        "-f",
        str(CI_VALUES),
        "--set",
        "image.repository=localhost:1/gangshare",
        "--wait",
        "--timeout=40s",
        check=False,
    )
    try:
        assert done.returncode != 0, done.stdout
        status = env.helm_release("status", RELEASE).stdout
        assert "STATUS: failed" in status, status
        assert "localhost:1/gangshare:dev" in status, status
        reasons = {
            s.state.waiting.reason
            for p in env.release_pods()
            for s in [
                *(p.status.init_container_statuses or []),
                *(p.status.container_statuses or []),
            ]
            if s.state and s.state.waiting
        }
        assert reasons & {"ErrImagePull", "ImagePullBackOff"}, reasons
    finally:
        env.helm_release("uninstall", RELEASE, "--wait", "--timeout=2m", check=False)
        eventually(lambda: env.release_pods() == [], timeout=60, what="no release pod left")
