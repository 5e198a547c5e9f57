"""Every causal-LM type the installed transformers ships, built tiny from its config, is either
measured correctly — the cosine and logit-lens curves equal an independent computation from HF's own
hidden states and the model's own tail (the forward after the last layer, fed each layer's state) —
or refused in one line; none gives numbers that differ. A type that cannot be built tiny here is
skipped with its reason. A transformers upgrade that adds or changes a model is caught here."""

from __future__ import annotations

import csv
import dataclasses
import re
import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from effdepth_core.errors import UnsupportedModelError
from effdepth_core.measurement.probes import logit_lens, residual_cosine, token_weighted_mean
from effdepth_core.models import mixer_kind, wrap_model

# every size field a config may have, shrunk (only those it has are set; sub-configs too)
SMALL = dict(
    hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, vocab_size=128, max_position_embeddings=256, moe_intermediate_size=32, num_experts=4,
    n_routed_experts=4, num_local_experts=4, num_experts_per_tok=2, shared_expert_intermediate_size=32,
    n_shared_experts=1, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
    sliding_window=4, first_k_dense_replace=1, moe_layer_freq=1, decoder_sparse_step=1, n_group=1, topk_group=1,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
    num_key_value_groups=2, d_model=64, n_embd=64, n_layer=2, n_head=4, ffn_dim=128, encoder_layers=2,
    decoder_layers=2, encoder_ffn_dim=128, decoder_ffn_dim=128, decoder_attention_heads=4,
    encoder_attention_heads=4, pad_token_id=0, bos_token_id=1, eos_token_id=2, initializer_range=0.2,
    image_size=32, patch_size=8, rotary_dim=8, index_head_dim=16, index_n_heads=2, index_topk=4,
    word_embed_proj_dim=64, vocab_size_per_layer_input=128, hidden_size_per_layer_input=16, ffn_hidden_size=128,
    moe_num_experts=4, moe_top_k=2, kv_n_heads=2,
)  # fmt: skip
SUBCONFIGS = (
    "text_config", "decoder", "language_config", "llm_config", "vision_config", "audio_config", "attn_config",
    "ffn_config",
)  # fmt: skip
COVERAGE = Path(__file__).parent / "data" / "coverage.csv"  # type → outcome, with transformers' version
MAX_PARAMS = 20_000_000  # a config whose sizes are not all named above stays large: not built here


def _shrink(config):
    fields = config.to_dict()
    for key, value in SMALL.items():
        if key in fields or key in getattr(config, "attribute_map", {}):
            try:
                setattr(config, key, value)
            except Exception:  # a config that validates its fields may refuse one: keep its own
                pass
    if "qk_rope_head_dim" in fields:  # multi-head latent attention: its rotary part is head_dim (where the
        for key, value in (("head_dim", config.qk_rope_head_dim), ("num_key_value_heads", config.num_attention_heads)):
            if key not in fields:  # config has one), and its keys have every head (no grouping)
                continue
            try:
                setattr(config, key, value)
            except Exception:
                pass
    if "qk_head_dim" in fields and "qk_nope_head_dim" in fields:  # a derived size some versions (transformers
        try:  # 5.6) fix at init and read in the forward: kept equal to its parts at the shrunk sizes
            config.qk_head_dim = config.qk_nope_head_dim + config.qk_rope_head_dim
        except Exception:
            pass
    attention = getattr(config, "attn_config", None)  # DBRX's defaults cannot run: no rope_theta, clip_qkv None
    if attention is not None and hasattr(attention, "to_dict"):
        if not hasattr(attention, "rope_theta"):
            attention.rope_theta = 10000.0
        if getattr(attention, "clip_qkv", 0) is None:
            attention.clip_qkv = 8.0
    if isinstance(fields.get("layer_types"), list):
        config.layer_types = fields["layer_types"][:2]
    if isinstance(fields.get("mlp_only_layers"), list):
        config.mlp_only_layers = []
    for name in SUBCONFIGS:
        inner = getattr(config, name, None)
        if inner is not None and hasattr(inner, "to_dict"):
            _shrink(inner)
    return config


def _build(model_type: str):
    """The tiny float32 model of ``model_type`` with its norms and other constants (zero biases)
    perturbed, or the reason it cannot be built."""
    try:
        config = _shrink(AutoConfig.for_model(model_type))
        with torch.device("meta"):
            size = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
        if size > MAX_PARAMS:
            return None, f"its config keeps {size / 1e6:.0f}M parameters at the shrunk sizes"
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).float().eval()
    except Exception as exc:  # many configs need fields this generic shrink does not know
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"
    perturb_constants(model)
    return model, None


def perturb_constants(model: torch.nn.Module) -> list[str]:
    """Add noise to every parameter that starts as a constant (norm weights, zero biases, one-element
    gates) and every floating-point buffer that does (a per-layer residual scale such as Gemma 4's
    ``layer_scalar``, a normalizer): at its initial value such a tensor can hide a misread block (a
    scale of 1 multiplies nothing), in a trained checkpoint it does not. Returns the buffers perturbed."""
    buffers = []
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or bool((param == param.flatten()[0]).all()):  # one-element gates included
                param.add_(0.3 * torch.randn_like(param))
        for name, buffer in model.named_buffers():
            first = buffer.flatten()[0] if buffer.numel() else None
            if buffer.is_floating_point() and first is not None and first != 0 and bool((buffer == first).all()):
                buffer.mul_(1 + 0.3 * torch.randn_like(buffer))  # a zero (a cleared state, a cache) is left
                buffers.append(name)
    return buffers


def _own_forward_fails(model) -> str | None:
    """Why the model's own forward fails at the shrunk sizes (a rotary size left large, say), or None."""
    try:
        with torch.no_grad():
            model(input_ids=torch.arange(1, 10)[None] % max(model.config.vocab_size - 1, 1), use_cache=False)
    except Exception as exc:
        return f"its own forward fails at the shrunk sizes: {type(exc).__name__}: {str(exc)[:80]}"
    return None


def _reference(loaded, prompts):
    """Token-weighted cos(h_{l+1} − h_l, h_l) per layer and KL(q_l ‖ p) per layer 0..L, from HF's
    hidden states (h_L from the last layer's output) and the model's own forward after its last
    layer fed h_l (its final norm, head and whatever it applies to the logits), in float64."""
    n_layers, last = loaded.n_layers, loaded.layers[-1]
    cos = torch.zeros(n_layers, dtype=torch.float64)
    kl = torch.zeros(n_layers + 1, dtype=torch.float64)
    tokens = 0
    for ids in prompts:
        kept = {}
        handle = last.register_forward_hook(
            lambda m, a, o, kept=kept: kept.__setitem__("h_L", o[0] if isinstance(o, tuple) else o)
        )
        with torch.no_grad():
            out = loaded.model(input_ids=ids[None], output_hidden_states=True, use_cache=False)
        handle.remove()
        states = [s[0] for s in out.hidden_states[:n_layers]] + [kept["h_L"][0]]  # [token, d] each
        log_p = torch.log_softmax(out.logits[0].double(), -1)
        for layer in range(n_layers):
            delta, h = states[layer + 1].double() - states[layer].double(), states[layer].double()
            cos[layer] += torch.nn.functional.cosine_similarity(delta, h, dim=-1).sum()
        for layer, state in enumerate(states):

            def replace(module, args, output, state=state):
                return (state[None], *output[1:]) if isinstance(output, tuple) else state[None]

            handle = last.register_forward_hook(replace)
            with torch.no_grad():
                log_q = torch.log_softmax(loaded.model(input_ids=ids[None], use_cache=False).logits[0].double(), -1)
            handle.remove()
            kl[layer] += (log_q.exp() * (log_q - log_p)).sum()
        tokens += ids.numel()
    return cos / tokens, kl / tokens


def _outcome(model_type: str) -> tuple[str, str]:
    """(outcome, detail) of one type: ``measured`` (and equal to the reference: asserted here),
    ``refused (mixer)`` / ``refused`` (one line naming the model), or ``unbuildable`` (its reason)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # inferred layouts are announced; transformers warns on tiny configs
        model, why = _build(model_type)
        if model is None:
            return "unbuildable", why
        try:
            loaded = wrap_model(model, None, name=model_type)
        except UnsupportedModelError as exc:
            if "its forward failed" in str(exc) and (why := _own_forward_fails(model)):
                return "unbuildable", why  # no layout was tried: the tiny model itself cannot run
            assert "\n" not in str(exc) and model_type in str(exc)  # one line, naming the model
            # a state-space, recurrent or convolutional mixer is refused as that, not for module names
            assert (mixer_kind(model.config, model_type) is not None) == ("mixes tokens with" in str(exc)), str(exc)
            return ("refused (mixer)" if "mixes tokens with" in str(exc) else "refused"), str(exc)
        vocab = loaded.vocab_size
        # two prompts of other lengths, measured as one right-padded batch
        prompts = [(torch.arange(11) * 7 + 3) % (vocab - 3) + 3, (torch.arange(7) * 5 + 4) % (vocab - 3) + 3]
        cos = token_weighted_mean(residual_cosine(loaded, prompts, batch_size=2, progress=False))
        lens = token_weighted_mean(logit_lens(loaded, prompts, batch_size=2, progress=False))
        ref_cos, ref_kl = _reference(loaded, prompts)
    ours_cos = torch.tensor(cos.filter(metric="cos_layer").sort("layer")["value"].to_list(), dtype=torch.float64)
    ours_kl = torch.tensor(lens.filter(metric="kl").sort("layer")["value"].to_list(), dtype=torch.float64)
    # float32 forward passes round at ~1e-7 of the values; 1e-4 (cosines, in [-1, 1]) and 1e-3 of
    # the largest KL (+1e-3 nats for near-uniform tiny models) separate rounding from a wrong read
    assert float((ours_cos - ref_cos).abs().max()) < 1e-4, (ours_cos, ref_cos)
    assert float((ours_kl - ref_kl).abs().max()) < 1e-3 * (float(ref_kl.abs().max()) + 1e-3), (ours_kl, ref_kl)
    return _replay_outcome(loaded, prompts[0])


def _replay_outcome(loaded, ids: torch.Tensor) -> tuple[str, str]:
    """The replay probes on a measured type: their fast paths (layers re-run on recorded arguments)
    equal their oracles (whole forwards with a hook) — skip and erasure — or the model is refused
    for them in one line (``measured (no replay)``); never different numbers."""
    from effdepth_core.errors import EffdepthError
    from effdepth_core.measurement.probes import erasure_map, skip_effects

    def gap(fast, slow) -> float:  # over the largest value: 1e-4 separates float32 rounding from a wrong replay
        keys = [c for c in fast.columns if c != "value"]
        both = fast.join(slow, on=keys, nulls_equal=True, how="full")
        return float((both["value"] - both["value_right"]).abs().max()) / max(float(both["value"].abs().max()), 1.0)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            parts = {"skip_variants": "current", "skip_parts": "layer,attn", "progress": False}
            skip = [skip_effects(loaded, [ids], method=m, **parts) for m in ("fast", "slow")]
            erased = [erasure_map(loaded, [(ids, 3)], method=m, progress=False) for m in ("fast", "slow")]
        except EffdepthError as exc:
            assert "\n" not in str(exc) and loaded.name in str(exc), str(exc)
            return "measured (no replay)", str(exc)
    assert gap(*skip) < 1e-4 and gap(*erased) < 1e-4, (loaded.name, gap(*skip), gap(*erased))
    return "measured", ""


# why a type is refused, told by its refusal's words: (reason, words in the refusal, how
# book/using/models.md says it, after the count); the first that matches names it
REASONS = (
    ("mixer", "mixes tokens with", "state-space, recurrent and hybrid mixers, refused as such"),
    ("by name", "the probes assume a pre-norm decoder-only LM", "encoders or encoder-decoders, refused by name"),
    ("post-norm", "it is post-norm", "post-norm, read off their blocks"),
    ("returns residual", "return the residual with their writes", "whose sublayers return the residual with a write"),
    ("not two writes", "no two of its blocks' sublayer outputs", "whose blocks are not the residual plus two writes"),
    ("three writes", "three writes to the residual", "that add a third write"),
    ("streams", "residual streams that each block mixes", "that carry several residual streams"),
    ("runs twice", "more than once per forward", "that run their blocks more than once"),
    ("no stack", "runs as a stack of blocks", "whose layers are no stack of modules"),
    ("forward fails", "its forward fails on a plain", "whose forward fails on a plain prompt"),
    ("ambiguous", "which modules write is ambiguous", "whose writes are ambiguous"),
    ("no mixer first", "does not mix tokens", "whose first write does not mix tokens"),
    ("layout", "", "that no layout fits"),
)  # fmt: skip


def _reason(refusal: str) -> str:
    return next(reason for reason, words, _ in REASONS if words in refusal)


def _recorded() -> tuple[str, dict[str, str], dict[str, str]]:
    """The committed coverage table: the transformers version it was made with, type → outcome, and
    type → the reason of a refusal (``REASONS``)."""
    lines = COVERAGE.read_text().splitlines()
    version = lines[0].removeprefix("# transformers ")
    rows = list(csv.DictReader(lines[1:]))
    return version, {row["model_type"]: row["outcome"] for row in rows}, {r["model_type"]: r["reason"] for r in rows}


@pytest.mark.parametrize("model_type", sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))
def test_every_causal_lm_type_is_measured_right_or_refused_in_one_line(model_type):
    kind, why = _outcome(model_type)
    version, recorded, reasons = _recorded()
    if version == transformers.__version__:  # the committed table (and the models page's counts) hold
        reason = _reason(why) if kind.startswith("refused") else ""
        assert (recorded.get(model_type), reasons.get(model_type)) == (kind, reason), (
            f"{model_type} is now {kind} ({reason}), {COVERAGE.name} says {recorded.get(model_type)} "
            f"({reasons.get(model_type)}): regenerate it with `python tests/test_coverage.py` and update "
            "book/using/models.md's counts"
        )
    if kind == "unbuildable":
        pytest.skip(f"{model_type} cannot be built tiny here: {why}")


MODELS_PAGE = Path(__file__).parents[1] / "book" / "using" / "models.md"
PAGE_BEGIN = "<!-- coverage counts: written by `python tests/test_coverage.py` from tests/data/coverage.csv -->"
PAGE_END = "<!-- end of coverage counts -->"


def coverage_markdown(version: str, recorded: dict[str, str], reasons: dict[str, str]) -> str:
    """The models page's coverage counts, written from the committed table (each refusal's reason
    with the types it names), so the page states what the run gave and nothing typed once."""
    counts = Counter(recorded.values())
    refused = counts["refused"] + counts["refused (mixer)"]
    measured = counts["measured"] + counts["measured (no replay)"]
    lines = [
        f"With transformers {version} its {len(recorded)} types gave:",
        "",
        f"- {measured} measured correctly. For {counts['measured (no replay)'] or 'none'} of them the replay check "
        "refuses the probes that re-run layers (it refuses them, in one line, for a model whose blocks pass more "
        "than the residual from one to the next).",
        f"- {refused} refused in one line: {counts['refused (mixer)']} state-space, recurrent and hybrid mixers, "
        f"refused as such, and {counts['refused']} for what their blocks are, each refusal saying which "
        "(`tests/data/coverage.csv` keeps the reason):",
    ]
    for reason, _, said in REASONS:
        names = sorted(t for t, r in reasons.items() if r == reason and recorded[t] == "refused")
        if names:
            lines.append(f"  - {len(names)} {said} ({', '.join(names)});")
    lines[-1] = lines[-1].removesuffix(";") + "."
    lines += [
        f"- {counts['unbuildable']} that the generic tiny-config shrink cannot build, skipped, each with its reason.",
        "- None measured wrong.",
    ]
    return "\n".join([PAGE_BEGIN, *lines, PAGE_END])


def _page_with(text: str, block: str) -> str:
    """The models page with its coverage block replaced by ``block``."""
    head, rest = text.split(PAGE_BEGIN, 1)
    return head + block + rest.split(PAGE_END, 1)[1]


def test_the_models_page_states_the_committed_coverage():
    """book/using/models.md's coverage counts are the committed table's (which the test above holds
    to what the installed transformers gives), written from it, not numbers typed once."""
    text = MODELS_PAGE.read_text()
    assert PAGE_BEGIN in text and PAGE_END in text, "the models page lost its coverage markers"
    assert _page_with(text, coverage_markdown(*_recorded())) == text, (
        "book/using/models.md's coverage counts are not tests/data/coverage.csv's: rewrite them with "
        "`python tests/test_coverage.py`"
    )


def _wrapped_or_refusal(model_type: str, adapter=None, **config):
    """``wrap_model`` of the tiny ``model_type`` (config fields set first; ``adapter`` given), or its
    refusal's text."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, why = _build(model_type)
        if model is None:
            pytest.skip(f"{model_type} cannot be built tiny here: {why}")
        for field, value in config.items():
            setattr(model.config, field, value)
        try:
            return wrap_model(model, None, name=model_type, adapter=adapter)
        except UnsupportedModelError as exc:
            return str(exc)


@pytest.mark.parametrize(
    ("model_type", "reason"),
    [
        ("openai-gpt", r"post-norm: each block's output is that of its normalization layer transformer\.h\[i\]\.ln_2"),
        ("bert-generation", r"post-norm: .*output\.LayerNorm"),  # a norm nested in the block's last module
        ("hrm_text", r"runs its blocks more than once per forward"),
        ("deepseek_v4", r"carry 4 residual streams .*hyper-connections"),
    ],
)
def test_a_refusal_says_what_the_model_is_not_which_names_were_missing(model_type, reason):
    """Blocks no layout fits are read off one forward pass, and the refusal names the model's own
    reason: post-norm blocks, layers run more than once, several residual streams (a third write:
    ``test_a_block_with_a_third_write_and_a_residual_scale_is_measured_through_its_row``)."""
    refusal = _wrapped_or_refusal(model_type)
    assert isinstance(refusal, str), f"{model_type} was measured"
    assert re.search(reason, refusal) and "adapter table" not in refusal, refusal


@pytest.mark.parametrize(
    ("model_type", "attn", "mlp"),
    [("afmoe", "post_attention_layernorm", "post_mlp_layernorm"), ("hyperclovax", "post_norm1", "post_norm2")],
)
def test_writes_no_name_list_knows_are_read_off_the_blocks_outputs(model_type, attn, mlp):
    """Post-sublayer norms under names no layout lists are found as the two outputs that add up to
    each block's change; what the trace reads then is the block's own split (the measured numbers
    against the independent reference: the coverage test)."""
    from effdepth_core.measurement.trace import trace_layers

    loaded = _wrapped_or_refusal(model_type)
    assert not isinstance(loaded, str), loaded
    assert (loaded.adapter.attn_out, loaded.adapter.mlp_out) == (attn, mlp)
    mids, traced = {}, {}
    handles = [  # the input of the norm before the MLP is h_l + a_l, whatever the block calls it
        (
            layer.pre_mlp_layernorm if model_type == "afmoe" else layer.post_attention_layernorm
        ).register_forward_pre_hook(lambda m, a, i=i: mids.__setitem__(i, a[0]))
        for i, layer in enumerate(loaded.layers)
    ]
    with torch.no_grad(), trace_layers(loaded, lambda t: traced.__setitem__(t.layer, t)):
        loaded.model(input_ids=torch.arange(3, 12)[None], use_cache=False)
    for handle in handles:
        handle.remove()
    for i, t in traced.items():  # float32: the split differs from the block's by rounding, ~1e-7 of h
        assert float((t.attn - (mids[i] - t.h_in)).norm()) < 1e-5 * float(t.h_out.norm())
        assert float((t.mlp - (t.h_out - mids[i])).norm()) < 1e-5 * float(t.h_out.norm())


def test_a_head_with_more_than_a_norm_and_an_unembedding_is_found_and_its_scale_read_from_the_config():
    """ModernBERT-decoder's head runs a prediction head between the final norm and the unembedding:
    it is found among the LM's own modules, and the lens's last layer then reproduces the model's
    distribution. Cohere 2 MoE (no row) scales its logits by ``config.logit_scale``: read from there."""
    from effdepth_core.measurement.probes import logit_lens

    loaded = _wrapped_or_refusal("modernbert-decoder")
    assert not isinstance(loaded, str), loaded
    assert loaded.adapter.head_transform == "lm_head"
    final = logit_lens(loaded, [torch.arange(3, 14)], progress=False).filter(layer=loaded.n_layers, metric="kl")
    assert float(final["value"].abs().max()) < 1e-5  # float32 rounding of a KL of 0
    cohere = _wrapped_or_refusal("cohere2_moe", logit_scale=0.0625)
    assert not isinstance(cohere, str), cohere
    assert cohere.logit_scale == 0.0625


@pytest.mark.parametrize("model_type", ["mamba", "jamba", "zamba", "lfm2", "qwen3_next", "rwkv", "recurrent_gemma"])
def test_state_space_and_recurrent_mixers_are_refused_as_such(model_type):
    """The families issue 33 names, refused for what they are (a mixer that is not attention)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, why = _build(model_type)
        if model is None:
            pytest.skip(f"{model_type} cannot be built tiny here: {why}")
        with pytest.raises(UnsupportedModelError, match=f"model_type '{model_type}'.* mixes tokens with state-space"):
            wrap_model(model, None, name=model_type)


@pytest.mark.parametrize("model_type", ["granite", "granitemoe", "granitemoeshared", "granitemoe_swa", "hyperclovax"])
def test_granite_multipliers_at_realistic_values_are_measured_right(model_type, monkeypatch):
    """The tiny configs default to multipliers of 1, where any layout adds up; at a real
    checkpoint's residual multiplier 0.22 and logits scaling 8 only the rows that apply them do, and
    the layout read off HyperCLOVA X's blocks (no row) finds both in its config (its head multiplies
    by logits_scaling where Granite's divides)."""
    shrink = _shrink

    def realistic(config):
        config = shrink(config)
        config.residual_multiplier, config.logits_scaling = 0.22, 8.0
        return config

    monkeypatch.setitem(globals(), "_shrink", realistic)
    kind, why = _outcome(model_type)
    if kind == "unbuildable":  # e.g. granitemoe_swa is newer than the lowest transformers allowed
        pytest.skip(f"{model_type} cannot be built tiny here: {why}")
    assert kind == "measured", why


def test_minicpm3_multipliers_at_realistic_values_are_measured_right(monkeypatch):
    """MiniCPM3 scales each write by scale_depth / √L (1.4 / √62 = 0.18 in the 4B checkpoint) and the
    final residual by 1 / logits_scaling (2560 / 256 = 10 there; 8 here, where dim_model_base must be a
    whole number): its row applies both."""
    shrink = _shrink

    def realistic(config):
        config = shrink(config)
        config.scale_depth = 0.25  # 0.25 / √2 = 0.18, as 1.4 / √62
        config.dim_model_base = config.hidden_size // 8  # logits_scaling = hidden / dim_model_base: 8 (10 there)
        assert config.logits_scaling == 8.0  # a read-only property of these two
        return config

    monkeypatch.setitem(globals(), "_shrink", realistic)
    kind, why = _outcome("minicpm3")
    if kind == "unbuildable":
        pytest.skip(f"minicpm3 cannot be built tiny here: {why}")
    assert kind == "measured", why


@pytest.mark.parametrize("model_type", ["granitemoeshared", "granitemoe_swa"])
def test_granite_moe_with_shared_experts_is_refused_not_measured_wrong(model_type, monkeypatch):
    """With shared experts a block adds a second MLP's write that the row does not name: refused
    at load in one line (the tiny configs have none, so the coverage table says measured)."""
    shrink = _shrink

    def shared(config):
        config = shrink(config)
        config.shared_intermediate_size = 32
        return config

    monkeypatch.setitem(globals(), "_shrink", shared)
    kind, why = _outcome(model_type)
    if kind == "unbuildable":  # as above: a type the installed transformers lacks
        pytest.skip(f"{model_type} cannot be built tiny here: {why}")
    assert kind == "refused" and "miss each block's change" in why, why


if __name__ == "__main__":  # python tests/test_coverage.py [TYPE ...]: rewrite the table (those rows) and the page
    wanted = sys.argv[1:] or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    version, recorded, reasons = _recorded()
    if sys.argv[1:] and version != transformers.__version__:
        sys.exit(f"{COVERAGE.name} is of transformers {version}: rerun every type (no arguments)")
    if not sys.argv[1:]:
        recorded, reasons = {}, {}
    for model_type in wanted:
        kind, why = _outcome(model_type)
        recorded[model_type], reasons[model_type] = kind, _reason(why) if kind.startswith("refused") else ""
        print(f"{model_type}: {kind}", file=sys.stderr)
    rows = [(t, recorded[t], reasons[t]) for t in sorted(recorded)]
    with COVERAGE.open("w", newline="") as out:
        out.write(f"# transformers {transformers.__version__}\n")
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["model_type", "outcome", "reason"])
        writer.writerows(rows)
    MODELS_PAGE.write_text(_page_with(MODELS_PAGE.read_text(), coverage_markdown(*_recorded())))
    print(dict(Counter(kind for _, kind, _ in rows)), dict(Counter(reason for *_, reason in rows if reason)))


@pytest.mark.parametrize(
    ("model_type", "mid_norm", "mlp"), [("bloom", "post_attention_layernorm", "mlp"), ("mpt", "norm_2", "ffn")]
)
def test_a_sublayer_that_returns_the_residual_with_its_write_is_read_and_skipped_right(model_type, mid_norm, mlp):
    """BLOOM's attention and MLP and MPT's MLP return the residual they are given plus their write.
    The trace's writes equal the block's own split — the attention's is the input of the norm before
    the MLP less h_l, the MLP's the rest — and skipping the attention leaves the block the MLP
    module's own output on h_l: h_l + mlp(norm(h_l))."""
    from effdepth_core.measurement.probes.skip import skip_hooks
    from effdepth_core.measurement.trace import intervene, trace_layers

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, why = _build(model_type)
        if model is None:
            pytest.skip(f"{model_type} cannot be built tiny here: {why}")
        loaded = wrap_model(model, None, name=model_type)
    assert loaded.adapter.residual_arg == "residual"
    ids = torch.arange(3, 12)[None]
    mids, traced = {}, {}
    handles = [
        getattr(layer, mid_norm).register_forward_pre_hook(lambda m, a, i=i: mids.__setitem__(i, a[0]))
        for i, layer in enumerate(loaded.layers)
    ]
    with torch.no_grad(), trace_layers(loaded, lambda t: traced.__setitem__(t.layer, t)):
        model(input_ids=ids, use_cache=False)
    for handle in handles:
        handle.remove()
    for i, t in traced.items():
        # float32 forward passes: the split differs from the block's own by rounding, ~1e-7 of h
        scale = float(t.h_out.norm())
        assert float((t.attn - (mids[i] - t.h_in)).norm()) < 1e-5 * scale
        assert float((t.mlp - (t.h_out - mids[i])).norm()) < 1e-5 * scale
    layer = loaded.layers[0]
    kept = {}
    handle = layer.register_forward_pre_hook(
        lambda m, a, k: kept.__setitem__("h", a[0] if a else k["hidden_states"]), with_kwargs=True
    )
    out = {}
    handle_out = layer.register_forward_hook(lambda m, a, o: out.__setitem__("h", o[0] if isinstance(o, tuple) else o))
    rows = torch.ones(1, dtype=torch.bool)
    with torch.no_grad(), intervene(skip_hooks(loaded, "attn", 0, rows, slice(0, ids.shape[1]))):
        model(input_ids=ids, use_cache=False)
    handle.remove(), handle_out.remove()
    with torch.no_grad():
        h = kept["h"]
        expected = getattr(layer, mlp)(getattr(layer, mid_norm)(h), h)
    assert float((out["h"] - expected).norm()) < 1e-5 * float(expected.norm())


def test_a_write_flattened_over_batch_and_tokens_is_read_and_skipped_per_token():
    """OPT's MLP runs on ``[batch · token, d]`` and the block views its sum back: the trace reads
    the write per token (the block's own split: the MLP's is h_(l+1) less the input of the norm
    before it), and skipping the MLP of one row at some positions leaves exactly those positions of
    that row at that input, the rest of the batch as it was."""
    from effdepth_core.measurement.probes.skip import skip_hooks
    from effdepth_core.measurement.trace import intervene, trace_layers

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, why = _build("opt")
        if model is None:
            pytest.skip(f"opt cannot be built tiny here: {why}")
        loaded = wrap_model(model, None, name="opt")
    ids = torch.stack([torch.arange(3, 12), torch.arange(20, 29)])  # [batch 2, token 9]
    layer = loaded.layers[1]
    mids, outs, traced = {}, {}, {}
    handles = [
        layer.final_layer_norm.register_forward_pre_hook(lambda m, a: mids.__setitem__("h", a[0])),
        layer.register_forward_hook(lambda m, a, o: outs.__setitem__("h", o[0] if isinstance(o, tuple) else o)),
    ]
    with torch.no_grad(), trace_layers(loaded, lambda t: traced.__setitem__(t.layer, t)):
        model(input_ids=ids, use_cache=False)
    clean_mid, clean_out = mids["h"].reshape(2, 9, -1), outs["h"]
    t = traced[1]
    # float32: the split differs from the block's own by rounding, ~1e-7 of h
    assert t.mlp.shape == t.h_in.shape
    assert float((t.mlp - (clean_out - clean_mid)).norm()) < 1e-5 * float(clean_out.norm())
    rows = torch.tensor([False, True])
    with torch.no_grad(), intervene(skip_hooks(loaded, "mlp", 1, rows, slice(3, 7))):
        model(input_ids=ids, use_cache=False)
    for handle in handles:
        handle.remove()
    expected = clean_out.clone()
    expected[1, 3:7] = clean_mid[1, 3:7]
    assert float((outs["h"] - expected).norm()) < 1e-5 * float(expected.norm())


def test_a_block_with_a_third_write_and_a_residual_scale_is_measured_through_its_row():
    """Gemma 4 with per-layer inputs: each block adds a third write (``post_per_layer_input_norm``)
    and multiplies its output, residual included, by its ``layer_scalar`` buffer (perturbed by the
    sweep, as every constant buffer). Its row names both: the writes the trace reads are the block's
    own split — a_l = s · (the pre-MLP norm's input − h_l), m_l = s · the rest, with (s − 1) · h_l
    the residual's own rescale — and the coverage outcome (against the independent reference) is
    measured. The same row without the third write, or without the scale, is refused at load, the
    refusal keeping what the blocks' outputs show (three writes, at a scale of 1)."""
    from effdepth_core.measurement.trace import trace_layers
    from effdepth_core.models import ADAPTERS, Adapter

    loaded = _wrapped_or_refusal("gemma4_text")
    assert not isinstance(loaded, str), loaded
    scales = [loaded.residual_scale(i) for i in range(loaded.n_layers)]
    assert all(float((s - 1).abs().max()) > 1e-2 for s in scales)  # perturbed: a scale of 1 would hide it
    mids, traced = {}, {}
    handles = [
        layer.pre_feedforward_layernorm.register_forward_pre_hook(lambda m, a, i=i: mids.__setitem__(i, a[0]))
        for i, layer in enumerate(loaded.layers)
    ]
    with torch.no_grad(), trace_layers(loaded, lambda t: traced.__setitem__(t.layer, t)):
        loaded.model(input_ids=torch.arange(3, 12)[None], use_cache=False)
    for handle in handles:
        handle.remove()
    for i, t in traced.items():  # float32: the split differs from the block's by rounding, ~1e-7 of h
        s, size = scales[i], float(t.h_out.norm())
        assert float((t.attn - s * (mids[i] - t.h_in)).norm()) < 1e-5 * size
        assert float((t.h_in + t.attn + t.mlp + (s - 1) * t.h_in - t.h_out).norm()) < 1e-5 * size
    assert _outcome("gemma4_text") == ("measured", "")
    row = ADAPTERS["gemma4_text"]
    for partial in (dataclasses.replace(row, mlp_also=()), dataclasses.replace(row, residual_scale=None)):
        refusal = _wrapped_or_refusal("gemma4_text", adapter=partial)
        assert isinstance(refusal, str) and "miss each block's change" in refusal, refusal
    model = loaded.model
    with torch.no_grad():
        for layer in loaded.layers:
            layer.layer_scalar.fill_(1.0)  # as an unperturbed checkpoint: the blocks show three writes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(UnsupportedModelError, match=r"read off its blocks: each block adds three writes"):
            wrap_model(model, None, name="gemma4_text", adapter=Adapter(
                attn_out="post_attention_layernorm", mlp_out="post_feedforward_layernorm"))  # fmt: skip
