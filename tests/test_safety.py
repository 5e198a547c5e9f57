"""Effdepth's writes: the lock never writes through a link nor removes a file it did not create; a
kill at any write leaves a directory that resumes to the same numbers; a full disk is one line that
says nothing was lost, and leaves no temporary behind."""

from __future__ import annotations

import errno
import json
import os

import polars as pl
import pytest
from conftest import char_tokenizer, make_tiny

from effdepth_core import cache, rundir
from effdepth_core.cli import main
from effdepth_core.models import wrap_model
from effdepth_core.results import RunSettings, run
from effdepth_core.task_loading import load_task

LOCK = cache.LOCK_NAME


def _run_cli(capsys, *argv) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    return code, capsys.readouterr().err


def _argv(tiny_dir, out) -> list[str]:
    return ["run", "--model", str(tiny_dir), "--task", "addition", "--n", "1", "--out", str(out), "--no-progress"]


def test_a_link_named_like_the_lock_is_refused_and_its_target_untouched(tiny_dir, tmp_path, capsys):
    target = tmp_path / "precious.txt"
    target.write_text("a user's file outside --out")
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).symlink_to(target)
    code, err = _run_cli(capsys, *_argv(tiny_dir, out))
    assert code == 2 and "symbolic link, not effdepth's lock" in err and len(err.strip().splitlines()) == 1
    assert target.read_text() == "a user's file outside --out"  # not truncated, no pid written
    assert (out / LOCK).is_symlink() and sorted(p.name for p in out.iterdir()) == [LOCK]


def test_a_users_file_named_like_the_lock_is_refused_and_kept(tiny_dir, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).write_text("my notes")
    code, err = _run_cli(capsys, *_argv(tiny_dir, out))
    assert code == 2 and "not effdepth's lock" in err
    assert (out / LOCK).read_text() == "my notes"
    hard = tmp_path / "hard"
    hard.mkdir()
    (tmp_path / "mine.txt").write_text(f"{cache.LOCK_MARK} — but a user's file with another name too")
    os.link(tmp_path / "mine.txt", hard / LOCK)
    code, err = _run_cli(capsys, *_argv(tiny_dir, hard))
    assert (
        code == 2 and "not effdepth's lock" in err and (tmp_path / "mine.txt").read_text().startswith(cache.LOCK_MARK)
    )


def test_a_killed_runs_lock_is_taken_over_and_removed(tiny_dir, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).write_text(f"{cache.LOCK_MARK}\npid 999999\nhost elsewhere\n")  # its process is gone
    code, _ = _run_cli(capsys, *_argv(tiny_dir, out))
    assert code == 0 and not (out / LOCK).exists()


def test_two_holders_exclude_each_other(tmp_path):
    first = cache.DirectoryLock(tmp_path)
    first.acquire()
    try:
        with pytest.raises(cache.CacheLockError, match="being written by another effdepth process"):
            cache.DirectoryLock(tmp_path).acquire()
    finally:
        first.release()
    assert not (tmp_path / LOCK).exists()
    with cache.locked(tmp_path):
        assert (tmp_path / LOCK).read_text().startswith(cache.LOCK_MARK)


class _Killed(BaseException):
    """The process died here: nothing after this point runs, no cleanup either."""


def _loaded():
    return wrap_model(make_tiny("llama").model, char_tokenizer(), name="tiny")


def _kill_at(monkeypatch, k: int) -> list[int]:
    """Make the k-th rename of the run "kill the process" just before it happens: no handler runs,
    the lock file stays (the OS drops the lock itself when a process dies)."""
    calls = [0]
    real = os.replace

    def replace(src, dst):
        calls[0] += 1
        if calls[0] == k:
            raise _Killed
        real(src, dst)

    def dies_holding(self):
        if self._fd is not None:
            os.close(self._fd)  # what the kernel does for a dead process; the file stays
            self._fd = None

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(cache.DirectoryLock, "release", dies_holding)
    monkeypatch.setattr(rundir.RunDirectory, "discard_if_empty", lambda self: None)
    return calls


def test_a_kill_at_any_write_resumes_to_the_same_numbers(tmp_path, monkeypatch):
    loaded = _loaded()
    settings = RunSettings("tiny", "addition", n=2, digits=2, progress=False)
    examples = load_task("addition", n=2, digits=2)
    probes = ["cosine", "logit_lens"]
    with monkeypatch.context() as patch:
        calls = _kill_at(patch, 0)  # count the renames of an uninterrupted run
        reference = run(settings, probes, tmp_path / "reference", loaded=loaded, examples=examples, n_bootstrap=50)
    renames = calls[0]
    assert renames >= 12  # metadata, examples, each probe's frames, the summary: each under the pending protocol
    for k in range(1, renames + 1):
        out = tmp_path / f"killed-{k}"
        with monkeypatch.context() as patch:
            _kill_at(patch, k)
            with pytest.raises(_Killed):
                run(settings, probes, out, loaded=loaded, examples=examples, n_bootstrap=50)
        resumed = run(settings, probes, out, loaded=loaded, examples=examples, n_bootstrap=50)  # no error, resumes
        assert resumed.summary == reference.summary, k
        for name in probes:
            assert resumed.per_example[name].equals(reference.per_example[name]), (k, name)
        leftovers = [p.name for p in out.iterdir() if ".effdepth-tmp-" in p.name or p.name == LOCK]
        assert not leftovers, (k, leftovers)
        metadata = json.loads((out / "metadata.json").read_text())
        assert not metadata["pending"] and set(metadata["probes"]) == set(probes)


def test_a_full_disk_is_one_line_and_leaves_nothing_behind(tiny_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert _run_cli(capsys, *_argv(tiny_dir, out))[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = pl.DataFrame.write_parquet

    def full(self, target, *args, **kwargs):  # frames are serialized in memory first: fail there too
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", full)
    code, err = _run_cli(capsys, *_argv(tiny_dir, out), "--probes", "skip")
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "internal error" not in err, err
    assert "the disk is full" in lines[0] and "nothing was lost" in lines[0] and str(out) in lines[0]
    assert not [p.name for p in out.iterdir() if ".effdepth-tmp-" in p.name]  # no 0-byte temporary left
    for name, data in before.items():
        if name != "metadata.json":
            assert (out / name).read_bytes() == data, name  # what was finished is intact
    monkeypatch.setattr(pl.DataFrame, "write_parquet", real)
    assert _run_cli(capsys, *_argv(tiny_dir, out), "--probes", "skip")[0] == 0  # resumes


def test_a_changed_run_file_is_found_by_its_hash(tiny_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert _run_cli(capsys, *_argv(tiny_dir, out))[0] == 0
    frame = pl.read_parquet(out / "cosine_by_example.parquet")
    frame.with_columns(pl.col("value") * 1.5).write_parquet(out / "cosine_by_example.parquet")  # valid, other numbers
    code, err = _run_cli(capsys, *_argv(tiny_dir, out))
    assert code == 2 and "cosine_by_example.parquet is damaged" in err and "sha256" in err


def test_an_output_is_claimed_at_the_moment_it_is_written(tmp_path):
    """A file that appears at an output path while effdepth works (after its check, before its write)
    is never replaced: the no-replace write refuses in one line and leaves the user's bytes; a free
    path is written whole with no temporary left behind."""
    from effdepth_core.cache import OutputExistsError, atomic_write

    out = tmp_path / "u.svg"

    def racing(handle) -> None:
        out.write_text("the user's file")  # appears between effdepth's check and its write
        handle.write(b"effdepth's chart")

    with pytest.raises(OutputExistsError, match="appeared while effdepth was working; it was not replaced"):
        atomic_write(out, racing, replace=False)
    assert out.read_text() == "the user's file"
    free = tmp_path / "v.svg"
    atomic_write(free, lambda handle: handle.write(b"chart"), replace=False)
    assert free.read_bytes() == b"chart" and sorted(p.name for p in tmp_path.iterdir()) == ["u.svg", "v.svg"]


def test_the_cache_root_is_resolved_once_and_never_a_system_folder(tmp_path, monkeypatch):
    """EFFDEPTH_CACHE pointing at a link to / once made a plain run write /fingerprints/<hash>.json:
    the root (or what it links to) may not be / or a system folder; no home directory is one line."""
    from pathlib import Path

    from effdepth_core.errors import EffdepthError
    from effdepth_core.zoo import cache_dir

    link = tmp_path / "link"
    link.symlink_to("/")
    for root, said in ((link, r"is a link to a system folder \(/\)"), (Path("/etc/effdepth"), "is a system folder")):
        monkeypatch.setenv("EFFDEPTH_CACHE", str(root))
        with pytest.raises(EffdepthError, match=said):
            cache_dir()
    target = tmp_path / "real"
    target.mkdir()
    (tmp_path / "mine").symlink_to(target)
    monkeypatch.setenv("EFFDEPTH_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == target  # resolved once: every path below it is the real folder's
    monkeypatch.delenv("EFFDEPTH_CACHE")

    def homeless():
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(homeless))
    with pytest.raises(EffdepthError, match=r"cannot find a home directory for effdepth's cache.*EFFDEPTH_CACHE"):
        cache_dir()


def test_folders_effdepth_creates_have_their_mode_whatever_the_umask(tmp_path):
    """After ``umask 000`` the cache and an --out folder came out mode 777 (and the next command
    refused effdepth's own cache as writable by others): folders are created with explicit modes."""
    import stat

    from effdepth_core.cache import make_dirs

    before = os.umask(0)
    try:
        make_dirs(tmp_path / "cache" / "models", 0o700)
        make_dirs(tmp_path / "out" / "run")
    finally:
        os.umask(before)
    for folder, mode in ((tmp_path / "cache", 0o700), (tmp_path / "cache" / "models", 0o700),
                         (tmp_path / "out", 0o755), (tmp_path / "out" / "run", 0o755)):  # fmt: skip
        assert stat.S_IMODE(folder.stat().st_mode) == mode, folder


def test_a_cache_root_that_is_a_file_or_open_to_others_is_refused_for_every_use(tmp_path, monkeypatch):
    """measure() wrote runs and prompts into a world-writable root and crashed with
    NotADirectoryError on a root that is a file: the root's own checks now run wherever it is used."""
    from effdepth_core.api import _prompts_task
    from effdepth_core.errors import EffdepthError

    afile = tmp_path / "afile"
    afile.write_text("x")
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    for root, said in ((afile, "it is not a directory"), (open_to_all, "writable by")):
        monkeypatch.setenv("EFFDEPTH_CACHE", str(root))
        with pytest.raises(EffdepthError, match=said):
            _prompts_task(["a prompt"])


def test_a_task_number_beyond_a_float_is_refused_not_recorded_as_infinity(tmp_path):
    from effdepth_core.errors import TaskError
    from effdepth_core.task_loading import load_task

    path = tmp_path / "t.jsonl"
    path.write_text('{"prompt": "a", "x": 1e400}\n')
    with pytest.raises(TaskError, match=r"t.jsonl:1: .*1e400 is beyond a float's range"):
        load_task(str(path), n=1)
