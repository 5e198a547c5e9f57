"""Run directories — the cache format, read and written here only — and their safety: effdepth
writes only into its own, never deletes a file it did not write, lets one process at a time write
into a directory, and verifies every file it reads back.

Layout: ``metadata.json`` (settings, key, provenance, per probe its time, peak memory, key and the
sha256 of each file it wrote), ``examples.jsonl``, per probe ``<probe>.parquet`` and
``<probe>_by_example.parquet`` plus its derived frames (``depth_score.parquet``, …), and
``effective_depth.json``. A run directory is one whose ``metadata.json`` carries a ``key`` and
``effdepth_version``.

Crash consistency (format 2): before writing any file, ``metadata.json`` lists it under
``pending``; then each file is written atomically (``cache.atomic_write``); then ``metadata.json``
records the files with their sha256 and drops them from ``pending``. A process killed at any point
leaves either a finished record or files that ``pending`` names as effdepth's own; the next run
(holding the lock) deletes those and computes them again. Directories written before format 2
(``format`` absent) carry no sha256: they are read after the structural checks alone
(``COMPATIBILITY`` in ``settings.py``).

Before any model loads, ``RunDirectory.open`` refuses an ``--out`` that is a link, a file, cannot
be created, is a non-empty directory of someone else's files, holds a run with other parameters
(unless ``overwrite``), or is locked by another effdepth process.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from .cache import (
    LOCK_NAME,
    CacheLockError,
    DirectoryLock,
    LockHeldError,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_parquet,
    make_dirs,
    read_json,
    read_regular,
    remove_stale_temporaries,
    sha256_file,
    temporary_of,
)
from .errors import EffdepthError

FORMAT = 2
METADATA = "metadata.json"
EXAMPLES = "examples.jsonl"
SUMMARY = "effective_depth.json"
_OWN_FIXED = {METADATA, EXAMPLES, SUMMARY, LOCK_NAME}
_KEPT = "the probes finished before are kept; free space (or fix the permission) and rerun to resume"

__all__ = [
    "EXAMPLES",
    "LOCK_NAME",
    "METADATA",
    "SUMMARY",
    "DirectoryBusyError",
    "OutputDirectoryError",
    "RunDirectory",
    "is_complete",
    "read_metadata",
]


class OutputDirectoryError(EffdepthError):
    """``--out`` cannot be used without risking files effdepth did not write."""


class DirectoryBusyError(OutputDirectoryError):
    """Another effdepth process is writing the run directory now (the grid leaves the cell to it)."""


def is_own_file(name: str, frames: Mapping[str, tuple[str, ...]], probes) -> bool:
    """Whether effdepth writes a file of this name into a run directory, for ``probes`` (``frames``:
    probe → the frame names it saves, each as ``<frame>.parquet``)."""
    if name in _OWN_FIXED:
        return True
    stem = name.removesuffix(".parquet")
    return name.endswith(".parquet") and any(stem in frames.get(p, ()) for p in probes)


def read_cached_frame(path: Path) -> pl.DataFrame:
    """A cached parquet frame; one-line error when it is damaged or holds a non-finite number
    (effdepth never writes one: nulls mean "not defined")."""
    fix = "rerun `effdepth run` with its options and --overwrite to compute it again"
    try:
        frame = pl.read_parquet(io.BytesIO(read_regular(path, 1 << 34, "cached frame")))
    except Exception as exc:  # polars raises several types for a damaged file
        raise EffdepthError(f"the cached {path} is damaged ({type(exc).__name__}); {fix}") from exc
    floats = [c for c, t in frame.schema.items() if t.is_float()]
    if any(bool((~frame[c].is_finite()).fill_null(False).any()) for c in floats):
        raise EffdepthError(f"the cached {path} holds NaN or inf values, which effdepth never writes; {fix}")
    return frame


def check_recorded(folder: Path, metadata: dict, probe: str) -> None:
    """The files a probe's record lists have their recorded sha256 (one line naming the first that does not)."""
    bad = verified_files(folder, ((metadata.get("probes") or {}).get(probe) or {}).get("files", {}))
    if bad is not None:
        raise EffdepthError(
            f"the cached {probe} results in {folder} do not match its metadata ({damage(folder / bad)}); rerun "
            "`effdepth run` with its options and --overwrite to compute them again"
        )


def read_metadata(out: Path, skip_newer: bool = False) -> dict | None:
    """The run directory's metadata, or None when ``out`` holds no effdepth metadata (a missing,
    unreadable or hand-damaged file is not effdepth's). A run written by a newer effdepth (a format
    above ``FORMAT``) is refused in one line — never read, plotted or rewritten by this one — or,
    with ``skip_newer`` (a scan for donors), passed over as None."""
    path = out / METADATA
    if path.is_symlink() or not path.is_file():  # a FIFO, a link or a directory is not effdepth's
        return None
    try:
        metadata = read_json(path)  # checked again on the open file: nothing swapped in can block
    except (OSError, ValueError, EffdepthError):
        return None
    if not isinstance(metadata, dict) or not isinstance(metadata.get("key"), str) or "effdepth_version" not in metadata:
        return None
    if not isinstance(metadata.get("settings", {}), dict) or not isinstance(metadata.get("probes", {}), dict):
        return None
    written = metadata.get("format", 1)
    if _count(written) and written > FORMAT:
        if skip_newer:
            return None
        raise EffdepthError(
            f"{path} was written by a newer effdepth (run format {written}; this one reads formats up to {FORMAT}): "
            "upgrade effdepth to read or extend it, or choose another folder"
        )
    return metadata if well_formed(metadata) else None


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _names(value) -> bool:
    """A mapping of plain file names (no folders, links or effdepth's control files) to sha256s."""
    return isinstance(value, dict) and all(_plain(k) and isinstance(v, str) for k, v in value.items())


def _plain(name) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..", LOCK_NAME) and Path(name).name == name


def well_formed(metadata: dict) -> bool:
    """Whether the metadata has the structure effdepth writes (a hand-damaged one is not effdepth's:
    nothing it names is read, deleted or trusted)."""
    if "format" in metadata and not _count(metadata["format"]):
        return False
    probes, pending = metadata.get("probes"), metadata.get("pending", {})  # effdepth always writes probes
    if not isinstance(metadata.get("settings", {}), dict) or not isinstance(probes, dict):
        return False
    if not _names(metadata.get("files", {})) or not isinstance(pending, dict):
        return False
    if not all(isinstance(v, list) and all(_plain(n) and n != METADATA for n in v) for v in pending.values()):
        return False
    for record in probes.values():
        if not isinstance(record, dict) or not _names(record.get("files", {})):
            return False
        if any(k in record and not _count(record[k]) for k in ("revision", "answer_format")):
            return False
        if "key" in record and not isinstance(record["key"], str):
            return False
    return True


def is_complete(out: Path, key: str, probes, summary: bool = True) -> bool:
    """Whether ``out`` holds a finished run of ``key`` with every probe in ``probes`` and, with
    ``summary``, its ED summary (a run killed between its last probe and the summary is not
    finished; the cross-model map has no EDs, hence no summary)."""
    metadata = read_metadata(out)
    return (
        metadata is not None
        and metadata["key"] == key
        and not metadata.get("pending")
        and (out / EXAMPLES).is_file()
        and (not summary or (out / SUMMARY).is_file())
        and all(p in metadata.get("probes", {}) and (out / f"{p}_by_example.parquet").is_file() for p in probes)
    )


def is_finished(out: Path) -> bool:
    """Whether ``out`` holds a finished run of any key: nothing pending, and its ED summary recorded
    unless no probe it holds has an ED rule (the cross-model map). A run between two probes (the
    grid computing it now, or killed there) is not finished: no page reads it, so no page's digest
    holds it, and a clean clone without it agrees."""
    from .measurement import registry

    metadata = read_metadata(out)
    if metadata is None or metadata.get("pending"):
        return False
    with_rules = {spec.name for spec, _ in registry.rules().values()}
    return SUMMARY in metadata.get("files", {}) or not with_rules & set(metadata.get("probes", {}))


FACTS = ("key", "n_layers", "d_model", "vocab_size", "n_params", "n_examples", "n_asked", "n_lines")


def facts_digest(metadata: dict) -> str:
    """The sha256 of the run's model facts (``FACTS``): a hand-edited ``n_layers`` or ``n_examples``
    would change every ratio and table without touching a recorded file."""
    import hashlib

    facts = json.dumps({k: metadata.get(k) for k in FACTS}, sort_keys=True)
    return hashlib.sha256(facts.encode()).hexdigest()


def describes_a_run(metadata: dict) -> bool:
    """Whether the metadata holds the model facts a finished start wrote (n_layers, n_examples),
    unchanged since (their digest, where the run recorded one)."""
    asked = metadata.get("n_asked", metadata.get("n_examples"))
    if not (_count(metadata.get("n_layers")) and _count(metadata.get("n_examples")) and _count(asked)):
        return False
    return "facts_sha256" not in metadata or metadata["facts_sha256"] == facts_digest(metadata)


def verified_files(folder: Path, records: Mapping) -> str | None:
    """None when every recorded file of ``folder`` has its recorded sha256, else the first that
    does not (missing, a link, or changed)."""
    for name, sha in records.items():
        path = folder / name
        if path.is_symlink() or not path.is_file() or not isinstance(sha, str) or sha256_file(path) != sha:
            return name
    return None


def damage(path: Path) -> str:
    """What is wrong with a recorded file that failed its check, in a few words."""
    if path.is_symlink():
        return f"{path.name} is now a symbolic link"
    if not path.is_file():
        return f"{path.name} is missing"
    return f"{path.name} is damaged: its sha256 differs from the one effdepth recorded when writing it"


def _short(value) -> str:
    text = repr(value)
    return text[:14] + "…'" if isinstance(value, str) and len(value) > 16 else text


def _differences(old: dict, new: dict) -> str:
    names = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k) and k not in ("progress",))
    listed = ", ".join(f"{k}: {_short(old.get(k))} → {_short(new.get(k))}" for k in names[:4])
    return listed or "the same options, but another task file content, model files or effdepth version"


def _check_out(out: Path) -> None:
    if out.is_symlink():
        target = out.readlink()
        if not out.exists():
            raise OutputDirectoryError(
                f"--out {out} is a dangling symbolic link (to {target}); effdepth never writes through links: "
                "give a real directory"
            )
        raise OutputDirectoryError(
            f"--out {out} is a symbolic link (to {target}); effdepth never writes through links: "
            f"give the directory itself ({out.resolve()})"
        )
    if out.exists() and not out.is_dir():
        raise OutputDirectoryError(f"--out {out} is a file, not a directory; choose a directory")


@dataclass
class RunDirectory:
    """An output directory this process holds the lock of. ``stale`` is true when it holds a run
    with other parameters that ``overwrite`` allowed replacing (see ``clear_stale``). ``frames``
    maps each probe to the frames it saves (how effdepth knows its own files)."""

    path: Path
    frames: Mapping[str, tuple[str, ...]]
    stale: bool = False
    metadata: dict | None = None
    created: list[Path] = field(default_factory=list)  # directories this run made, deepest last
    opened_metadata: dict | None = None  # what the directory held when opened
    wrote: bool = False
    finished: int = 0  # probes finished by this process
    written: list[str] = field(default_factory=list)  # the files this process wrote here
    forgotten: set[str] = field(default_factory=set)  # damaged probes dropped to be computed again (their files own)
    _lock: DirectoryLock | None = None

    @property
    def probes(self) -> tuple[str, ...]:
        return tuple(self.frames)

    @classmethod
    def open(
        cls, out: Path, key: str, settings: dict, frames: Mapping[str, tuple[str, ...]], overwrite: bool
    ) -> RunDirectory:
        """Check ``out`` and lock it (creating it if needed). Raises OutputDirectoryError with one
        line naming the problem and the fix; nothing is deleted here but effdepth's own leftovers."""
        _check_out(out)
        directory = cls(out, frames)
        directory._inspect(key, settings, overwrite)
        directory._create()
        try:
            directory._lock = DirectoryLock(out)
            directory._lock.acquire()
        except CacheLockError as exc:
            directory._lock = None
            directory.abandon()
            kind = DirectoryBusyError if isinstance(exc, LockHeldError) else OutputDirectoryError
            raise kind(str(exc).replace("another effdepth process", "another effdepth run")) from exc
        try:  # what the directory holds now that nobody else writes: read it again
            directory._inspect(key, settings, overwrite)
            directory._clean_leftovers()
        except BaseException:
            directory.abandon()
            raise
        return directory

    def _inspect(self, key: str, settings: dict, overwrite: bool) -> None:
        out, metadata = self.path, None
        if out.is_dir():
            metadata = read_metadata(out)
            others = [p for p in out.iterdir() if p.name != LOCK_NAME and not self._is_own_temporary(p)]
            if metadata is None and others:
                what = (
                    f"its {METADATA} is not effdepth's or is damaged"
                    if (out / METADATA).exists() or (out / METADATA).is_symlink()
                    else f"no effdepth {METADATA}"
                )
                raise OutputDirectoryError(
                    f"--out {out} is not empty and is not an effdepth run directory ({what}); "
                    "effdepth never writes among other files: choose a new or empty directory"
                )
            if metadata is not None and metadata["key"] != key and not overwrite:
                old = {**metadata.get("settings", {}), **(metadata.get("key_fields") or {})}
                raise OutputDirectoryError(
                    f"--out {out} holds an effdepth run with other parameters "
                    f"({_differences(old, settings)}); "
                    "pass --overwrite to replace its effdepth files, or choose another --out"
                )
        self.stale = metadata is not None and metadata["key"] != key
        self.metadata = self.opened_metadata = metadata

    def _is_own_temporary(self, path: Path) -> bool:
        name = temporary_of(path.name)
        return (
            name is not None
            and is_own_file(name, self.frames, self.probes)
            and path.is_file()
            and not path.is_symlink()
        )

    def _create(self) -> None:
        missing = []
        for parent in [self.path, *self.path.parents]:
            if parent.exists() or parent.is_symlink():
                break
            missing.append(parent)
        try:
            make_dirs(self.path)
        except OSError as exc:
            raise OutputDirectoryError(
                f"cannot create --out {self.path} ({exc.strerror or exc}); choose another"
            ) from exc
        import os

        if not os.access(self.path, os.W_OK | os.X_OK):
            raise OutputDirectoryError(f"--out {self.path} is not writable; choose another directory")
        self.created = list(reversed(missing))

    def _clean_leftovers(self) -> None:
        """With the lock held: temporaries of killed writes, and the files a killed run listed as
        pending (effdepth's own, half done) are removed; the metadata then forgets them."""
        remove_stale_temporaries(self.path, lambda name: is_own_file(name, self.frames, self.probes))
        pending = (self.metadata or {}).get("pending") or {}
        if not pending:
            return
        for names in pending.values():  # plain names (``well_formed``): only files in this directory
            for name in names:
                path = self.path / name
                if is_own_file(name, self.frames, self.probes) and path.is_file() and not path.is_symlink():
                    path.unlink()
        self.metadata = {**self.metadata, "pending": {}, "probes": dict(self.metadata.get("probes", {}))}
        for entry in pending:  # a half-written probe is not finished, whatever else says so
            self.metadata["probes"].pop(entry, None)
        self._write_metadata()

    def clear_stale(self) -> None:
        """Delete the effdepth files of the earlier run with other parameters (``overwrite``), and
        only those: files effdepth did not write stay."""
        if not self.stale:
            return
        written = tuple(p for p in (self.metadata or {}).get("probes", {}) if p in self.frames)  # by the old run
        for entry in self.path.iterdir():
            if entry.is_symlink() or not entry.is_file() or entry.name == LOCK_NAME:
                continue
            if is_own_file(entry.name, self.frames, written):
                entry.unlink()
        self.stale, self.metadata = False, None

    # --- the cache format ---------------------------------------------------------------------

    @property
    def verifies(self) -> bool:
        """Whether this run's files carry sha256 records (format 2 and later)."""
        return int((self.metadata or {}).get("format", 1)) >= FORMAT

    def probe_record(self, name: str) -> dict:
        return ((self.metadata or {}).get("probes") or {}).get(name) or {}

    def has_probe(self, name: str) -> bool:
        """Finished here: recorded in the metadata, and its marker file is present."""
        recorded = name in (self.metadata or {}).get("probes", {})
        return not self.stale and recorded and (self.path / f"{name}_by_example.parquet").is_file()

    def foreign_files_for(self, probes) -> list[str]:
        """Files that writing ``probes`` would replace but that no effdepth run here recorded (a
        user's file of the same name): effdepth refuses rather than overwrite them."""
        recorded = (*(self.metadata or {}).get("probes", {}), *self.forgotten)  # by the run here (also a stale one)
        names = [f"{frame}.parquet" for p in probes for frame in self.frames.get(p, ())]
        return [n for n in names if (self.path / n).exists() and not is_own_file(n, self.frames, recorded)]

    def damaged(self, probes) -> dict[str, str]:
        """The finished ``probes`` here whose recorded files fail their sha256 check: probe → what is wrong."""
        found = {}
        examples = {EXAMPLES: (self.metadata or {}).get("files", {}).get(EXAMPLES)}
        if not self.stale and examples[EXAMPLES] is not None and verified_files(self.path, examples) is not None:
            found["examples"] = damage(self.path / EXAMPLES)
        for name in probes:
            if self.has_probe(name):
                bad = verified_files(self.path, self.probe_record(name).get("files", {}))
                if bad is not None:
                    found[name] = damage(self.path / bad)
        return found

    def forget(self, probes) -> None:
        """Drop the records of ``probes`` (damaged ones ``--overwrite`` computes again; their files,
        effdepth's own names, are replaced when they are)."""
        for name in probes:
            self.metadata["probes"].pop(name, None)
            self.forgotten.add(name)
        self._write_metadata()

    def has_examples(self) -> bool:
        """Present and, where recorded, unchanged (damaged ones are written again under ``--overwrite``)."""
        record = (self.metadata or {}).get("files", {}).get(EXAMPLES)
        if self.stale or not (self.path / EXAMPLES).is_file():
            return False
        return record is None or verified_files(self.path, {EXAMPLES: record}) is None

    def _write_metadata(self) -> None:
        atomic_write_json(self.path / METADATA, self.metadata, _KEPT)

    def _write_recorded(self, entry: str, files: dict[str, object], finish) -> None:
        """Write ``files`` (name → bytes or frame) under the pending protocol: the metadata lists them
        as pending, each is written atomically, then ``finish(name → sha256)`` records them in the
        metadata, which is written once more without them pending."""
        self.metadata.setdefault("pending", {})[entry] = list(files)
        self._write_metadata()
        hashes = {}
        for name, content in files.items():
            path = self.path / name
            if isinstance(content, bytes):
                atomic_write_bytes(path, content, _KEPT)
            else:
                atomic_write_parquet(path, content, _KEPT)
            self.written.append(name)
            hashes[name] = sha256_file(path)
        finish(hashes)
        del self.metadata["pending"][entry]
        self._write_metadata()

    def start(self, metadata: dict, examples) -> dict:
        """Begin (or continue) writing: replace a stale run's files, then write the metadata (kept
        from an earlier call of the same run, with its probe records) and the examples."""
        previous = None if self.stale else self.metadata
        self.clear_stale()
        if previous is not None:
            metadata["probes"] = dict(previous.get("probes", {}))
            if int(previous.get("format", 1)) < FORMAT:  # its probes carry no sha256: keep it format 1
                metadata["format"] = previous.get("format", 1)
        metadata.setdefault("format", FORMAT)
        metadata["facts_sha256"] = facts_digest(metadata)
        metadata.setdefault("files", {})
        metadata.setdefault("pending", {})
        self.metadata, self.wrote = metadata, True
        text = "".join(json.dumps(e.to_json()) + "\n" for e in examples)
        self._write_recorded("examples", {EXAMPLES: text.encode()}, self.metadata["files"].update)
        return self.metadata

    def save_probe(self, name: str, frames: dict[str, pl.DataFrame], record: dict) -> None:
        """A finished probe's frames, then its record (``record`` plus each file's sha256)."""
        self.metadata["probes"].pop(name, None)
        files = {f"{frame_name}.parquet": frame for frame_name, frame in frames.items()}

        def finish(hashes: dict[str, str]) -> None:
            self.metadata["probes"][name] = {**record, "files": hashes}

        self._write_recorded(name, files, finish)
        self.finished += 1

    def write_summary(self, payload: dict) -> None:
        """``effective_depth.json`` (not rewritten when it holds the same, verified content)."""
        data = (json.dumps(payload, indent=2) + "\n").encode()
        path = self.path / SUMMARY
        import hashlib

        digest = hashlib.sha256(data).hexdigest()
        files = self.metadata.setdefault("files", {})
        if files.get(SUMMARY) == digest and path.is_file() and not path.is_symlink() and sha256_file(path) == digest:
            return
        if not self.verifies:  # a format-1 run: the summary is rewritten as before, unrecorded
            atomic_write_bytes(path, data, _KEPT)
            return
        self._write_recorded("summary", {SUMMARY: data}, files.update)

    def read_metadata_or_fail(self) -> dict:
        metadata = read_metadata(self.path)
        if metadata is None or not describes_a_run(metadata) or not self._examples_agree(metadata):
            raise EffdepthError(
                f"{self.path / METADATA} is damaged (its model facts are missing or were changed since effdepth "
                "wrote them); delete the directory's effdepth files or choose another --out"
            )
        return metadata

    def _examples_agree(self, metadata: dict) -> bool:
        path = self.path / EXAMPLES
        if not path.is_file() or path.is_symlink():
            return False
        try:
            lines = read_regular(path, 1 << 30, "examples file").splitlines()
        except (OSError, EffdepthError):
            return False
        # the map's examples.jsonl holds its training prompts too (``n_lines``)
        return sum(1 for line in lines if line.strip()) == metadata.get("n_lines", metadata["n_examples"])

    def _read(self, name: str) -> pl.DataFrame:
        return read_cached_frame(self.path / name)

    def check_files(self, metadata: dict) -> None:
        """Every file the metadata records has its recorded sha256 (format 2), else one line."""
        records = dict(metadata.get("files", {}))  # a format-1 run records none; any record is checked
        for entry in metadata.get("probes", {}).values():
            records.update((entry or {}).get("files", {}))
        records.pop(SUMMARY, None)  # derived: rewritten from the probes on every run
        bad = verified_files(self.path, records)
        if bad is not None:
            raise EffdepthError(
                f"the cached probe files in {self.path} do not match its metadata ({damage(self.path / bad)}); "
                "rerun `effdepth run` with the same options and --overwrite to compute the damaged probe again"
            )

    def read_probes(self, metadata: dict) -> tuple[dict[str, pl.DataFrame], dict[str, pl.DataFrame]]:
        """Per-example frames and saved frames (derived ones included) of every probe the run's
        metadata records as finished (a file of a probe's name that no run wrote is not read),
        after checking each file's sha256."""
        self.check_files(metadata)
        recorded = metadata.get("probes", {})
        done = [p for p in self.probes if p in recorded and (self.path / f"{p}_by_example.parquet").is_file()]
        per_example = {p: self._read(f"{p}_by_example.parquet") for p in done}
        saved = {}
        for probe in done:
            for frame in self.frames[probe]:
                if frame != f"{probe}_by_example" and (self.path / f"{frame}.parquet").is_file():
                    saved[frame] = self._read(f"{frame}.parquet")
        return per_example, saved

    def discard_if_empty(self) -> None:
        """After a failure: a new run directory in which no probe finished is removed again (only
        the files this run wrote, and the directories it created)."""
        if self.opened_metadata is not None or self.finished:
            return
        if self.wrote:  # every file this process wrote here, so the folder is new again (resumable)
            for name in dict.fromkeys((*self.written, EXAMPLES, METADATA)):
                (self.path / name).unlink(missing_ok=True)
        self.abandon()

    def release(self) -> None:
        """Drop the lock (the lock file goes with it)."""
        if self._lock is not None:
            self._lock.release()
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
