"""Padding verified where it matters (issue 45): the sparse-attention types, built tiny with an
indexer that keeps fewer keys than the prompts have and prompts of tens of tokens, give each
prompt's own numbers when prompts are batched — against an independent reference computed one
prompt at a time (HF's hidden states, the model's own tail) — and a padded batch would not; an
attention kernel swapped in transformers' registry after a model was checked is checked again."""

from __future__ import annotations

import warnings

import polars as pl
import pytest
import torch
from test_coverage import _build, _reference, _shrink

from effdepth_core.measurement.probes import logit_lens, residual_cosine, token_weighted_mean
from effdepth_core.models import wrap_model

SPARSE_TYPES = ("deepseek_v32", "glm_moe_dsa", "axk2", "dots3_note_text")
INDEX_TOPK = 16  # below every prompt's length but one: the indexer really selects among real keys
LENGTHS = (72, 23, 50, 12)  # the run's prompts, tens of tokens (hundreds in a real run; tiny CPU budget)


def _dots3_note_text() -> torch.nn.Module:
    """Dots 3 Note's text model, tiny: its config names per-layer attention sizes (its sliding
    layers') that the generic shrink cannot set, so they are given here."""
    from transformers import AutoModelForCausalLM

    try:  # added in transformers 5.x after the lowest version allowed
        from transformers.models.dots3_note.configuration_dots3_note import Dots3NoteTextConfig
    except ImportError as exc:
        pytest.skip(f"dots3_note_text cannot be built tiny here: this transformers has no dots3_note ({exc})")

    sizes = dict(num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, head_dim=16,
                 qk_nope_head_dim=8, v_head_dim=16)  # fmt: skip
    config = Dots3NoteTextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
        n_routed_experts=4, num_experts_per_tok=2, qk_rope_head_dim=8, index_topk=INDEX_TOPK, index_head_dim=16,
        index_n_heads=2, shared_experts_intermediate_size=32, max_position_embeddings=256, sliding_window=32,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, first_k_dense_replace=1, initializer_range=0.2,
        **sizes, **{f"swa_{key}": value for key, value in sizes.items()},
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():  # norms start at identity, biases at zero: perturbed so that they matter
        for name, param in model.named_parameters():
            if "norm" in name or bool((param == param.flatten()[0]).all()):
                param.add_(0.3 * torch.randn_like(param))
    return model


def _sparse_model(model_type: str, monkeypatch) -> torch.nn.Module:
    if model_type == "dots3_note_text":
        return _dots3_note_text()

    def shrink(config):
        config = _shrink(config)
        config.index_topk = INDEX_TOPK
        return config

    monkeypatch.setattr("test_coverage._shrink", shrink)
    model, why = _build(model_type)
    if model is None:
        pytest.skip(f"{model_type} cannot be built tiny here: {why}")
    return model


def _values(frame: pl.DataFrame, metric: str) -> torch.Tensor:
    rows = token_weighted_mean(frame).filter(metric=metric).sort("layer")
    return torch.tensor(rows["value"].to_list(), dtype=torch.float64)


def _probes(loaded, prompts, batch_size: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    return (
        residual_cosine(loaded, prompts, batch_size=batch_size, progress=False),
        logit_lens(loaded, prompts, batch_size=batch_size, progress=False),
    )


@pytest.mark.parametrize("selection_rule", [True, False], ids=["index_topk-rule", "run-length-check-alone"])
@pytest.mark.parametrize("model_type", SPARSE_TYPES)
def test_sparse_attention_at_a_runs_lengths_gives_each_prompts_own_numbers(model_type, selection_rule, monkeypatch):
    """Batched as asked (4 prompts of 12-72 tokens), the cosine and lens curves equal the reference
    computed one prompt at a time; the load-time check (prompts of 5 and 9 tokens, within the
    indexer's 16 keys) passes these models, so only the check at the run's own lengths — or the
    rule that an indexer keeping fewer keys than the prompts have is never padded — keeps them
    right. Without either (every batch padded), the same probes are off."""
    import effdepth_core.measurement.wrapping as wrapping

    model = _sparse_model(model_type, monkeypatch)
    if not selection_rule:  # the run-length check alone, as for a selector no config field names
        monkeypatch.setattr(wrapping, "key_selection", lambda model: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = wrap_model(model, None, name=model_type)
    vocab = loaded.vocab_size
    prompts = [(torch.arange(n) * 7 + 3 * i) % (vocab - 3) + 3 for i, n in enumerate(LENGTHS)]
    if loaded.pads_safely:  # the load-time check cannot see it at 9 tokens (current transformers): the run's does
        with pytest.warns(match="effdepth measures it one prompt at a time"):
            cos, lens = _probes(loaded, prompts, batch_size=4)
    else:  # an older indexer (transformers 5.6's glm_moe_dsa) reads padded keys at 9 tokens already
        assert loaded.rows(4, prompts) == 1
        cos, lens = _probes(loaded, prompts, batch_size=4)
    ref_cos, ref_kl = _reference(loaded, prompts)
    # float32 forwards round at ~1e-7 of the values: 1e-4 (cosines, in [-1, 1]) and 1e-3 of the largest
    # KL separate rounding from padding, which moved them by 1e-3..1e-2 (cosine) and 1e-2 (KL) here
    assert float((_values(cos, "cos_layer") - ref_cos).abs().max()) < 1e-4
    assert float((_values(lens, "kl") - ref_kl).abs().max()) < 1e-3 * (float(ref_kl.abs().max()) + 1e-3)
    alone = _probes(loaded, prompts, batch_size=1)  # every metric (overlap too), each prompt alone
    for ours, theirs in zip((cos, lens), alone, strict=True):
        keys = ["example", "layer", "metric"]
        assert ours.sort(keys).select(keys).equals(theirs.sort(keys).select(keys))
        assert float((ours.sort(keys)["value"] - theirs.sort(keys)["value"]).abs().max()) < 1e-5
    # what every batch padded would have given: the reference sees the difference (the test can fail)
    monkeypatch.setattr(type(loaded), "rows", lambda self, batch_size, token_lists=None: batch_size)
    padded_cos, padded_lens = _probes(loaded, prompts, batch_size=4)
    off = max(
        float((_values(padded_cos, "cos_layer") - ref_cos).abs().max()),
        float((_values(padded_lens, "kl") - ref_kl).abs().max()) / (float(ref_kl.abs().max()) + 1e-3),
    )
    assert off > 1e-3, off


def test_a_kernel_swapped_in_the_attention_registry_is_checked_again(monkeypatch):
    """A model checked once as padding safely, then run with a kernel that ignores the mask (swapped
    under its implementation's name in ``ALL_ATTENTION_FUNCTIONS``): the next call sees another
    attention, checks padding again and measures one prompt at a time — equal to each prompt alone
    under that kernel, where a padded batch is off."""
    from conftest import make_tiny
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model = make_tiny("llama").model
    model.config._attn_implementation = "sdpa"
    prompts = [torch.arange(3, 40) % 60 + 3, torch.arange(5, 14), torch.arange(7, 30) % 60 + 3]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # safe: no warning, batched
        before = residual_cosine(model, prompts, batch_size=3, progress=False)
    assert wrap_model(model).rows(3, prompts) == 3

    def mask_ignoring(module, query, key, value, attention_mask, **kwargs):  # every key, padded ones too
        kwargs.pop("is_causal", None)
        return sdpa_attention_forward(module, query, key, value, None, is_causal=False, **kwargs)

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._local_mapping, "sdpa", mask_ignoring)
    with pytest.warns(match="effdepth measures it one prompt at a time"):
        after = residual_cosine(model, prompts, batch_size=3, progress=False)
    alone = residual_cosine(model, prompts, batch_size=1, progress=False)
    keys = ["example", "layer", "metric"]
    after, alone, before = (frame.sort(keys) for frame in (after, alone, before))
    assert float((after["value"] - alone["value"]).abs().max()) < 1e-5  # float32 rounding of one forward
    assert float((alone["value"] - before["value"]).abs().max()) > 1e-3  # the kernel does change the model
    loaded = wrap_model(model)
    monkeypatch.setattr(type(loaded), "rows", lambda self, batch_size, token_lists=None: batch_size)
    padded = residual_cosine(loaded, prompts, batch_size=3, progress=False).sort(keys)
    assert float((padded["value"] - alone["value"]).abs().max()) > 1e-2  # what the stale verdict gave
