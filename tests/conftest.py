"""Fixtures shared by the integration and e2e tests: one real control plane per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kube import Kube, new_namespace, start_session_cluster


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    cluster, handle = start_session_cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield handle
    finally:
        survivors = cluster.down()
        assert survivors == [], f"components survived teardown: {survivors}"


@pytest.fixture
def namespace(kube: Kube) -> Iterator[str]:
    yield from new_namespace(kube)
