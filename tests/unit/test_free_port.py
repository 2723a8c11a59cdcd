"""free_port never hands the same port out twice in one process."""

from __future__ import annotations

import itertools

import pytest

from gangshare.dev import processes


def test_a_port_picked_before_is_not_picked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # The first two draws coincide, as two random picks did in CI.
    draws = itertools.chain([23456, 23456], itertools.count(23457))
    monkeypatch.setattr(processes.random, "randint", lambda _lo, _hi: next(draws))
    monkeypatch.setattr(processes, "_HANDED_OUT", set())
    first, second = processes.free_port(), processes.free_port()
    assert first == 23456
    assert second != first


def test_many_picks_are_distinct() -> None:
    ports = [processes.free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
