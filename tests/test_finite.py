"""No probe reports or caches a non-finite number: each fails with one line naming where."""

from __future__ import annotations

import dataclasses
import math

import polars as pl
import pytest
import torch
from conftest import char_tokenizer, make_tiny, random_prompts
from hypothesis import given, settings
from hypothesis import strategies as st

from effdepth_core import results
from effdepth_core.errors import NonFiniteActivationError
from effdepth_core.measurement import registry
from effdepth_core.measurement.probes import (
    erasure_map,
    integrated_gradients,
    logit_lens,
    residual_cosine,
    skip_effects,
)
from effdepth_core.models import wrap_model
from effdepth_core.tasks import Example


def _poisoned(where: str):
    loaded = make_tiny("llama")
    with torch.no_grad():
        if where == "layer 1":
            loaded.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
        else:  # the final norm: every layer is finite, only decoding breaks
            loaded.final_norm.weight[0] = float("inf")
            loaded.final_norm.weight[1] = -float("inf")
    return loaded


PROBES = {
    "cosine": lambda m, p, e: residual_cosine(m, p),
    "logit_lens": lambda m, p, e: logit_lens(m, p),
    "skip": lambda m, p, e: skip_effects(m, p, skip_positions=1),
    "skip_slow": lambda m, p, e: skip_effects(m, p, skip_positions=1, method="slow"),
    "erasure": lambda m, p, e: erasure_map(m, e),
    "igrad": lambda m, p, e: integrated_gradients(m, e, igrad_steps=8),
}


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_a_nan_inside_a_layer_is_named(probe):
    prompts = random_prompts([16])
    examples = [(prompts[0], 3)]
    with pytest.raises(NonFiniteActivationError, match=r"output of layer 1 .*NaN or inf"):
        PROBES[probe](_poisoned("layer 1"), prompts, examples)


@pytest.mark.parametrize("probe", ["logit_lens", "skip", "erasure", "igrad"])
def test_a_broken_final_norm_is_named(probe):
    prompts = random_prompts([16])
    with pytest.raises(NonFiniteActivationError, match=r"final norm|integrated gradients of layer 0"):
        PROBES[probe](_poisoned("final norm"), prompts, [(prompts[0], 3)])
    residual_cosine(_poisoned("final norm"), prompts)  # the residual stream itself is fine


def test_early_exit_names_the_head_not_a_layers_input():
    # before: "the early-exit decode of layer 0's input", as if the residual were broken
    from effdepth_core.measurement.probes import early_exit

    prompts = random_prompts([16])
    with pytest.raises(NonFiniteActivationError, match=r"early-exit decode \(final norm \+ LM head\)"):
        early_exit(_poisoned("final norm"), [(prompts[0], 3)])


def test_nothing_non_finite_is_cached(tmp_path, monkeypatch):
    loaded = wrap_model(make_tiny("llama").model, char_tokenizer(), name="tiny")
    examples = [Example("1 + 2 =", " 3", {"task": "addition"})]
    original = registry.get("cosine")

    def with_a_nan(*args):
        frame = original.compute(*args)
        return frame.with_columns(pl.when(pl.col("layer") == 2).then(float("nan")).otherwise("value").alias("value"))

    monkeypatch.setitem(registry._all(), "cosine", dataclasses.replace(original, compute=with_a_nan))
    settings = results.RunSettings(model="tiny", task="addition", n=1, progress=False)
    with pytest.raises(NonFiniteActivationError, match="cosine probe produced 6 NaN"):
        results.run(settings, ["cosine"], tmp_path / "run", loaded=loaded, examples=examples)
    assert not list((tmp_path / "run").glob("cosine*.parquet"))


def test_deferred_finite_checks_raise_the_first_failing_one_when_the_block_ends(monkeypatch):
    """On a GPU, ``require_finite`` inside ``finite_checks_deferred`` records its check on the device
    and the block raises at its end, naming the first failing check (the CPU made to defer too)."""
    import torch

    from effdepth_core.errors import NonFiniteActivationError
    from effdepth_core.measurement import trace

    monkeypatch.setattr(trace, "_CHECKED_AT_ONCE", ())  # CPU tensors take the accelerator's road

    def tensor(*values):
        return torch.tensor(values)

    reached = []
    with pytest.raises(NonFiniteActivationError, match="layer 1 of model 'm'"):
        with trace.finite_checks_deferred():
            trace.require_finite(tensor(1.0), "layer 0", "m")
            trace.require_finite(tensor(float("nan")), "layer 1", "m")
            trace.require_finite(tensor(float("inf")), "layer 2", "m")
            reached.append("end of block")  # nothing raised inside: the checks waited
    assert reached == ["end of block"]
    with pytest.raises(ValueError, match="inner"):  # an error inside the block is not swallowed
        with trace.finite_checks_deferred():
            raise ValueError("inner")
    with pytest.raises(NonFiniteActivationError):  # outside the block a check raises at once
        trace.require_finite(tensor(float("nan")), "layer 3", "m")


@settings(max_examples=200, deadline=None)
@given(
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]),
    size=st.integers(0, 300),
    poison=st.lists(st.tuples(st.integers(0, 299), st.sampled_from([math.nan, math.inf, -math.inf])), max_size=3),
    scale=st.sampled_from([1.0, 1e-40, 1e30]),
)
def test_the_lens_checks_its_final_distribution_by_its_ends(dtype, size, poison, scale):
    """``finite_ends`` (a tensor's least and greatest entries, which the lens checks in place of
    the whole ``[token, vocab]``) is finite exactly when ``torch.isfinite(t).all()``: NaN, +inf and
    -inf anywhere, every floating dtype, empty tensors, subnormal and huge entries (an overflow to
    inf in float16 included)."""
    from effdepth_core.measurement.probes.shared.lens import finite_ends

    values = torch.randn(size, dtype=torch.float64) * scale
    for at, value in poison:
        if at < size:
            values[at] = value
    tensor = values.to(dtype)
    assert bool(torch.isfinite(finite_ends(tensor)).all()) == bool(torch.isfinite(tensor).all())
