"""The machine and code a replay's timings were measured on, written beside the timings: a
replay-speed figure means nothing without the cores it had and the commit it ran."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def commit(repo: Path) -> str:
    """The short commit, marked when the source differs from it; "unknown" outside git."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"], cwd=repo, capture_output=True, text=True
        )
    except OSError:
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + (" with uncommitted changes to src/" if dirty.stdout else "")


def describe_machine(workers: int, repo: Path) -> str:
    """One sentence: cores, CPU model, Python, commit, and how many replays ran at once."""
    cores = os.cpu_count() or 1
    side = (
        f"{workers} replays ran side by side, each with at most {max(1, cores // workers)} core(s)"
        if workers > 1
        else "replays ran one at a time"
    )
    return (
        f"Measured on {cores} core(s) of {cpu_model()}, Python {platform.python_version()}, "
        f"at commit {commit(repo)}; {side}."
    )
