"""A hostile-but-realistic user: every bad input is one line on stderr, exit 2, no traceback, found
before the model loads where the input allows it, and no file beside the output is touched."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from effdepth_core import results, zoo
from effdepth_core.cli import main

# (case id, argv after `effdepth`, what the one line must say, whether the model may load first)
# "{tiny}" is a tiny local model, "{tmp}" the test's directory (files made by _files below).
CASES = [
    ("task not UTF-8", ["run", "--task", "{tmp}/latin1.jsonl"], "latin1.jsonl:2: not UTF-8", False),
    ("task is a directory", ["run", "--task", "{tmp}"], "is a directory", False),
    ("task file missing", ["run", "--task", "{tmp}/nope.jsonl"], "does not exist", False),
    ("task not JSON", ["run", "--task", "{tmp}/bad.jsonl"], "bad.jsonl:1: not valid JSON", False),
    ("task answer not text", ["run", "--task", "{tmp}/answer.jsonl"], "'answer' must be a string", False),
    ("unknown task", ["run", "--task", "gsm9k"], "unknown task 'gsm9k'", False),
    ("model is a text file", ["run", "--model", "{tmp}/notes.txt"], "is a file but not a GGUF model", False),
    ("model is a fake .gguf", ["run", "--model", "{tmp}/fake.gguf"], "is a file but not a GGUF model", False),
    ("model is a truncated GGUF", ["run", "--model", "{tmp}/truncated.gguf"], "cannot load model", True),
    ("model folder without config", ["run", "--model", "{tmp}"], "has no config.json", False),
    ("model path missing", ["run", "--model", "./no-such-model"], "no such model file or directory", False),
    ("out is a file", ["run", "--out", "{tmp}/notes.txt"], "is a file, not a directory", False),
    ("out under a file", ["run", "--out", "{tmp}/notes.txt/run"], "cannot create --out", False),
    ("out holds other files", ["run", "--out", "{tmp}"], "not an effdepth run directory", False),
    ("top-k above the vocabulary", ["run", "--top-k", "65"], "exceeds the vocabulary", False),
    ("unknown skip part", ["run", "--probes", "skip", "--skip-parts", "layer,ffn"], "unknown skip part", False),
    ("unknown skip variant", ["run", "--probes", "skip", "--skip-variants", "past"], "unknown skip variant", False),
    ("too few igrad steps", ["run", "--probes", "igrad", "--igrad-steps", "3"], "too few for the adaptive", False),
    (
        "slow adaptive igrad",
        ["run", "--probes", "igrad", "--slow"],
        "the slow method has no adaptive quadrature",
        False,
    ),
    (
        "level outside math",
        ["run", "--task", "gsm8k", "--level", "3"],
        "level= (--level) applies to the math task",
        False,
    ),
    ("level out of range", ["run", "--task", "math", "--level", "9"], "--level: must be in 1..5", False),
    ("digits outside arithmetic", ["run", "--task", "gsm8k", "--digits", "3"], "--digits applies to", False),
    ("n above the data set", ["run", "--task", "gsm8k", "--n", "5000"], "than gsm8k has (1319)", False),
    ("n above a file", ["run", "--task", "{tmp}/two.jsonl", "--n", "3"], "has (2); use n=2 (--n 2)", False),
    ("n zero", ["run", "--n", "0"], "must be at least 1", False),
    ("negative batch size", ["run", "--batch-size", "-1"], "must be at least 1", False),
    ("unknown dtype", ["run", "--dtype", "float8"], "invalid choice: 'float8'", False),
    ("unknown probe", ["run", "--probes", "cosine,lense"], "unknown probe(s) lense", False),
    ("prompt too short to skip", ["run", "--task", "{tmp}/two.jsonl", "--probes", "skip"], "needs at least 13", True),
    (
        "erasure without answers",
        ["run", "--task", "{tmp}/two.jsonl", "--probes", "erasure"],
        "needs examples with",
        True,
    ),
    ("unknown lens", ["run", "--lens", "tunned"], "invalid choice: 'tunned'", False),
    ("prune sizes not numbers", ["run", "--probes", "prune", "--prune-sizes", "1,x"], "whole numbers", False),
    ("prune the whole model", ["run", "--probes", "prune", "--prune-sizes", "3"], "below the model's 3 layers", False),
    ("prune without answers", ["run", "--task", "{tmp}/two.jsonl", "--probes", "prune"], "needs examples with", True),
    ("lens steps zero", ["run", "--lens", "tuned", "--lens-steps", "0"], "must be at least 1", False),
    ("map of one prompt", ["map", "--small", "{tiny}", "--big", "{tiny}", "--n", "1"], "must be at least 2", False),
    ("no GPU", ["run", "--device", "cuda"], "sees no CUDA GPU", False),
    ("unknown device", ["run", "--device", "gpu"], "unknown --device 'gpu'", False),
    (
        "max-tokens on arithmetic",
        ["run", "--max-tokens", "5"],
        "max_tokens= (--max-tokens) applies to data-set tasks",
        False,
    ),
    ("not a whole number", ["run", "--n", "abc"], "must be a whole number, got 'abc'", False),
    ("unknown command", ["rnu"], "invalid choice: 'rnu'", False),
    ("refetch unknown alias", ["models", "--refetch", "gpt5"], "unknown offline model 'gpt5'", False),
    ("table of nothing", ["table", "{tmp}/empty"], "no effective_depth.json", False),
    ("table of a missing folder", ["table", "{tmp}/missing"], "no such directory", False),
    # issue 17: each of these was an internal error, a wrong message or exit 0 before
    ("empty model", ["run", "--model", ""], "--model: is empty", False),
    ("out is a dangling link", ["run", "--out", "{tmp}/dangling"], "is a dangling symbolic link", False),
    ("out is a link to a folder", ["run", "--out", "{tmp}/linked"], "is a symbolic link (to", False),
    ("refetch of an empty alias", ["models", "--refetch", ""], "--refetch: is empty", False),
    (
        "map max-tokens on arithmetic",
        ["map", "--small", "{tiny}", "--big", "{tiny}", "--task", "addition", "--n", "4", "--max-tokens", "9"],
        "--max-tokens applies to data-set tasks",
        False,
    ),
    ("a one-token prompt", ["run", "--task", "{tmp}/one-token.jsonl"], "has 1 token(s); the cosine probe needs", True),
    ("igrad tolerance not a number", ["run", "--probes", "igrad", "--igrad-tol", "x"], "must be a number", False),
    ("kl fraction out of range", ["run", "--kl-fraction", "1.5"], "must be a fraction between 0 and 1", False),
    # the hostile pass of issue 17 (second round): each hung, was ignored or misled before
    ("generated n absurd", ["run", "--n", "200000"], "use n=100000 (--n 100000) or fewer", False),
    ("n past any task", ["run", "--n", "100000000000000000000"], "--n: must be at most 10,000,000", False),
    ("digits past int text", ["run", "--task", "multiplication", "--digits", "3000"], "at most 1,000", False),
    ("task is a FIFO", ["run", "--task", "{tmp}/fifo.jsonl"], "is not a regular file", False),
    ("reuse from nowhere", ["run", "--reuse-from", "{tmp}/nowhere"], "--reuse-from", False),
    ("reuse from a file", ["run", "--reuse-from", "{tmp}/notes.txt"], "is not a directory", False),
    ("lens option unused", ["run", "--probes", "cosine", "--lens", "tuned"], "--lens applies to early_exit", False),
    ("prune sizes unused", ["run", "--probes", "cosine", "--prune-sizes", "1"], "--prune-sizes applies to", False),
    (
        "map holds out every prompt",
        ["map", "--small", "{tiny}", "--big", "{tiny}", "--task", "{tmp}/two.jsonl", "--n", "2"],
        "leaving none to fit the map on",
        False,
    ),
    ("grid root without params", ["grid", "quick", "--dry-run", "--root", "{tmp}/empty"], "no params/ folder", False),
    ("shard of zero", ["grid", "quick", "--dry-run", "--shard", "1/0"], "N must be at least 1", False),
    ("shard out of range", ["grid", "quick", "--dry-run", "--shard", "2/2"], "i must be 0..N-1", False),
    ("ray sizes without ray", ["grid", "quick", "--dry-run", "--cpus-per-cell", "2"], "add --executor ray", False),
    ("memory not a size", ["grid", "quick", "--executor", "ray", "--memory-per-cell", "nan"], "finite number", False),
]


def _files(tmp: Path) -> None:
    (tmp / "latin1.jsonl").write_bytes(b'{"prompt": "fine"}\n{"prompt": "caf\xe9"}\n')
    (tmp / "bad.jsonl").write_text("{prompt: 1}\n")
    (tmp / "bom.jsonl").write_bytes(b'\xef\xbb\xbf{"prompt": "1 + 1 ="}\n')
    (tmp / "answer.jsonl").write_text(json.dumps({"prompt": "a", "answer": 3}) + "\n")
    (tmp / "two.jsonl").write_text('{"prompt": "1 + 1 ="}\n{"prompt": "2 + 2 ="}\n')
    (tmp / "notes.txt").write_text("not a model")
    (tmp / "fake.gguf").write_bytes(b"PK\x03\x04 a zip, not GGUF")
    (tmp / "truncated.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 3)
    (tmp / "one-token.jsonl").write_text('{"prompt": " "}\n')
    (tmp / "dangling").symlink_to(tmp / "nowhere")
    (tmp / "elsewhere").mkdir()
    (tmp / "linked").symlink_to(tmp / "elsewhere")
    (tmp / "empty").mkdir()
    os.mkfifo(tmp / "fifo.jsonl")


@pytest.fixture
def hostile(tmp_path, tiny_dir, monkeypatch):
    _files(tmp_path)
    sentinel = tmp_path / "sentinel.txt"
    sentinel.write_text("the user's file")
    loads: list[str] = []
    real_load = results.load_model

    def counting_load(spec, *args, **kwargs):
        loads.append(spec)
        return real_load(spec, *args, **kwargs)

    monkeypatch.setattr(results, "load_model", counting_load)
    return tmp_path, tiny_dir, sentinel, loads


def _expand(argv: list[str], tmp: Path, tiny: Path) -> list[str]:
    argv = [a.replace("{tmp}", str(tmp)).replace("{tiny}", str(tiny)) for a in argv]
    if argv[0] == "run":
        defaults = {"--model": str(tiny), "--task": "addition", "--out": str(tmp / "out")}
        for flag, value in defaults.items():
            if flag not in argv:
                argv += [flag, value]
        argv.append("--no-progress")
    return argv


def _checksums(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(hostile, capsys, case):
    tmp, tiny, sentinel, loads = hostile
    _, argv, expected, may_load = case
    if case[0] == "no GPU":
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a CUDA GPU, so --device cuda is not a mistake here")
    argv = _expand(argv, tmp, tiny)
    before = _checksums(tmp)
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's errors exit through SystemExit
        code = exc.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("effdepth: error:"), err
    assert "Traceback" not in err and "internal error" not in err
    assert expected in lines[0], lines[0]
    if not may_load:
        assert loads == [], f"{case[0]}: the model was loaded before the error was found"
    assert sentinel.read_text() == "the user's file"
    assert _checksums(tmp) == before  # nothing beside the output was written, moved or deleted
    assert not (tmp / "out").exists()  # a run that could not start leaves no directory


def test_unwritable_model_cache(hostile, capsys, monkeypatch):
    tmp, _, sentinel, _ = hostile
    monkeypatch.setenv(zoo.CACHE_ENV, str(sentinel))  # a file where the cache directory should be
    entry = zoo.ZooModel("fake", ("fake==1",), ("fake.gguf",), "fake.gguf", "0" * 64, "test", 1)
    monkeypatch.setitem(zoo.ZOO, "fake", entry)
    code = main(["run", "--model", "fake", "--task", "addition", "--out", str(tmp / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "cannot write the model cache" in err and len(err.strip().splitlines()) == 1
    assert sentinel.read_text() == "the user's file"


def test_a_byte_order_mark_is_accepted(hostile, capsys):
    tmp, tiny, _, _ = hostile
    argv = ["run", "--model", str(tiny), "--task", str(tmp / "bom.jsonl"), "--out", str(tmp / "bom"), "--no-progress"]
    assert main(argv) == 0


def test_unreadable_task_file(hostile, capsys, monkeypatch):
    tmp, _, _, loads = hostile
    task = tmp / "two.jsonl"
    real = Path.read_bytes

    def denied(self):
        if self == task:
            raise PermissionError(13, "Permission denied")
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", denied)  # root reads any file, so deny it here
    from effdepth_core import cache

    checked = cache.read_regular

    def denied_regular(path, *args, **kwargs):  # the task file's own reader (a bounded regular file)
        if Path(path) == task:
            raise PermissionError(13, "Permission denied")
        return checked(path, *args, **kwargs)

    monkeypatch.setattr(cache, "read_regular", denied_regular)
    code = main(["run", "--model", str(hostile[1]), "--task", str(task), "--out", str(tmp / "out")])
    err = capsys.readouterr().err
    assert code == 2 and "cannot read task file" in err and "Permission denied" in err and loads == []


def test_table_skips_a_corrupt_or_foreign_summary(hostile, capsys):
    tmp, tiny, _, _ = hostile
    good = tmp / "runs" / "good"
    assert (
        main(["run", "--model", str(tiny), "--task", "addition", "--n", "1", "--out", str(good), "--no-progress"]) == 0
    )
    (tmp / "runs" / "corrupt").mkdir()
    (tmp / "runs" / "corrupt" / "effective_depth.json").write_text('{"model": "x", "task"')
    (tmp / "runs" / "foreign").mkdir()
    (tmp / "runs" / "foreign" / "effective_depth.json").write_text('{"depth": 3}')
    capsys.readouterr()
    assert main(["table", str(tmp / "runs")]) == 0
    out = capsys.readouterr()
    assert "addition" in out.out
    warnings = out.err.strip().splitlines()
    assert len(warnings) == 2 and all(w.startswith("effdepth: warning: skipping") for w in warnings)
    assert "corrupt" in warnings[0] and "foreign" in warnings[1]
    assert main(["table", str(tmp / "runs" / "corrupt")]) == 2
    for bad in ('"ratio": "0.3"', '"ratio": NaN'):  # hand-edited types are skipped, NaN never shown
        damaged = tmp / "runs" / "good" / "effective_depth.json"
        text = json.loads(damaged.read_text())
        text["logit_lens_kl"] = {"ed": 1, "ratio": 0.5}
        damaged.write_text(json.dumps(text).replace('"ratio": 0.5', bad, 1))
        capsys.readouterr()
        assert main(["table", str(damaged)]) == 2
        assert "nan" not in capsys.readouterr().out.lower()


@pytest.mark.parametrize(
    "edit, why",
    [
        ({"ed": 1, "ratio": 0.9}, "is not (ED+1)/L"),  # the ratio of another ED
        ({"ed": 1, "ratio": 2 / 3, "ci_low": 2, "ci_high": 0}, "is reversed"),
        ({"ed": 1, "ratio": 2 / 3, "ci_low": 0}, "interval is out of range"),  # half an interval
    ],
)
def test_table_skips_a_summary_that_contradicts_itself(hostile, capsys, edit, why):
    tmp, tiny, _, _ = hostile
    good = tmp / "runs" / "good"
    argv = ["run", "--model", str(tiny), "--task", "addition", "--n", "2", "--out", str(good), "--no-progress"]
    assert main(argv) == 0
    summary = good / "effective_depth.json"
    text = json.loads(summary.read_text())
    text["cosine"] = edit
    summary.write_text(json.dumps(text))
    capsys.readouterr()
    assert main(["table", str(good)]) == 2  # nothing left to show
    err = capsys.readouterr().err
    assert f"skipping {summary}" in err and why in err


@pytest.mark.parametrize("argv", [["run", "--model", "README.md"], ["run", "--task", "math", "--level", "0"]])
def test_a_real_process_exits_2_with_one_line(argv, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "effdepth_core.cli", *argv, "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[1],
    )
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("effdepth: error:")


def _numbers_cases():
    from effdepth_core.measurement.probes import (
        early_exit,
        erasure_map,
        integrated_gradients,
        layer_pruning,
        skip_effects,
    )

    return [
        (lambda m, ex: early_exit(m, ex, chunk=0), "chunk must be a whole number of at least 1, got 0"),
        (
            lambda m, ex: integrated_gradients(m, ex, layers=[99]),
            r"layers must be layer indices 0\.\.2 .* \[99\]",
        ),
        (lambda m, ex: integrated_gradients(m, ex, layers=[]), "layers must be layer indices"),
        (lambda m, ex: integrated_gradients(m, ex, layers=[True]), "layers must be layer indices"),
        (lambda m, ex: integrated_gradients(m, ex, slow_block=0), "slow_block must be a whole number"),
        (lambda m, ex: integrated_gradients(m, ex, max_rows=2.5), "max_rows must be a whole number"),
        (lambda m, ex: integrated_gradients(m, ex, method="fastest"), "method must be 'fast' or 'slow'"),
        (lambda m, ex: erasure_map(m, ex, max_rows=0), "max_rows must be a whole number of at least 1"),
        (lambda m, ex: layer_pruning(m, ex, max_rows=-1), "max_rows must be a whole number"),
        (lambda m, ex: skip_effects(m, [ex[0][0]], max_rows=1.5), "max_rows must be a whole number"),
    ]


@pytest.mark.parametrize("case", range(len(_numbers_cases())))
def test_every_number_a_probe_function_takes_is_checked_before_work(case, monkeypatch):
    """A number out of its range is one line (an EffdepthError the CLI prints, and the ValueError
    Python code expects), raised before the model runs a single forward pass."""
    from conftest import make_tiny, random_prompts

    from effdepth_core.errors import EffdepthError

    call, message = _numbers_cases()[case]
    loaded = make_tiny("llama")
    forwards = []
    handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda *a: forwards.append(1))
    try:
        with pytest.raises(EffdepthError, match=message) as raised:
            call(loaded, [(ids, 4) for ids in random_prompts([14])])
    finally:
        handle.remove()
    assert isinstance(raised.value, ValueError)
    assert forwards == [], "the check ran after the model's forward pass"


def test_a_ctrl_c_is_never_exit_0_whoever_catches_it(monkeypatch, capsys):
    """A Ctrl-C that a library catches (or one at start-up, before a command handles it) still ends
    the command with status 130 and the one line, never as a success."""
    import signal
    import time

    from effdepth_core import cli

    def swallowing(args):  # a library that catches KeyboardInterrupt and carries on
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(2)
        except KeyboardInterrupt:
            pass
        return 0

    monkeypatch.setattr(cli, "_cmd_models", swallowing)
    before = signal.getsignal(signal.SIGINT)
    assert main(["models"]) == 130
    assert capsys.readouterr().err.strip() == "effdepth: interrupted; finished results are kept, rerun to resume"
    assert signal.getsignal(signal.SIGINT) is before  # put back

    def interrupted_at_start(command=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted_at_start)
    assert main(["models"]) == 130 and "interrupted" in capsys.readouterr().err


def test_a_summary_whose_anchor_is_gone_is_not_trusted(tiny_dir, tmp_path, capsys):
    """A run's files are trusted through its metadata.json (which records their sha256): without it
    `effdepth table` skips the summary, saying why, rather than printing numbers nobody vouches for."""
    from effdepth_core.results import RunSettings, run

    task = tmp_path / "t.jsonl"
    task.write_text('{"prompt": "the cat sat on the mat"}\n')
    run(RunSettings(str(tiny_dir), str(task), n=1, progress=False), "cosine", tmp_path / "runs" / "a")
    assert main(["table", str(tmp_path / "runs")]) == 0
    capsys.readouterr()
    (tmp_path / "runs" / "a" / "metadata.json").unlink()
    assert main(["table", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "no effdepth metadata.json beside it" in err and "could be read" in err


def test_the_review_cases_of_read_once_layers_and_padding(tiny_dir, tmp_path, monkeypatch):
    """A review of this change found: examples passed in beside a task file refused as "changed";
    a file named like a built-in task hashed into its key and refusing it; numpy layer indices
    refused; a padded batch that breaks (NaN) taken as padding safely."""
    import types

    import numpy as np
    from conftest import make_tiny

    from effdepth_core.errors import require_layers
    from effdepth_core.models import pads_safely
    from effdepth_core.results import RunSettings, run
    from effdepth_core.tasks import Example

    task = tmp_path / "t.jsonl"
    task.write_text('{"prompt": "the cat sat on the mat"}\n')
    given = [Example("hello there, world")]
    done = run(RunSettings(str(tiny_dir), str(task), n=1, progress=False), "cosine", tmp_path / "a", examples=given)
    assert done.summary["n_examples"] == 1
    monkeypatch.chdir(tmp_path)
    (tmp_path / "addition").write_text("not a task file")  # a file named like a built-in task
    assert run(RunSettings(str(tiny_dir), "addition", n=1, digits=2, progress=False), "cosine", tmp_path / "b")
    assert require_layers("layers", np.arange(2), 3, "m") == [0, 1]
    assert 1 in require_layers("layers", np.int64(1), 3, "m")

    loaded = make_tiny("llama")

    class Breaks(torch.nn.Module):  # finite alone, NaN in any batch of two
        def __init__(self):
            super().__init__()
            self.config = types.SimpleNamespace(vocab_size=loaded.vocab_size)
            self.embed = torch.nn.Embedding(loaded.vocab_size, 8)

        def forward(self, input_ids, attention_mask, use_cache=False):
            h = self.embed(input_ids)
            return types.SimpleNamespace(last_hidden_state=h * float("nan") if input_ids.shape[0] > 1 else h)

    stack = Breaks()
    assert pads_safely(stack, stack) is False
