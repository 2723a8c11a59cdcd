"""A container image's file system staged in a folder, and its layer tarball.

The layer is reproducible: entries sorted, every time zero, owners root unless a folder was
staged for another user, so the same files always give the same layer digest.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import tarfile
from collections.abc import Iterable
from pathlib import Path


class Rootfs:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.owners: dict[str, tuple[int, int]] = {}

    def path(self, name: str) -> Path:
        return self.root / name.lstrip("/")

    def mkdir(self, name: str, mode: int = 0o755, owner: tuple[int, int] = (0, 0)) -> None:
        target = self.path(name)
        target.mkdir(parents=True, exist_ok=True)
        target.chmod(mode)
        if owner != (0, 0):
            self.owners[str(target.relative_to(self.root))] = owner

    def write(self, name: str, data: bytes, mode: int = 0o644) -> None:
        target = self.path(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        target.chmod(mode)

    def copy(self, source: Path, name: str, mode: int = 0o644) -> None:
        """The file's bytes, links followed: a link's target may sit elsewhere on this host."""
        target = self.path(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink():
            target.unlink()
        shutil.copyfile(source, target)
        target.chmod(mode)

    def symlink(self, name: str, points_to: str) -> None:
        target = self.path(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.exists():
            target.unlink()
        target.symlink_to(points_to)


def layer_tarball(fs: Rootfs, out: Path) -> Path:
    with tarfile.open(out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for path in _walk(fs.root):
            name = str(path.relative_to(fs.root))
            info = tarfile.TarInfo(name)
            info.mtime = 0
            info.uid, info.gid = fs.owners.get(name, (0, 0))
            mode = path.lstat().st_mode
            info.mode = stat.S_IMODE(mode)
            if stat.S_ISLNK(mode):
                info.type = tarfile.SYMTYPE
                info.linkname = os.readlink(path)
                tar.addfile(info)
            elif stat.S_ISDIR(mode):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = path.stat().st_size
                with path.open("rb") as data:
                    tar.addfile(info, data)
    return out


def _walk(root: Path) -> Iterable[Path]:
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        base = Path(folder)
        if base != root:
            yield base
        for name in sorted(names):
            yield base / name
        # Links to folders are entries, not places to descend into.
        for name in [d for d in dirs if (base / d).is_symlink()]:
            dirs.remove(name)
            yield base / name


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as data:
        for chunk in iter(lambda: data.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def loaded_libraries(objects: list[Path], inside: list[Path]) -> list[Path]:
    """The shared libraries `ldd` says these ELF files load from outside the `inside` folders
    (wheels bundle most of theirs; libc, libstdc++ and the like come from the system)."""
    found: set[Path] = set()
    for path in objects:
        listed = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=False)
        if listed.returncode != 0:
            continue  # static binaries and some stripped objects: nothing to load
        for line in listed.stdout.splitlines():
            for part in line.split():
                if part.startswith("/"):
                    library = Path(part)
                    if not any(library.is_relative_to(r) for r in inside):
                        found.add(library)
                    break
    return sorted(found)
