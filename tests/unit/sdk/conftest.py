"""Fixtures for the SDK's tests: a stand-in agent on a real unix socket, and a fake clock."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sdkkit import FakeTime, StubAgent


@pytest.fixture
def fake() -> FakeTime:
    return FakeTime()


@pytest.fixture
def sock_path(tmp_path: Path) -> str:
    return str(tmp_path / "agent.sock")


@pytest.fixture
def agent(sock_path: str) -> Iterator[StubAgent]:
    stub = StubAgent(sock_path)
    try:
        yield stub
    finally:
        stub.stop()
