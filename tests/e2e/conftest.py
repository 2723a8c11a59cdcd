"""Fixtures the real-kubelet modules share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_process import AgentProcess, running_agent
from test_agent import allocatable
from test_coordinator import spec

from gangshare.dev.realnode import RealNode
from kube import Kube


@pytest.fixture
def one_gpu_agent(kube: Kube, real_node: RealNode, tmp_path: Path) -> Iterator[AgentProcess]:
    """The agent on the real node with one fake 16 GiB GPU (4 share slots), deciding every 1 s."""

    def ready() -> bool:
        held = allocatable(kube, real_node)
        return held == {"nvidia.com/gpu": "1", "gangshare.io/gpu-share": "4"}

    with running_agent(kube, real_node, tmp_path, spec(), ready) as process:
        yield process
