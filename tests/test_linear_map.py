"""The cross-model linear map (method.md §7) recovers known maps and a model's map onto itself."""

from __future__ import annotations

import pytest
import torch
from conftest import char_tokenizer, make_tiny, random_prompts

from effdepth_core.errors import EffdepthError
from effdepth_core.linear_map import cross_model_map, fit_errors
from effdepth_core.models import wrap_model


def _streams(states: torch.Tensor, batch: int):
    return lambda: (states[i : i + batch] for i in range(0, states.shape[0], batch))


@pytest.mark.parametrize("budget_mb", [1024, 0])  # 0: one small layer per pass (the bounded scheme)
def test_a_known_affine_map_is_recovered(budget_mb):
    generator = torch.Generator().manual_seed(0)
    n_train, n_test, d_small, d_big = 400, 60, 6, 9
    small = torch.randn(n_train + n_test, 3, d_small, generator=generator)  # 3 small layers
    maps = [
        (1, torch.randn(d_small, d_big, generator=generator), torch.randn(d_big, generator=generator)),
        (2, torch.randn(d_small, d_big, generator=generator), torch.randn(d_big, generator=generator)),
    ]
    big = torch.stack([small[:, m] @ a + b for m, a, b in maps], dim=1)  # big layer l = affine map of small layer l+1
    errors = fit_errors(
        _streams(small[:n_train], 37),
        _streams(big[:n_train], 37),
        small[n_train:],
        big[n_train:],
        memory_budget_mb=budget_mb,
    )
    # exact up to the float32 rounding of the states themselves (relative error 5.6e-8 seen; float32
    # eps is 6e-8), so 1e-6 of the scale; unrelated layers miss by more than half
    assert errors[1, 0] < 1e-6 and errors[2, 1] < 1e-6
    assert errors[0, 0] > 0.5 and errors[1, 1] > 0.5  # unrelated layers: no map explains them


def test_a_model_mapped_onto_itself_has_a_zero_diagonal():
    loaded = wrap_model(make_tiny("llama").model, char_tokenizer(), name="tiny")
    prompts = random_prompts([40, 40, 40, 40, 40, 40], seed=3)
    frame = cross_model_map(loaded, loaded, prompts[:4], prompts[4:])
    errors = frame.filter(metric="relative_error")
    diagonal = errors.filter(small_layer=errors["big_layer"])
    assert diagonal["value"].max() < 1e-6  # the identity map, found by least squares in float64
    best = frame.filter(metric="best_big_layer").sort("small_layer")["value"].to_list()
    assert best == [0.0, 1.0, 2.0, 3.0]
    assert frame.filter(metric="equal_depth_layer").sort("small_layer")["value"].to_list() == [0.0, 1.0, 2.0, 3.0]


def test_models_with_other_tokenizers_are_refused():
    with_tokenizer = wrap_model(make_tiny("llama").model, char_tokenizer(), name="a")
    without = make_tiny("qwen2")
    with pytest.raises(EffdepthError, match="do not share a tokenizer"):
        cross_model_map(with_tokenizer, without, ["ab"], ["cd"])


def test_the_map_command_prints_the_best_layers_and_writes_the_frame(tiny_dir, tmp_path, capsys):
    import polars as pl

    from effdepth_core.cli import main

    out = tmp_path / "map.parquet"
    argv = ["map", "--small", str(tiny_dir), "--big", str(tiny_dir), "--task", "addition", "--digits", "3"]
    assert main([*argv, "--n", "8", "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "best big l" in printed and pl.read_parquet(out).filter(metric="best_big_layer").height == 4
    assert main([*argv, "--n", "8", "--out", str(out)]) == 2  # exists: refused
    with pytest.raises(SystemExit) as refused:  # nothing to test on: --n's declared bound, argparse's exit 2
        main([*argv, "--n", "1"])
    assert refused.value.code == 2


def test_the_measured_map_chooses_its_ridge_and_beats_a_shuffled_baseline():
    from effdepth_core.linear_map import RIDGES, fit_map

    generator = torch.Generator().manual_seed(1)
    n_train, n_val, n_test, d_small, d_big = 400, 80, 80, 6, 9
    small = torch.randn(n_train + n_val + n_test, 2, d_small, generator=generator)
    a, b = torch.randn(d_small, d_big, generator=generator), torch.randn(d_big, generator=generator)
    noise = 0.01 * torch.randn(small.shape[0], d_big, generator=generator)
    big = torch.stack([small[:, 1] @ a + b + noise, torch.randn(small.shape[0], d_big, generator=generator)], dim=1)
    split = (slice(0, n_train), slice(n_train, n_train + n_val), slice(n_train + n_val, None))
    fit = fit_map(
        _streams(small[split[0]], 50),
        _streams(big[split[0]], 50),
        (small[split[1]], big[split[1]]),
        (small[split[2]], big[split[2]]),
    )
    # the noise is 1% of the signal's scale: the map's error is about that; shuffling the pairs
    # leaves only the mean (error ~1); the unrelated big layer stays near 1 either way
    assert fit.errors[1, 0] < 0.05 and fit.baseline[1, 0] > 0.5
    assert fit.errors[0, 1] > 0.5
    assert fit.ridges.shape == (2, 2) and all(float(r) in RIDGES for r in fit.ridges.flatten())
    assert torch.allclose(fit.per_token.mean(dim=0), fit.errors)


def test_a_model_measured_onto_itself(tmp_path, monkeypatch):
    import polars as pl

    from effdepth_core.linear_map import map_measurement

    loaded = wrap_model(make_tiny("llama").model, char_tokenizer(), name="tiny")
    prompts = random_prompts([40] * 12, seed=3)
    frame = map_measurement(loaded, loaded, prompts[:6], prompts[6:8], prompts[8:])
    overall = frame.filter(pl.col("prompt").is_null())
    for metric in ("relative_error", "self_error"):
        rows = overall.filter(metric=metric)
        assert rows.filter(small_layer=rows["big_layer"])["value"].max() < 1e-6  # the identity, in float64
    baseline = overall.filter(metric="baseline_error")
    assert baseline.filter(small_layer=baseline["big_layer"])["value"].min() > 0.1  # shuffled pairs: no identity
    per_prompt = frame.filter(pl.col("prompt").is_not_null())
    assert sorted(per_prompt["prompt"].unique().to_list()) == [0, 1, 2, 3]  # equal lengths: means of means
    mean = per_prompt.group_by("small_layer", "big_layer").agg(pl.col("value").mean())
    joined = mean.join(overall.filter(metric="relative_error"), on=["small_layer", "big_layer"], suffix="_all")
    assert (joined["value"] - joined["value_all"]).abs().max() < 1e-9
    assert overall.filter(metric="best_big_layer").sort("small_layer")["value"].to_list() == [0.0, 1.0, 2.0, 3.0]


def test_the_map_run_directory_is_read_back_without_models(tiny_dir, tmp_path, monkeypatch):
    from effdepth_core import map_run
    from effdepth_core.settings import MapSettings

    settings = MapSettings(str(tiny_dir), str(tiny_dir), task="addition", digits=3, n=3, n_validation=2, progress=False)
    out = tmp_path / "map"
    first = map_run.run_map(settings, out)
    assert first.filter(metric="n_train_tokens")["value"][0] >= 10 * 32  # ten times the tiny width
    monkeypatch.setattr(map_run, "load_model", lambda *a, **k: pytest.fail("the map was computed again"))
    again = map_run.run_map(settings, out)
    assert again.sort(again.columns, nulls_last=True).equals(first.sort(first.columns, nulls_last=True))
    # the book's cached-only reading and the grid's plan see it as finished too (a map has no ED summary)
    from effdepth_book import grid, study

    pair = {"small": str(tiny_dir), "big": str(tiny_dir), "task": "addition", "digits": 3, "n": 3, "n_validation": 2}
    settings_again, where = study.map_settings(pair, {"progress": False}, tmp_path / "book")
    assert settings_again.key() == settings.key()
    where.parent.mkdir(parents=True)
    out.rename(where)  # the same run directory, where the book's results folder names it
    read = study.map_study(pair, {"progress": False}, tmp_path / "book", cached_only=True)
    assert read.height == first.height
    assert grid.MapCell("beyond", "map", pair, {"progress": False}, tmp_path / "book").state() == "cached"


def test_the_self_map_check_runs_the_maps_own_ridge_choice(monkeypatch):
    """The self-map check must test the procedure the map used, ridge choice included (it once fitted
    without a ridge and so hid that the choice shrank the diagonal)."""
    from effdepth_core import linear_map

    calls = []
    real = linear_map.fit_map

    def spy(*args, **kwargs):
        calls.append(args[4] if len(args) > 4 else kwargs.get("ridges", linear_map.RIDGES))
        return real(*args, **kwargs)

    monkeypatch.setattr(linear_map, "fit_map", spy)
    loaded = wrap_model(make_tiny("llama").model, char_tokenizer(), name="tiny")
    prompts = random_prompts([40] * 12, seed=3)
    linear_map.map_measurement(loaded, loaded, prompts[:6], prompts[6:8], prompts[8:])
    assert [tuple(c) for c in calls] == [tuple(linear_map.RIDGES)] * 2


def test_each_map_chooses_its_own_ridge_so_a_self_map_is_the_identity():
    """One ridge per small layer, chosen over every big layer, is pulled up by targets that gain from
    shrinkage (here a noise layer, overfitted with 3 tokens per unknown) and shrinks the identity map
    beside them; chosen per map, the identity keeps ridge 0."""
    from effdepth_core.linear_map import fit_map

    generator = torch.Generator().manual_seed(4)
    small = torch.randn(160, 1, 16, generator=generator, dtype=torch.float64)
    big = torch.cat([small, torch.randn(160, 3, 16, generator=generator, dtype=torch.float64)], dim=1)
    train, val, test = slice(0, 60), slice(60, 110), slice(110, None)
    fit = fit_map(
        _streams(small[train], 20), _streams(big[train], 20), (small[val], big[val]), (small[test], big[test])
    )
    assert fit.ridges[0, 0] == 0.0 and fit.errors[0, 0] < 1e-9  # float64 identity
    assert (fit.ridges[0, 1:] > 0).all()  # noise targets: a ridge beats least squares on held-out tokens
    # the old rule, one ridge for the small layer: the best mean validation error over all four targets
    pooled = fit_map(
        _streams(small[train], 20),
        _streams(big[train], 20),
        (small[val], big[val]),
        (small[test], big[test]),
        ridges=(float(fit.ridges[0, 1:].max()),),
    )
    assert pooled.errors[0, 0] > 1e-3  # what the pooled choice would have done to the identity


def test_a_ridge_is_a_share_of_each_dimension_so_a_self_map_stays_the_identity():
    """A residual stream's massive dimension must not set every dimension's penalty: with a ridge of
    1e-3 of each dimension's own second moment a self-map shrinks by about 1e-3; as a share of the
    mean diagonal (dimension 0 a thousand times the others) it would shrink the rest by ~10 %."""
    from effdepth_core.linear_map import fit_map

    generator = torch.Generator().manual_seed(2)
    states = torch.randn(600, 2, 16, generator=generator, dtype=torch.float64)
    states[:, :, 0] *= 1000.0  # one massive activation dimension
    train, val, test = states[:400], states[400:500], states[500:]
    fit = fit_map(_streams(train, 50), _streams(train, 50), (val, val), (test, test), ridges=(1e-3,))
    # shrinkage share/(1 + share) per uncorrelated dimension: ~1e-3 of each state's norm, 2e-3 leaves
    # room for the sample's correlations; the mean-diagonal penalty gives ~0.1 here
    assert fit.errors.diagonal().max() < 2e-3
    assert (fit.ridges == 1e-3).all()
