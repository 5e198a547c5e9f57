"""No leftovers: a temporary that a killed write of effdepth's left where no lock names an owner — the
prompt files of ``measure``, a user's ``plot --out`` folder — is removed by the next call that writes
there, once its writer (this host, its pid) no longer runs; a live writer's, another host's and
anything not named as effdepth's temporaries are left alone."""

from __future__ import annotations

import subprocess
import sys

import pytest

from effdepth_core.cache import _HOST


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


@pytest.fixture
def live_pid():
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield sleeper.pid
    sleeper.kill()
    sleeper.wait()


def _temporary(folder, name: str, pid: int, host: str = _HOST):
    path = folder / f".{name}.effdepth-tmp-{host}-{pid}-0123456789abcdef"
    path.write_text("half written")
    return path


def test_a_killed_prompt_file_write_is_removed_by_the_next_call(tmp_path, monkeypatch, live_pid):
    from effdepth_core.api import _prompts_task

    monkeypatch.setenv("EFFDEPTH_CACHE", str(tmp_path / "cache"))
    _prompts_task(["a prompt"])  # the folder exists
    folder = (tmp_path / "cache" / "prompts").resolve()
    killed = _temporary(folder, "0" * 32 + ".jsonl", _dead_pid())
    writing = _temporary(folder, "1" * 32 + ".jsonl", live_pid)
    elsewhere = _temporary(folder, "2" * 32 + ".jsonl", _dead_pid(), host="another-host")
    _prompts_task(["another prompt"])
    assert not killed.exists() and writing.exists() and elsewhere.exists()


def test_a_killed_plot_leaves_nothing_in_the_users_folder(tmp_path, live_pid):
    from effdepth_core.cli import main

    mine = tmp_path / "mine"
    mine.mkdir()
    killed = _temporary(mine, "chart.svg", _dead_pid())
    writing = _temporary(mine, "other.png", live_pid)
    notes = mine / ".notes.txt.effdepth-tmp-x"  # not a name effdepth's writes give: the user's
    notes.write_text("mine")
    assert main(["plot", str(tmp_path / "no-run"), "--out", str(mine / "chart.svg")]) == 2  # not a run: refused
    assert not killed.exists() and writing.exists() and notes.read_text() == "mine"
