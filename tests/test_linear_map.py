"""The cross-model linear map (method.md §7) recovers known maps and a model's map onto itself."""

from __future__ import annotations

import pytest
import torch
from conftest import char_tokenizer, make_tiny, random_prompts

from effdepth_core.errors import EffdepthError
from effdepth_core.models import wrap_model
from effdepth_core.probes import cross_model_map
from effdepth_core.probes.linear_map import fit_errors


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
    assert main([*argv, "--n", "1"]) == 2  # nothing to test on
