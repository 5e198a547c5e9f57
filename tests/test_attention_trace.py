"""Attention patterns as a trace (issue 45): ``trace_layers(..., attention=True)`` hands each layer's
attention weights per head to a measurement, equal to what the model returns with
``output_attentions`` for each prompt alone; the model's own attention kernel is back afterwards;
the attention-entropy probe, one file on that trace, equals its oracle from ``output_attentions``."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny, random_prompts

from effdepth_core.measurement.probes.attention_entropy import attention_entropy
from effdepth_core.measurement.trace import Hook, intervene, iter_batches, trace_layers

ARCHS = ("llama", "gemma3_text", "gpt2", "gpt_neox", "qwen3")


def _own_attentions(loaded, ids: torch.Tensor) -> list[torch.Tensor]:
    """The model's attention weights per layer for one prompt alone ``[head, query, key]``, as
    transformers returns them (``output_attentions``, eager kernel)."""
    config = loaded.model.config
    before = config._attn_implementation
    config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            out = loaded.model(input_ids=ids[None], output_attentions=True, use_cache=False)
    finally:
        config._attn_implementation = before
    return [a[0] for a in out.attentions]


@pytest.mark.parametrize("arch", ARCHS)
def test_the_attention_trace_is_the_models_own_attention_and_its_kernel_is_restored(arch):
    """Prompts of other lengths, padded together: each layer's traced weights at a prompt's own
    queries and keys equal ``output_attentions`` of that prompt alone; the implementation the
    model had (sdpa here) is its own again after the block."""
    loaded = make_tiny(arch)
    loaded.model.config._attn_implementation = "sdpa"
    prompts = random_prompts([9, 5, 12])
    traced: dict[int, torch.Tensor] = {}
    batch = next(iter(iter_batches(prompts, 3, loaded.input_device)))
    with torch.no_grad(), trace_layers(loaded, lambda t: traced.__setitem__(t.layer, t.attention), attention=True):
        assert loaded.model.config._attn_implementation == "eager"
        loaded.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
    assert loaded.model.config._attn_implementation == "sdpa"
    assert sorted(traced) == list(range(loaded.n_layers))
    for row, ids in enumerate(prompts):
        n = ids.numel()
        for layer, own in enumerate(_own_attentions(loaded, ids)):
            ours = traced[layer][row, :, :n, :n]
            assert ours.shape == own.shape
            # float32 softmax of the same scores in another batch shape: rounding of ~1e-7 of weights ≤ 1
            assert float((ours - own).abs().max()) < 1e-5
            padded_keys = traced[layer][row, :, :n, n:]
            assert padded_keys.numel() == 0 or float(padded_keys.abs().max()) == 0.0  # padded keys get nothing


def test_an_outputs_hook_sees_every_output_and_may_replace_them():
    """``Hook(where="outputs")`` hands the whole output, the attention weights included, and what
    it returns replaces the whole output."""
    loaded = make_tiny("llama")
    attn = loaded.layers[0].self_attn
    seen = []
    ids = random_prompts([7])[0][None]
    loaded.model.config._attn_implementation = "eager"
    with torch.no_grad(), intervene([Hook(attn, "outputs", lambda out, kwargs: seen.append(out))]):
        loaded.model(input_ids=ids, use_cache=False)
    assert isinstance(seen[0], tuple) and seen[0][1].shape == (1, 4, 7, 7)
    with torch.no_grad():
        clean = loaded.model(input_ids=ids, use_cache=False).logits
        with intervene([Hook(attn, "outputs", lambda out, kwargs: (torch.zeros_like(out[0]), out[1]))]):
            zeroed = loaded.model(input_ids=ids, use_cache=False).logits
    assert float((clean - zeroed).abs().max()) > 1e-3  # the attention's write was replaced


@pytest.mark.parametrize("arch", ARCHS)
def test_attention_entropy_equals_its_oracle_from_output_attentions(arch):
    """Per example and layer, the probe's value (batched, padded) is the mean over the prompt's
    tokens of the heads' mean entropy, computed here from ``output_attentions`` one prompt at a time."""
    loaded = make_tiny(arch)
    prompts = random_prompts([9, 5, 12])
    frame = attention_entropy(loaded, prompts, batch_size=3, progress=False)
    assert set(frame["metric"]) == {"attn_entropy"}
    for example, ids in enumerate(prompts):
        for layer, own in enumerate(_own_attentions(loaded, ids)):
            w = own.double()
            expected = float(-(w * torch.log(w.clamp_min(1e-300))).sum(-1).mean(0).mean())
            row = frame.filter(example=example, layer=layer)
            assert row.height == 1 and int(row["n_tokens"][0]) == ids.numel()
            # float32 sums of ~10 terms of order 1: rounding of ~1e-6 of entropies of order 1
            assert float(row["value"][0]) == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_the_registered_attention_entropy_probe_runs_and_caches_what_its_function_computes(tmp_path, tiny_dir):
    """``effdepth run --probes attention_entropy`` (here ``measure``): its per-example rows are the
    function's, and a second call is a cache hit with the same rows."""
    from effdepth_core import load_model, measure

    loaded = load_model(str(tiny_dir), device="cpu", dtype="float32", progress=False)
    prompts = ["the capital of france is paris", "two plus two is four", "a b c"]
    result = measure(loaded, prompts, probes="attention_entropy", out=tmp_path / "run", progress=False)
    direct = attention_entropy(loaded, prompts, progress=False)
    key = ["example", "layer", "metric"]
    ours = result.per_example["attention_entropy"].sort(key)
    assert ours.select(*key, "value").equals(direct.sort(key).select(*key, "value"))
    again = measure(loaded, prompts, probes="attention_entropy", out=tmp_path / "run", progress=False)
    assert again.per_example["attention_entropy"].sort(key).equals(ours)
    assert result.eds.height == 0 or "attention_entropy" not in set(result.eds["rule"])  # no ED rule


@pytest.mark.parametrize("arch", ["llama", "gemma3_text", "gpt2"])
def test_run_with_cache_equals_the_models_own_hidden_states_and_attentions(arch):
    """The public activation cache, batched and padded: each prompt's residual states equal HF's
    ``output_hidden_states`` of that prompt alone (h_L: the last layer's output, before the final
    norm HF applies to its last entry), its writes add up to each layer's change (h_(l+1) − h_l =
    a_l + m_l), its attention is ``output_attentions``'; a subset of layers keeps those layers'
    rows; what would exceed ``max_bytes`` is refused before any forward pass."""
    from effdepth_core import run_with_cache
    from effdepth_core.errors import EffdepthError

    loaded = make_tiny(arch)
    prompts = random_prompts([9, 5, 12])
    caches = run_with_cache(loaded, prompts, attention=True, batch_size=3)
    last = loaded.layers[-1]
    for ids, cache in zip(prompts, caches, strict=True):
        kept = {}
        handle = last.register_forward_hook(
            lambda m, a, o, kept=kept: kept.__setitem__("h_L", o[0] if isinstance(o, tuple) else o)
        )
        with torch.no_grad():
            out = loaded.model(input_ids=ids[None], output_hidden_states=True, use_cache=False)
        handle.remove()
        own = torch.stack([h[0] for h in out.hidden_states[: loaded.n_layers]] + [kept["h_L"][0]])
        scale = float(own.norm(dim=-1).max())
        # float32 forwards in another batch shape: rounding of ~1e-7 of the states' size
        assert cache.residual.shape == own.shape and float((cache.residual - own).abs().max()) < 1e-5 * scale
        change = cache.residual[1:] - cache.residual[:-1]
        assert float((cache.attn + cache.mlp - change).abs().max()) < 1e-5 * scale
        for layer, weights in enumerate(_own_attentions(loaded, ids)):
            assert float((cache.attention[layer] - weights).abs().max()) < 1e-5
    some = run_with_cache(loaded, prompts[:1], layers=[1], writes=False)[0]
    assert some.layers == [1] and some.attn is None and some.attention is None
    assert float((some.residual - caches[0].residual[1:3]).abs().max()) < 1e-5 * float(caches[0].residual.abs().max())
    with pytest.raises(EffdepthError, match=r"run_with_cache would hold .* over max_bytes"):
        run_with_cache(loaded, prompts, max_bytes=1000)
