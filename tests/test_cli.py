"""The command line: the run contract, caching/resume, and one-line errors for bad input."""

from __future__ import annotations

import dataclasses
import json
import sys

import polars as pl
import pytest
from conftest import save_tiny_dir
from transformers import AutoConfig, AutoModelForCausalLM

from effdepth_core.cli import main
from effdepth_core.errors import EffdepthError
from effdepth_core.measurement import registry


def _run(capsys, *argv):
    capsys.readouterr()  # drop what the test itself printed before
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_run_writes_the_contract_files(tiny_dir, tmp_path, capsys):
    out = tmp_path / "run"
    code, stdout, _ = _run(
        capsys,
        "run",
        "--model",
        str(tiny_dir),
        "--task",
        "addition",
        "--n",
        "3",
        "--digits",
        "2",
        "--out",
        str(out),
        "--no-progress",
    )
    assert code == 0
    for name in ("cosine.parquet", "logit_lens.parquet", "effective_depth.json", "examples.jsonl", "metadata.json"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "effective_depth.json").read_text())
    assert summary["n_layers"] == 3 and summary["n_examples"] == 3 and summary["task"] == "addition"
    for rule in ("cosine", "logit_lens_kl", "logit_lens_overlap"):
        assert "ed" in summary[rule] and "ratio" in summary[rule]
        if summary[rule]["ed"] is None:
            assert summary[rule]["reason"]
        else:
            assert summary[rule]["ratio"] == pytest.approx((summary[rule]["ed"] + 1) / 3)
    cosine = pl.read_parquet(out / "cosine.parquet")
    assert cosine.columns == ["layer", "metric", "value"]
    assert set(cosine["metric"]) == {"cos_attn", "cos_mlp", "cos_layer", "rel_attn", "rel_mlp", "rel_layer"}
    assert set(pl.read_parquet(out / "logit_lens.parquet")["metric"]) == {"kl", "overlap"}
    prompts = [json.loads(line)["prompt"] for line in (out / "examples.jsonl").read_text().splitlines()]
    assert len(prompts) == 3 and all(p.startswith("Give the answer directly: ") for p in prompts)
    assert "cosine" in stdout and "lens KL" in stdout

    code, stdout, _ = _run(capsys, "table", str(tmp_path))
    assert code == 0 and "addition" in stdout


def test_rerun_reuses_and_interrupted_run_resumes(tiny_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "resume"
    calls: list[str] = []
    specs = registry.specs()

    def counting(name):
        def compute(*args):
            calls.append(name)
            if name == "logit_lens" and calls.count(name) == 1:
                raise KeyboardInterrupt  # the user presses Ctrl-C during the lens
            return specs[name].compute(*args)

        # computed through ``compute`` one by one (no shared pass: tests/test_shared_pass.py interrupts that)
        return dataclasses.replace(specs[name], compute=compute, pass_part=None)

    for name in specs:
        monkeypatch.setitem(registry._all(), name, counting(name))
    argv = ["run", "--model", str(tiny_dir), "--task", "addition", "--n", "2", "--out", str(out), "--no-progress"]
    code, _, err = _run(capsys, *argv)
    assert code == 130 and "interrupted" in err
    assert (out / "cosine.parquet").is_file() and not (out / "logit_lens.parquet").exists()
    assert not [p for p in out.iterdir() if ".tmp" in p.name]  # nothing half-written
    assert _run(capsys, *argv)[0] == 0
    assert calls == ["cosine", "logit_lens", "logit_lens"]  # the rerun computed only the lens
    assert _run(capsys, *argv)[0] == 0
    assert calls == ["cosine", "logit_lens", "logit_lens"]  # and a third run nothing
    changed = [*argv[:-1], "--seed", "5", "--no-progress"]
    code, _, err = _run(capsys, *changed)
    assert code == 2 and "other parameters (seed: 0 → 5)" in err and "--overwrite" in err  # refused
    assert calls.count("cosine") == 1
    assert _run(capsys, *changed, "--overwrite")[0] == 0
    assert calls.count("cosine") == 2  # other parameters, --overwrite: recomputed
    assert json.loads((out / "metadata.json").read_text())["settings"]["seed"] == 5


def _error(capsys, *argv) -> str:
    code, _, err = _run(capsys, *argv)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("effdepth: error:") and "Traceback" not in err
    return lines[0]


def test_bad_models(capsys, tmp_path, monkeypatch):
    assert "no such model file or directory" in _error(capsys, "run", "--model", "./nope", "--task", "addition")
    assert "smollm2-135m" in _error(capsys, "run", "--model", str(tmp_path / "x.gguf"))
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # fail at once instead of retrying a dead network
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    message = _error(capsys, "run", "--model", "some-org/not-a-model", "--task", "addition")
    assert "some-org/not-a-model" in message and "smollm2-135m" in message  # names the offline aliases
    encoder = tmp_path / "bert"
    config = AutoConfig.for_model("bert", vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32, is_decoder=True)  # fmt: skip
    AutoModelForCausalLM.from_config(config).save_pretrained(encoder)
    said = _error(capsys, "run", "--model", str(encoder), "--task", "addition")
    assert "'bert'" in said and "an encoder" in said  # refused before loading, in one line


def test_bad_tasks_and_inputs(capsys, tiny_dir, tmp_path):
    base = ["run", "--model", str(tiny_dir), "--out", str(tmp_path / "o"), "--no-progress"]
    assert "unknown task 'nope'" in _error(capsys, *base, "--task", "nope")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert "no examples" in _error(capsys, *base, "--task", str(empty))
    long_prompt = tmp_path / "long.jsonl"
    long_prompt.write_text(json.dumps({"prompt": "a" * 500}) + "\n")  # the tiny model takes 128 positions
    assert "at most 128" in _error(capsys, *base, "--task", str(long_prompt))
    assert "unknown probe" in _error(capsys, *base, "--task", "addition", "--probes", "cosine,typo")
    with pytest.raises(SystemExit) as info:
        main([*base, "--task", "addition", "--n", "0"])
    assert info.value.code == 2


def test_nan_activation_is_reported_with_its_layer(capsys, tmp_path):
    poisoned = save_tiny_dir(tmp_path / "nan", poison=True)
    message = _error(
        capsys, "run", "--model", str(poisoned), "--task", "addition", "--out", str(tmp_path / "o"), "--no-progress"
    )
    assert "layer 1" in message and "NaN" in message


def test_debug_shows_the_traceback(capsys):
    code = main(["--debug", "run", "--model", "./nope"])
    assert code == 2 and "Traceback" in capsys.readouterr().err


def test_models_lists_the_zoo(capsys):
    code, stdout, _ = _run(capsys, "models")
    assert code == 0
    for alias in ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        assert alias in stdout


def test_console_script_is_installed():
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "effdepth"]
    assert script.value == "effdepth_core.cli:main" and sys.executable


def test_an_unknown_option_names_the_nearest_one_and_the_command_help(capsys):
    for argv, command, nearest in (
        (["run", "--topk", "3"], "run", "--top-k"),
        (["table", "runs", "--formatt", "json"], "table", "--format"),
    ):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert (
            f"did you mean {nearest}?" in err and f"`effdepth {command} --help`" in err and len(err.splitlines()) == 1
        )


def test_measure_names_an_unknown_setting_in_the_caller_spelling():
    import effdepth_core

    with pytest.raises(EffdepthError, match=r"unknown setting 'topk' \(did you mean top_k\?\)"):
        effdepth_core.measure("smollm2-135m", ["2 + 2 ="], topk=3)  # refused before any model loads
    with pytest.raises(EffdepthError, match=r"did you mean progress\?"):  # measure's own arguments too
        effdepth_core.measure("smollm2-135m", ["2 + 2 ="], progres=False)


def test_a_closed_standard_output_is_one_line_not_an_internal_error(tmp_path):
    """`effdepth table RUN >&-` (Python then has no sys.stdout) said "internal error"."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", "import sys; from effdepth_core.cli import main; sys.exit(main(['models']))"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, pass_fds=(), close_fds=True,
        preexec_fn=lambda: __import__("os").close(1),
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == "effdepth: error: standard output is closed; redirect it to a file or /dev/null"


def test_every_free_text_option_refuses_an_empty_value(capsys, tmp_path, monkeypatch):
    """`effdepth book --section ""` once executed every section (an empty text read as "not
    given"); every option of every command that takes a value is now refused empty, in one line."""
    import argparse

    from effdepth_core.cli_args import build_parser

    monkeypatch.chdir(tmp_path)  # an option that took "" would run its command here, not in the checkout
    monkeypatch.setenv("EFFDEPTH_CACHE", str(tmp_path / "cache"))
    checked = 0
    for command in ("run", "models", "table", "plot", "map", "book", "grid"):
        parser = build_parser(command)
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
        for action in sub._actions:
            takes_text = action.option_strings and action.nargs in (None, "?") and not action.choices  # a value
            if not takes_text or isinstance(action, argparse._HelpAction | argparse._VersionAction):
                continue
            with pytest.raises(SystemExit) as exit_info:
                main([command, action.option_strings[0], ""])
            assert exit_info.value.code == 2, (command, action.option_strings)  # argparse's exit, not a run's
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and err.startswith(f"effdepth: error: argument {action.option_strings[0]}"), err
            checked += 1
    assert checked > 40  # the probes' options (--prune-sizes, …) included


def _run_help(capsys) -> str:
    import contextlib

    from effdepth_core.cli_args import build_parser

    capsys.readouterr()
    with contextlib.suppress(SystemExit):
        build_parser("run").parse_args(["run", "--help"])
    return capsys.readouterr().out


def test_run_help_describes_every_probe_and_every_option(capsys):
    """Issue 47: cosine and erasure had no description in ``run --help``, --dtype, --seed and
    --batch-size no help, and --device left out mps. Now every registered probe has its line
    (its spec's description) and every option of ``run`` has help text."""
    import argparse

    from effdepth_core.cli_args import build_parser
    from effdepth_core.measurement import registry

    text = _run_help(capsys)
    probes = text.split("probes (--probes", 1)[1].split("\n\n", 1)[0]  # the heading and its block
    flat = " ".join(probes.split())
    for name, spec in registry.specs().items():
        assert f"{name} {' '.join(spec.description.split())}" in flat, name  # the name, then its description
    parser = build_parser("run")
    run = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["run"]
    unexplained = [a.option_strings[0] for a in run._actions if a.option_strings and not (a.help or "").strip()]
    assert not unexplained, unexplained
    assert "mps" in " ".join(text.split("\n  --device DEVICE", 1)[1].split("--device-map", 1)[0].split())


def test_options_sit_under_every_probe_they_affect(capsys):
    """--lens chooses logit_lens's lens as well as early_exit's: it sits under a group naming
    both (it sat under early_exit alone); an option two probes declare sits under both names."""
    from effdepth_core.measurement import registry

    text = _run_help(capsys)
    groups: dict[str, str] = {}  # each heading (a line at column 0 ending in ':') and what follows it
    title = ""
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            title = line.removesuffix(":").removesuffix(" options")
            groups[title] = ""
        elif title:
            groups[title] += line + "\n"
    lens_group = next(title for title, block in groups.items() if "--lens {" in block)
    assert lens_group == "logit_lens and early_exit", lens_group
    top_k_group = next(title for title, block in groups.items() if "--top-k" in block)
    assert top_k_group == "logit_lens and tuned_lens"
    for option in registry.options().values():  # each flag exactly once, under every probe that declares it
        titles = [title for title, block in groups.items() if f"{option.cli_flag} " in block]
        assert len(titles) == 1, option.cli_flag
        declared = [n for n, spec in registry.specs().items() if option in spec.options]
        assert all(name in titles[0].replace(",", " ").split() for name in declared), (option.cli_flag, titles)


def test_effdepth_probes_lists_every_probe(capsys):
    """``effdepth probes`` (named by measure()'s docstring and the API page) exists: each probe with
    its description, its ED rules and its options."""
    from effdepth_core.measurement import registry

    code, stdout, err = _run(capsys, "probes")
    assert code == 0 and not err
    for name, spec in registry.specs().items():
        line = next(line for line in stdout.splitlines() if line.startswith(f"{name}"))
        assert spec.description in line, name
    assert "logit_lens_kl (lens KL)" in stdout
    block = stdout.split("logit_lens (run by default)", 1)[1].split("\nskip", 1)[0]
    assert "--lens" in block and "--top-k" in block


def test_a_cached_rerun_says_so_and_the_default_table_is_narrow(tiny_dir, tmp_path, capsys):
    """Issue 47: a cached rerun printed the same table with no note, and the table was ~230
    columns wide. The rerun now says it read every probe from the cache (a run that adds a probe
    names both kinds); the default table leaves out the continuous statistics and the empty
    columns, --wide shows them."""
    task = tmp_path / "t.jsonl"
    task.write_text('{"prompt": "the cat sat on", "answer": " the mat"}\n{"prompt": "two plus two"}\n')
    argv = ["run", "--model", str(tiny_dir), "--task", str(task), "--out", str(tmp_path / "o"), "--no-progress"]
    code, first, _ = _run(capsys, *argv)
    assert code == 0 and "read from the cache" not in first
    assert "measured text: each example's prompt + answer (1 of 2 have one" in first
    header = first.splitlines()[0].split()
    assert header == ["model", "task", "L", "n", "cosine", "lens", "KL", "lens", "overlap"]  # no level, digits, asked
    assert "depth" not in first.splitlines()[0] and "--wide adds" in first
    code, again, _ = _run(capsys, *argv)
    assert code == 0 and "read from the cache: every probe (cosine, logit_lens) was computed before" in again
    assert again.split("read from the cache")[0] == first.split("measured text")[0]  # the same table
    code, more, _ = _run(capsys, *argv, "--probes", "norm,cosine,logit_lens", "--wide")
    assert "read from the cache: cosine, logit_lens; computed now: norm" in more
    assert "cosine depth" in more.splitlines()[0] and "asked" in more.splitlines()[0]


def test_probes_run_in_the_tables_order(tiny_dir, tmp_path):
    """--probes logit_lens,cosine computed the lens first while the table shows cosine first: the
    probes now run in the table's (the registry's) order, on disk and in memory."""
    from effdepth_core.measurement import registry
    from effdepth_core.results import RunSettings, run, run_in_memory

    settings = RunSettings(str(tiny_dir), "addition", n=1, digits=2, progress=False)
    kept = run(settings, "norm,logit_lens,cosine", tmp_path / "o")
    order = [name for name in registry.names() if name in ("cosine", "logit_lens", "norm")]
    assert list(kept.computed) == order == ["cosine", "logit_lens", "norm"]
    assert list(run_in_memory(settings, "norm,logit_lens,cosine").computed) == order
    assert run(settings, "norm,logit_lens,cosine", tmp_path / "o").computed == ()  # all cached


def test_the_run_prints_an_overall_line_with_an_estimate_of_the_time_left(tiny_dir, tmp_path, capsys):
    """Issue 47: a run had a bar per probe and no overall estimate. With progress on, each probe's
    start prints "probe k/N" and, from the second, the time so far and the time left: each probe's
    operations (its spec's work) at the rate of those before it — 10 s for 1 unit, then 3 units
    left, is 30 s."""
    import time

    from effdepth_core.results import Overall, RunSettings, run

    settings = RunSettings(str(tiny_dir), "addition", n=1, digits=2, progress=True)
    capsys.readouterr()
    run(settings, "cosine,logit_lens,skip", tmp_path / "o")
    err = capsys.readouterr().err
    # the cosine and the lens share one forward pass (one line for both), then the skip
    assert "effdepth: probe 1, 2/3, residual cosine + logit lens (one shared forward pass)\n" in err
    assert "effdepth: probe 3/3, layer skipping; " in err
    assert "left (estimated from each probe's operations)" in err
    overall = Overall.__new__(Overall)
    overall.names, overall.work, overall.started = ["cosine", "logit_lens"], [1.0, 3.0], time.perf_counter() - 10
    overall.done = set()
    overall.starting(1)
    assert "probe 2/2, logit lens; 10 s so far, about 30 s left" in capsys.readouterr().err
    run(settings.replace(progress=False), "cosine,logit_lens,norm", tmp_path / "p")
    assert "effdepth: probe" not in capsys.readouterr().err  # --no-progress: no line
