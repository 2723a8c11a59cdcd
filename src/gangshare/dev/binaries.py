"""Where the Kubernetes binaries are, building them first if they are missing.

scripts/build-k8s.sh builds them from Go modules into a per-version cache
outside the repository; GANGSHARE_K8S_BIN points at another folder instead.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REQUIRED = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    # Only the optional real node (realnode.py) runs it, but the build script treats it like
    # the rest, so a missing kubelet counts as an incomplete build here too.
    "kubelet",
    "kwok",
    "helm",
)


class BinariesError(RuntimeError):
    pass


def repo_root() -> Path:
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / "scripts" / "build-k8s.sh").exists():
            return parent
    raise BinariesError(
        "cannot find scripts/build-k8s.sh: run gangshare dev from a gangshare checkout"
    )


def build_script() -> Path:
    return repo_root() / "scripts" / "build-k8s.sh"


def bin_dir(build: bool = True) -> Path:
    override = os.environ.get("GANGSHARE_K8S_BIN")
    if override:
        folder = Path(override)
    else:
        script = build_script()
        printed = subprocess.run(
            ["bash", str(script), "--print-bin-dir"], check=True, capture_output=True, text=True
        )
        folder = Path(printed.stdout.strip())
        missing = [b for b in REQUIRED if not (folder / b).exists()]
        if missing and build:
            # Cold: tens of minutes on two cores; warm runs skip straight through.
            subprocess.run(["bash", str(script)], check=True)
    missing = [b for b in REQUIRED if not (folder / b).exists()]
    if missing:
        raise BinariesError(
            f"missing binaries in {folder}: {', '.join(missing)} (run scripts/build-k8s.sh)"
        )
    return folder
