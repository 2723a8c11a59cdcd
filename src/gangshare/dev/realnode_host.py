"""What a kubelet and containerd leave on the host, found and removed again.

The kubelet bind-mounts its root dir onto itself and mounts pod volumes under it,
containerd mounts container root filesystems under its state dir, both create
`/kubepods` cgroups and iptables chains, and containerd's shims (own process groups)
outlive containerd. None of that goes away with the processes, so teardown and the
sweep after a crashed owner remove it explicitly.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from gangshare.dev.realnode_config import POD_LOGS

CGROUP_ROOT = Path("/sys/fs/cgroup")
# The kubelet's pod log folders and its per-container symlinks to their files.
LOG_FOLDERS = (POD_LOGS, Path("/var/log/containers"))
KUBEPODS = "kubepods"
KUBELET_CHAINS = ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT")
MNT_DETACH = 2


def process_names(pid: int) -> tuple[str, list[str]]:
    """(executable basename, argv) of a process; ("", []) once it is gone."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        exe = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return "", []
    return exe.removesuffix(" (deleted)"), [a.decode(errors="replace") for a in argv if a]


def all_pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def kubelet_pids() -> list[int]:
    """Every kubelet on the machine, ours or not: the device-plugin socket is one per host."""
    return [pid for pid in all_pids() if process_names(pid)[0] == "kubelet"]


def shim_pids(containerd_socket: Path) -> list[int]:
    """containerd-shim-runc-v2 processes that serve the containerd on this socket."""
    found = []
    for pid in all_pids():
        exe, argv = process_names(pid)
        if exe.startswith("containerd-shim") and str(containerd_socket) in argv:
            found.append(pid)
    return found


def kill_pids(pids: Iterable[int], timeout: float = 5.0) -> list[int]:
    """SIGKILL each; returns those still there after `timeout`."""
    pending = list(pids)
    for pid in pending:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        pending = [p for p in pending if _exists(p)]
        if pending:
            time.sleep(0.05)
    return pending


def _exists(pid: int) -> bool:
    # Our own zombies are reaped by processes.stop; others' are gone for every practical purpose.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def kubepods_dirs() -> list[Path]:
    """Every kubepods cgroup folder, deepest first, in every mounted hierarchy."""
    found: list[Path] = []
    if not CGROUP_ROOT.is_dir():
        return found
    for hierarchy in sorted(CGROUP_ROOT.iterdir()):
        top = hierarchy / KUBEPODS
        if top.is_dir() and not top.is_symlink():
            found += [Path(d) for d, _, _ in os.walk(top)]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def kill_pod_processes(timeout: float = 10.0) -> list[int]:
    """SIGKILL whatever still runs in a pod cgroup (containers whose kubelet is gone)."""
    deadline = time.monotonic() + timeout
    while True:
        pids: set[int] = set()
        for folder in kubepods_dirs():
            with contextlib.suppress(OSError):
                pids.update(int(p) for p in (folder / "cgroup.procs").read_text().split())
        pids = {p for p in pids if _exists(p)}
        if not pids or time.monotonic() >= deadline:
            return sorted(pids)
        kill_pids(pids, timeout=1.0)


def remove_kubepods_cgroups() -> list[Path]:
    """rmdir the kubepods trees bottom-up; returns the folders that would not go."""
    left = []
    for folder in kubepods_dirs():
        try:
            folder.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            # The kernel may still be tearing down a just-killed task: one short retry.
            time.sleep(0.2)
            try:
                folder.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                left.append(folder)
    return left


def mounts_under(*roots: Path) -> list[Path]:
    """Mount points at or below any of `roots`, deepest (and latest) first."""
    prefixes = [str(r.resolve()) if r.exists() else str(r) for r in roots]
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = _unescape(line.split()[4])
            if any(point == p or point.startswith(p.rstrip("/") + "/") for p in prefixes):
                found.append(Path(point))
    # Later mounts stack on earlier ones: undo them in reverse, deepest first.
    ordered = list(reversed(found))
    return sorted(ordered, key=lambda p: len(p.parts), reverse=True)


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as octal escapes.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def unmount_all(*roots: Path) -> list[Path]:
    """Unmount everything under `roots` (a bind mount of a root onto itself included)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for _ in range(5):
        points = mounts_under(*roots)
        if not points:
            return []
        for point in points:
            if libc.umount2(os.fsencode(point), 0) != 0:
                # Busy (a process still has it open): detach now, the kernel frees it later.
                libc.umount2(os.fsencode(point), MNT_DETACH)
    return mounts_under(*roots)


def remove_tree(folder: Path) -> bool:
    """rm -r, but never through a mount point still in place (it could be a host folder)."""
    if mounts_under(folder):
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return not folder.exists()


def remove_iptables_chains(chains: tuple[str, ...] = KUBELET_CHAINS) -> list[str]:
    """Delete the kubelet's chains and the rules that jump to them; returns what stayed."""
    left = []
    for tool in ("iptables", "ip6tables"):
        if shutil.which(tool) is None:
            continue
        for table in ("filter", "nat", "mangle"):
            rules = _iptables(tool, "-t", table, "-S")
            if rules is None:
                continue
            lines = rules.splitlines()
            ours = [c for c in chains if f"-N {c}" in lines]
            if not ours:
                continue
            for line in lines:
                # -S quotes comments the way a shell would, and -D wants them back as one word.
                words = shlex.split(line)
                # Jumps from other chains first: -X refuses a chain something still refers to.
                if words[:1] == ["-A"] and words[1] not in ours and _target(words) in ours:
                    _iptables(tool, "-t", table, "-D", *words[1:])
            for chain in ours:
                _iptables(tool, "-t", table, "-F", chain)
                if _iptables(tool, "-t", table, "-X", chain) is None:
                    left.append(f"{tool} -t {table} {chain}")
    return left


def _target(words: list[str]) -> str:
    for flag in ("-j", "-g"):
        if flag in words[:-1]:
            return words[words.index(flag) + 1]
    return ""


def _iptables(tool: str, *args: str) -> str | None:
    try:
        done = subprocess.run(
            [tool, "-w", "5", *args], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def pod_log_entries() -> list[str]:
    return sorted(str(e) for folder in LOG_FOLDERS if folder.is_dir() for e in folder.iterdir())


def remove_pod_logs(keep: list[str]) -> None:
    for entry in set(pod_log_entries()) - set(keep):
        path = Path(entry)
        if path.is_symlink() or not path.is_dir():
            path.unlink(missing_ok=True)
        else:
            shutil.rmtree(path, ignore_errors=True)


def parse_cri_log(text: str) -> str:
    """The messages of a CRI log file (`<time> <stream> <P|F> <message>` per line)."""
    out = []
    for line in text.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 3:
            continue
        message = parts[3] if len(parts) == 4 else ""
        # P marks a line the runtime split; the next part continues it.
        out.append(message if parts[2] == "P" else message + "\n")
    return "".join(out)
