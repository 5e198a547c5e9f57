"""Run directories: effdepth writes only into its own, never deletes a file it did not write, and
lets one run at a time write into a directory.

A run directory is one whose ``metadata.json`` effdepth wrote (it carries the run's ``key`` and
``effdepth_version``). Before any model loads, ``RunDirectory.open`` refuses an ``--out`` that is a
file, cannot be created, is a non-empty directory of someone else's files, holds a run with other
parameters (unless ``overwrite``), or is being written by another effdepth process (a lock file).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import EffdepthError

LOCK_NAME = ".effdepth.lock"
METADATA = "metadata.json"
_TMP = re.compile(r"^\..+\.tmp-\d+$")  # atomic_write_* temporaries: .<name>.tmp-<pid>
_OWN_FIXED = {METADATA, "examples.jsonl", "effective_depth.json", LOCK_NAME}


class OutputDirectoryError(EffdepthError):
    """``--out`` cannot be used without risking files effdepth did not write."""


def is_own_file(name: str, probes: tuple[str, ...]) -> bool:
    """Whether effdepth writes files of this name into a run directory."""
    if name in _OWN_FIXED or _TMP.match(name):
        return True
    stem = name.removesuffix(".parquet")
    return name.endswith(".parquet") and (
        stem in probes or stem.removesuffix("_by_example") in probes or stem == "depth_score"
    )


def read_metadata(out: Path) -> dict | None:
    """The run directory's metadata, or None when ``out`` holds no effdepth metadata."""
    try:
        metadata = json.loads((out / METADATA).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(metadata, dict) or "key" not in metadata or "effdepth_version" not in metadata:
        return None
    return metadata


def _differences(old: dict, new: dict) -> str:
    names = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and k not in ("progress",))
    return ", ".join(f"{k}: {old.get(k)!r} → {new.get(k)!r}" for k in names[:4]) or "the task file's content"


@dataclass
class RunDirectory:
    """An output directory this process holds the lock of. ``stale`` is true when it holds a run
    with other parameters that ``overwrite`` allowed replacing (see ``clear_stale``)."""

    path: Path
    probes: tuple[str, ...]
    stale: bool = False
    metadata: dict | None = None
    created: list[Path] = field(default_factory=list)  # directories this run made, deepest last
    _lock: int | None = None

    @classmethod
    def open(cls, out: Path, key: str, settings: dict, probes: tuple[str, ...], overwrite: bool) -> RunDirectory:
        """Check ``out`` and lock it (creating it if needed). Raises OutputDirectoryError with one
        line naming the problem and the fix; nothing is deleted here."""
        metadata = None
        if out.exists() or out.is_symlink():
            if not out.is_dir():
                raise OutputDirectoryError(f"--out {out} is a file, not a directory; choose a directory")
            metadata = read_metadata(out)
            if metadata is None and any(p.name != LOCK_NAME and not _TMP.match(p.name) for p in out.iterdir()):
                raise OutputDirectoryError(
                    f"--out {out} is not empty and is not an effdepth run directory (no effdepth {METADATA}); "
                    "effdepth never writes among other files: choose a new or empty directory"
                )
            if metadata is not None and metadata["key"] != key and not overwrite:
                raise OutputDirectoryError(
                    f"--out {out} holds an effdepth run with other parameters "
                    f"({_differences(metadata.get('settings', {}), settings)}); "
                    "pass --overwrite to replace its effdepth files, or choose another --out"
                )
        directory = cls(out, probes, stale=metadata is not None and metadata["key"] != key, metadata=metadata)
        directory._create()
        directory._acquire()
        return directory

    def _create(self) -> None:
        missing = []
        for parent in [self.path, *self.path.parents]:
            if parent.exists():
                break
            missing.append(parent)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputDirectoryError(
                f"cannot create --out {self.path} ({exc.strerror or exc}); choose another"
            ) from exc
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise OutputDirectoryError(f"--out {self.path} is not writable; choose another directory")
        self.created = list(reversed(missing))

    def _acquire(self) -> None:
        lock_path = self.path / LOCK_NAME
        for _ in range(3):  # a lock file unlinked by its releasing holder between open and flock: retry
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                self.abandon()
                raise OutputDirectoryError(f"cannot write in --out {self.path} ({exc.strerror or exc})") from exc
            try:
                import fcntl

                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except ImportError:  # no flock (Windows): one run per directory is then up to the user
                pass
            except OSError as exc:
                os.close(fd)
                holder = lock_path.read_text().strip() if lock_path.is_file() else ""
                raise OutputDirectoryError(
                    f"--out {self.path} is being written by another effdepth run ({holder or 'a live process'}); "
                    "wait for it to finish or choose another --out"
                ) from exc
            try:
                same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        else:
            raise OutputDirectoryError(f"could not lock --out {self.path}; another effdepth run keeps starting there")
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}".encode())
        self._lock = fd
        for leftover in self.path.iterdir():  # temporaries of a killed run: we hold the lock, so none is live
            if _TMP.match(leftover.name):
                leftover.unlink(missing_ok=True)

    def clear_stale(self) -> None:
        """Delete the effdepth files of the earlier run with other parameters (``overwrite``), and
        only those: files effdepth did not write stay."""
        if not self.stale:
            return
        for entry in self.path.iterdir():
            if entry.is_file() and entry.name != LOCK_NAME and is_own_file(entry.name, self.probes):
                entry.unlink()
        self.stale, self.metadata = False, None

    def release(self) -> None:
        """Drop the lock (the lock file goes with it)."""
        if self._lock is None:
            return
        (self.path / LOCK_NAME).unlink(missing_ok=True)  # while still holding it
        os.close(self._lock)
        self._lock = None

    def abandon(self) -> None:
        """After a failure before anything was written: release, and remove the directories this
        run created if they are still empty."""
        self.release()
        for directory in reversed(self.created):
            try:
                directory.rmdir()
            except OSError:
                break
        self.created = []
