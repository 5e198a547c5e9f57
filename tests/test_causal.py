"""Causal probes: fast paths equal the one-forward-per-intervention oracles on every architecture,
plus hand-checked invariants (skipping nothing, erasing with the true residual, completeness)."""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest
import torch
from conftest import ARCHS, make_tiny, random_prompts

from effdepth_core.cli import main
from effdepth_core.errors import EffdepthError
from effdepth_core.measurement import replay
from effdepth_core.measurement.probes import depth_score, depth_scores, erasure_map, integrated_gradients, skip_effects
from effdepth_core.measurement.probes.erasure import _map_fast
from effdepth_core.measurement.probes.igrad import make_baseline, quadrature_rule
from effdepth_core.measurement.probes.shared.answers import AnswerSplit, answer_split
from effdepth_core.measurement.probes.skip import Intervention, _effects_fast, sample_positions
from effdepth_core.measurement.replay import clean_run, run_suffix_layer
from effdepth_core.tasks import Example

SKIP_KEYS = ["example", "variant", "position", "part", "skipped_layer", "layer", "metric"]


def _max_diff(a: pl.DataFrame, b: pl.DataFrame, keys: list[str]) -> float:
    joined = a.join(b, on=keys, how="full", suffix="_b", nulls_equal=True)
    assert joined.height == a.height == b.height
    return float((joined["value"] - joined["value_b"]).abs().max())


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_skip_fast_equals_slow(arch):
    loaded = make_tiny(arch)
    prompts = random_prompts([21, 30])
    fast = skip_effects(loaded, prompts, max_rows=2)  # chunks smaller than the layer count
    slow = skip_effects(loaded, prompts, method="slow")
    # positions range(8, T-4, 8): 2 for T=21, 3 for T=30; plus the current-token variant each
    assert fast.height == 3 * ((1 + 2) + (1 + 3)) * loaded.n_layers * (loaded.n_layers + 1)
    assert _max_diff(fast, slow, SKIP_KEYS) < 1e-5
    assert fast["value"].max() > 0.05  # the interventions do something


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_prefix_replay_reproduces_the_clean_run(arch):
    # replaying positions cut..stop-1 against the cached keys/values of positions < cut must give
    # the clean pass's residuals there: the prefix reuse of erasure and the future-token skip rests on it
    loaded = make_tiny(arch)
    run = clean_run(loaded, random_prompts([14])[0])
    # every architecture takes the prefix path but one whose blocks get a bias over the keys with the
    # batch folded in (BLOOM's ALiBi), which effdepth does not slice: it replays whole prompts
    assert run.reuses_prefixes == (not loaded.adapter.folded_kwargs)
    if not run.reuses_prefixes:
        return
    scale = max(float(h.abs().max()) for h in run.hidden)
    for cut, stop in ((1, 14), (5, 14), (6, 10), (13, 14)):
        hidden = run.hidden[0][:, cut:stop].expand(2, -1, -1)  # two rows: the prefix broadcasts
        with torch.no_grad():
            for layer in range(loaded.n_layers):
                hidden, (keys, _) = run_suffix_layer(loaded, run, layer, hidden, cut)
                # float32 rounding of a batched replay against the one-row pass: ~1e-6 of the scale
                assert (hidden - run.hidden[layer + 1][:, cut:stop]).abs().max() < 1e-5 * scale
                assert keys.shape[2] == stop
                assert torch.allclose(keys[:1, :, :cut], run.keys_values[layer][0][:, :, :cut])


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_future_only_skip_fast_equals_slow(arch):
    # without the all-token variant the fast path records the skipped prefixes on its own
    loaded = make_tiny(arch)
    prompts = random_prompts([26])
    fast = skip_effects(loaded, prompts, skip_variants=("future",), max_rows=2)
    slow = skip_effects(loaded, prompts, skip_variants=("future",), method="slow")
    assert fast.height == 3 * 2 * loaded.n_layers * (loaded.n_layers + 1)  # cuts 8 and 16
    assert _max_diff(fast, slow, SKIP_KEYS) < 1e-5
    assert fast["value"].max() > 0.05


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_fast_paths_without_prefix_reuse_equal_slow(arch, monkeypatch):
    # an attention kernel whose mask effdepth cannot slice (flash) falls back to whole-prompt replays
    monkeypatch.setattr(replay, "_PREFIX_ATTENTION", ())
    loaded = make_tiny(arch)
    prompts = random_prompts([21])
    assert not clean_run(loaded, prompts[0]).reuses_prefixes
    fast = skip_effects(loaded, prompts, max_rows=2)
    assert _max_diff(fast, skip_effects(loaded, prompts, method="slow"), SKIP_KEYS) < 1e-5
    items = [(prompts[0], 4)]
    fast = erasure_map(loaded, items, max_rows=5)
    slow = erasure_map(loaded, items, method="slow")
    assert _max_diff(fast, slow, ["example", "layer", "position", "metric"]) < 1e-5


def test_skip_invariants():
    loaded = make_tiny("llama")
    ids = random_prompts([24])[0]
    frame = skip_effects(loaded, [ids], skip_parts=("layer",))
    future = frame.filter(variant="future", metric="layer_effect")
    # by causality a skip cannot change layers at or before it on future tokens
    assert future.filter(pl.col("layer") <= pl.col("skipped_layer"))["value"].abs().max() == 0.0
    assert future.filter(pl.col("layer") > pl.col("skipped_layer"))["value"].min() > 0.0
    # skipping a whole layer at every token but the first removes its contribution there: effect 1
    current = frame.filter(variant="current", metric="layer_effect")
    assert current.filter(pl.col("layer") == pl.col("skipped_layer"))["value"].to_list() == pytest.approx([1.0] * 3)
    # skipping at no position changes nothing
    run = clean_run(loaded, ids)
    empty = [Intervention("future", 8, part, 1, slice(1, 1), slice(8, 24)) for part in ("layer", "attn", "mlp")]
    for item in empty:
        with torch.no_grad():
            probs = torch.softmax(loaded.head(run.hidden[-1][0, item.measure]), -1)
        effects, outputs = _effects_fast(loaded, run, [item], probs)
        assert effects.abs().max() < 1e-6 and outputs.abs().max() < 1e-6


def test_skip_positions_are_seeded_and_in_range():
    positions = sample_positions(100, 4, seed=3, example=0)
    assert positions == sample_positions(100, 4, seed=3, example=0)
    assert len(positions) == 4 and set(positions) <= set(range(8, 96, 8))
    assert sample_positions(100, 4, seed=3, example=1) != positions or sample_positions(100, 4, 4, 0) != positions
    assert sample_positions(12, 4, 0, 0) == []  # range(8, 8, 8) is empty


def test_a_short_prompt_records_the_skip_positions_measured_not_those_asked():
    """A 17-token prompt has room for one cut position (8; 16 is past T−5) where 4 are asked: the
    call says so in one warning, and the summary records the positions measured per prompt (by
    hand: 37 tokens → range(8, 33, 8) = 4 positions; 17 tokens → 1)."""
    from effdepth_core.measurement.probes.skip import _summarize, positions_used

    loaded = make_tiny("llama")
    prompts = [torch.arange(3, 40) % 60 + 3, torch.arange(3, 20)]
    with pytest.warns(match=r"1 prompt\(s\) have room for fewer than the 4 skip positions asked .*prompt 1: 1"):
        frame = skip_effects(loaded, prompts, skip_positions=4, skip_parts="layer")
    assert positions_used(frame) == {"fewest": 1, "most": 4}
    assert _summarize({"skip_by_example": frame})["skip_positions_used"] == {"fewest": 1, "most": 4}
    assert positions_used(frame.filter(variant="current")) is None


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_erasure_fast_equals_slow(arch):
    loaded = make_tiny(arch)
    items = [(ids, 4) for ids in random_prompts([14, 9])]
    fast = erasure_map(loaded, items, max_rows=5)
    slow = erasure_map(loaded, items, method="slow")
    assert fast.height == (14 + 9) * (loaded.n_layers + 1)
    assert _max_diff(fast, slow, ["example", "layer", "position", "metric"]) < 1e-5
    last = fast.filter(pl.col("position") == pl.col("position").max().over("example"))
    assert last["value"].abs().max() == 0.0  # the last token predicts nothing inside the prompt


def _reachable(loaded, layer: int, position: int, n_tokens: int) -> set[int]:
    """Positions that a change to h_layer[position] can reach through the remaining layers: each
    sliding-window layer moves information at most window − 1 positions ahead (HF's mask lets
    query q see keys q − window < k ≤ q), a full-attention layer anywhere after it."""
    config = loaded.model.config
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None) or ["sliding_attention" if window else "full_attention"] * 3
    last = position
    for index in range(layer, loaded.n_layers):
        last = last + window - 1 if types[index] == "sliding_attention" else n_tokens
    return set(range(position, min(last, n_tokens - 1) + 1))


@pytest.mark.parametrize("arch", ["gemma3_text", "gemma2", "mistral", "llama"])
def test_erasing_with_the_true_residual_changes_nothing(arch):
    loaded = make_tiny(arch)
    ids = random_prompts([12])[0]
    run = clean_run(loaded, ids)
    position = 5
    truth = torch.stack([h[0, position] for h in run.hidden])  # [L+1, d]: h_l at that position
    effects = _map_fast(loaded, AnswerSplit(ids, 4), truth, max_rows=4)
    assert effects[:, position].abs().max() < 1e-6
    # other positions change the answer where the architecture lets them reach a position that
    # predicts an answer token (7..10 of the 11 run), and only there: with 4-token sliding windows
    # in every layer (tiny Gemma 3) early positions cannot. Unreachable effects are 0 up to float32
    # rounding of probabilities ≤ 1 (≤ 1e-7 measured, as the batched replay rounds differently from
    # the clean pass); reachable ones are ≥ 4e-3 here, so 1e-5 separates them with margin both ways.
    measured = set(range(12 - 1 - 4, 12 - 1))
    for layer in range(loaded.n_layers):
        for earlier in range(position):
            reaches = bool(_reachable(loaded, layer, earlier, 11) & measured)
            assert (effects[layer, earlier] > 1e-5) == reaches, (layer, earlier, float(effects[layer, earlier]))


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_igrad_fast_equals_slow_and_is_complete(arch):
    loaded = make_tiny(arch)
    items = [(ids, 3) for ids in random_prompts([11])]
    fast = integrated_gradients(loaded, items, igrad_steps=8, igrad_quadrature="gauss", max_rows=3)
    slow = integrated_gradients(loaded, items, igrad_steps=8, igrad_quadrature="gauss", method="slow")
    assert _max_diff(fast, slow, ["example", "layer", "position", "metric"]) < 1e-6
    # the published script's loop: 3 values of α per pass as batch rows from the layer on (16 there)
    blocked = integrated_gradients(loaded, items, igrad_steps=8, igrad_quadrature="gauss", method="slow", slow_block=3)
    assert _max_diff(blocked, slow, ["example", "layer", "position", "metric"]) < 1e-6
    # 48 nodes: Granite's tiny layer 0 is smooth but sharp (gap 2.3 % at 24 nodes, 7e-6 at 48)
    precise = integrated_gradients(loaded, items, igrad_steps=48, igrad_quadrature="gauss")
    delta = precise.filter(metric="target_delta")["value"].abs()
    gap = precise.filter(metric="completeness_gap")["value"].abs()
    # Σ attributions = target(h) − target(b) for a smooth path. A router's top-k choice switches along
    # the path, so a mixture of experts' integrand jumps and a fixed Gauss rule has no bound there
    # (qwen3_moe 0.56 % at 24 nodes, mixtral's layer 0 a gap 4× its change): the adaptive rule's
    # business (test_adaptive_rule_…); the fast path still equals the oracle above. OPT's ReLU has a
    # kink where a unit switches off along the path: no smooth integrand either (2 % gap at 48 nodes)
    if arch not in ("qwen3_moe", "mixtral", "opt"):
        assert (gap <= 1e-3 * delta + 1e-7).all()
    attribution = precise.filter(metric="attribution")
    assert attribution.filter(position=10)["value"].abs().max() == 0.0  # the last token cannot matter


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_igrad_batched_rows_equal_one_row_per_pass(arch):
    """The fast path's α rows per pass (the memory budget's choice: all of them here) give the same
    attributions as one row per pass, for a fixed rule and for the adaptive rule."""
    loaded = make_tiny(arch)
    items = [(ids, 3) for ids in random_prompts([11])]
    keys = ["example", "layer", "position", "metric"]
    for rule in (
        {"igrad_steps": 16, "igrad_quadrature": "riemann"},
        {"igrad_steps": 16, "igrad_quadrature": "adaptive"},
    ):
        one = integrated_gradients(loaded, items, max_rows=1, **rule)
        batched = integrated_gradients(loaded, items, **rule)
        # float32 replays of 1 and 16 rows round differently; attributions are O(1e-2..1) here and
        # agree to ~1e-7, so 1e-5 of the largest one separates rounding from a wrong row
        scale = float(one.filter(metric="attribution")["value"].abs().max())
        assert _max_diff(one, batched, keys) <= 1e-5 * max(scale, 1.0)


def test_adaptive_rule_halving_several_panels_per_round_meets_the_same_tolerance():
    loaded = make_tiny("gemma3_text")
    items = [(ids, 3) for ids in random_prompts([11])]
    # a tolerance tight enough that some layer needs several rounds, so halving more than the worst
    # panel per round changes which nodes are spent (at looser ones both stop after the same round)
    rule = {"igrad_steps": 16, "igrad_quadrature": "adaptive", "igrad_tol": 1e-5}
    one = integrated_gradients(loaded, items, **rule)
    several = integrated_gradients(loaded, items, igrad_panels=8, **rule)
    fine = integrated_gradients(loaded, items, igrad_steps=96, igrad_quadrature="gauss")
    spent = [r.filter(metric="grad_evals").sort("layer")["value"].to_list() for r in (one, several)]
    assert spent[0] != spent[1]  # the batched rounds ran
    b = fine.filter(metric="attribution").sort("layer", "position")["value"].to_numpy()
    for result in (one, several):
        a = result.filter(metric="attribution").sort("layer", "position")["value"].to_numpy()
        # the rules stop at 1e-5 of each layer's target change (or its float32 rounding floor, 1e-4
        # of the target's magnitude); 1e-3 of the largest attribution bounds the per-position errors
        # a summed tolerance does not bound one by one
        assert np.abs(a - b).max() <= 1e-3 * np.abs(b).max()


def test_igrad_rows_follow_the_memory_budget():
    from effdepth_core.measurement.probes.igrad import rows_for_budget

    loaded = make_tiny("llama")
    small = rows_for_budget(loaded, n_tokens=32, first_layer=1, n_answer=3, budget_bytes=1 << 20)
    large = rows_for_budget(loaded, n_tokens=32, first_layer=1, n_answer=3, budget_bytes=1 << 30)
    later = rows_for_budget(loaded, n_tokens=32, first_layer=loaded.n_layers - 1, n_answer=3, budget_bytes=1 << 20)
    assert 1 <= small < large and later > small  # fewer replayed layers: more rows in the same memory
    assert rows_for_budget(loaded, n_tokens=32, first_layer=1, n_answer=3, budget_bytes=1) == 1


def test_gauss_reaches_the_256_step_riemann_result():
    loaded = make_tiny("llama")
    items = [(ids, 3) for ids in random_prompts([11])]
    riemann = integrated_gradients(loaded, items, igrad_steps=256, igrad_quadrature="riemann", max_rows=64)
    gauss = integrated_gradients(loaded, items, igrad_steps=16, igrad_quadrature="gauss")
    diff = _max_diff(
        riemann.filter(metric="attribution"),
        gauss.filter(metric="attribution"),
        ["example", "layer", "position", "metric"],
    )
    riemann_gap = riemann.filter(metric="completeness_gap")["value"].abs().max()
    gauss_gap = gauss.filter(metric="completeness_gap")["value"].abs().max()
    assert gauss_gap < riemann_gap  # 16 Gauss nodes are closer to the exact integral than 256 Riemann steps
    assert diff < 2 * riemann_gap + 1e-6  # and agree with Riemann to within Riemann's own error


def test_adaptive_rule_is_complete_and_agrees_with_a_fine_rule():
    loaded = make_tiny("gemma3_text")
    items = [(ids, 3) for ids in random_prompts([11])]
    adaptive = integrated_gradients(loaded, items, igrad_steps=64, igrad_quadrature="adaptive")
    fine = integrated_gradients(loaded, items, igrad_steps=96, igrad_quadrature="gauss")
    delta = adaptive.filter(metric="target_delta")["value"].abs()
    assert (adaptive.filter(metric="completeness_gap")["value"].abs() <= 1e-3 * delta + 1e-7).all()
    a = adaptive.filter(metric="attribution").sort("layer", "position")["value"].to_numpy()
    b = fine.filter(metric="attribution").sort("layer", "position")["value"].to_numpy()
    assert np.abs(a - b).max() <= 1e-3 * np.abs(b).max()
    with pytest.raises(ValueError, match="no slow path"):
        integrated_gradients(loaded, items, igrad_quadrature="adaptive", method="slow")
    with pytest.raises(ValueError, match="at least 4"):
        integrated_gradients(loaded, items, igrad_steps=2, igrad_quadrature="adaptive")


def test_quadrature_and_baselines():
    nodes, weights = quadrature_rule("gauss", 3)
    assert float((weights * nodes**5).sum()) == pytest.approx(1 / 6, abs=1e-12)  # exact up to degree 5
    nodes, weights = quadrature_rule("riemann", 4)
    assert nodes.tolist() == [0.0, 0.25, 0.5, 0.75] and float(weights.sum()) == pytest.approx(1.0)
    h = torch.arange(6.0).view(1, 2, 3)  # [1, token, d]
    assert make_baseline(h, "position-mean")[0].tolist() == [[1.5, 2.5, 3.5]] * 2
    assert make_baseline(h, "hidden-mean")[0].tolist() == [[1.0] * 3, [4.0] * 3]
    with pytest.raises(ValueError):
        quadrature_rule("simpson", 4)


def test_depth_score_by_hand():
    assert depth_score([0, 1, 1, 2]) == pytest.approx((0 + 1 + 2 + 6) / 4)
    assert math.isnan(depth_score([0, 0, 0]))
    rows = []
    for example, e in enumerate([[1.0, 0.0, 0.0], [0.0, 0.0, 2.0]]):
        for layer, value in enumerate(e):
            rows.append(("future", 8, "layer", layer, None, "output_effect", value, example))
            rows.append(("future", 16, "layer", layer, None, "output_effect", value / 2, example))
    skip = pl.DataFrame(
        rows,
        schema=["variant", "position", "part", "skipped_layer", "layer", "metric", "value", "example"],
        orient="row",
    )
    scores = depth_scores(skip, {0: "easy", 1: "hard"})
    per_example = scores.filter(pl.col("example").is_not_null()).sort("example")["value"].to_list()
    assert per_example == [0.0, 2.0]
    both = depth_scores(skip).filter(pl.col("example").is_null(), metric="depth_score")["value"][0]
    assert both == pytest.approx((0 * 1 + 2 * 2) / 3)  # from the max importance over prompts: [1, 0, 2]


def test_answer_split_uses_the_question_prefix():
    from conftest import char_tokenizer

    from effdepth_core.models import wrap_model

    loaded = make_tiny("llama")
    loaded = wrap_model(loaded.model, char_tokenizer(), name="tiny")
    ids, n_answer = answer_split(loaded, Example("1 + 2 =", " 3"))
    assert ids.numel() == 9 and n_answer == 2  # " 3" is two characters
    with pytest.raises(EffdepthError, match="needs examples with an answer"):
        answer_split(loaded, Example("no answer here"))


def test_cli_runs_the_causal_probes(tiny_dir, tmp_path, capsys):
    out = tmp_path / "causal"
    argv = ["run", "--model", str(tiny_dir), "--task", "addition", "--digits", "3", "--n", "2", "--out", str(out)]
    argv += ["--probes", "skip,erasure,igrad", "--igrad-steps", "4", "--no-progress"]
    assert main(argv) == 0
    for name in ("skip", "erasure", "igrad", "depth_score"):
        assert (out / f"{name}.parquet").is_file(), name
    summary = json.loads((out / "effective_depth.json").read_text())
    assert set(summary["depth_score"]) == {"3 digits"}
    skip = pl.read_parquet(out / "skip.parquet")
    assert {"value", "mean", "std"} <= set(skip.columns)
    assert "depth score" in capsys.readouterr().out
    code = main([*argv[:-1], "--slow"])
    assert code == 2 and "--igrad-quadrature riemann" in capsys.readouterr().err
    no_answers = tmp_path / "plain.jsonl"
    no_answers.write_text(json.dumps({"prompt": "abc def"}) + "\n")
    code = main(
        [
            "run",
            "--model",
            str(tiny_dir),
            "--task",
            str(no_answers),
            "--probes",
            "erasure",
            "--out",
            str(tmp_path / "x"),
            "--no-progress",
        ]
    )
    assert code == 2 and "needs examples with an answer" in capsys.readouterr().err


def _max_relative_diff(a: pl.DataFrame, b: pl.DataFrame, keys: list[str]) -> float:
    """Largest |a − b| over the largest |b| of the frame (the values' scale)."""
    return _max_diff(a, b, keys) / max(float(b["value"].abs().max()), 1e-30)


@pytest.mark.real_model
@pytest.mark.slow
def test_fast_equals_slow_on_the_default_model(smollm2):
    # The fast paths run the same float32 arithmetic in batches of other shapes than the one-row
    # slow path, so BLAS sums in another order: over 30 layers (forward and, for igrad, backward)
    # that rounds differently by up to ~1e-5 of the values' scale (1.5e-5 absolute seen on one
    # CPU, 2.6e-8 on another, for values up to 1.7). 1e-4 of the scale leaves that margin on any
    # CPU or thread count, while a real error (a wrong layer, position or step) moves values by
    # percents of their scale.
    tolerance = 1e-4
    (example,) = [Example("Give the answer directly: 12 + 34 =", " 46")]
    skip_kw = dict(skip_parts=("layer",), skip_variants=("future",), skip_positions=1)
    fast = skip_effects(smollm2, [example.prompt], **skip_kw)
    slow = skip_effects(smollm2, [example.prompt], method="slow", **skip_kw)
    assert _max_relative_diff(fast, slow, SKIP_KEYS) < tolerance
    fast = erasure_map(smollm2, [example])
    slow = erasure_map(smollm2, [example], method="slow")
    assert _max_relative_diff(fast, slow, ["example", "layer", "position", "metric"]) < tolerance
    fast = integrated_gradients(smollm2, [example], igrad_steps=4, igrad_quadrature="riemann", layers=[3, 25])
    slow = integrated_gradients(
        smollm2, [example], igrad_steps=4, igrad_quadrature="riemann", method="slow", layers=[3, 25]
    )
    assert _max_relative_diff(fast, slow, ["example", "layer", "position", "metric"]) < tolerance
    np.testing.assert_array_less(-1e-9, fast.filter(metric="target_delta")["value"].abs().to_numpy())


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_the_kl_change_at_the_output_fast_equals_slow_and_leaves_the_layer_effects(arch):
    loaded = make_tiny(arch)
    prompts = random_prompts([21])
    fast = skip_effects(loaded, prompts, max_rows=2, output_metric="kl")
    slow = skip_effects(loaded, prompts, method="slow", output_metric="kl")
    # KL values are O(0.01–1) nats here; 1e-5 is float32 rounding of sums over a 64-token vocabulary
    assert _max_diff(fast, slow, SKIP_KEYS) < 1e-5
    l2 = skip_effects(loaded, prompts, max_rows=2)
    assert set(fast["metric"]) == {"layer_effect", "output_kl"} and "output_effect" in set(l2["metric"])
    layer_keys = [k for k in SKIP_KEYS if k != "metric"]
    same = fast.filter(metric="layer_effect").join(l2.filter(metric="layer_effect"), on=layer_keys, nulls_equal=True)
    assert same.height == l2.filter(metric="layer_effect").height and (same["value"] == same["value_right"]).all()
    assert fast.filter(metric="output_kl")["value"].min() >= -1e-6  # a KL is never negative
    items = [(ids, 4) for ids in random_prompts([14])]
    erased = erasure_map(loaded, items, max_rows=5, output_metric="kl")
    erased_slow = erasure_map(loaded, items, method="slow", output_metric="kl")
    assert set(erased["metric"]) == {"erasure_kl"}
    assert _max_diff(erased, erased_slow, ["example", "layer", "position", "metric"]) < 1e-5


def test_the_output_change_by_hand():
    from effdepth_core.measurement.probes.shared.output_change import change_of

    clean = torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.8, 0.1]])  # [token, vocab]
    logits = torch.log(torch.tensor([[[0.25, 0.5, 0.25], [0.1, 0.8, 0.1]]]))  # one row; token 1 unchanged
    kl = 0.5 * math.log(0.5 / 0.25) + 0.25 * math.log(0.25 / 0.5)  # KL(clean ‖ changed) at token 0
    assert change_of(clean, logits, "kl").item() == pytest.approx(kl, rel=1e-6)
    assert change_of(clean, logits, "l2").item() == pytest.approx(math.sqrt(2 * 0.25**2), rel=1e-6)
    with pytest.raises(EffdepthError, match="output_metric must be one of l2, kl"):
        skip_effects(make_tiny("llama"), random_prompts([21]), output_metric="js")


def test_skip_summary_is_the_same_bytes_whatever_the_row_order():
    """Identical runs write identical files: the summary's sums see each group's prompts in one order
    (the per-prompt maxima came out of a hash group-by in any order, and a std's 17th digit moved)."""
    from effdepth_core.measurement.probes.skip import skip_summary

    frame = skip_effects(make_tiny("llama"), random_prompts([21, 24, 19, 22]), skip_positions=2, skip_parts=("layer",))
    summary = skip_summary(frame)
    for seed in range(5):
        assert skip_summary(frame.sample(fraction=1.0, shuffle=True, seed=seed)).equals(summary)
    keys = ["variant", "part", "skipped_layer", "layer", "metric"]
    row = summary.row(0, named=True)
    group = frame.filter(*((pl.col(k) == row[k]) if row[k] is not None else pl.col(k).is_null() for k in keys))
    maxima = [group.filter(example=e)["value"].max() for e in sorted(set(group["example"]))]  # one per prompt
    assert row["value"] == max(maxima) and row["mean"] == pytest.approx(np.mean(maxima), rel=1e-12)
    assert row["std"] == pytest.approx(np.std(maxima, ddof=1), rel=1e-12)  # sample std, as polars gives it


def test_a_layer_failing_in_a_replay_is_one_line_but_running_out_of_memory_stays_itself():
    """A layer that raises on recorded arguments is a model effdepth cannot replay (one line, a
    ``ReplayError``); an out-of-memory error is the caller's memory, never reported as the model."""
    from effdepth_core.measurement.replay import ReplayError, clean_run, run_layer

    loaded = make_tiny("llama")
    run = clean_run(loaded, random_prompts([9])[0])
    layer = loaded.layers[1]
    for raised, expected in (
        (ValueError("bad mask"), ReplayError),
        (torch.OutOfMemoryError("no memory"), torch.OutOfMemoryError),
    ):

        def fail(*args, raised=raised, **kwargs):
            raise raised

        layer.forward = fail
        try:
            with pytest.raises(expected) as caught:
                run_layer(loaded, run, 1, run.hidden[1].expand(2, -1, -1))
        finally:
            del layer.forward
        assert "\n" not in str(caught.value)
        assert (expected is ReplayError) == (
            "cannot have its layers replayed one by one (ValueError: bad mask)" in str(caught.value)
        )
