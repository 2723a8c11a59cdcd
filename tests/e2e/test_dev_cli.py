"""`gangshare dev up/status/down` as a user runs them, and cleanup when the owner crashes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gangshare.dev import binaries
from gangshare.dev.processes import Child, port_is_open
from kube import eventually

pytestmark = pytest.mark.e2e
GANGSHARE = [sys.executable, "-m", "gangshare.cli"]
# What `dev up` runs when every controller is built (make test builds them all first).
COMPONENTS = 10


def alive(pids: dict[str, int]) -> list[str]:
    return [name for name, pid in pids.items() if Child(name, pid, Path()).alive()]


def test_up_then_kubectl_then_down_leaves_nothing(tmp_path: Path):
    root = tmp_path / "dev"
    spec = tmp_path / "cluster.yaml"
    spec.write_text(
        "nodePools:\n  - name: gpu\n    count: 2\n    gpusPerNode: 4\n"
        "    nvlinkIslands: [[0, 1], [2, 3]]\n"
    )
    up = subprocess.run(
        [*GANGSHARE, "dev", "up", "--root", str(root), "--cluster", str(spec)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    state = json.loads((root / "state.json").read_text())
    try:
        assert up.returncode == 0, up.stderr
        assert f"export KUBECONFIG={root / 'kubeconfig'}" in up.stdout
        kubectl = binaries.bin_dir(build=False) / "kubectl"
        nodes = subprocess.run(
            [
                str(kubectl),
                f"--kubeconfig={root / 'kubeconfig'}",
                "get",
                "nodes",
                "--no-headers",
                "-o",
                "custom-columns=NAME:.metadata.name,GPU:.status.capacity.nvidia\\.com/gpu",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert nodes == ["gpu-0", "4", "gpu-1", "4"]
        status = subprocess.run(
            [*GANGSHARE, "dev", "status", "--root", str(root)], capture_output=True, text=True
        )
        # etcd, the API server, kube-scheduler, the controller manager, KWOK, the extender with
        # its kube-scheduler, and JobSet's, Trainer's and the training-operator's controllers.
        assert status.returncode == 0 and status.stdout.count("running") == COMPONENTS
        assert (
            sorted((root / "logs").glob("*.log"))
            and len(list((root / "logs").glob("*.log"))) == COMPONENTS
        )
    finally:
        down = subprocess.run(
            [*GANGSHARE, "dev", "down", "--root", str(root)], capture_output=True, text=True
        )
    assert down.returncode == 0, down.stderr
    assert alive(state["pids"]) == []
    assert [p for p in state["ports"].values() if port_is_open(p)] == []
    assert not (root / "state.json").exists()
    assert (root / "etcd").exists()  # `down` keeps the last store to look at


def test_up_again_after_down_on_the_same_folder_starts_clean(tmp_path: Path):
    root = tmp_path / "dev"
    spec = tmp_path / "cluster.yaml"
    spec.write_text("nodePools:\n  - name: gpu\n    count: 1\n    gpusPerNode: 2\n")
    up = [*GANGSHARE, "dev", "up", "--root", str(root), "--cluster", str(spec)]
    down = [*GANGSHARE, "dev", "down", "--root", str(root)]
    kubectl = binaries.bin_dir(build=False) / "kubectl"
    try:
        for round_ in range(2):
            started = subprocess.run(up, capture_output=True, text=True, timeout=300)
            assert started.returncode == 0 and "Traceback" not in started.stderr, (
                round_,
                started.stderr[-3000:],
            )
            nodes = subprocess.run(
                [str(kubectl), f"--kubeconfig={root / 'kubeconfig'}", "get", "nodes", "-o", "name"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
            assert nodes == ["node/gpu-0"]
            stopped = subprocess.run(down, capture_output=True, text=True, timeout=120)
            assert stopped.returncode == 0, stopped.stderr
    finally:
        subprocess.run(down, capture_output=True, text=True, timeout=120)


def test_up_refuses_a_bad_cluster_spec(tmp_path: Path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("nodePools:\n  - name: gpu\n    gpusPerNode: 0\n")
    up = subprocess.run(
        [*GANGSHARE, "dev", "up", "--root", str(tmp_path), "--cluster", str(spec)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert up.returncode == 1
    assert up.stderr.strip() == "error: nodePools[0].gpusPerNode: must be between 1 and 64, got 0"


def test_components_die_with_a_crashed_owner(tmp_path: Path):
    owner = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from gangshare.dev import binaries
        from gangshare.dev.cli import load_nodes
        from gangshare.dev.cluster import LocalCluster
        bins = binaries.bin_dir(build=False)
        cluster = LocalCluster(Path({str(tmp_path)!r}), bins, attached=True)
        cluster.up(load_nodes(None)[:1])
        print("UP", flush=True)
        time.sleep(600)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", owner], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "UP"
        pids = json.loads((tmp_path / "state.json").read_text())["pids"]
        assert len(alive(pids)) == COMPONENTS
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    eventually(
        lambda: alive(pids) == [], timeout=15, what="components to exit after their owner died"
    )
    time.sleep(0.1)
    assert alive(pids) == []
