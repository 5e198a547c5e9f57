"""The adapter table (one row per architecture) and, for a model outside it, the inferred layout;
either verified once per model and unchanged model (the checked-once cache)."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
import weakref

from torch import nn

from ..errors import UnsupportedModelError
from .block_reading import read_blocks, share
from .checks import (
    LayoutCheck,
    _missing_module,
    _returns_residual,
    _verify_or_diagnose,
    layout_check,
    mixer_kind,
    pads_safely,
)
from .identity import _check_canary, _what_checks_see
from .layout import Adapter, _exists, _get, decoder_stack, execution_device


def _logit_scale(config) -> float:
    return config.logit_scale  # the Cohere family's


def _inverse_logits_scaling(config) -> float:
    return 1 / config.logits_scaling  # Granite's, MiniCPM3's


def _logits_scaling(config) -> float:
    return config.logits_scaling  # HyperCLOVA X's (it multiplies)


def _residual_multiplier(config) -> float:
    return config.residual_multiplier  # Granite's, HyperCLOVA X's


# what a head may multiply its logits by, by the config field that holds it: tried where a layout's
# writes add up and its head misses the logits, and kept only when the head then gives them
_CONFIG_LOGIT_SCALES = (
    ("logit_scale", _logit_scale), ("logits_scaling", _inverse_logits_scaling), ("logits_scaling", _logits_scaling),
)  # fmt: skip
_LLAMA_LIKE = Adapter()
_POST_SUBLAYER_NORMS = Adapter(attn_out="post_attention_layernorm", mlp_out="post_feedforward_layernorm")

ADAPTERS: dict[str, Adapter] = {
    "llama": _LLAMA_LIKE,
    "qwen2": _LLAMA_LIKE,
    "qwen3": _LLAMA_LIKE,
    "mistral": _LLAMA_LIKE,
    "phi3": _LLAMA_LIKE,
    "gemma2": _POST_SUBLAYER_NORMS,
    "gemma3_text": _POST_SUBLAYER_NORMS,
    "olmo2": _POST_SUBLAYER_NORMS,
    # mixture-of-experts blocks: the MLP slot holds the router and experts; what it adds to the
    # residual is its output, whatever the router chose
    "mixtral": _LLAMA_LIKE,
    "qwen2_moe": _LLAMA_LIKE,
    "qwen3_moe": _LLAMA_LIKE,
    "olmoe": _LLAMA_LIKE,
    "gpt2": Adapter(layers="transformer.h", final_norm="transformer.ln_f", attn_out="attn", mlp_out="mlp"),
    # a parallel block (attention and MLP both read the normed input) whose head scales its logits
    "cohere": Adapter(logit_scale=_logit_scale),
    "cohere2": Adapter(logit_scale=_logit_scale),
    # each write is scaled by a residual multiplier, the logits divided by logits_scaling
    "granite": Adapter(write_scale=_residual_multiplier, logit_scale=_inverse_logits_scaling),
    # Granite's multipliers, its MoE in the MLP's place
    **dict.fromkeys(
        ("granitemoe", "granitemoeshared", "granitemoe_swa"),
        Adapter(
            mlp_out="block_sparse_moe",
            write_scale=_residual_multiplier,
            logit_scale=_inverse_logits_scaling,
        ),
    ),
    # BLOOM: sublayers given the residual return it with their write; ALiBi folds the batch into heads
    "bloom": Adapter(
        layers="transformer.h",
        final_norm="transformer.ln_f",
        attn_out="self_attention",
        mlp_out="mlp",
        residual_arg="residual",
        folded_kwargs=("alibi",),
    ),
    # DBRX: the attention inside a norm-attention-norm module, the MoE beside it
    "dbrx": Adapter(
        layers="transformer.blocks", final_norm="transformer.norm_f", attn_out="norm_attn_norm.attn", mlp_out="ffn"
    ),
    # MiniCPM3 scales each write by scale_depth / √L and divides the final residual by logits_scaling
    "minicpm3": Adapter(
        write_scale=lambda config: config.scale_depth / math.sqrt(config.num_hidden_layers),
        logit_scale=_inverse_logits_scaling,
    ),
    # Gemma 4: a third write where a block has per-layer inputs (their projection, counted with the
    # MLP's) and each block's output times its layer_scalar buffer
    **{
        model_type: Adapter(
            layers=f"{stack}.layers",
            final_norm=f"{stack}.norm",
            attn_out="post_attention_layernorm",
            mlp_out="post_feedforward_layernorm",
            mlp_also=("post_per_layer_input_norm",),
            residual_scale="layer_scalar",
        )
        for model_type, stack in (
            ("gemma4_text", "model"),
            ("gemma4", "model.language_model"),
            ("gemma4_unified_text", "model"),
            ("gemma4_unified", "model.language_model"),
        )
    },
    "gpt_neox": Adapter(
        layers="gpt_neox.layers",
        final_norm="gpt_neox.final_layer_norm",
        attn_out="attention",
        mlp_out="mlp",
    ),
}

# Known architectures the probes cannot handle, with the reason.
_REJECTED: dict[str, str] = {
    "bert": "an encoder (bidirectional, post-norm)",
    "roberta": "an encoder (bidirectional, post-norm)",
    "distilbert": "an encoder (bidirectional, post-norm)",
    "t5": "an encoder-decoder",
    "bart": "an encoder-decoder (post-norm)",
}


# the layouts a model type outside the table is tried against, each verified on a probe input
_LAYOUTS = {
    "Llama-like": _LLAMA_LIKE,
    "sublayer-norm (Gemma 2/3, OLMo 2)": _POST_SUBLAYER_NORMS,
    "GPT-2-like": ADAPTERS["gpt2"],
    "GPT-NeoX-like": ADAPTERS["gpt_neox"],
    "final_layernorm (Phi, Persimmon)": Adapter(final_norm="model.final_layernorm"),
}


# ``self_attention``, Llama 4's ``feed_forward``, MPT's ``transformer.blocks``, GLM-4's post-sublayer
# norms): every combination the model has is tried, in this order, and only one that verifies is used.
_LAYER_LISTS = (
    "model.layers", "transformer.h", "transformer.blocks", "transformer.layers", "gpt_neox.layers",
    "model.decoder.layers", "biogpt.layers",
)  # fmt: skip
_FINAL_NORMS = (
    "model.norm", "transformer.ln_f", "transformer.norm_f", "transformer.norm", "model.final_layernorm",
    "model.final_norm", "gpt_neox.final_layer_norm", "model.decoder.final_layer_norm", "model.layer_norm",
    "biogpt.layer_norm",
)  # fmt: skip
_WRITE_PAIRS = (  # (attention's write, MLP's write): post-sublayer norms first, where a block has them
    ("post_attention_layernorm", "post_feedforward_layernorm"),
    ("post_self_attn_layernorm", "post_mlp_layernorm"),
)
_ATTENTIONS = ("self_attn", "self_attention", "attn", "attention")
_MLPS = ("mlp", "feed_forward", "ffn", "block_sparse_moe", "moe", "fc2")  # fc2: OPT's, XGLM's MLP write
MAX_CANDIDATES = 12  # each candidate costs one short forward pass at load


def _candidate_layouts(model: nn.Module) -> list[tuple[str, Adapter]]:
    """The known layouts, then every layout the model's own module names make (at most
    ``MAX_CANDIDATES`` in all that exist), each to be verified before use."""
    found = [(label, adapter) for label, adapter in _LAYOUTS.items() if _missing_module(model, adapter) is None]
    for layers_path in _LAYER_LISTS:
        try:
            first = _get(model, layers_path)[0]
            children = {name for name, _ in first.named_children()}
        except (AttributeError, IndexError, KeyError, TypeError):  # not a list of modules
            continue
        pairs = [pair for pair in _WRITE_PAIRS if set(pair) <= children]
        pairs += [(a, m) for a in _ATTENTIONS for m in _MLPS if a in children and m in children]
        norms = [norm for norm in _FINAL_NORMS if pairs and _exists(model, norm)]
        for norm in norms:
            for attn, mlp in pairs:
                residual = _returns_residual(getattr(first, attn)) or _returns_residual(getattr(first, mlp))
                adapter = Adapter(layers=layers_path, final_norm=norm, attn_out=attn, mlp_out=mlp)
                if residual:  # BLOOM's, MPT's: a sublayer given the residual returns it with its write
                    adapter = Adapter(layers_path, norm, attn, mlp, residual_arg="residual")
                if all(adapter != known for _, known in found):
                    found.append((f"{layers_path}[i].{attn} + .{mlp}, {norm}", adapter))
    return found[:MAX_CANDIDATES]


def _head_transforms(model: nn.Module, adapter: Adapter) -> list[str]:
    """Modules of the causal LM, outside its decoder stack and embeddings, that its head may apply
    between the final norm and the unembedding (ModernBERT-decoder's prediction head)."""
    skip = {
        adapter.layers.partition(".")[0],
        *(n for n, m in model.named_children() if m is model.get_output_embeddings()),
    }
    return [
        name
        for name, module in model.named_children()
        if name not in skip and module is not model.get_input_embeddings() and any(True for _ in module.parameters())
    ]


def _verified_layout(
    model: nn.Module, label: str, adapter: Adapter, tried: list[str]
) -> tuple[Adapter, LayoutCheck] | None:
    """``adapter`` (or it with the head transform or config-named logit scale that makes its head give
    the model's logits) and its check when it verifies, else None with what was off appended to ``tried``."""
    try:
        check = layout_check(model, adapter)
    except Exception as exc:  # a forward pass the hooks cannot read: not this layout
        tried.append(f"{label} (its forward failed: {type(exc).__name__})")
        return None
    if check.repeated:
        tried.append(f"{label} ({check.repeated})")
        return None
    if check.writes_ok and check.ordered and not check.head_ok:
        heads = [dataclasses.replace(adapter, head_transform=name) for name in _head_transforms(model, adapter)]
        heads += [  # a logit multiplier the config names (the Cohere family's, Granite's)
            dataclasses.replace(adapter, logit_scale=scale)
            for field, scale in _CONFIG_LOGIT_SCALES
            if adapter.logit_scale is None
            and isinstance(getattr(model.config.get_text_config(), field, None), int | float)
        ]
        for head in heads:
            with contextlib.suppress(Exception):  # a module that is no head transform may not even take h
                if (head_check := layout_check(model, head)).fits:
                    return head, head_check
        tried.append(
            f"{label}: the writes add up, but the final normalization and head miss its logits by {share(check.head)}"
        )
        return None
    if check.fits:
        return adapter, check
    if check.writes_ok and not check.ordered:
        tried.append(f"{label}: the writes add up, but {adapter.attn_out} runs after {adapter.mlp_out}")
        return None
    tried.append(f"{label} (off by {share(check.gap)} of the change)")
    return None


def infer_adapter(model: nn.Module, model_type: str, name: str) -> Adapter:
    """The adapter of a model type outside the table: the first known layout, or layout made of the
    model's own module names, or layout read off its blocks' outputs (``block_reading``), whose
    attention and MLP writes add up to what each block adds to the residual and whose final norm and
    head give its logits, checked on a probe input (a warning names it); else one line saying why,
    about the model where its blocks say (post-norm, layers run more than once, a third write)."""
    import warnings

    from ..errors import EffdepthWarning

    tried: list[str] = []
    candidates = [
        (label, adapter) for label, adapter in _candidate_layouts(model) if not _missing_module(model, adapter)
    ]
    found = next((v for label, a in candidates if (v := _verified_layout(model, label, a, tried))), None)
    mixer = mixer_kind(model.config, model_type)
    multiplier = getattr(
        model.config.get_text_config(), "residual_multiplier", None
    )  # each write's, where the config names one
    scaled = isinstance(multiplier, int | float) and not isinstance(multiplier, bool)
    # the two writes found by their outputs, whatever their names; never a token mixer's in the
    # attention's place (a mixer is measured only where a named layout verifies: kimi_linear)
    reading = None
    if found is None and mixer is None:
        reading = read_blocks(model, float(multiplier) if scaled else 1.0, execution_device(model))
    if reading is not None and reading.writes:
        attn, mlp = reading.writes
        named = [norm for norm in _FINAL_NORMS if _exists(model, norm)]  # known names first, then its other norms
        norms = dict.fromkeys((*named, *reading.final_norms))
        for norm in norms:
            adapter = Adapter(reading.layers, norm, attn, mlp, write_scale=_residual_multiplier if scaled else None)
            label = f"{reading.layers}[i].{attn} + .{mlp}, {norm} (read off the blocks' outputs)"
            if all(adapter != known for _, known in candidates) and (
                found := _verified_layout(model, label, adapter, tried)
            ):
                break
    if found is not None:
        found, check = found
        label = next((label for label, known in _LAYOUTS.items() if known == found), _describe(found))
        warnings.warn(
            f"model {name!r} (model_type {model_type!r}) is not in the adapter table; its layout was inferred as "
            f"{label} and verified on a probe input (the attention and MLP writes add up to each block's "
            f"change within {check.gap:.1e})",
            EffdepthWarning,
            stacklevel=3,
        )
        return found
    tried_text = "; ".join(tried) if tried else "no known layout's module names match"
    if mixer is not None:
        raise UnsupportedModelError(
            f"model {name!r} (model_type {model_type!r}) mixes tokens with state-space, recurrent, linear-attention "
            f"or convolutional layers ({mixer}), and its blocks do not verify as a token mixer's write plus an MLP's "
            f"adding up to each block's change ({tried_text}); effdepth measures residual blocks it can split so "
            "(linear-attention hybrids that verify, such as kimi_linear, are measured)"
        )
    if reading is not None and reading.reason:
        raise UnsupportedModelError(
            f"model {name!r} (model_type {model_type!r}) is not a pre-norm residual decoder effdepth can split: "
            f"{reading.reason}"
        )
    text = getattr(model.config, "text_config", None)
    if text is not None and text is not model.config:
        raise UnsupportedModelError(
            f"model {name!r} (model_type {model_type!r}) is a multimodal model around a text decoder "
            f"(config.text_config, model_type {getattr(text, 'model_type', '?')!r}); measure that decoder alone"
        )
    raise UnsupportedModelError(
        f"model {name!r} has model_type {model_type!r}, which is not in the adapter table, and no layout could be "
        f"verified: the attention and MLP writes must add up to h_(l+1) − h_l and the final normalization and "
        f"head give its logits ({tried_text}). Supported model types: "
        f"{', '.join(supported_model_types())}; describe its layout with wrap_model(model, adapter=Adapter(...))"
    )


def _describe(adapter: Adapter) -> str:
    """A layout in a few words: ``model.layers[i].self_attn + .mlp, model.norm`` (and its head transform)."""
    text = f"{adapter.layers}[i].{adapter.attn_out} + .{adapter.mlp_out}, {adapter.final_norm}"
    return text + (f", head through {adapter.head_transform}" if adapter.head_transform else "")


def supported_model_types() -> list[str]:
    return sorted(ADAPTERS)


def _unsupported_message(model_type: str, name: str) -> str:
    why = _REJECTED.get(model_type, "not a known pre-norm decoder")
    return (
        f"model {name!r} has model_type {model_type!r}, which is {why}; the probes assume a pre-norm "
        f"decoder-only LM. Supported model types: {', '.join(supported_model_types())}"
    )


# a model wrapped again unchanged (a probe called on a plain model, call after call) is not checked again
_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _checked_layout(model: nn.Module, adapter: Adapter | None, model_type: str, name: str) -> tuple[Adapter, bool]:
    """The verified layout of ``model`` (``adapter``, the table's row, or inferred) and whether a
    padded batch leaves each prompt's states as they are alone; refused in one line when a check
    fails. A model checked before under the same name and unchanged since (``_what_checks_see``,
    read after the checks ran: what their forwards update is part of it) is not run again; the
    warnings its checks gave are given again."""
    try:
        seen = _what_checks_see(model, adapter)
    except Exception:  # weights without storage (a tensor subclass): checked every time, as before
        seen = None
    known = _CHECKED.get(model)
    fresh = seen is not None and known is not None and known[:2] == (seen, name) and known[5] is not None
    if fresh and known[5] == _check_canary(model):
        _, _, found, padding, given, _ = known  # unchanged as far as fingerprints see, and computing the same
    else:
        found, padding, given = _run_checks(model, adapter, model_type, name)
        if seen is not None:
            canary = _check_canary(model)
            _CHECKED[model] = (_what_checks_see(model, adapter), name, found, padding, given, canary)
    for warning in given:
        warnings.warn(warning.message, warning.category, stacklevel=3)
    return found, padding


def _run_checks(model: nn.Module, adapter: Adapter | None, model_type: str, name: str) -> tuple[Adapter, bool, list]:
    """The layout checks and the padding check, run: (layout, pads safely, the warnings they gave)."""
    with warnings.catch_warnings(record=True) as given:
        warnings.simplefilter("always")
        if adapter is not None:
            _verify_or_diagnose(model, adapter, name, "the adapter given")
            found = adapter
        elif model_type in ADAPTERS:
            found = ADAPTERS[model_type]
            _verify_or_diagnose(model, found, name, f"the adapter table's row for {model_type!r}")
        else:
            found = infer_adapter(model, model_type, name)
        try:  # the lens reads the stack's last hidden state (final norm applied): a stack must give one
            padding = pads_safely(model, decoder_stack(model, found), _get(model, found.layers)[0])
        except Exception as exc:
            raise UnsupportedModelError(
                f"model {name!r}: its decoder stack ({found.layers.rpartition('.')[0] or 'the model'}) gives no "
                f"last hidden state on its own ({type(exc).__name__}); load the text model alone, or describe it "
                "with wrap_model(adapter=...)"
            ) from None
    return found, padding, list(given)
