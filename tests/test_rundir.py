"""Output directories: effdepth never deletes or overwrites a file it did not write."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from effdepth_core import results
from effdepth_core.cli import main
from effdepth_core.measurement import registry
from effdepth_core.results import RunSettings, default_out_dir
from effdepth_core.rundir import LOCK_NAME, RunDirectory


def _run(capsys, *argv) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    return code, capsys.readouterr().err


def _never_load(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("the model was loaded before the output directory was checked")

    monkeypatch.setattr(results, "load_model", fail)


def _user_files(directory: Path) -> dict[str, bytes]:
    files = {"data.parquet": b"PAR1 a user's table", "examples.jsonl": b'{"mine": 1}\n', "notes.txt": b"keep me"}
    directory.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return files


def test_a_directory_of_other_files_is_refused_before_loading(tiny_dir, tmp_path, capsys, monkeypatch):
    own = tmp_path / "my-data"
    files = _user_files(own)
    _never_load(monkeypatch)
    code, err = _run(capsys, "run", "--model", str(tiny_dir), "--task", "addition", "--out", str(own))
    assert code == 2 and "not an effdepth run directory" in err and len(err.strip().splitlines()) == 1
    assert {p.name: p.read_bytes() for p in own.iterdir()} == files  # untouched, nothing added


def test_other_parameters_need_overwrite_which_replaces_only_effdepths_files(tiny_dir, tmp_path, capsys):
    out = tmp_path / "run"
    base = ["run", "--model", str(tiny_dir), "--task", "addition", "--n", "2", "--out", str(out), "--no-progress"]
    assert _run(capsys, *base)[0] == 0
    (out / "notes.txt").write_text("my notes on this run")
    before = (out / "cosine.parquet").read_bytes()
    code, err = _run(capsys, *base, "--top-k", "3")
    assert code == 2 and "top_k: 5 → 3" in err and "--overwrite" in err
    assert (out / "cosine.parquet").read_bytes() == before
    # --overwrite, but the model cannot load: nothing is deleted either
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "llama"}))
    code, err = _run(capsys, *[a if a != str(tiny_dir) else str(broken) for a in base], "--overwrite")
    assert code == 2 and (out / "cosine.parquet").read_bytes() == before
    assert _run(capsys, *base, "--top-k", "3", "--overwrite")[0] == 0
    metadata = json.loads((out / "metadata.json").read_text())
    assert metadata["settings"]["top_k"] == 3 and (out / "notes.txt").read_text() == "my notes on this run"
    assert not (out / LOCK_NAME).exists()


def test_default_directories_differ_whenever_the_numbers_could(tmp_path):
    task = tmp_path / "t.jsonl"
    task.write_text('{"prompt": "a"}\n')
    base = RunSettings(model="smollm2-135m", task=str(task))
    variants = [
        base,
        RunSettings(model="smollm2-135m", task=str(task), top_k=3),
        RunSettings(model="smollm2-135m", task=str(task), dtype="bfloat16"),
        RunSettings(model="smollm2-135m", task=str(task), max_tokens=100),
        RunSettings(model="smollm2-135m", task=str(task), skip_variants="future"),
    ]
    names = {default_out_dir(s) for s in variants}
    assert len(names) == len(variants)
    before = default_out_dir(base)
    task.write_text('{"prompt": "b"}\n')  # same file name, other content
    assert default_out_dir(base) != before
    model_a, model_b = tmp_path / "a" / "model", tmp_path / "b" / "model"
    model_a.mkdir(parents=True), model_b.mkdir(parents=True)
    dirs = {default_out_dir(RunSettings(model=str(m), task="gsm8k")) for m in (model_a, model_b)}
    assert len(dirs) == 2  # two model folders of the same name


def test_a_directory_being_written_is_refused(tiny_dir, tmp_path, capsys):
    out = tmp_path / "busy"
    held = RunDirectory.open(out, "key", {}, registry.frames(), overwrite=False)  # another run holds it
    try:
        code, err = _run(capsys, "run", "--model", str(tiny_dir), "--task", "addition", "--out", str(out))
        assert code == 2 and "being written by another effdepth run" in err
    finally:
        held.release()
    assert _run(capsys, "run", "--model", str(tiny_dir), "--task", "addition", "--n", "1", "--out", str(out))[0] == 0


def test_a_killed_runs_temporaries_are_cleaned_and_a_failed_start_leaves_nothing(tiny_dir, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["run", "--model", str(tiny_dir), "--task", "addition", "--n", "1", "--out", str(out), "--no-progress"]
    assert _run(capsys, *argv)[0] == 0
    leftover = out / ".logit_lens.parquet.effdepth-tmp-999999"  # a run killed while writing
    leftover.write_bytes(b"half")
    assert _run(capsys, *argv, "--probes", "cosine,logit_lens,skip")[0] == 0
    assert not leftover.exists()
    nowhere = tmp_path / "new" / "deeper"
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "llama"}))
    code, _ = _run(capsys, "run", "--model", str(broken), "--task", "addition", "--out", str(nowhere))
    assert code == 2 and not (tmp_path / "new").exists()  # created for the run, removed when it failed


@pytest.mark.parametrize("kind", ["file", "under a file"])
def test_an_out_that_is_not_a_directory_is_refused(tiny_dir, tmp_path, capsys, kind):
    blocker = tmp_path / "results.csv"
    blocker.write_text("a,b\n")
    out = blocker if kind == "file" else blocker / "sub"
    code, err = _run(capsys, "run", "--model", str(tiny_dir), "--task", "addition", "--out", str(out))
    assert code == 2 and "--out" in err and blocker.read_text() == "a,b\n"


def _copy_run(tiny_dir, tmp_path, capsys, probes="cosine,logit_lens") -> list[str]:
    out = tmp_path / "run"
    argv = ["run", "--model", str(tiny_dir), "--task", "addition", "--n", "2", "--out", str(out), "--no-progress"]
    assert _run(capsys, *argv, "--probes", probes)[0] == 0
    return argv


def test_look_alike_temporaries_and_probe_names_of_the_user_are_kept(tiny_dir, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / ".draft.txt.tmp-42").write_text("a user's draft")  # looks like an old temporary name
    (mine / ".cache.effdepth-tmp-7").mkdir()  # a directory, whatever its name
    code, err = _run(capsys, "run", "--model", str(tiny_dir), "--task", "addition", "--out", str(mine))
    assert code == 2 and "not an effdepth run directory" in err
    assert (mine / ".draft.txt.tmp-42").read_text() == "a user's draft" and not (mine / LOCK_NAME).exists()
    # --overwrite replaces only the files the old run wrote: a user's igrad.parquet beside a run
    # that never ran igrad stays
    argv = _copy_run(tiny_dir, tmp_path, capsys)
    out = tmp_path / "run"
    for name in ("igrad.parquet", "erasure_by_example.parquet", "depth_score.parquet"):
        (out / name).write_text("mine")
    assert _run(capsys, *argv, "--top-k", "2", "--overwrite")[0] == 0
    assert all((out / n).read_text() == "mine" for n in ("igrad.parquet", "erasure_by_example.parquet"))


def test_overwrite_keeps_the_old_run_when_the_new_one_fails_in_its_first_probe(tiny_dir, tmp_path, capsys):
    argv = _copy_run(tiny_dir, tmp_path, capsys)
    out = tmp_path / "run"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    short = tmp_path / "short.jsonl"
    short.write_text('{"prompt": "1+1"}\n')
    swapped = [a if a != "addition" else str(short) for a in argv]
    code, err = _run(capsys, *swapped, "--n", "1", "--probes", "skip", "--overwrite")
    assert code == 2 and "needs at least 13" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the old run is intact


def test_damaged_run_files_are_one_line_errors(tiny_dir, tmp_path, capsys):
    argv = _copy_run(tiny_dir, tmp_path, capsys)
    out = tmp_path / "run"
    (out / "cosine_by_example.parquet").write_bytes(b"PAR1 truncated")
    code, err = _run(capsys, *argv)
    assert code == 2 and "cosine_by_example.parquet is damaged" in err and len(err.strip().splitlines()) == 1
    metadata = json.loads((out / "metadata.json").read_text())
    for damage in ({"settings": []}, {"n_layers": None}):
        (out / "metadata.json").write_text(json.dumps({**metadata, **damage}))
        code, err = _run(capsys, *argv)
        assert code == 2 and "internal error" not in err and len(err.strip().splitlines()) == 1, err


def test_skip_variants_other_than_the_default_run_without_a_depth_score(tiny_dir, tmp_path, capsys):
    out = tmp_path / "current"
    argv = ["run", "--model", str(tiny_dir), "--task", "addition", "--n", "1", "--out", str(out), "--no-progress"]
    assert _run(capsys, *argv, "--probes", "skip", "--skip-variants", "current")[0] == 0
    assert (out / "skip.parquet").is_file() and not (out / "depth_score.parquet").exists()


def test_a_tilde_in_out_means_home(tiny_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EFFDEPTH_CACHE", str(tmp_path / "cache"))  # the model's fingerprints go to effdepth's cache
    (tmp_path / "home").mkdir()
    argv = ["run", "--model", str(tiny_dir), "--task", "addition", "--n", "1", "--out", "~/efd", "--no-progress"]
    assert _run(capsys, *argv)[0] == 0
    assert (tmp_path / "home" / "efd" / "metadata.json").is_file()
    assert not [p for p in (tmp_path / "home").iterdir() if p.name != "efd"]  # nothing else written in home


def test_a_users_file_named_like_a_new_probes_output_is_not_overwritten(tiny_dir, tmp_path, capsys):
    argv = _copy_run(tiny_dir, tmp_path, capsys)
    out = tmp_path / "run"
    (out / "depth_score.parquet").write_text("user")
    code, err = _run(capsys, *argv, "--probes", "skip")
    assert code == 2 and "depth_score.parquet, which no effdepth run there wrote" in err
    assert (out / "depth_score.parquet").read_text() == "user"


def test_hand_damaged_counts_and_columns_are_one_line_errors(tiny_dir, tmp_path, capsys):
    argv = _copy_run(tiny_dir, tmp_path, capsys)
    out = tmp_path / "run"
    metadata = json.loads((out / "metadata.json").read_text())
    for damage in ({"n_asked": "x"}, {"n_asked": None}, {"n_layers": True}):
        (out / "metadata.json").write_text(json.dumps({**metadata, **damage}))
        code, err = _run(capsys, *argv)
        assert code == 2 and len(err.strip().splitlines()) == 1 and "internal error" not in err, (damage, err)
    (out / "metadata.json").write_text(json.dumps(metadata))
    (out / "cosine_by_example.parquet").write_bytes((out / "logit_lens_by_example.parquet").read_bytes())
    code, err = _run(capsys, *argv)
    assert code == 2 and "cosine results are damaged" in err and "cosine_by_example.parquet is damaged" in err


def test_a_fifo_in_place_of_effdepths_files_does_not_hang(tiny_dir, tmp_path, capsys):
    import os

    out = tmp_path / "fifo"
    out.mkdir()
    os.mkfifo(out / "metadata.json")
    code, err = _run(capsys, "run", "--model", str(tiny_dir), "--task", "addition", "--out", str(out))
    assert code == 2 and "not an effdepth run directory" in err
    table = tmp_path / "t"
    table.mkdir()
    os.mkfifo(table / "effective_depth.json")
    assert _run(capsys, "table", str(table))[0] == 2


def test_the_key_records_the_resolved_dtype_and_device(monkeypatch):
    # a bf16 GPU run must never resume a float32 CPU run's directory (nor the other way round)
    import torch

    cpu = RunSettings("m", "gsm8k", device="cpu").key()
    assert RunSettings("m", "gsm8k", device="auto").key() == cpu  # no GPU here: auto is the CPU
    assert RunSettings("m", "gsm8k", device="cpu", dtype="float32").key() != cpu  # as spelt: kept for old keys
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))  # an H100
    assert RunSettings("m", "gsm8k", device="cpu").key() == cpu
    gpu_auto = RunSettings("m", "gsm8k", device="auto").key()  # bfloat16 on cuda
    gpu_float32 = RunSettings("m", "gsm8k", device="cuda", dtype="float32").key()
    assert len({cpu, gpu_auto, gpu_float32}) == 3
    assert RunSettings("m", "gsm8k", device="cuda:1").key() == gpu_auto  # which GPU does not matter
    assert RunSettings("m", "gsm8k", device_map="auto").key() == gpu_auto  # sharded over the GPUs
