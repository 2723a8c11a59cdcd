"""Which object controls another, by the controller reference its controller wrote (pure).

Whoever may write an object may write its ownerReferences too, naming any owner whose name and
uid they can read (anyone in the namespace can). What makes a reference the controller's own is
admission: crds/pod-owner-policy.yaml lets only the Job controller give a gangshare pod its
reference to a Job, crds/job-owner-policy.yaml only JobSet's controller give a gangshare Job its
reference to a JobSet. So a reference counts only whole: controller, kind, apiVersion, name and
uid all the owner's, never a label's say-so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The object's controller reference (the API server allows at most one)."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


def refers_to(ref: Mapping[str, Any] | None, api_version: str, kind: str, name: str) -> bool:
    """The reference names an object of this apiVersion, kind and name (uid not judged)."""
    return (
        ref is not None
        and bool(name)
        and (ref.get("apiVersion"), ref.get("kind"), ref.get("name")) == (api_version, kind, name)
    )


def controlled_by(
    obj: Mapping[str, Any], owner: Mapping[str, Any], api_version: str, kind: str
) -> bool:
    """Whether `owner`, an object of `api_version` and `kind` (given: a list's items do not say
    their own), is `obj`'s controller: the reference names its name and its uid, so a namesake
    deleted and made again is not."""
    meta = owner.get("metadata") or {}
    ref = controller_ref(obj)
    uid = str(meta.get("uid") or "")
    named = refers_to(ref, api_version, kind, str(meta.get("name") or ""))
    return named and bool(uid) and ref is not None and ref.get("uid") == uid
