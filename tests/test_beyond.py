"""Tuned lens, layer pruning and early exit (method.md §8–§9) against independent computations on
every tiny architecture."""

from __future__ import annotations

import json

import polars as pl
import pytest
import torch
from conftest import make_tiny, random_prompts

from effdepth_core.measurement.probes import logit_lens
from effdepth_core.measurement.probes.early_exit import early_exit
from effdepth_core.measurement.probes.prune import (
    after_ed_block,
    layer_pruning,
    prune_summary,
    pruned_final,
    rule_comparison,
)
from effdepth_core.measurement.probes.skip import skip_hooks
from effdepth_core.measurement.probes.tuned_lens import LensTraining, TunedLens, cached_tuned_lens, train_tuned_lens
from effdepth_core.measurement.replay import clean_run
from effdepth_core.measurement.trace import intervene

# float32 on values of order 1–10: differences of a few 1e-6 are rounding of reordered sums
TOL = 1e-5


def _examples(lengths=(12, 9), answer=3, seed=4):
    return [(ids, answer) for ids in random_prompts(list(lengths), seed=seed)]


def _manual_nll(logits: torch.Tensor, ids: torch.Tensor, answer: int) -> tuple[float, float]:
    """Answer NLL and accuracy from full-sequence logits ``[token, vocab]`` of ``ids``."""
    n = ids.numel()
    logp = torch.log_softmax(logits[n - 1 - answer : n - 1].float(), dim=-1)
    targets = ids[n - answer :]
    nll = -logp[torch.arange(answer), targets].mean()
    return float(nll), float((logp.argmax(-1) == targets).float().mean())


def test_identity_tuned_lens_is_exactly_the_logit_lens(tiny):
    prompts = random_prompts([11, 7, 5])
    plain = logit_lens(tiny, prompts, batch_size=2)
    identity = logit_lens(tiny, prompts, batch_size=2, lens=TunedLens.identity(tiny))
    assert plain["value"].to_list() == identity["value"].to_list()  # bit for bit: A = 0, b = 0


def test_training_lowers_heldout_kl_at_every_layer():
    tiny = make_tiny("llama")
    texts = random_prompts([20] * 40, seed=7)
    training = LensTraining(train_tokens=600, heldout_tokens=200, steps=60, batch_tokens=64, lr=1e-2, init="zero")
    lens, fit = train_tuned_lens(tiny, texts, training)
    wide = fit.pivot(on="metric", index="layer", values="value").sort("layer")
    assert wide.height == tiny.n_layers
    assert (wide["heldout_kl_tuned"] < 0.9 * wide["heldout_kl_logit"]).all(), wide
    # the fit frame's tuned KL is what the lens probe measures on held-out tokens (KL(q||p) per token)
    heldout = texts[:10]  # the seeded split puts some texts in the held-out set; probe any texts
    by_probe = logit_lens(tiny, heldout, lens=lens)
    assert by_probe.filter(metric="kl")["value"].is_finite().all()


def test_regression_start_is_never_worse_than_zero_on_training_tokens():
    tiny = make_tiny("gemma3_text")
    texts = random_prompts([16] * 30, seed=3)
    base = dict(train_tokens=300, heldout_tokens=100, steps=1, batch_tokens=32, lr=1e-9)
    _, zero = train_tuned_lens(tiny, texts, LensTraining(**base, init="zero"))
    _, fitted = train_tuned_lens(tiny, texts, LensTraining(**base, init="regression"))
    assert (
        fitted.filter(metric="heldout_kl_tuned")["value"].sum() < zero.filter(metric="heldout_kl_tuned")["value"].sum()
    )


def test_tuned_lens_cache_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("EFFDEPTH_CACHE", str(tmp_path))
    tiny = make_tiny("qwen2")
    from effdepth_core.measurement.probes import tuned_lens as module

    monkeypatch.setattr("effdepth_core.tasks.lens_corpus", lambda: random_prompts([15] * 20, seed=9))
    training = LensTraining(train_tokens=150, heldout_tokens=60, steps=3, batch_tokens=16)
    first = cached_tuned_lens("tiny-qwen2", tiny, training)
    path = module.tuned_lens_path("tiny-qwen2", tiny, training)
    assert path.is_file() and path.parent == tmp_path / "tuned-lens"
    again = cached_tuned_lens("tiny-qwen2", tiny, training)  # read, not retrained
    assert torch.equal(first.weight, again.weight) and again.info["heldout_kl_tuned"] == first.info["heldout_kl_tuned"]
    path.write_bytes(b"not a lens")
    with pytest.raises(Exception, match="delete it to train it again"):
        cached_tuned_lens("tiny-qwen2", tiny, training)
    assert path.read_bytes() == b"not a lens"  # a damaged file is reported, never replaced silently


def test_a_cached_tuned_lens_is_trusted_only_while_the_model_computes_as_it_did(tmp_path, monkeypatch):
    """The lens cache's key cannot see a patched forward (the weights, config and tokenizer are the
    same): the canary recorded with the lens can. A patched model gets a lens trained for it (kept
    beside the first, keyed by its canary); the model as it was gets the first one back, unretrained."""
    from effdepth_core.measurement.probes import tuned_lens as module

    monkeypatch.setenv("EFFDEPTH_CACHE", str(tmp_path))
    monkeypatch.setattr("effdepth_core.tasks.lens_corpus", lambda: random_prompts([15] * 20, seed=9))
    tiny = make_tiny("qwen2")
    training = LensTraining(train_tokens=150, heldout_tokens=60, steps=3, batch_tokens=16)
    first = cached_tuned_lens("tiny-qwen2", tiny, training)
    assert first.info["canary"] == module._lens_canary(tiny, random_prompts([15] * 20, seed=9))["canary"]
    mlp = type(tiny.layers[0].mlp)
    original = mlp.forward
    monkeypatch.setattr(mlp, "forward", lambda self, x: original(self, x) * 1.5)  # every layer's MLP, by class
    patched = cached_tuned_lens("tiny-qwen2", tiny, training)
    assert patched.info["canary"] != first.info["canary"]
    assert not torch.equal(patched.weight, first.weight)  # trained on what the patched model computes
    assert len(list((tmp_path / "tuned-lens").glob("*.safetensors"))) == 2
    monkeypatch.setattr(mlp, "forward", original)

    def no_training(*args, **kwargs):
        raise AssertionError("retrained a lens the cache holds")

    monkeypatch.setattr(module, "train_tuned_lens", no_training)
    assert torch.equal(cached_tuned_lens("tiny-qwen2", tiny, training).weight, first.weight)
    monkeypatch.setattr(mlp, "forward", lambda self, x: original(self, x) * 1.5)
    assert torch.equal(cached_tuned_lens("tiny-qwen2", tiny, training).weight, patched.weight)


def _skip_all_forward(tiny, ids: torch.Tensor, removed) -> torch.Tensor:
    """Slow oracle: one full forward with the skip probe's hooks skipping every removed layer at
    every position (its output is its input)."""
    rows = torch.ones(1, dtype=torch.bool)
    hooks = [h for layer in removed for h in skip_hooks(tiny, "layer", layer, rows, slice(0, ids.numel()))]
    with intervene(hooks), torch.inference_mode():
        return tiny.model(input_ids=ids.view(1, -1), use_cache=False).logits[0]


@pytest.mark.parametrize("removed", [(), (1,), (0, 1), (0, 2), (1, 2)])
def test_pruned_model_equals_the_all_token_skip(tiny, removed):
    ids = random_prompts([10])[0]
    run = clean_run(tiny, ids)
    final = pruned_final(tiny, run, [removed, (), (2,)])  # rows with other sets beside it
    fast = tiny.head(final[0])
    slow = _skip_all_forward(tiny, ids, removed)
    scale = slow.abs().max()
    assert (fast - slow).abs().max() <= TOL * scale
    if not removed:  # removing nothing is the model itself
        with torch.inference_mode():
            model = tiny.model(input_ids=ids.view(1, -1), use_cache=False).logits[0]
        assert (fast - model).abs().max() <= TOL * scale


def test_layer_pruning_frame_against_full_forwards():
    tiny = make_tiny("mistral")
    examples = _examples()
    frame = layer_pruning(tiny, examples, prune_sizes=[1, 2])
    for example, (ids, answer) in enumerate(examples):
        rows = frame.filter(example=example, metric="answer_nll")
        for rule, removed in [("none", ""), ("block", "1"), ("block", "0,1")]:
            value = rows.filter(rule=rule, removed=removed)["value"].item()
            layers = [int(x) for x in removed.split(",") if x]
            expected, _ = _manual_nll(_skip_all_forward(tiny, ids[:-1], layers), ids, answer)
            assert value == pytest.approx(expected, rel=TOL)
    blocks = frame.filter(rule="block", metric="answer_nll")
    assert sorted(set(zip(blocks["k"], blocks["start"], strict=True))) == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1)]
    # ShortGPT's choice: the layers of least mean block influence over all prompts' tokens
    influence = frame.filter(metric="block_influence")
    mean = influence.group_by("start").agg((pl.col("value") * pl.col("n_tokens")).sum()).sort("value")
    assert frame.filter(rule="shortgpt", k=1, metric="answer_nll")["removed"][0] == str(mean["start"][0])


def test_pruning_summary_and_rule_comparison():
    tiny = make_tiny("llama")
    summary = prune_summary(layer_pruning(tiny, _examples(), prune_sizes=[1, 2]))
    clean = summary.filter(rule="none", metric="answer_nll")["value"].item()
    one = summary.filter(rule="block", k=1, start=1)
    assert one.filter(metric="delta_nll")["value"].item() == pytest.approx(
        one.filter(metric="answer_nll")["value"].item() - clean, abs=1e-12
    )
    comparison = rule_comparison(summary, {"cosine": 0, "lens KL": None}, tiny.n_layers)
    shortgpt = comparison.filter(choice="block influence").sort("k")
    assert shortgpt.height == 2 and shortgpt["delta_nll"].is_not_null().all()  # the pruned scores, not the BI rows
    expected = summary.filter(rule="shortgpt", metric="delta_nll").sort("k")
    assert shortgpt["delta_nll"].to_list() == expected["value"].to_list()
    assert shortgpt["removed"].to_list() == expected["removed"].to_list()
    after = comparison.filter(choice="after ED (cosine)")
    assert after["removed"].to_list() == ["1", "1,2"]  # ED 0: start at 1; k = 2 must end at L-1 = 2
    kept = comparison.filter(choice="after ED (cosine), final layer kept")
    assert kept["removed"].to_list() == ["1", "0,1"]  # ends at L-2 = 1 at the latest
    assert set(comparison["choice"]) == {
        "after ED (cosine)",
        "after ED (cosine), final layer kept",
        "angular distance",
        "block influence",
    }
    assert after_ed_block(ed=2, k=2, n_layers=3) == 1 and after_ed_block(ed=0, k=1, n_layers=30) == 1
    assert (
        after_ed_block(ed=26, k=1, n_layers=28) == 27 and after_ed_block(ed=26, k=1, n_layers=28, keep_final=True) == 26
    )
    assert after_ed_block(ed=0, k=3, n_layers=3, keep_final=True) is None


def test_early_exit_against_raw_hidden_states(tiny):
    examples = _examples(lengths=(9, 13))
    frame = early_exit(tiny, examples, chunk=4)  # small chunks: several per prompt
    for example, (ids, answer) in enumerate(examples):
        with torch.inference_mode():
            out = tiny.model(input_ids=ids[:-1].view(1, -1), use_cache=False, output_hidden_states=True)
        final = out.logits[0]
        rows = frame.filter(example=example)
        at_l = rows.filter(layer=tiny.n_layers)
        assert at_l.filter(metric="agreement")["value"].item() == 1.0  # exiting at L is the model
        nll, accuracy = _manual_nll(torch.cat([final, final[:1]]), ids, answer)
        assert at_l.filter(metric="answer_nll")["value"].item() == pytest.approx(nll, rel=TOL)
        assert at_l.filter(metric="answer_accuracy")["value"].item() == accuracy
        for layer in range(tiny.n_layers):  # HF's hidden_states[l] is layer l's input (pre-norm for l < L)
            logits = tiny.head(out.hidden_states[layer][0])
            nll, _ = _manual_nll(torch.cat([logits, logits[:1]]), ids, answer)
            agreement = float((logits.argmax(-1) == final.argmax(-1)).float().mean())
            assert rows.filter(layer=layer, metric="answer_nll")["value"].item() == pytest.approx(nll, rel=TOL)
            assert rows.filter(layer=layer, metric="agreement")["value"].item() == pytest.approx(agreement)


def test_early_exit_with_identity_lens_is_the_logit_lens_exit():
    tiny = make_tiny("gemma2")
    examples = _examples()
    assert early_exit(tiny, examples).equals(early_exit(tiny, examples, lens=TunedLens.identity(tiny)))


def test_cli_runs_the_new_probes_and_caches_the_lens(tiny_dir, tmp_path, monkeypatch, capsys):
    from effdepth_core.cli import main

    monkeypatch.setenv("EFFDEPTH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    argv = ["run", "--model", str(tiny_dir), "--task", "addition", "--digits", "2", "--n", "3", "--out", str(out)]
    argv += ["--probes", "cosine,logit_lens,prune,early_exit", "--lens", "both", "--lens-steps", "3"]
    argv += ["--lens-tokens", "300", "--prune-sizes", "1,2", "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "tuned KL" in printed.splitlines()[0] and "tuned overlap" in printed.splitlines()[0]
    for name in ("tuned_lens", "prune", "early_exit"):
        assert (out / f"{name}_by_example.parquet").is_file()
    assert (out / "tuned_lens_fit.parquet").is_file()
    assert len(list((tmp_path / "cache" / "tuned-lens").glob("*.safetensors"))) == 1
    exits = pl.read_parquet(out / "early_exit.parquet")
    assert set(exits["lens"]) == {"logit", "tuned"}
    summary = json.loads((out / "effective_depth.json").read_text())
    assert {"tuned_lens_kl", "tuned_lens_overlap", "logit_lens_kl"} <= summary.keys()
    stamp = (out / "prune_by_example.parquet").stat().st_mtime_ns
    assert main(argv) == 0  # a rerun reads every probe from the cache
    assert (out / "prune_by_example.parquet").stat().st_mtime_ns == stamp
    capsys.readouterr()
    assert main(["table", str(out)]) == 0
    assert "tuned KL" in capsys.readouterr().out


def test_pruning_scores_come_from_the_calibration_texts():
    tiny = make_tiny("qwen2")
    calibration = random_prompts([14, 11, 9], seed=11)
    frame = layer_pruning(tiny, _examples(), prune_sizes=[1], calibration=calibration)
    influence = frame.filter(metric="block_influence")
    assert sorted(influence["example"].unique()) == [0, 1, 2]  # one per calibration text
    run = clean_run(tiny, calibration[1])
    a, b = run.hidden[2][0], run.hidden[3][0]
    expected = float((1 - (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))).mean())
    assert influence.filter(example=1, start=2)["value"].item() == pytest.approx(expected, rel=TOL)
    mean = influence.group_by("start").agg((pl.col("value") * pl.col("n_tokens")).sum()).sort("value")
    assert frame.filter(rule="shortgpt", metric="answer_nll")["removed"][0] == str(mean["start"][0])


def test_damaged_or_blocked_lens_cache_is_one_line(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    from effdepth_core.errors import EffdepthError
    from effdepth_core.measurement.probes import tuned_lens as module

    monkeypatch.setenv("EFFDEPTH_CACHE", str(tmp_path))
    monkeypatch.setattr("effdepth_core.tasks.lens_corpus", lambda: random_prompts([15] * 20, seed=9))
    tiny = make_tiny("llama")
    training = LensTraining(train_tokens=150, heldout_tokens=60, steps=2, batch_tokens=16)
    path = module.tuned_lens_path("tiny", tiny, training)
    path.mkdir(parents=True)  # a directory where the lens would go: refused before any training
    with pytest.raises(EffdepthError, match="is not a file"):
        cached_tuned_lens("tiny", tiny, training)
    path.rmdir()
    shape = (tiny.n_layers, tiny.d_model)
    for bias, info in [
        (torch.full(shape, float("nan")), "{}"),
        (torch.zeros(shape), '{"heldout_kl_tuned": ["abc", 1, 2]}'),
        (torch.zeros(shape), "[1, 2]"),
    ]:
        weight = torch.zeros(tiny.n_layers, tiny.d_model, tiny.d_model)
        save_file({"weight": weight, "bias": bias}, str(path), metadata={"effdepth_tuned_lens": info})
        with pytest.raises(EffdepthError, match="is damaged; delete it"):
            cached_tuned_lens("tiny", tiny, training)
    assert not [p for p in path.parent.iterdir() if "effdepth-tmp" in p.name]


@pytest.mark.parametrize("ridge", ["nan", "inf", "-1"])
def test_map_ridge_must_be_finite(tiny_dir, capsys, ridge):
    from effdepth_core.cli import main

    argv = ["map", "--small", str(tiny_dir), "--big", str(tiny_dir), "--task", "addition", "--n", "4"]
    with pytest.raises(SystemExit) as refused:  # argparse reads --ridge from its declaration (options.py)
        main([*argv, "--ridge", ridge, "--no-progress"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert ("--ridge: must be at least 0" if ridge == "-1" else "--ridge: must be a finite number") in err


def test_table_skips_hand_edited_tuned_rules(tiny_dir, tmp_path, capsys):
    from effdepth_core.cli import main

    good = {"model": "m", "task": "gsm8k", "n_layers": 30, "n_examples": 2, "cosine": {"ed": 3, "ratio": 4 / 30}}
    bad = [
        {"ed": True, "ratio": 0.5},
        {"ed": 10**400, "ratio": 0.5},
        {"ed": -7, "ratio": -2.0},
        {"ed": 3, "ratio": 0.1, "ci_low": float("inf")},
    ]
    for index, entry in enumerate(bad):
        folder = tmp_path / f"run{index}"
        folder.mkdir()
        text = json.dumps({**good, "tuned_lens_kl": entry}).replace("Infinity", "1e999")
        (folder / "effective_depth.json").write_text(text)
    from effdepth_core.results import RunSettings, run

    task = tmp_path / "t.jsonl"
    task.write_text('{"prompt": "the cat sat on the mat"}\n')
    run(RunSettings(str(tiny_dir), str(task), n=1, progress=False), "cosine", tmp_path / "fine")  # a real run
    assert main(["table", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert len([line for line in out.splitlines() if line.startswith(str(tiny_dir))]) == 1  # the real run's row
    assert err.count("effdepth: warning: skipping") == len(bad), err
