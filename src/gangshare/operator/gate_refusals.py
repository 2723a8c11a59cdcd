"""What a refused gate lift tells the workload's author and the platform team.

A 403 on a lift is the cluster's configuration, not the gang's: most often a gang-gate admission
policy whose gateLifters do not name the account this operator runs as (crds/gang-gate-policy.yaml
installed beside a Helm release, or an operator run under another ServiceAccount). The gang
stays gated, which is safe; the event says why, and each later reconcile tries again.
"""

from __future__ import annotations

GATE_LIFT_REFUSED = "GateLiftRefused"


def gate_lift_refusal(refused: list[str]) -> str:
    """The event's message for `refused` ("pod: API message"), one named, the rest counted."""
    more = f" (and {len(refused) - 1} more pod(s))" if len(refused) > 1 else ""
    return (
        f"the gangshare.io/gang gate could not be lifted: {refused[0]}{more}; the gang waits "
        "gated until the gang-gate admission policy's gateLifters name this operator's account"
    )
