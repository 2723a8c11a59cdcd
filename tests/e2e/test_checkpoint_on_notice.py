"""Checkpoint on notice on a real kubelet: a real process counts steps with `gangshare.sdk`,
is told to stop (its pod deleted with grace: by the node agent for GPU memory, by the operator
when a lender reclaims borrowed GPUs), saves its counter with `on_preempt` into the job's
checkpoint folder (a hostPath: one node), exits 143, and the requeued attempt, with the same
GANGSHARE_CHECKPOINT_DIR and GANGSHARE_ATTEMPT=1, resumes from the saved counter. The real
operator, agent (fake NVML) and kubelet; no step of the hand-off is simulated.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from agent_process import AgentProcess, allow_privileged_templates, real_node_job
from kubernetes import watch
from test_coordinator import MODEL, spec, training_job

from gangshare.agent.cgroups import pids_by_pod
from gangshare.core.annotations import POD_GPU_CAPS
from gangshare.dev.realnode import RealNode
from gangshare.dev.realnode_pyimage import PY_IMAGE
from kube import Kube, OperatorProcess, eventually

pytestmark = pytest.mark.e2e

GROUP, VERSION, PLURAL = "gangshare.io", "v1alpha1", "trainingjobs"
MOUNT = "/ckpt"
GRACE_SECONDS = 10
# Counts steps; saves the count on notice. The first attempt counts until told to stop; one
# that finds a saved count starts from it and finishes `more` steps later.
COUNTER = """
import json, os, sys, time
import gangshare.sdk as gs
more, pause = int(sys.argv[1]), float(sys.argv[2])
folder = gs.checkpoint_dir()
path = os.path.join(folder, "counter.json")
step = 0
if os.path.exists(path):
    with open(path) as f:
        step = json.load(f)["step"]
resumed = step
total = step + more if step else 10**9
print(f"attempt={gs.attempt()} resume={step} folder={folder}", flush=True)

def save():
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"step": step, "attempt": gs.attempt()}, f)
    os.replace(tmp, path)
    print(f"saved={step}", flush=True)

gs.on_preempt(save)
while step < total:
    with gs.step(sync=False):
        time.sleep(pause)
        step += 1
    if step % 50 == 0:
        print(f"step={step}", flush=True)
with open(os.path.join(folder, f"done-{gs.attempt()}.json"), "w") as f:
    json.dump({"step": step, "resumed": resumed}, f)
print("done", flush=True)
"""


def counting_job(name: str, service_class: str, folder: Path) -> dict[str, Any]:
    """A one-GPU job on the real node whose checkpoint folder is a host folder."""
    job = real_node_job(
        name, service_class, MODEL, PY_IMAGE, ["python3", "-c", COUNTER, "100", "0.02"]
    )
    job["spec"]["checkpoint"] = {"path": MOUNT}
    pod = job["spec"]["template"]["spec"]
    pod["terminationGracePeriodSeconds"] = GRACE_SECONDS
    pod["volumes"] = [
        {"name": "ckpt", "hostPath": {"path": str(folder), "type": "DirectoryOrCreate"}}
    ]
    pod["containers"][0]["volumeMounts"] = [{"name": "ckpt", "mountPath": MOUNT}]
    return job


def status(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    job = kube.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    found: dict[str, Any] = job.get("status") or {}
    return found


@contextmanager
def exit_codes(kube: Kube, namespace: str, pod: str) -> Iterator[dict[str, int]]:
    """Each attempt's exit code of `pod`'s container, as the kubelet reports it."""
    seen: dict[str, int] = {}
    stream: Any = watch.Watch()  # type: ignore[no-untyped-call]
    stopped = threading.Event()

    def follow() -> None:
        while not stopped.is_set():
            try:
                for event in stream.stream(
                    kube.core.list_namespaced_pod,
                    namespace,
                    field_selector=f"metadata.name={pod}",
                    timeout_seconds=10,
                ):
                    obj = event["object"]
                    attempt = (obj.metadata.labels or {}).get("gangshare.io/attempt", "?")
                    for container in obj.status.container_statuses or []:
                        ended = container.state.terminated if container.state else None
                        if ended is not None:
                            seen[attempt] = ended.exit_code
            except Exception:  # a watch the API server ended: watch again
                stopped.wait(0.5)

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stopped.set()
        stream.stop()


def wait_until_counting(real_node: RealNode, namespace: str, pod: str) -> None:
    eventually(
        lambda: "step=50" in real_node.container_log(namespace, pod, "main"),
        timeout=90,
        what=f"{pod} counting steps",
    )


def check_resumed(
    kube: Kube, real_node: RealNode, namespace: str, name: str, folder: Path, counted: str
) -> None:
    """The first attempt saved on notice; the second resumed from it, told its attempt and the
    same folder, and finished; the notice cost no retry."""
    saved = json.loads((folder / "counter.json").read_text())
    assert saved["attempt"] == 0 and saved["step"] >= 50, saved
    assert not (folder / "done-0.json").exists()  # the first attempt never finished

    def finished() -> str | None:
        phase = status(kube, namespace, name).get("phase")
        return phase if phase in ("Succeeded", "Failed") else None

    assert eventually(finished, timeout=120, what=f"{name} finished") == "Succeeded"
    done = json.loads((folder / "done-1.json").read_text())
    assert done["resumed"] == saved["step"], (done, saved)
    final = status(kube, namespace, name)
    assert final[counted] == 1 and final.get("restarts", 0) == 0, final
    assert "lastFailure" not in final
    pod = f"{name}-worker-0"
    log = real_node.container_log(namespace, pod, "main")
    assert f"attempt=1 resume={saved['step']} folder={MOUNT}" in log, log[:2000]
    worker = kube.core.read_namespaced_pod(pod, namespace)
    env = {e.name: e.value for e in worker.spec.containers[0].env}
    assert env["GANGSHARE_ATTEMPT"] == worker.metadata.labels["gangshare.io/attempt"] == "1"
    assert env["GANGSHARE_CHECKPOINT_DIR"] == MOUNT
    assert env["GANGSHARE_PREEMPT_GRACE_SECONDS"] == str(GRACE_SECONDS)


def test_evicted_for_gpu_memory_it_saves_on_sigterm_and_the_next_attempt_resumes(
    crd: Kube, real_node: RealNode, one_gpu_agent: AgentProcess, namespace: str, tmp_path: Path
) -> None:
    kube = crd
    allow_privileged_templates(kube, namespace)
    folder = tmp_path / "ckpt-o"
    operator = OperatorProcess(kube, tmp_path).start()
    create = kube.custom.create_namespaced_custom_object
    try:
        # A guaranteed tenant, stepping alone first (the coordinator's baseline), whose GPU
        # memory the opportunistic job will then take.
        create(GROUP, VERSION, namespace, PLURAL, training_job("g", "Guaranteed", 100000, 0.05))
        eventually(
            lambda: "step=0" in real_node.container_log(namespace, "g-worker-0", "main"),
            timeout=90,
            what="the guaranteed job stepping",
        )
        create(GROUP, VERSION, namespace, PLURAL, counting_job("o", "Opportunistic", folder))
        wait_until_counting(real_node, namespace, "o-worker-0")
        eventually(
            lambda: (
                POD_GPU_CAPS
                in (
                    kube.core.read_namespaced_pod("o-worker-0", namespace).metadata.annotations
                    or {}
                )
            ),
            timeout=60,
            what="the coordinator capping the opportunistic job",
        )
        with exit_codes(kube, namespace, "o-worker-0") as codes:
            # NVML now reports the opportunistic container holding all of the GPU's memory.
            uid = kube.core.read_namespaced_pod("o-worker-0", namespace).metadata.uid
            pids = pids_by_pod().get(uid)
            assert pids, f"no host process of pod {uid}"
            one_gpu_agent.rewrite_spec(spec([{"gpu": 0, "pid": max(pids), "memoryMiB": 16000}]))
            eventually(
                lambda: (folder / "counter.json").exists(),
                timeout=60,
                what="the checkpoint saved on the agent's notice",
            )
            one_gpu_agent.rewrite_spec(spec())  # the next attempt holds nothing over its cap
            check_resumed(kube, real_node, namespace, "o", folder, "evictions")
        assert codes.get("0") == 143, codes  # preempted, not failed
        assert "removed" in one_gpu_agent.logs() and f"grace {GRACE_SECONDS}s" in (
            one_gpu_agent.logs()
        )
    finally:
        operator.stop()


def test_reclaimed_from_a_borrower_it_saves_on_sigterm_and_the_next_attempt_resumes(
    crd: Kube,
    real_node: RealNode,
    one_gpu_agent: AgentProcess,
    namespace: str,
    tmp_path: Path,
    queues: Callable[..., str],
) -> None:
    kube = crd
    allow_privileged_templates(kube, namespace)
    cohort = f"c{uuid.uuid4().hex[:6]}"
    lender = queues("lender", nominalGPUs=1, cohort=cohort)
    borrower = queues("borrower", nominalGPUs=0, cohort=cohort)
    folder = tmp_path / "ckpt-b"
    operator = OperatorProcess(kube, tmp_path).start()
    create = kube.custom.create_namespaced_custom_object
    try:
        b = counting_job("b", "Guaranteed", folder)
        b["spec"]["queue"] = borrower
        create(GROUP, VERSION, namespace, PLURAL, b)
        wait_until_counting(real_node, namespace, "b-worker-0")
        assert status(kube, namespace, "b").get("borrowed") is True
        with exit_codes(kube, namespace, "b-worker-0") as codes:
            lent = training_job("l", "Guaranteed", 100, 0.02)
            lent["spec"]["queue"] = lender
            create(GROUP, VERSION, namespace, PLURAL, lent)
            eventually(
                lambda: (folder / "counter.json").exists(),
                timeout=60,
                what="the checkpoint saved on the operator's notice",
            )
            check_resumed(kube, real_node, namespace, "b", folder, "preemptions")
        assert codes.get("0") == 143, codes
        assert status(kube, namespace, "l").get("phase") == "Succeeded"
    finally:
        operator.stop()
