"""The adapter table reads the right tensors: checked against HF's own hidden states and a manual
recomputation of each MLP sublayer, for every supported architecture."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from conftest import ARCHS, arch_of, make_tiny, random_prompts
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

from effdepth_core.errors import EffdepthWarning, NonFiniteActivationError, UnsupportedModelError
from effdepth_core.measurement.trace import forward, iter_batches, trace_layers
from effdepth_core.models import supported_model_types, truncate_layers, wrap_model

ATOL = 2e-5


def _trace(loaded, ids):
    records = []
    batch = next(iter_batches([ids], 1, "cpu"))
    with trace_layers(loaded, records.append):
        forward(loaded, batch)
    return records


def _manual_mlp(loaded, layer_index: int, h: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
    """What the MLP sublayer adds, recomputed from h_l and a_l by the architecture's own formula."""
    return arch_of(loaded).mlp(loaded.layers[layer_index], h, attn, loaded.model.config)


def test_residual_identity_and_hf_hidden_states(tiny):
    ids = random_prompts([11])[0]
    records = _trace(tiny, ids)
    with torch.no_grad():
        hidden = tiny.model(input_ids=ids[None], output_hidden_states=True).hidden_states
    assert len(records) == tiny.n_layers
    for rec in records:
        # h_{l+1} = h_l + a_l + m_l, with a_l and m_l as the adapter reports them
        torch.testing.assert_close(rec.h_out, rec.h_in + rec.attn + rec.mlp, atol=ATOL, rtol=1e-5)
        # the layer input is HF's hidden state l (HF's last entry has the final norm applied)
        torch.testing.assert_close(rec.h_in, hidden[rec.layer], atol=ATOL, rtol=1e-5)
        with torch.no_grad():
            expected_mlp = _manual_mlp(tiny, rec.layer, rec.h_in, rec.attn)
        torch.testing.assert_close(rec.mlp, expected_mlp, atol=ATOL, rtol=1e-5)
    torch.testing.assert_close(tiny.final_norm(records[-1].h_out), hidden[-1], atol=ATOL, rtol=1e-5)


def test_head_reproduces_model_logits(tiny):
    ids = random_prompts([9])[0]
    records = _trace(tiny, ids)
    with torch.no_grad():
        logits = tiny.model(input_ids=ids[None]).logits
        torch.testing.assert_close(tiny.head(records[-1].h_out), logits, atol=ATOL, rtol=1e-5)
        buffer = torch.empty(20, tiny.vocab_size)
        torch.testing.assert_close(tiny.head_into(records[-1].h_out[0], buffer), logits[0], atol=ATOL, rtol=1e-5)


def test_unsupported_architectures_fail_with_a_clear_message():
    config = AutoConfig.for_model("bert", vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32, is_decoder=True)  # fmt: skip
    model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(UnsupportedModelError) as info:
        wrap_model(model)
    message = str(info.value)
    assert "'bert'" in message and "an encoder" in message and "llama" in message and "gemma3_text" in message
    assert len(message.splitlines()) == 1
    assert set(supported_model_types()) >= {"llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text"}
    assert set(supported_model_types()) >= {"olmo2", "phi3", "gpt_neox", "gpt2", "mixtral", "qwen3_moe", "olmoe"}


def test_hooks_are_removed_even_on_error():
    loaded = make_tiny("llama")

    def explode(record):
        raise RuntimeError("boom")

    batch = next(iter_batches(random_prompts([5]), 1, "cpu"))
    with pytest.raises(RuntimeError), trace_layers(loaded, explode):
        forward(loaded, batch)
    modules = list(loaded.model.modules())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in modules)


def test_non_finite_activation_names_the_layer():
    loaded = make_tiny("llama")
    with torch.no_grad():
        loaded.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
    batch = next(iter_batches(random_prompts([5]), 1, "cpu"))
    with pytest.raises(NonFiniteActivationError, match="output of layer 1"), trace_layers(loaded, lambda r: None):
        forward(loaded, batch)


def test_truncated_copy_shares_weights_and_stops_early():
    loaded = make_tiny("gemma3_text")
    half = truncate_layers(loaded, 2)
    assert half.n_layers == 2 and loaded.n_layers == 3
    ids = random_prompts([8])[0]
    records = _trace(loaded, ids)
    with torch.no_grad():
        out = half.base_model()(input_ids=ids[None]).last_hidden_state
    torch.testing.assert_close(out, loaded.final_norm(records[1].h_out), atol=ATOL, rtol=1e-5)


def _tiny_of(model_type: str, **extra):
    from conftest import COMMON
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **{**COMMON, **extra})
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


def test_a_model_type_outside_the_table_gets_a_verified_layout_or_one_line(monkeypatch):
    """StarCoder2 is not in the table: its Llama-like layout is inferred, verified on a probe input
    (the writes add up, the head gives the logits) and then the probes agree with the naive
    computations as on any row. Granite without its row is inferred with the logit scale its config
    names; a head scaled by nothing the config names is refused, and Bloom's row does not
    add up when its sublayers are handed the normed input as their residual
    (``apply_residual_connection_post_layernorm``, a post-norm block): each is refused in one line
    that says what did not add up."""
    import pytest

    from effdepth_core import models
    from effdepth_core.errors import EffdepthWarning, UnsupportedModelError
    from effdepth_core.measurement.probes import logit_lens
    from effdepth_core.models import wrap_model

    monkeypatch.delitem(models.ADAPTERS, "granite")  # its row knows the logit scale; inference does not

    with pytest.warns(EffdepthWarning, match="inferred as Llama-like and verified"):
        loaded = wrap_model(_tiny_of("starcoder2"), None, name="tiny-starcoder2")
    ids = random_prompts([11])[0]
    records = _trace(loaded, ids)
    for record in records:  # what the adapter reads is what each block adds
        torch.testing.assert_close(record.h_out - record.h_in, record.attn + record.mlp, atol=ATOL, rtol=1e-5)
    final = logit_lens(loaded, [ids]).filter(layer=loaded.n_layers)
    assert final.filter(metric="kl")["value"].abs().max() < 1e-5  # the head reproduces the logits
    # the logit multiplier its config names is found (1 / logits_scaling); one it does not name is refused
    granite = wrap_model(_tiny_of("granite", logits_scaling=4.0, residual_multiplier=1.0), None, name="tiny-granite")
    assert granite.logit_scale == 0.25
    scaled = _tiny_of("starcoder2")
    scaled.register_forward_hook(lambda module, args, output: output.__setitem__("logits", 3 * output.logits))
    with pytest.raises(UnsupportedModelError, match=r"writes add up, but the final normalization and head miss"):
        wrap_model(scaled, None, name="tiny-scaled")
    bloom_layout = r"the adapter table's row for 'bloom' does not fit model 'tiny-bloom'.* miss each block's change by"
    with pytest.raises(UnsupportedModelError, match=bloom_layout):
        wrap_model(_tiny_of("bloom", n_head=4, apply_residual_connection_post_layernorm=True), None, name="tiny-bloom")


def test_every_layout_is_verified_at_load_a_table_row_and_a_users_adapter_alike(monkeypatch):
    """A table row passes the same check as an inferred layout: a naive Llama-like row for Cohere
    (which scales its logits) is refused naming the head, one that names the wrong write naming the
    blocks. A user describes an architecture without editing the package (``adapter=``), verified
    the same way: Granite with its logit scale off is measured as a row would measure it."""
    from effdepth_core import models
    from effdepth_core.models import Adapter

    monkeypatch.setitem(models.ADAPTERS, "cohere", models.Adapter())
    with pytest.raises(UnsupportedModelError, match=r"row for 'cohere' does not fit .* head miss the model's logits"):
        wrap_model(_tiny_of("cohere", logit_scale=0.0625), None, name="tiny-cohere")
    monkeypatch.setitem(models.ADAPTERS, "llama", Adapter(attn_out="input_layernorm"))
    with pytest.raises(UnsupportedModelError, match=r"row for 'llama' does not fit .* miss each block's change"):
        wrap_model(_tiny_of("llama"), None, name="tiny-llama")
    with pytest.raises(UnsupportedModelError, match=r"adapter given does not fit .* names no module"):
        wrap_model(_tiny_of("starcoder2"), None, name="s", adapter=Adapter(final_norm="model.final_layer_norm"))
    granite = _tiny_of("granite", logits_scaling=1.0, residual_multiplier=1.0, embedding_multiplier=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", EffdepthWarning)  # described, not inferred: nothing to warn of
        loaded = wrap_model(granite, None, name="tiny-granite", adapter=Adapter())
    ids = random_prompts([11])[0]
    for record in _trace(loaded, ids):  # what the adapter reads is what each block adds
        torch.testing.assert_close(record.h_out - record.h_in, record.attn + record.mlp, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_row_loads_in_half_precision(dtype):
    """The layout check runs in the model's own dtype and allows its rounding: every architecture
    in bfloat16 and float16 loads, and a swapped attention/MLP pair (whose writes add up too) is
    still refused there."""
    from effdepth_core.models import Adapter, layout_check

    for arch in sorted(ARCHS):
        model = make_tiny(arch).model.to(dtype)
        loaded = wrap_model(model, None, name=arch)
        assert layout_check(model, loaded.adapter).fits, arch
    with pytest.raises(UnsupportedModelError, match="runs after the one it names as the MLP"):
        wrap_model(make_tiny("llama").model.to(dtype), None, adapter=Adapter(attn_out="mlp", mlp_out="self_attn"))


def test_the_layout_enters_a_models_identity():
    """Two adapters read two sets of writes: a model given in memory is keyed by its adapter too."""
    import dataclasses

    from effdepth_core.models import Adapter, model_fingerprint

    loaded = make_tiny("llama")
    other = dataclasses.replace(loaded, adapter=Adapter(mlp_out="mlp.down_proj"))
    scaled = dataclasses.replace(loaded, logit_scale=0.5)
    assert len({model_fingerprint(x) for x in (loaded, other, scaled)}) == 3
    assert model_fingerprint(make_tiny("llama")) == model_fingerprint(loaded)  # the same model: the same key


def test_a_residual_argument_no_sublayer_takes_is_refused_in_one_line():
    """``Adapter(residual_arg=...)`` must name an argument of the attention or MLP module (BLOOM's
    ``residual``): a name neither takes, or a non-string, is a user's slip, refused in one line."""
    import pytest

    from effdepth_core.errors import UnsupportedModelError
    from effdepth_core.models import Adapter, wrap_model

    model = make_tiny("llama").model
    for bad in ("nope", 123):
        with pytest.raises(UnsupportedModelError, match=r"residual_arg=.* names no argument of its attention or MLP"):
            wrap_model(model, None, name="tiny-llama", adapter=Adapter(residual_arg=bad))


class _Block(nn.Module):
    """A Llama layer's modules under names no layout lists (``n1``, ``mix``, ``n2``, ``ffwd``), run
    as ``mode`` says: ``renamed`` (as Llama), ``dropout`` (one dropout module on both writes, as Phi
    does), ``shadow`` (a copy of the MLP run first, its output dropped), ``swapped`` (MLP first),
    ``postnorm`` or ``scaled`` (the residual × 0.9)."""

    def __init__(self, layer: nn.Module, mode: str):
        super().__init__()
        self.mode, self.n1, self.mix = mode, layer.input_layernorm, layer.self_attn
        self.drop = nn.Dropout(0.1)
        self.shadow = copy.deepcopy(layer.mlp) if mode == "shadow" else None
        self.n2, self.ffwd = layer.post_attention_layernorm, layer.mlp

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
        def attn(x):
            return self.mix(x, position_embeddings=position_embeddings, attention_mask=attention_mask)[0]

        h = hidden_states
        if self.mode == "postnorm":
            h = self.n1(h + attn(h))
            return self.n2(h + self.ffwd(h))
        if self.mode == "swapped":
            h = h + self.ffwd(self.n2(h))
            return h + attn(self.n1(h))
        drop = self.drop if self.mode == "dropout" else nn.Identity()  # Identity: no module of the block
        h = (0.9 if self.mode == "scaled" else 1.0) * h + drop(attn(self.n1(h)))
        if self.shadow is not None:
            self.shadow(self.n2(h))
        return h + drop(self.ffwd(self.n2(h)))


@pytest.mark.parametrize(
    ("mode", "refusal"),
    [
        ("renamed", None),
        ("dropout", None),  # the dropout runs twice a block: not a write, whatever its outputs add up to
        ("shadow", r"two pairs of its blocks' sublayer outputs add up .* ambiguous"),
        ("swapped", r"the first of its blocks' two writes \(ffwd, then mix\) does not mix tokens"),
        ("postnorm", r"post-norm: each block's output is that of its normalization layer model\.layers\[i\]\.n2"),
        ("scaled", r"no two of its blocks' sublayer outputs add up"),
    ],
)
def test_blocks_read_off_their_outputs_measure_as_the_stock_model_or_are_refused(mode, refusal):
    """Blocks whose modules no layout names are read off their outputs: renamed ones (and a dropout
    module both writes pass through) give the stock Llama's numbers for the same weights, skips of
    each sublayer included; a copy of a write, an MLP before the attention, a post-norm block and a
    rescaled residual are refused in one line saying which."""
    from effdepth_core.measurement.probes import residual_cosine, skip_effects

    stock = _tiny_of("llama")
    custom = copy.deepcopy(stock)
    custom.model.layers = nn.ModuleList(_Block(layer, mode) for layer in custom.model.layers)
    custom.config.model_type = "customllama"
    if refusal is not None:
        with pytest.raises(UnsupportedModelError, match=refusal):
            wrap_model(custom, None, name="custom")
        return
    with pytest.warns(EffdepthWarning, match=r"inferred as model\.layers\[i\]\.mix \+ \.ffwd"):
        loaded = wrap_model(custom, None, name="custom")
    reference = wrap_model(stock, None, name="stock")
    ids = random_prompts([21, 14])
    for probe, options in (
        (residual_cosine, {"batch_size": 2}),
        (skip_effects, {"skip_parts": ("layer", "attn", "mlp")}),
    ):
        ours, theirs = (probe(m, ids, progress=False, **options) for m in (loaded, reference))
        # the same float32 operations on the same weights: equal but for summation order, ~1e-7
        torch.testing.assert_close(ours["value"].to_torch(), theirs["value"].to_torch(), rtol=1e-4, atol=1e-6)


def test_a_layer_list_holding_one_block_twice_is_refused_whatever_the_row():
    """A block run twice per forward has no one depth: Llama's own row refuses it in one line."""
    model = _tiny_of("llama")
    model.model.layers[2] = model.model.layers[1]
    with pytest.raises(UnsupportedModelError, match=r"model\.layers\[1\] runs 2 times per forward"):
        wrap_model(model, None, name="tied")
