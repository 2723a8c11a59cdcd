"""NVLink islands inside a node: GPUs that talk to each other over NVLink/NVSwitch."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Island = tuple[int, ...]


def islands_from_link_matrix(matrix: Sequence[Sequence[int | bool]]) -> tuple[Island, ...]:
    """Connected components of the NVLink graph; a GPU with no links is its own island."""
    n = len(matrix)
    for i, row in enumerate(matrix):
        if len(row) != n:
            raise ValueError(f"linkMatrix[{i}]: expected {n} entries, got {len(row)}")
    seen: set[int] = set()
    islands: list[Island] = []
    for start in range(n):
        if start in seen:
            continue
        component, stack = [], [start]
        seen.add(start)
        while stack:
            gpu = stack.pop()
            component.append(gpu)
            for other in range(n):
                linked = matrix[gpu][other] or matrix[other][gpu]
                if other != gpu and linked and other not in seen:
                    seen.add(other)
                    stack.append(other)
        islands.append(tuple(sorted(component)))
    return tuple(sorted(islands))


def normalize_islands(
    gpu_indices: Iterable[int], islands: Iterable[Iterable[int]]
) -> tuple[Island, ...]:
    """Validate a declared island list and add singleton islands for unlisted GPUs."""
    indices = sorted(set(gpu_indices))
    known = set(indices)
    placed: set[int] = set()
    result: list[Island] = []
    for position, island in enumerate(islands):
        members = tuple(sorted(set(island)))
        if not members:
            raise ValueError(f"nvlinkIslands[{position}]: an island needs at least one GPU")
        unknown = [g for g in members if g not in known]
        if unknown:
            raise ValueError(f"nvlinkIslands[{position}]: no GPU with index {unknown[0]}")
        twice = placed.intersection(members)
        if twice:
            raise ValueError(f"nvlinkIslands[{position}]: GPU {min(twice)} is already in an island")
        placed.update(members)
        result.append(members)
    result.extend((g,) for g in indices if g not in placed)
    return tuple(sorted(result))
