"""A Kubeflow Trainer TrainJob (trainer.kubeflow.org/v1alpha1, Trainer v2.0) queued by gangshare
as one gang (pure; kube/queued.py and kube/jobset.py share).

Trainer runs a TrainJob through a JobSet of the same name that it creates at once and controls
(suspended while the TrainJob is), built from the TrainJob's runtime. So the gang is sized from
that child JobSet, its pods are the child's (ranked as a JobSet's), and the child is never
queued a second time (`runs_a_trainjob`). What the adapter is handed is the TrainJob with its
child attached (`with_child`): the TrainJob decides queue, class, priority and suspension, the
child the pods.

Admission, before the first run: the child's pod templates are gated and labelled as the
TrainingJob's (`child_patch`, while both are suspended; Trainer re-applies the JobSet with
server-side apply, which keeps fields another manager wrote, and JobSet copies template labels
and scheduling gates into its child Jobs on resume), then the TrainJob is unsuspended. Trainer's
own override field (`spec.podSpecOverrides`) cannot carry labels, and changes to it are refused
once it runs, so it is left to the author. Reclaimed, the TrainJob is suspended again (Trainer
suspends the JobSet, JobSet deletes the pods) and requeued.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gangshare.kube import jobset as js
from gangshare.kube.ownership import controlled_by, controller_ref
from gangshare.kube.queued import CHILD_KEY, QueuedJobSpec, WorkloadKind, queue_ask
from gangshare.kube.queued_podsets import pod_sets_gang
from gangshare.kube.queued_writes import finished_by_conditions, gated_template, resume_body
from gangshare.kube.trainingjob import InvalidSpec

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TrainJob"
PREFIX = "trainjob-"


def with_child(trainjob: Mapping[str, Any], jobset: Mapping[str, Any] | None) -> dict[str, Any]:
    """The TrainJob with its child JobSet attached, when the JobSet is the TrainJob's own."""
    own = jobset is not None and controlled_by(jobset, trainjob, API_VERSION, KIND)
    return {**trainjob, CHILD_KEY: dict(jobset) if own and jobset is not None else None}


def child(trainjob: Mapping[str, Any]) -> dict[str, Any] | None:
    found = trainjob.get(CHILD_KEY)
    return found if isinstance(found, dict) else None


def runs_a_trainjob(jobset: Mapping[str, Any]) -> str | None:
    """The TrainJob a JobSet runs (its controller), else None: such a JobSet is queued through
    its TrainJob only, whatever labels Trainer copied onto it."""
    ref = controller_ref(jobset)
    if ref is not None and (ref.get("apiVersion"), ref.get("kind")) == (API_VERSION, KIND):
        return str(ref.get("name", ""))
    return None


def _runtime(trainjob: Mapping[str, Any]) -> str:
    ref = (trainjob.get("spec") or {}).get("runtimeRef") or {}
    return f"{ref.get('kind', 'ClusterTrainingRuntime')} {ref.get('name', '')}"


def parse_queued_trainjob(trainjob: Mapping[str, Any]) -> QueuedJobSpec:
    """The gang a labelled TrainJob is, sized from the JobSet Trainer made for it; InvalidSpec
    names the field (the runtime's, where its templates decide)."""
    jobset = child(trainjob)
    if jobset is None:
        raise InvalidSpec(
            f"spec.runtimeRef: Trainer has made no JobSet for this TrainJob (yet); is its "
            f"runtime ({_runtime(trainjob)}) there?"
        )
    ask = queue_ask(trainjob)
    try:
        asks = js.pod_set_asks(jobset, PREFIX, ask.service_class)
    except InvalidSpec as err:
        raise InvalidSpec(f"its runtime {_runtime(trainjob)}'s {err}") from None
    if not asks:
        raise InvalidSpec(f"spec.runtimeRef: runtime {_runtime(trainjob)} makes no pods")
    return pod_sets_gang(
        trainjob,
        asks,
        f"its runtime {_runtime(trainjob)}'s replicatedJobs",
        api_version=API_VERSION,
        kind=KIND,
        prefix=PREFIX,
        pods_uid=str((jobset.get("metadata") or {}).get("uid", "")),
    )


def trainjob_finished(trainjob: Mapping[str, Any]) -> tuple[str, str] | None:
    return finished_by_conditions(trainjob, "Complete", "TrainJob")


def suspended(trainjob: Mapping[str, Any]) -> bool:
    return bool((trainjob.get("spec") or {}).get("suspend"))


def may_resume(trainjob: Mapping[str, Any], pods: list[dict[str, Any]]) -> bool:
    """Suspended, and its JobSet suspended by Trainer with no pod of the last run left."""
    jobset = child(trainjob)
    return suspended(trainjob) and jobset is not None and js.may_resume(jobset, pods)


def prepared(trainjob: Mapping[str, Any], workload_job: str) -> bool:
    jobset = child(trainjob)
    return jobset is not None and js.templates_prepared(jobset, workload_job)


def never_frozen(trainjob: Mapping[str, Any]) -> bool:
    return False


def child_patch(trainjob: Mapping[str, Any], workload_job: str) -> dict[str, Any] | None:
    """The merge patch that gates and labels the child JobSet's pod templates as
    `workload_job`'s; None once they are (or with no child to patch)."""
    jobset = child(trainjob)
    if jobset is None or js.templates_prepared(jobset, workload_job):
        return None
    replicated = []
    for item in js.replicated_jobs(jobset):
        template = js.pod_template(item)
        gated = gated_template(template, workload_job)
        replicated.append(js.with_pod_template(item, template, gated))
    return {"spec": {"replicatedJobs": replicated}}


def resume_patch(trainjob: Mapping[str, Any], workload_job: str, attempt: int) -> dict[str, Any]:
    return resume_body(attempt)


def pod_rank(pod: Mapping[str, Any], trainjob: Mapping[str, Any]) -> int | None:
    jobset = child(trainjob)
    if jobset is None:
        return None
    return js.pod_rank(pod, jobset, PREFIX, queue_ask(trainjob).service_class)


def pod_templates(trainjob: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    jobset = child(trainjob)
    if jobset is None:
        return []
    where = f"its runtime {_runtime(trainjob)}'s "
    return [(where + path, template) for path, template in js.pod_templates(jobset)]


def owns(pod: Mapping[str, Any], trainjob: Mapping[str, Any]) -> bool:
    """A pod of the TrainJob's own JobSet (judged as a JobSet's pod: through a child Job)."""
    jobset = child(trainjob)
    return jobset is not None and js.owns(pod, jobset)


TRAINJOB = WorkloadKind(
    api_version=API_VERSION,
    kind=KIND,
    group=GROUP,
    version=VERSION,
    plural="trainjobs",
    prefix=PREFIX,
    parse=parse_queued_trainjob,
    finished=trainjob_finished,
    may_resume=may_resume,
    prepared=prepared,
    frozen=never_frozen,
    resume_patch=resume_patch,
    pod_rank=pod_rank,
    owns=owns,
    pod_templates=pod_templates,
    suspended=suspended,
    child_kind=js.JOBSET,
    child_patch=child_patch,
    attach_child=with_child,
)
