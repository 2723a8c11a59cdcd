"""Whether a queued object still asks for the gang its TrainingJob holds a place for (pure).

Kubernetes lets a suspended Job change its parallelism (elastic Indexed Jobs, with
completions), and, before its first run, its pods' node selector, affinity and tolerations.
A gang is queued, planned and admitted for one shape: one scaled from 2 pods to 4 while it
waits would be admitted for 2, run indexes 0-1 and leave 2-3 gated for ever, holding its
quota; one whose pods were narrowed to other nodes would be pinned where they may not go.
The admission policies refuse such edits at the API server (crds/); where they are not
installed, the operator finds the change here and refuses the gang with this reason, so no
part of it ever runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gangshare.kube.queued import WorkloadKind, scheduling_template
from gangshare.kube.trainingjob import InvalidSpec

# What a pod template says of where its pods may run (as the TrainingJob's template keeps it).
PLACEMENT_KEYS = ("nodeSelector", "affinity", "tolerations")


def shape_change(
    kind: WorkloadKind, obj: Mapping[str, Any], workload: Mapping[str, Any]
) -> str | None:
    """Why the object no longer asks for the gang its TrainingJob queues; None when it does."""
    try:
        asked = kind.parse(obj)
    except InvalidSpec as err:
        return f"the {kind.kind} was changed after it was queued and is no gang now: {err}"
    held = workload.get("spec") or {}
    changes = []
    if asked.workers != held.get("workers"):
        changes.append(f"{held.get('workers')} pods became {asked.workers}")
    if asked.gpus_per_worker != held.get("gpusPerWorker"):
        changes.append(f"{held.get('gpusPerWorker')} GPUs per pod became {asked.gpus_per_worker}")
    changes += _placement_changes("its pods'", asked.template, held.get("template"))
    had_groups = {g.get("name"): g for g in held.get("replicaGroups") or []}
    if [g.name for g in asked.groups] != list(had_groups):
        changes.append(f"its pod sets {list(had_groups)} became {[g.name for g in asked.groups]}")
    for group in asked.groups:
        had = had_groups.get(group.name) or {}
        if (group.replicas, group.gpus) != (had.get("replicas"), had.get("gpus")):
            changes.append(
                f"pod set {group.name}: {had.get('replicas')} x {had.get('gpus')} GPU(s) became "
                f"{group.replicas} x {group.gpus}"
            )
        changes += _placement_changes(
            f"pod set {group.name}'s", group.template, had.get("template")
        )
    if not changes:
        return None
    return (
        f"the {kind.kind} was changed after it was queued ({'; '.join(changes)}): a gang keeps "
        "the shape it was queued with and is never run in part; delete it and create it again"
    )


def _placement_changes(whose: str, template: Mapping[str, Any], held: Any) -> list[str]:
    wanted = scheduling_template(template).get("spec") or {}
    had = ((held or {}).get("spec") or {}) if isinstance(held, dict) else {}
    return [
        f"{whose} {key} changed"
        for key in PLACEMENT_KEYS
        if (wanted.get(key) or None) != (had.get(key) or None)
    ]
