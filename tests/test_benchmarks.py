"""The benchmark scripts run (their numbers are measurements, not assertions: only that every probe
and published loop was timed, and that the operation counts they divide by are right)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import paper_scale


def test_paper_scale_runs_every_probe_on_a_tiny_configuration(capsys):
    paper_scale.main(["--tiny", "--rows-before", "--repeats", "2", "--igrad-default-panels", "1", "--dtype", "float32"])
    lines = capsys.readouterr().out.splitlines()
    timed = {line.split()[0] for line in lines if line.split() and line.split()[0] in paper_scale.PROBES}
    assert timed == set(paper_scale.PROBES)
    published = [line for line in lines if "2 runs] = " in line]  # each loop warmed up, then timed twice
    assert len(published) == 3  # skip, erasure and integrated gradients against their published loops
    assert any(line.startswith("igrad-rule") and "published Riemann-8 loop" in line for line in lines)
    assert any("16 rows per pass" in line for line in lines)


def test_the_operation_counts_by_hand():
    # one layer of d = 2, d_ff = 3, KV width 2, vocab 5: projections per query token
    # 2 · (2·2·2 + 2·2·2 + 3·2·3) = 2 · 34 = 68, and 4 · keys · d for scores and weighted values
    work = paper_scale.Work(layers=1, d=2, d_ff=3, kv=2, vocab=5)
    assert work.layer(queries=1, keys=1) == 68 + 8
    assert work.stack(3) == 3 * 68 + 4 * 3 * 2 * 2  # 3 tokens attend 2 keys on average (causal)
    assert work.head(4) == 2 * 4 * 2 * 5
    assert work.lens(3) == 2 * work.stack(3) + 3 * work.head(3)  # L + 2 = 3 decodes


def test_the_paper_grid_estimate_runs(capsys):
    paper_scale.main(["--paper-grid"])
    out = capsys.readouterr().out
    assert "Qwen2.5-32B: 3 models" in out and "in all" in out


@pytest.mark.parametrize(
    "argv",
    [["--sizes", "3B"], ["--probes", "lens,attn"], ["--sizes", ""], ["--n", "0"], ["--tokens", "3"],
     ["--igrad-steps", "0"], ["--short-tokens", "8", "--answer-tokens", "8"], ["--tiny", "--n", "3"]],
)  # fmt: skip
def test_paper_scale_refuses_unknown_sizes_and_probes(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        paper_scale.main(argv)
    assert exited.value.code == 2


def test_the_quantization_control_is_saved_merged_and_stated_beside_the_scale_verdict(tmp_path, monkeypatch):
    pytest.importorskip("gguf", reason="the quantization control requantizes through gguf's quantizer")
    import quantization_control

    from effdepth_book import evidence, findings
    from effdepth_core.errors import EffdepthError

    saved = tmp_path / evidence.QUANTIZATION_FILE
    monkeypatch.setattr(quantization_control, "SAVED", saved)

    def row(model, task, rule, shift, low, high):
        return {"model": model, "task": task, "rule": rule, "quant": "Q4_0", "n": 20, "seed": 0, "before": 10.0,
                "after": 10.0 + shift, "shift": shift, "low": low, "high": high, "ed_shift": 0.0}  # fmt: skip

    quantization_control.save(
        [row("a", "hellaswag", "cosine", 0.07, 0.05, 0.24), row("a", "gsm8k", "cosine", 9, 8, 10)]
    )
    # a new measurement replaces its own row only
    quantization_control.save(
        [row("a", "gsm8k", "cosine", -0.5, -0.9, -0.1), row("b", "hellaswag", "cosine", 0.3, 0, 1)]
    )
    frame = evidence.quantization_control(tmp_path, ["a", "b"])
    assert sorted(frame.select("model", "task", "shift").iter_rows()) == [
        ("a", "gsm8k", -0.5),
        ("a", "hellaswag", 0.07),
        ("b", "hellaswag", 0.3),
    ]
    assert evidence.quantization_control(tmp_path, ["c"]).height == 0
    assert evidence.quantization_control(tmp_path / "none", ["a"]).height == 0
    # the largest shift by size (-0.5 beats +0.3), its interval, where it was measured, who was not
    sentence = findings.quantization_sentence(evidence.quantization_control(tmp_path, ["a", "c"]), ("a", "c"))
    assert "by up to 0.50 layers (a GSM8K cosine: −0.50 [−0.90, −0.10], n = 20 prompts)" in sentence, sentence
    assert "every interval within ±0.90 layers" in sentence  # the farthest bound, not the largest point
    assert "measured on a on GSM8K, HellaSwag; not measured on c" in sentence and "margin of one layer" in sentence
    unbounded = evidence.quantization_control(tmp_path, ["a"]).with_columns(low=None, high=None)
    assert "−0.50 (no interval)" in findings.quantization_sentence(unbounded, ("a",), "half a layer")
    assert findings.quantization_sentence(evidence.quantization_control(tmp_path, ["c"]), ("c",)) is None
    # never over a file it did not write, never through a link
    saved.write_text('{"rows": []}\n')
    with pytest.raises(EffdepthError, match="not written by effdepth"):
        quantization_control.save([row("a", "hellaswag", "cosine", 0.1, 0, 0.2)])
    assert saved.read_text() == '{"rows": []}\n'
    saved.unlink()
    saved.symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(EffdepthError, match="symbolic link"):
        quantization_control.save([row("a", "hellaswag", "cosine", 0.1, 0, 0.2)])
    assert not (tmp_path / "elsewhere.json").exists()


def test_every_timed_benchmark_repeats_at_least_five_times_by_default():
    """Issue 49's rule for the benchmarks: a timed path is warmed up and repeated (≥ 5 by default,
    median and min–max printed through ``measure.repeated``/``alternating``), never timed once."""
    import ast

    folder = Path(__file__).resolve().parents[1] / "benchmarks"
    defaults = {}
    for script in sorted(folder.glob("*.py")):
        tree = ast.parse(script.read_text())
        for node in ast.walk(tree):
            is_call = isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"
            if is_call and node.args and getattr(node.args[0], "value", None) == "--repeats":
                default = next(k.value.value for k in node.keywords if k.arg == "default")
                defaults[script.name] = default
    assert {"main_run.py", "probe_cost.py", "beyond_cost.py", "load_cost.py", "intervention_cost.py"} <= set(defaults)
    assert {name: n for name, n in defaults.items() if n < 5} == {}


def test_the_published_igrad_loop_runs_the_prompt_at_batch_1_up_to_the_layer():
    """``PublishedBatching``: the published script's integrated gradients (one row of the prompt up
    to layer l, 16 α rows from it on) does exactly the work ``intervention_cost`` models for it
    (the library's oracle alone runs every layer at 16 rows: more), with the fast path's numbers,
    and leaves the model as it found it (no hook left)."""
    from conftest import make_tiny, random_prompts
    from intervention_cost import KEYS, igrad_published_work, max_difference
    from measure import PublishedBatching, WorkCounter

    from effdepth_core.measurement.probes import integrated_gradients

    loaded = make_tiny("llama")
    model = loaded.model
    (ids,) = random_prompts([13])
    rule = dict(igrad_steps=32, igrad_quadrature="riemann", igrad_baseline="hidden-mean", layers=[0, 2])
    integrated_gradients(loaded, [(ids, 3)], method="slow", slow_block=16, **rule)  # the load-time checks, once
    with WorkCounter(loaded) as oracle:
        integrated_gradients(loaded, [(ids, 3)], method="slow", slow_block=16, **rule)
    with WorkCounter(loaded) as work, PublishedBatching(loaded):
        assert loaded.base_model() is model.model  # the model's own parts, as the library reads them
        published = integrated_gradients(loaded, [(ids, 3)], method="slow", slow_block=16, **rule)
    assert loaded.model is model and not model._forward_pre_hooks
    expected = igrad_published_work(loaded.n_layers, ids.numel(), [0, 2], 32)
    assert (work.layer_tokens, work.head_tokens) == expected
    assert oracle.layer_tokens > expected[0]  # what the benchmarks timed as "published" before
    fast = integrated_gradients(loaded, [(ids, 3)], **rule)
    scale = float(fast.filter(metric="attribution")["value"].abs().max())
    # float32 passes of 1 and 16 rows round differently (~1e-7 of values O(1e-2..1)); a wrong α row
    # or position moves an attribution by its own size
    assert max_difference(published, fast, KEYS["igrad"]) <= 1e-5 * max(scale, 1.0)
