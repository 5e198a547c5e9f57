"""A run directory edited by hand (or by a hostile neighbour): nothing its metadata names outside the
directory is deleted, no malformed record is an internal error, hand-edited model facts and frames
are found, and ``--overwrite`` computes a damaged probe again (the hostile pass of issue 17)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest

from effdepth_core import cache
from effdepth_core.cli import main


def _cli(capsys, *argv) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    return code, capsys.readouterr().err


def _argv(tiny_dir: Path, out: Path, *extra: str) -> list[str]:
    model = ["--model", str(tiny_dir), "--task", "addition", "--n", "2"]
    return ["run", *model, "--out", str(out), "--no-progress", *extra]


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_dir):
    out = tmp_path_factory.mktemp("finished") / "run"
    assert main(_argv(tiny_dir, out)) == 0
    return out


def _copy(finished: Path, where: Path) -> Path:
    target = where / "copy"
    shutil.copytree(finished, target)
    return target


def _edit(run: Path, **changes) -> None:
    metadata = json.loads((run / "metadata.json").read_text())
    for key, value in changes.items():
        if value is _DROP:
            metadata.pop(key, None)
        else:
            metadata[key] = value
    (run / "metadata.json").write_text(json.dumps(metadata))


_DROP = object()


@pytest.mark.parametrize("where", ["../victim/examples.jsonl", "ABS", "sub/cosine.parquet"])
def test_pending_never_deletes_outside_the_directory(finished, tmp_path, tiny_dir, capsys, where):
    run = _copy(finished, tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    for name in ("examples.jsonl", "cosine.parquet"):
        (victim / name).write_text("the user's file")
    (run / "sub").symlink_to(victim)  # a link inside the run directory
    name = str(victim / "examples.jsonl") if where == "ABS" else where
    _edit(run, pending={"cosine": [name]})
    code, err = _cli(capsys, *_argv(tiny_dir, run))
    assert code == 2 and "not an effdepth run directory" in err and len(err.strip().splitlines()) == 1
    assert all((victim / n).read_text() == "the user's file" for n in ("examples.jsonl", "cosine.parquet"))


def test_the_lock_named_as_pending_is_damage_not_a_bypass(finished, tmp_path, tiny_dir, capsys):
    run = _copy(finished, tmp_path)
    _edit(run, pending={"zz": [cache.LOCK_NAME]})
    code, err = _cli(capsys, *_argv(tiny_dir, run))
    assert code == 2 and "is damaged" in err


@pytest.mark.parametrize(
    "changes",
    [
        {"format": "abc"},
        {"format": None},
        {"format": True},
        {"probes": {"cosine": "abc"}},
        {"probes": {"cosine": {"files": "abc"}}},
        {"probes": {"cosine": {"revision": "x"}}},
        {"probes": _DROP, "pending": {"cosine": ["cosine.parquet"]}},
        {"pending": {"cosine": "abc"}},
        {"files": {"/etc/hostname": "0" * 64}},
    ],
    ids=["format text", "format null", "format bool", "record text", "files text", "revision text",
         "pending without probes", "pending text", "files outside"],
)  # fmt: skip
def test_malformed_metadata_is_one_line_in_out_and_ignored_beside_it(finished, tmp_path, tiny_dir, capsys, changes):
    run = _copy(finished, tmp_path)
    _edit(run, **changes)
    code, err = _cli(capsys, *_argv(tiny_dir, run))
    assert code == 2 and "is damaged" in err and "internal error" not in err, err
    code, err = _cli(capsys, *_argv(tiny_dir, tmp_path / "beside"))  # a neighbour that may lend examples
    assert code == 0, err


@pytest.mark.parametrize("fact", [("n_layers", 2), ("n_examples", 7), ("n_asked", 7)])
def test_hand_edited_model_facts_are_found(finished, tmp_path, tiny_dir, capsys, fact):
    run = _copy(finished, tmp_path)
    _edit(run, **dict([fact]))
    code, err = _cli(capsys, *_argv(tiny_dir, run))
    assert code == 2 and "were changed since effdepth wrote them" in err


def test_overwrite_computes_a_damaged_probe_again(finished, tmp_path, tiny_dir, capsys):
    run = _copy(finished, tmp_path)
    reference = pl.read_parquet(run / "cosine_by_example.parquet")
    (run / "cosine_by_example.parquet").unlink()
    (run / "logit_lens.parquet").write_bytes(b"garbage")
    code, err = _cli(capsys, *_argv(tiny_dir, run))
    assert code == 2 and "logit_lens.parquet is damaged" in err and "--overwrite" in err
    code, err = _cli(capsys, *_argv(tiny_dir, run, "--overwrite"))
    assert code == 0, err
    assert pl.read_parquet(run / "cosine_by_example.parquet").equals(reference)  # the same numbers again
    assert main(_argv(tiny_dir, run)) == 0


def test_plot_refuses_frames_that_fail_their_record(finished, tmp_path, capsys):
    pytest.importorskip("altair", reason="the book extra draws charts")
    run = _copy(finished, tmp_path)
    lens = pl.read_parquet(run / "logit_lens.parquet")
    lens.with_columns(pl.col("value") * 1000).write_parquet(run / "logit_lens.parquet")  # valid, other numbers
    code, err = _cli(capsys, "plot", str(run), "--chart", "logit_lens", "--out", str(tmp_path / "lens.svg"))
    assert code == 2 and "logit_lens.parquet is damaged" in err and not (tmp_path / "lens.svg").exists()
    (run / "logit_lens.parquet").unlink()
    code, err = _cli(capsys, "plot", str(run), "--chart", "logit_lens", "--out", str(tmp_path / "lens.svg"))
    assert code == 2 and ("is missing" in err or "has no logit_lens results" in err)


def test_a_non_finite_cached_frame_is_never_read(tmp_path):
    from effdepth_core.errors import EffdepthError
    from effdepth_core.rundir import read_cached_frame

    pl.DataFrame({"layer": [0, 1], "value": [0.5, float("nan")]}).write_parquet(tmp_path / "cosine.parquet")
    with pytest.raises(EffdepthError, match="NaN or inf"):
        read_cached_frame(tmp_path / "cosine.parquet")
    pl.DataFrame({"layer": [0, 1], "value": [0.5, None]}).write_parquet(tmp_path / "nulls.parquet")
    assert read_cached_frame(tmp_path / "nulls.parquet")["value"].null_count() == 1  # "not defined" is allowed


def test_table_lists_a_run_once_and_refuses_control_characters(finished, tmp_path, capsys):
    assert main(["table", str(finished)]) == 0
    once = capsys.readouterr().out
    assert main(["table", str(finished), str(finished / "effective_depth.json")]) == 0
    assert capsys.readouterr().out == once
    run = _copy(finished, tmp_path)
    summary = json.loads((run / "effective_depth.json").read_text())
    (run / "effective_depth.json").write_text(json.dumps({**summary, "model": "evil\nmodel\x1b[31m"}))
    code, err = _cli(capsys, "table", str(run))
    assert code == 2 and "not a printable name" in err and "\x1b" not in err


def _book_root(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    shutil.copytree(Path(__file__).resolve().parents[1] / "params", root / "params")
    (root / "book").mkdir()
    return root


def test_book_never_writes_through_a_link_nor_over_a_foreign_toc(tmp_path, capsys):
    pytest.importorskip("papermill", reason="the book extra runs the book")
    root = _book_root(tmp_path)
    victim = tmp_path / "victim.yml"
    victim.write_text("my own table of contents\n")
    (root / "_toc.yml").symlink_to(victim)
    code, err = _cli(capsys, "book", "--toc-only", "--root", str(root))
    assert code == 2 and "symbolic link" in err and victim.read_text() == "my own table of contents\n"
    (root / "_toc.yml").unlink()
    (root / "_toc.yml").write_text("format: jb-book\nroot: mine\n")
    code, err = _cli(capsys, "book", "--toc-only", "--root", str(root))
    assert code == 2 and "not written by effdepth" in err
    assert (root / "_toc.yml").read_text() == "format: jb-book\nroot: mine\n"
    (root / "_toc.yml").unlink()
    assert _cli(capsys, "book", "--toc-only", "--root", str(root))[0] == 0  # absent: written
    toc = (root / "_toc.yml").read_text()
    code, err = _cli(capsys, "book", "--only", "typo", "--root", str(root))  # found before any write
    assert code == 2 and "no parameter set named 'typo'" in err and (root / "_toc.yml").read_text() == toc


def test_grid_refuses_two_cells_that_would_share_a_run_directory(tmp_path, capsys, tiny_dir):
    pytest.importorskip("papermill", reason="the grid reads the book's params")
    root = tmp_path / "checkout"
    (root / "params").mkdir(parents=True)
    (root / "params" / "common.yml").write_text(
        "profiles:\n  quick:\n    tasks: [{task: addition, digits: 3, n: 1}]\n    results_dir: res\n"
    )
    (root / "params" / "scale.yml").write_text(
        "title: t\nprofiles:\n  quick:\n    defaults:\n      causal: {task: addition, digits: 3, n: 1, probes: [skip],"
        f" skip_positions: 1, skip_parts: layer}}\n    sets:\n      - name: one\n        models: [{tiny_dir}]\n"
    )
    code, err = _cli(capsys, "grid", "quick", "--root", str(root), "--section", "scale", "--dry-run")
    assert code == 2 and "would both write" in err and "with different settings" in err
    assert not (root / "res").exists()


def test_a_run_of_a_newer_format_is_refused_not_read_or_rewritten(finished, tmp_path, tiny_dir, capsys):
    """A run folder whose metadata names a newer format was read, plotted and rewritten: this
    effdepth cannot know what that format means, so every command refuses it in one line and the
    folder stays byte for byte."""
    run = _copy(finished, tmp_path)
    _edit(run, format=99)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    for argv in (["table", str(run)], _argv(tiny_dir, run), ["plot", str(run), "--chart", "cosine", "--out",
                                                             str(tmp_path / "c.svg")]):  # fmt: skip
        code, err = _cli(capsys, *argv)
        assert code == 2 and "was written by a newer effdepth (run format 99" in err, (argv, err)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert not (tmp_path / "c.svg").exists()
