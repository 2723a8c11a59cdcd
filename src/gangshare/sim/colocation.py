"""Measured co-location on real GPUs (Lucid: single_data.csv and colocate_info.csv).

A workload is one (model, dataset, batch size, AMP) configuration. Solo: its GPU
utilization (%) and memory (MiB). Pairs: each side's speed when sharing one GPU,
normalised by its solo speed, and the pair's utilization. Only configurations
that appear in at least one measured pair are offered to the workload mapping.

Speeds above 1.0 (20% of the measurements) are noise around "no slowdown" and are
clipped to 1.0. A pair that was never measured uses the mean of the workload's
measured speeds with other partners, and a pair utilization of
max(u_a, u_b) + 0.26 * min(u_a, u_b) (0.26 is the median of that ratio over the
measured pairs).
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

UNMEASURED_UTIL_SHARE = 0.26
MIN_SPEED = 0.05

Config = tuple[str, str, str, str]


class ColocationError(ValueError):
    """Co-location data that cannot be used; the message names the file and field."""


@dataclass(frozen=True)
class Workload:
    name: str
    # Solo SM utilization, percent.
    util: float
    memory_mib: int


class ColocationModel:
    def __init__(
        self,
        workloads: list[Workload],
        pairs: Mapping[tuple[int, int], tuple[float, float]],
    ) -> None:
        """`pairs[(a, b)]` = (speed of a beside b, pair utilization %); a != b or a == b."""
        if not workloads:
            raise ColocationError("co-location data: no workload with a measured pair")
        self.workloads = workloads
        self._speed: dict[tuple[int, int], float] = {}
        self._util: dict[tuple[int, int], float] = {}
        for (a, b), (speed, util) in pairs.items():
            self._speed[(a, b)] = min(1.0, max(MIN_SPEED, speed))
            self._util[(a, b)] = self._util[(b, a)] = min(100.0, util)
        self._fallback = [
            _mean([s for (a, _), s in self._speed.items() if a == w], 1.0)
            for w in range(len(workloads))
        ]

    def __len__(self) -> int:
        return len(self.workloads)

    def speed(self, job: int, beside: int) -> float:
        """Speed of `job` (as a fraction of solo) while `beside` shares its GPU at full duty."""
        found = self._speed.get((job, beside))
        return self._fallback[job] if found is None else found

    def pair_util(self, a: int, b: int) -> float:
        found = self._util.get((a, b))
        if found is not None:
            return found
        ua, ub = self.workloads[a].util, self.workloads[b].util
        return min(100.0, max(ua, ub) + UNMEASURED_UTIL_SHARE * min(ua, ub))


def _mean(values: list[float], default: float) -> float:
    return sum(values) / len(values) if values else default


def _config(row: Mapping[str, str], suffix: str = "") -> Config:
    return (
        row[f"model{suffix}"].strip(),
        row[f"dataset{suffix}"].strip(),
        str(int(float(row[f"batchsize{suffix}"]))),
        str(int(float(row[f"amp{suffix}"]))),
    )


def _rows(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as handle:
            return list(csv.DictReader(handle))
    except OSError as err:
        raise ColocationError(f"--colocation: cannot read {path} ({err.strerror or err})") from None


def load_colocation(directory: Path) -> ColocationModel:
    single = _rows(directory / "single_data.csv")
    pairs = _rows(directory / "colocate_info.csv")
    return build_model(single, pairs, str(directory))


def build_model(
    single: Iterable[Mapping[str, str]], pairs: Iterable[Mapping[str, str]], source: str = ""
) -> ColocationModel:
    solo: dict[Config, tuple[float, int]] = {}
    try:
        for row in single:
            solo[_config(row)] = (float(row["gpu_util"]), int(float(row["gmem"])))
    except (KeyError, ValueError) as err:
        raise ColocationError(f"--colocation: {source} single_data.csv: bad field {err}") from None
    measured: dict[tuple[Config, Config], list[tuple[float, float]]] = {}
    try:
        for row in pairs:
            a, b = _config(row, "1"), _config(row, "2")
            if a not in solo or b not in solo:
                continue
            util = float(row["gpu_util"])
            measured.setdefault((a, b), []).append((float(row["speed1"]), util))
            measured.setdefault((b, a), []).append((float(row["speed2"]), util))
    except (KeyError, ValueError) as err:
        raise ColocationError(
            f"--colocation: {source} colocate_info.csv: bad field {err}"
        ) from None
    names = sorted({a for a, _ in measured})
    index = {name: i for i, name in enumerate(names)}
    workloads = [Workload("/".join(name), solo[name][0], solo[name][1]) for name in names]
    table = {
        (index[a], index[b]): (_mean([s for s, _ in obs], 1.0), _mean([u for _, u in obs], 0.0))
        for (a, b), obs in measured.items()
    }
    return ColocationModel(workloads, table)
