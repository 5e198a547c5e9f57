"""Run directories — the cache format, read and written here only — and their safety: effdepth
writes only into its own, never deletes a file it did not write, and lets one run at a time write
into a directory.

Layout: ``metadata.json`` (settings, key, provenance, time per probe; written first, so it marks the
directory as effdepth's), ``examples.jsonl``, per probe ``<probe>.parquet`` (its saved result) and
``<probe>_by_example.parquet`` (written last: marks the probe done), derived frames such as
``depth_score.parquet``, and ``effective_depth.json``. Every file is written to a temporary name
and renamed. A run directory is one whose ``metadata.json`` carries a ``key`` and
``effdepth_version``. Before any model loads, ``RunDirectory.open`` refuses an ``--out`` that is a
file, cannot be created, is a non-empty directory of someone else's files, holds a run with other
parameters (unless ``overwrite``), or is being written by another effdepth process (a lock file).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from .errors import EffdepthError

LOCK_NAME = ".effdepth.lock"
METADATA = "metadata.json"
EXAMPLES = "examples.jsonl"
SUMMARY = "effective_depth.json"
DERIVED = {"skip": ("depth_score",), "tuned_lens": ("tuned_lens_fit",)}  # probe → frames derived from it
_OWN_FIXED = {METADATA, EXAMPLES, SUMMARY, LOCK_NAME}
_TMP = re.compile(r"^\.(?P<name>.+)\.effdepth-tmp-\d+$")  # atomic_write_*: .<own file name>.effdepth-tmp-<pid>


class OutputDirectoryError(EffdepthError):
    """``--out`` cannot be used without risking files effdepth did not write."""


def is_own_file(name: str, probes: tuple[str, ...]) -> bool:
    """Whether effdepth writes files of this name into a run directory (for ``probes``)."""
    if name in _OWN_FIXED:
        return True
    stem = name.removesuffix(".parquet")
    return name.endswith(".parquet") and (
        stem in probes
        or stem.removesuffix("_by_example") in probes
        or any(stem in names and probe in probes for probe, names in DERIVED.items())
    )


def is_own_temporary(path: Path, probes: tuple[str, ...]) -> bool:
    """A temporary file of effdepth's atomic writes (a file, named after one of its own files)."""
    match = _TMP.match(path.name)
    return bool(match) and is_own_file(match["name"], probes) and path.is_file() and not path.is_symlink()


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}.effdepth-tmp-{os.getpid()}")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = _temporary(path)
    tmp.write_bytes(data)
    os.replace(tmp, path)


def atomic_write_json(path: Path, payload: dict) -> None:
    atomic_write_bytes(path, (json.dumps(payload, indent=2) + "\n").encode())


def atomic_write_parquet(path: Path, frame: pl.DataFrame) -> None:
    tmp = _temporary(path)
    frame.write_parquet(tmp)
    os.replace(tmp, path)


def read_cached_frame(path: Path) -> pl.DataFrame:
    """A cached parquet frame; one-line error when it is damaged."""
    try:
        return pl.read_parquet(path)
    except Exception as exc:  # polars raises several types for a damaged file
        raise EffdepthError(
            f"the cached {path} is damaged ({type(exc).__name__}); delete it and rerun to compute it again"
        ) from exc


def is_complete(out: Path, key: str, probes) -> bool:
    """Whether ``out`` holds a finished run of ``key`` with every probe in ``probes``."""
    metadata = read_metadata(out)
    return (
        metadata is not None
        and metadata["key"] == key
        and (out / EXAMPLES).is_file()
        and all((out / f"{p}_by_example.parquet").is_file() for p in probes)
    )


def read_metadata(out: Path) -> dict | None:
    """The run directory's metadata, or None when ``out`` holds no effdepth metadata (a missing,
    unreadable or hand-damaged file is not effdepth's)."""
    path = out / METADATA
    if not path.is_file():  # a FIFO or a directory of that name is not effdepth's (and reading a FIFO hangs)
        return None
    try:
        metadata = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(metadata, dict) or not isinstance(metadata.get("key"), str) or "effdepth_version" not in metadata:
        return None
    if not isinstance(metadata.get("settings", {}), dict) or not isinstance(metadata.get("probes", {}), dict):
        return None
    return metadata


def describes_a_run(metadata: dict) -> bool:
    """Whether the metadata holds the model facts a finished start wrote (n_layers, n_examples)."""

    def count(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value > 0

    asked = metadata.get("n_asked", metadata.get("n_examples"))
    return count(metadata.get("n_layers")) and count(metadata.get("n_examples")) and count(asked)


def _differences(old: dict, new: dict) -> str:
    names = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and k not in ("progress",))
    listed = ", ".join(f"{k}: {old.get(k)!r} → {new.get(k)!r}" for k in names[:4])
    return listed or "the same options, but another task file content, model path or effdepth version"


@dataclass
class RunDirectory:
    """An output directory this process holds the lock of. ``stale`` is true when it holds a run
    with other parameters that ``overwrite`` allowed replacing (see ``clear_stale``)."""

    path: Path
    probes: tuple[str, ...]
    stale: bool = False
    metadata: dict | None = None
    created: list[Path] = field(default_factory=list)  # directories this run made, deepest last
    opened_metadata: dict | None = None  # what the directory held when opened
    wrote: bool = False
    finished: int = 0  # probes finished by this process
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
            others = [p for p in out.iterdir() if p.name != LOCK_NAME and not is_own_temporary(p, probes)]
            if metadata is None and others:
                what = (
                    f"its {METADATA} is not effdepth's or is damaged"
                    if (out / METADATA).exists()
                    else (f"no effdepth {METADATA}")
                )
                raise OutputDirectoryError(
                    f"--out {out} is not empty and is not an effdepth run directory ({what}); "
                    "effdepth never writes among other files: choose a new or empty directory"
                )
            if metadata is not None and metadata["key"] != key and not overwrite:
                raise OutputDirectoryError(
                    f"--out {out} holds an effdepth run with other parameters "
                    f"({_differences(metadata.get('settings', {}), settings)}); "
                    "pass --overwrite to replace its effdepth files, or choose another --out"
                )
        stale = metadata is not None and metadata["key"] != key
        directory = cls(out, tuple(probes), stale=stale, metadata=metadata, opened_metadata=metadata)
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
            if is_own_temporary(leftover, self.probes):
                leftover.unlink(missing_ok=True)

    def clear_stale(self) -> None:
        """Delete the effdepth files of the earlier run with other parameters (``overwrite``), and
        only those: files effdepth did not write stay."""
        if not self.stale:
            return
        written = tuple(p for p in (self.metadata or {}).get("probes", {}) if p in self.probes)  # by the old run
        for entry in self.path.iterdir():
            if entry.is_file() and entry.name != LOCK_NAME and is_own_file(entry.name, written):
                entry.unlink()
        self.stale, self.metadata = False, None

    # --- the cache format ---------------------------------------------------------------------

    def has_probe(self, name: str) -> bool:
        """Finished here: recorded in the metadata, and its marker file is present."""
        recorded = name in (self.metadata or {}).get("probes", {})
        return not self.stale and recorded and (self.path / f"{name}_by_example.parquet").is_file()

    def foreign_files_for(self, probes) -> list[str]:
        """Files that writing ``probes`` would replace but that no effdepth run here recorded (a
        user's file of the same name): effdepth refuses rather than overwrite them."""
        recorded = tuple((self.metadata or {}).get("probes", {}))  # by the run here (also a stale one)
        names = [f"{p}.parquet" for p in probes] + [f"{p}_by_example.parquet" for p in probes]
        names += [f"{d}.parquet" for probe, derived in DERIVED.items() if probe in probes for d in derived]
        return [n for n in names if (self.path / n).exists() and not is_own_file(n, recorded)]

    def has_examples(self) -> bool:
        return not self.stale and (self.path / EXAMPLES).is_file()

    def start(self, metadata: dict, examples) -> dict:
        """Begin (or continue) writing: replace a stale run's files, then write the metadata (kept
        from an earlier call of the same run, with its probe timings) and the examples."""
        previous = None if self.stale else self.metadata
        self.clear_stale()
        if previous is not None:
            metadata["probes"] = dict(previous.get("probes", {}))
        self.write_metadata(metadata)  # first: marks the directory as effdepth's
        text = "".join(json.dumps(e.to_json()) + "\n" for e in examples)
        atomic_write_bytes(self.path / EXAMPLES, text.encode())
        self.metadata, self.wrote = metadata, True
        return metadata

    def write_metadata(self, metadata: dict) -> None:
        atomic_write_json(self.path / METADATA, metadata)

    def write_json(self, name: str, payload: dict) -> None:
        atomic_write_json(self.path / name, payload)

    def save_probe(self, name: str, frames: dict[str, pl.DataFrame]) -> None:
        """A finished probe's frames, its per-example frame last (that one marks the probe done)."""
        marker = f"{name}_by_example"
        for frame_name, frame in frames.items():
            if frame_name != marker:
                atomic_write_parquet(self.path / f"{frame_name}.parquet", frame)
        atomic_write_parquet(self.path / f"{marker}.parquet", frames[marker])
        self.finished += 1

    def read_metadata_or_fail(self) -> dict:
        metadata = read_metadata(self.path)
        if metadata is None or not describes_a_run(metadata):
            raise EffdepthError(
                f"{self.path / METADATA} is damaged (it lacks the run's model facts); delete the directory's effdepth "
                "files or choose another --out"
            )
        return metadata

    def _read(self, name: str) -> pl.DataFrame:
        return read_cached_frame(self.path / name)

    def read_probes(self, metadata: dict) -> tuple[dict[str, pl.DataFrame], dict[str, pl.DataFrame]]:
        """Per-example frames and saved frames (derived ones included) of every probe the run's
        metadata records as finished (a file of a probe's name that no run wrote is not read)."""
        recorded = metadata.get("probes", {})
        done = [p for p in self.probes if p in recorded and (self.path / f"{p}_by_example.parquet").is_file()]
        per_example = {p: self._read(f"{p}_by_example.parquet") for p in done}
        saved = {p: self._read(f"{p}.parquet") for p in done}
        for probe, derived in DERIVED.items():
            for name in derived:
                if probe in done and (self.path / f"{name}.parquet").is_file():
                    saved[name] = self._read(f"{name}.parquet")
        return per_example, saved

    def discard_if_empty(self) -> None:
        """After a failure: a new run directory in which no probe finished is removed again (only
        the files this run wrote, and the directories it created)."""
        if self.opened_metadata is not None or self.finished:
            return
        if self.wrote:
            for name in (METADATA, EXAMPLES):
                (self.path / name).unlink(missing_ok=True)
        self.abandon()

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
