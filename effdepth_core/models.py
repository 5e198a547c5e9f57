"""Load a causal LM and describe where its residual stream, sublayers, norm and head live."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import itertools
import math
import warnings
import weakref
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from .acquire import hub_error, resolve_model, save_dequantized
from .block_reading import HALF_TOLERANCE, LAYOUT_TOLERANCE, read_blocks, share
from .cache import read_json
from .errors import EffdepthError, ModelNotFoundError, UnsupportedModelError, nearest_name
from .paths import exists, user_path
from .zoo import ZOO, is_gguf


@dataclass(frozen=True)
class Adapter:
    """Where one architecture keeps the parts the probes read.

    ``attn_out`` / ``mlp_out`` name the submodule of a decoder layer whose output, times
    ``write_scale``, is exactly what that sublayer adds to the residual stream (after any
    post-sublayer norm). The optional callables read the model's (text) config: ``write_scale`` (a
    residual multiplier, Granite's), ``logit_scale`` (what the head's logits are multiplied by:
    Cohere's ``logit_scale``, Granite's 1 / ``logits_scaling``). ``residual_arg``: a sublayer whose
    call takes an argument of this name returns that residual plus its write (BLOOM's attention and
    MLP, MPT's MLP): its write is its output minus that argument. ``folded_kwargs``: keyword
    arguments a block receives with the batch folded into their first dimension (BLOOM's ``alibi``,
    ``[batch · head, 1, key]``): a replay of several rows repeats them per row. ``head_transform``:
    a module of the model that its head applies between the final norm and the unembedding
    (ModernBERT-decoder's prediction head, ``lm_head``). ``attn_also`` / ``mlp_also``: further
    modules of a block whose outputs are writes to the residual, counted with the attention's or
    with the MLP's (the rest of the block: Gemma 4's per-layer-input write,
    ``post_per_layer_input_norm``). ``residual_scale``: a buffer, parameter or one-tensor module of
    a block whose value multiplies the block's output, residual included (Gemma 4's
    ``layer_scalar``: h_(l+1) = s · (h_l + writes)); each write is then read times s (method.md §1).
    Every adapter is verified at load.
    """

    layers: str = "model.layers"
    final_norm: str = "model.norm"
    attn_out: str = "self_attn"
    mlp_out: str = "mlp"
    write_scale: Callable[[Any], float] | None = None
    logit_scale: Callable[[Any], float] | None = None
    residual_arg: str | None = None
    folded_kwargs: tuple[str, ...] = ()
    head_transform: str | None = None
    attn_also: tuple[str, ...] = ()
    mlp_also: tuple[str, ...] = ()
    residual_scale: str | None = None

    def write_names(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The modules of a block whose outputs are its writes: the attention's group, the rest."""
        return (self.attn_out, *self.attn_also), (self.mlp_out, *self.mlp_also)


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


PADDING_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-9}  # else (bf16, fp16): 2e-2
# float32 rounding of one forward in another batch shape moves hidden states by ~1e-6 relative; a
# sparse-attention indexer that picks padded keys moves them by 1-10 % (issue 33): 1e-4 is between,
# with margin both ways. Half precision rounds at ~4e-3 per operation, so 2e-2 there.
PADDING_NOISE_FACTOR = 4
# Deep in a bfloat16 stack the batch's other kernels' rounding is amplified: on an H200, random
# Qwen2.5-1.5B/7B weights moved the last state of the *unpadded* prompt of the batch by 1.4-1.5 %
# and of the padded one by 2.3-3.6 % (layer 0: 0 and 0.3 %). So the last state is judged against
# that prompt's own drift (the rounding this batch shape gives; padding cannot reach it): over 4x
# that drift, and over the tolerance, is padding. The first layer's output, before any
# amplification, is judged against the tolerance alone.


def decoder_stack(model: nn.Module, adapter: Adapter) -> nn.Module:
    """The module that holds the decoder layers (``model.layers`` → ``model``): run alone, it gives
    the last hidden state without the head. (``base_model`` is not always it: a multimodal causal
    LM's may be the whole model.)"""
    parent = adapter.layers.rpartition(".")[0]
    return _get(model, parent) if parent else model


# config fields naming how many keys a sparse-attention indexer keeps per query (DeepSeek V3.2's DSA
# and its relatives): past that many keys, which ones a padded batch keeps can differ from those the
# prompt alone keeps, batch by batch (with the batch's width and content: a tiny deepseek_v32 passed
# on its run's longest and shortest prompt padded together and failed on the run's whole batch), so
# no one padded batch verifies the rest (issue 45)
KEY_SELECTION_FIELDS = ("index_topk",)


def model_configs(model: nn.Module) -> list:
    """The model's config and each of its sub-configs, once each."""
    configs, found, visited = [model.config], [], set()
    while configs:
        config = configs.pop()
        if id(config) in visited:
            continue
        visited.add(id(config))
        found.append(config)
        configs += [getattr(config, key) for key in getattr(config, "sub_configs", {}) if getattr(config, key, None)]
    return found


def attention_key(model: nn.Module) -> tuple:
    """What the model's attention runs, per config and sub-config: its attention and experts
    implementations and the kernels transformers' registries hold under those names (an entry of
    ``ALL_ATTENTION_FUNCTIONS`` or ``ALL_MASK_ATTENTION_FUNCTIONS`` swapped is another attention)."""
    try:
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError:  # pragma: no cover - transformers always ships them
        ALL_ATTENTION_FUNCTIONS = ALL_MASK_ATTENTION_FUNCTIONS = {}
    key = []
    for config in model_configs(model):
        implementation = getattr(config, "_attn_implementation", None)
        kernels = (None, None)
        if isinstance(implementation, str):
            kernels = tuple(
                _held(registry.get(implementation))
                for registry in (ALL_ATTENTION_FUNCTIONS, ALL_MASK_ATTENTION_FUNCTIONS)
            )
        key.append((implementation, getattr(config, "_experts_implementation", None), kernels))
    return tuple(key)


def key_selection(model: nn.Module) -> int | None:
    """The fewest keys a sparse-attention indexer of ``model`` keeps per query (``index_topk`` of its
    config or a sub-config), or None where none selects keys."""
    sizes = [
        int(value)
        for config in model_configs(model)
        for name in KEY_SELECTION_FIELDS
        if isinstance(value := getattr(config, name, None), int) and value > 0
    ]
    return min(sizes) if sizes else None


def pads_safely(
    model: nn.Module,
    stack: nn.Module,
    first_layer: nn.Module | None = None,
    prompts: list[torch.Tensor] | None = None,
) -> bool:
    """Whether right-padding a batch leaves every prompt's own hidden states as they are alone:
    ``prompts`` (default: two of 5 and 9 tokens; a run passes its own, ``padding_holds``), padded
    together, against each one alone — at ``first_layer``'s output and at the stack's last hidden
    state (``stack``: the decoder stack run alone; an error running a prompt alone is raised: the
    lens needs that). A model whose attention reads padded keys fails, and is then measured one
    prompt at a time. The longest prompt has no padding: its drift is the batch's rounding, which
    the last state is judged by."""
    vocab = int(getattr(model.config, "vocab_size", 8) or 8)
    if prompts is None:
        prompts = [(torch.arange(n) * 7 + 3 * i) % max(vocab - 1, 1) + 1 for i, n in enumerate((5, 9))]
    prompts = [p.flatten().cpu() for p in prompts]
    lengths = [p.numel() for p in prompts]
    device = execution_device(model)

    def states(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        # the stack's own output, not output_hidden_states (transformers 5 records those through
        # hooks it leaves on every layer); the first layer's output through a hook of our own
        seen: list[torch.Tensor] = []

        def keep(module, args, output):
            seen.append((output[0] if isinstance(output, tuple) else output).float().cpu())

        handle = first_layer.register_forward_hook(keep) if first_layer is not None else None
        try:
            out = stack(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False)
        finally:
            if handle is not None:
                handle.remove()
        first = seen[0] if seen and seen[0].dim() == 3 else None
        return out.last_hidden_state.float().cpu(), first

    with torch.inference_mode():
        alone = [states(p[None], torch.ones(1, p.numel(), dtype=torch.long)) for p in prompts]
    try:
        with torch.inference_mode():
            width = max(lengths)
            ids = torch.zeros(len(prompts), width, dtype=torch.long)
            mask = torch.zeros(len(prompts), width, dtype=torch.long)
            for row, p in enumerate(prompts):
                ids[row, : p.numel()], mask[row, : p.numel()] = p, 1
            padded, padded_first = states(ids, mask)
    except Exception:  # a model that cannot take a padded batch is measured one prompt at a time
        return False
    dtype = next(model.parameters()).dtype
    tolerance = PADDING_TOLERANCE.get(dtype, 2e-2)
    if not all(torch.isfinite(state).all() for state, _ in alone):
        return True  # a model that gives NaN alone: the probes name the layer; padding is not the question

    def drift(together: torch.Tensor, state: torch.Tensor) -> float:
        if not torch.isfinite(together).all():
            return math.inf
        return float((together - state).norm(dim=-1).max()) / (float(state.norm(dim=-1).max()) or 1.0)

    unpadded = lengths.index(width)
    noise = drift(padded[unpadded, :width], alone[unpadded][0][0])
    if not math.isfinite(noise):  # the batch itself breaks (NaN where alone is finite): never padded
        return False
    for row, (state, first) in enumerate(alone):
        n = state.shape[1]
        if drift(padded[row, :n], state[0]) > max(tolerance, PADDING_NOISE_FACTOR * noise):
            return False
        if first is not None and padded_first is not None and drift(padded_first[row, :n], first[0]) > tolerance:
            return False
    return True


class LayoutCheck(NamedTuple):
    """What ``layout_check`` found: the worst layer's |h_{l+1} − h_l − (a_l + m_l)| relative to
    |h_{l+1} − h_l| (``gap``) and whether it is within rounding (``writes_ok``); the relative miss
    of the final norm and head against the model's logits (``head``, ``head_ok``); whether each
    layer's attention ran before its MLP (``ordered``: swapped names add up too); and what ran more
    than once per forward where a layer and each of its writes must run once (``repeated``: a
    layer list holding one block twice, a dropout module shared by both writes)."""

    gap: float
    writes_ok: bool
    head: float
    head_ok: bool
    ordered: bool
    repeated: str | None = None

    @property
    def fits(self) -> bool:
        return self.writes_ok and self.head_ok and self.ordered and self.repeated is None


def layout_check(model: nn.Module, adapter: Adapter) -> LayoutCheck:
    """Run the model once on a short probe input with hooks on what ``adapter`` names, in the
    model's own dtype. Rounding allowed: ``LAYOUT_TOLERANCE`` of the change, plus two units of the
    dtype's rounding of the summed magnitudes (a bfloat16 block's small change beside a large
    residual cannot add up closer than that)."""
    layers = _get(model, adapter.layers)
    seen: dict[int, dict[str, torch.Tensor]] = {i: {} for i in range(len(layers))}
    order: dict[int, list[str]] = {i: [] for i in range(len(layers))}
    handles = []

    def keep(index: int, key: str, output: bool):
        def hook(module, args, kwargs, *out):
            value = out[0] if output else (args[0] if args else kwargs["hidden_states"])
            value = value[0] if isinstance(value, tuple) else value
            if key != "h_out" and output:  # a sublayer's output: less the residual it may include
                value = sublayer_write(adapter, value, named_arguments(module, args, kwargs), seen[index]["h_in"].shape)
            seen[index][key] = value.detach().clone()  # a block may change it in place later
            order[index].append(key)

        return hook

    vocab = int(getattr(model.config, "vocab_size", 8) or 8)
    try:  # hooks registered inside: a module missing on a later layer leaves none behind
        for index, layer in enumerate(layers):
            handles.append(layer.register_forward_pre_hook(keep(index, "h_in", False), with_kwargs=True))
            handles.append(layer.register_forward_hook(keep(index, "h_out", True), with_kwargs=True))
            for group, modules in zip(("attn", "mlp"), write_modules(layer, adapter), strict=True):
                for number, module in enumerate(modules):
                    key = f"{group}_out" if number == 0 else f"{group}_also{number}"
                    handles.append(module.register_forward_hook(keep(index, key, True), with_kwargs=True))
        with torch.inference_mode():
            ids = (torch.arange(9) % max(vocab - 1, 1) + 1)[None]  # 9 tokens of ids 1.., whatever they mean
            logits = model(input_ids=ids.to(execution_device(model)), use_cache=False).logits.float()
            last = seen[len(layers) - 1]["h_out"]  # in the model's dtype, as its own final norm reads it
            normed = _get(model, adapter.final_norm)(last)
            if adapter.head_transform:
                normed = _get(model, adapter.head_transform)(normed)
            decoded = model.get_output_embeddings()(normed).float()
            if adapter.logit_scale is not None:
                decoded = decoded * float(adapter.logit_scale(model.config.get_text_config()))
            cap = getattr(model.config.get_text_config(), "final_logit_softcapping", None)
            if cap:
                decoded = cap * torch.tanh(decoded / cap)
    finally:
        for handle in handles:
            handle.remove()
    ordered = all(keys.index("attn_out") < keys.index("mlp_out") for keys in order.values() if "mlp_out" in keys)
    names = {"h_in": f"{adapter.layers}[{{}}]", "attn_out": adapter.attn_out, "mlp_out": adapter.mlp_out}
    names |= {f"attn_also{i}": n for i, n in enumerate(adapter.attn_also, 1)}
    names |= {f"mlp_also{i}": n for i, n in enumerate(adapter.mlp_also, 1)}
    repeated = next(
        (
            f"{names[key].format(index)} runs {keys.count(key)} times per forward"
            for index, keys in order.items()
            for key in names
            if keys.count(key) > 1
        ),
        None,
    )
    finite = bool(torch.isfinite(logits).all()) and all(
        bool(torch.isfinite(t).all()) for p in seen.values() for t in p.values()
    )
    if not finite:  # NaN or inf in the model itself: not the layout's fault; the probes name the layer
        return LayoutCheck(0.0, True, 0.0, True, ordered, repeated)
    dtype = last.dtype
    tolerance = LAYOUT_TOLERANCE.get(dtype, HALF_TOLERANCE)
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    scale = float(adapter.write_scale(model.config.get_text_config())) if adapter.write_scale is not None else 1.0
    gaps, writes_ok = [], True
    for index, parts in seen.items():
        h_in, h_out = parts["h_in"].float(), parts["h_out"].float()
        groups = [[v.float() for k, v in parts.items() if k.startswith(g)] for g in ("attn_", "mlp_")]
        if any(w.shape != h_in.shape for group in groups for w in group):  # a write of another size than the
            gaps.append(1.0)  # residual: it may add up by broadcasting here and still be no per-token write
            writes_ok = False
            continue
        rescale = residual_scale(layers[index], adapter)  # h_(l+1) = s · (h_l + writes): writes read times s
        block_scale = rescale.float().to(h_in.device) if rescale is not None else 1.0
        attn, mlp = (scale * block_scale * sum(group) for group in groups)
        change = h_out - h_in
        if rescale is not None:  # the residual's own rescaling, (s − 1) · h_l, is no sublayer's write
            change = change - (block_scale - 1) * h_in
        missed = float((change - attn - mlp).norm())
        gaps.append(missed / max(float(change.norm()), 1e-12))
        rounding = 2 * eps * float(h_out.norm() + attn.norm() + mlp.norm())
        writes_ok &= missed <= tolerance * float(change.norm()) + rounding
    head = float((decoded - logits).norm() / logits.norm().clamp_min(1e-12))
    return LayoutCheck(max(gaps), writes_ok, head, head <= tolerance, ordered, repeated)


def arguments_by_name(module: nn.Module, args: tuple, kwargs: dict) -> dict:
    """The call's arguments after the hidden state, all by name: some blocks (GPT-2's) are called
    with their mask and cache positionally, and a replay passes them back by name."""
    if len(args) <= 1:
        return kwargs
    names = list(inspect.signature(module.forward).parameters)[1 : len(args)]
    if len(names) < len(args) - 1:
        raise RuntimeError(f"{type(module).__name__} got {len(args)} positional arguments for {len(names) + 1} names")
    return {**dict(zip(names, args[1:], strict=True)), **kwargs}


def named_arguments(module: nn.Module, args: tuple, kwargs: dict) -> dict:
    """The call's arguments after the hidden state, by name (``arguments_by_name``), or its keyword arguments
    alone where its signature cannot name the positional ones."""
    try:
        return arguments_by_name(module, args, kwargs)
    except (RuntimeError, TypeError, ValueError):
        return kwargs


def sublayer_write(
    adapter: Adapter, output: torch.Tensor, arguments: dict, shape: torch.Size | None = None
) -> torch.Tensor:
    """What a sublayer adds to the residual, from its output and its call's named arguments: the
    output, less the residual argument where the adapter says the output includes it — a new
    tensor either way, since a block may add to its sublayer's output in place afterwards
    (Falcon's ``mlp_output += attention_output``). An output flattened over the batch and tokens
    (OPT's MLP, Llama 4's MoE: ``[batch · token, d]``) is read in the residual's ``shape``, as the
    block itself views it."""
    if adapter.residual_arg is not None and isinstance(arguments.get(adapter.residual_arg), torch.Tensor):
        output = output - arguments[adapter.residual_arg]
    else:
        output = output.clone()
    if shape is not None and output.shape != shape and output.numel() == math.prod(shape):
        output = output.reshape(shape)
    return output


def _parameters(module: nn.Module) -> tuple[str, ...]:
    """The names of a module's ``forward`` parameters (none where its signature cannot be read)."""
    try:
        return tuple(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return ()


def _returns_residual(module: nn.Module) -> bool:
    """Whether a sublayer takes the residual as an argument (and so returns it with its write)."""
    return "residual" in _parameters(module)


def _missing_module(model: nn.Module, adapter: Adapter) -> str | None:
    """Why a module ``adapter`` names is not in ``model`` (None when all are)."""
    try:
        layers = _get(model, adapter.layers)
        _get(model, adapter.final_norm)
        _get(layers[0], adapter.attn_out), _get(layers[0], adapter.mlp_out)
        if adapter.residual_scale:
            _get(layers[0], adapter.residual_scale)
        if adapter.head_transform:
            _get(model, adapter.head_transform)
    except (AttributeError, IndexError, TypeError) as exc:
        return str(exc)
    return None


def verify_adapter(model: nn.Module, adapter: Adapter, name: str, what: str) -> None:
    """Refuse ``adapter`` in one line unless the modules it names exist, their writes add up to each
    block's change (attention first), and the final norm and head give the model's own logits."""
    if not isinstance(adapter, Adapter):
        raise UnsupportedModelError(f"adapter= takes an effdepth_core.models.Adapter, got {type(adapter).__name__}")
    missing = _missing_module(model, adapter)
    if missing:
        raise UnsupportedModelError(f"{what} does not fit model {name!r}: it names no module {missing}")
    if adapter.residual_arg is not None:
        first = _get(model, adapter.layers)[0]
        sublayers = (_get(first, adapter.attn_out), _get(first, adapter.mlp_out))
        if not isinstance(adapter.residual_arg, str) or not any(
            adapter.residual_arg in _parameters(m) for m in sublayers
        ):
            raise UnsupportedModelError(
                f"{what} does not fit model {name!r}: residual_arg={adapter.residual_arg!r} names no argument of "
                f"its attention or MLP ({adapter.attn_out}, {adapter.mlp_out}); name the one that carries the "
                "residual, or leave it None"
            )
    try:
        check = layout_check(model, adapter)
    except Exception as exc:  # a forward pass the hooks cannot read, or a callable that fails
        _refuse_for_its_cause(model, adapter, name)
        raise UnsupportedModelError(
            f"{what} does not fit model {name!r}: the layout check failed ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:120] if str(exc) else 'no message'})"
        ) from None
    if check.repeated or not check.writes_ok or not check.ordered or not check.head_ok:
        _refuse_for_its_cause(model, adapter, name)  # the user's hook or a config at odds with the modules
    if check.repeated:
        raise UnsupportedModelError(
            f"{what} does not fit model {name!r}: {check.repeated}, where each layer and each of its writes runs "
            "once (a block run more than once has no one depth; a write module called twice is not one write)"
        )
    if not check.writes_ok:
        raise UnsupportedModelError(
            f"{what} does not fit model {name!r}: the attention and MLP writes it names miss each block's change "
            f"by {share(check.gap)} (a residual multiplier, or other modules write into the residual)"
        )
    if not check.ordered:
        raise UnsupportedModelError(
            f"{what} does not fit model {name!r}: the module it names as the attention ({adapter.attn_out}) runs "
            f"after the one it names as the MLP ({adapter.mlp_out}); swap them"
        )
    if not check.head_ok:
        raise UnsupportedModelError(
            f"{what} does not fit model {name!r}: its final normalization and head miss the model's logits by "
            f"{share(check.head)} (a logit scale or soft-cap the lens would not apply)"
        )


def _refuse_for_its_cause(model: nn.Module, adapter: Adapter, name: str) -> None:
    """A layout check failed: refuse in one line naming a cause the caller can fix, where there is one
    — a hook or replaced forward of theirs (which the check ran through), or a config whose layer
    count disagrees with the layers the model holds — before any guess at the architecture."""
    hooked = user_hooks(model)
    if hooked is not None:
        raise UnsupportedModelError(
            f"model {name!r} has a hook on {hooked}, which changed what effdepth's layout check read: remove it "
            "(handle.remove(); for hooks you cannot reach, load the model again) and measure the clean model"
        )
    config = getattr(model, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    declared = getattr(config, "num_hidden_layers", None)
    try:
        held = len(_get(model, adapter.layers))
    except (AttributeError, IndexError, TypeError):
        return
    if isinstance(declared, int) and not isinstance(declared, bool) and declared != held:
        raise UnsupportedModelError(
            f"model {name!r}: its config says {declared} layers (num_hidden_layers) but {adapter.layers} holds "
            f"{held}; make them agree (set config.num_hidden_layers = {held}, or load the model again)"
        )


# Token mixers that are not attention: state-space (Mamba), recurrent (RWKV, xLSTM, Griffin),
# convolutional (LFM) layers, told by the config effdepth reads, not by the model's name.
_MIXER_FIELDS = (
    "state_size",
    "ssm_state_size",
    "mamba_d_state",
    "mamba_expand",
    "conv_L_cache",
    "hybrid_override_pattern",
)
_MIXER_LAYER_TYPES = ("mamba", "linear_attention", "hybrid", "conv", "recurrent", "rwkv", "mlstm", "ssm")
_MIXER_MODEL_TYPES = ("rwkv", "xlstm")  # recurrent models whose configs name no such field


def mixer_kind(config, model_type: str) -> str | None:
    """What mixes tokens in a model whose blocks are not (or not only) attention — a state-space,
    recurrent, linear-attention or convolutional layer — as named by its config; None otherwise."""
    fields = [f for f in _MIXER_FIELDS if getattr(config, f, None) not in (None, [], "")]
    types = [*(getattr(config, "layer_types", None) or []), *(getattr(config, "layers_block_type", None) or [])]
    kinds = sorted({t for t in types if isinstance(t, str) and any(k in t.lower() for k in _MIXER_LAYER_TYPES)})
    if kinds:
        return f"its layer types include {', '.join(kinds)}"
    if fields:
        return f"its config has {', '.join(fields)}"
    if model_type in _MIXER_MODEL_TYPES:
        return f"{model_type} is a recurrent model"
    return None


# The module names a layout is built from where no known layout's names match (Falcon's
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


def _exists(model: nn.Module, path: str) -> bool:
    try:
        _get(model, path)
    except (AttributeError, IndexError, KeyError, TypeError):
        return False
    return True


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

    from .errors import EffdepthWarning

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


def _get(root: nn.Module, dotted: str) -> nn.Module:
    module = root
    for part in dotted.split("."):
        module = getattr(module, part)
    return module


def write_modules(block: nn.Module, adapter: Adapter) -> tuple[tuple[nn.Module, ...], tuple[nn.Module, ...]]:
    """The modules of ``block`` whose outputs are its writes, as (the attention's group, the rest):
    ``attn_out`` and ``mlp_out`` always, each ``attn_also`` / ``mlp_also`` module where the block
    has it (a Gemma 4 block without per-layer inputs has no third write)."""
    attn, rest = adapter.write_names()
    return (
        (_get(block, attn[0]), *(_get(block, n) for n in attn[1:] if _exists(block, n))),
        (_get(block, rest[0]), *(_get(block, n) for n in rest[1:] if _exists(block, n))),
    )


def residual_scale(block: nn.Module, adapter: Adapter) -> torch.Tensor | None:
    """The value ``block``'s output is multiplied by (``Adapter.residual_scale``: a buffer or
    parameter, or a module holding exactly one tensor), or None where the adapter names none."""
    if adapter.residual_scale is None:
        return None
    value = _get(block, adapter.residual_scale)
    if isinstance(value, nn.Module):
        tensors = list(itertools.chain(value.parameters(), value.buffers()))
        if len(tensors) != 1:
            raise UnsupportedModelError(
                f"residual_scale={adapter.residual_scale!r} names a module holding {len(tensors)} tensors; name "
                "the buffer or parameter the block's output is multiplied by"
            )
        value = tensors[0]
    if not isinstance(value, torch.Tensor):
        raise UnsupportedModelError(
            f"residual_scale={adapter.residual_scale!r} names a {type(value).__name__}; name a buffer or parameter"
        )
    return value.detach()


@dataclass(repr=False)
class LoadedModel:
    """A causal LM plus everything the probes need to read and decode its residual stream."""

    model: nn.Module
    tokenizer: object | None
    name: str
    adapter: Adapter
    layers: nn.ModuleList
    final_norm: nn.Module
    lm_head: nn.Module
    logit_softcap: float | None
    head_transform: nn.Module | None
    max_positions: int | None
    source: str | None = None  # the name load_model loaded it from (None: a model wrapped in memory)
    loaded_weights: tuple | None = None  # ``weights_state`` when load_model returned it
    loaded_config: str | None = None  # ``config_digest`` then (a field edited in place is another model)
    loaded_tokenizer: object | None = None  # the tokenizer it came with (another one is another model)
    pads_safely: bool = True  # False: a padded batch changes a prompt's numbers; measured one at a time
    replay_checked_tokens: int = 0  # the longest prompt ``replay.check_replay`` passed on
    prefix_replays: bool = True  # False: ``replay.check_replay`` found its prefix replay off; whole prompts
    write_scale: float | None = None  # ``Adapter.write_scale`` of this model's config
    logit_scale: float | None = None  # ``Adapter.logit_scale`` of this model's config
    padding_key: tuple | None = None  # ``attention_key`` when ``pads_safely`` was found (another: not known)
    # (attention_key, the prompts checked) → whether padding them together kept each prompt's
    # numbers (``padding_holds``); shared by the copies ``dataclasses.replace`` makes (the same model)
    padding_verdicts: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def rows(self, batch_size: int, token_lists: Sequence[torch.Tensor] | None = None) -> int:
        """The prompts a padded batch may hold: ``batch_size``, or 1 where padding changes numbers —
        for ``token_lists`` (a run's prompts) verified at their own lengths (``padding_holds``)."""
        if batch_size <= 1:
            return batch_size
        if token_lists is None:
            return batch_size if self.pads_safely and self.padding_key in (None, attention_key(self.model)) else 1
        return batch_size if self.padding_holds(token_lists, batch_size) else 1

    def padding_holds(self, token_lists: Sequence[torch.Tensor], batch_size: int) -> bool:
        """Whether right-padding these prompts in batches of ``batch_size`` leaves each one's hidden
        states as they are alone, verified on the run's own prompts: its first batch, with its longest
        and shortest prompt added, padded together against each prompt alone (``pads_safely``: one
        forward of that batch and one per prompt, once per attention and set of prompts). False, with
        a warning once, where the load-time check failed under the same attention, where this check
        fails, or where a sparse-attention indexer keeps fewer keys than the longest prompt has
        (``key_selection``: which keys it keeps under padding differs batch by batch, so no batch
        verifies the others)."""
        from .errors import EffdepthWarning

        lengths = [int(ids.numel()) for ids in token_lists]
        if len(set(lengths)) <= 1:
            return True  # every batch is as wide as each of its prompts: nothing is padded
        key = attention_key(self.model)
        if key == self.padding_key and not self.pads_safely:
            return False  # found at load under this attention, and said then
        order = sorted(range(len(lengths)), key=lengths.__getitem__)
        long = lengths[order[-1]]
        selection = key_selection(self.model)
        if selection is not None and long > selection:
            verdict_key: tuple = (key, "selection", selection)
            why = (
                f"its sparse attention keeps {selection} keys per query (index_topk) and this run's prompts have "
                f"up to {long} tokens: which keys a padded batch keeps differs from the prompt alone"
            )
            verdict = False
        else:
            rows = sorted({*range(min(batch_size, len(lengths))), order[0], order[-1]})
            prompts = [token_lists[row].flatten().cpu() for row in rows]
            verdict_key = (key, tuple(tuple(ids.tolist()) for ids in prompts))
            why = (
                f"a padded batch of this run's prompts ({min(lengths)} to {long} tokens) changes a shorter one's "
                "hidden states (its attention reads padded positions)"
            )
            verdict = self.padding_verdicts.get(verdict_key)
            if verdict is None:
                verdict = pads_safely(self.model, self.base_model(), self.layers[0], prompts)
        if verdict_key not in self.padding_verdicts:
            self.padding_verdicts[verdict_key] = verdict
            if not verdict:
                warnings.warn(
                    f"model {self.name!r}: {why}; effdepth measures it one prompt at a time",
                    EffdepthWarning,
                    stacklevel=3,
                )
        return verdict

    def is_as_loaded(self, spec: str, dtype: torch.dtype) -> bool:
        """Whether this is exactly what ``load_model(spec)`` gives in ``dtype``, untouched since: only
        then may a run be keyed by the name (load_model's other arguments, a weight or a config field
        edited in place, a cast or another tokenizer make it another model, keyed by
        ``model_fingerprint``)."""
        return (
            self.source == spec
            and self.dtype == dtype
            and self.loaded_weights is not None
            and weights_state(self.model) == self.loaded_weights
            and self.loaded_config == config_digest(self.model)
            and self.loaded_tokenizer is self.tokenizer
        )

    def __repr__(self) -> str:
        return (
            f"LoadedModel({self.name!r}, {self.model_type}, {self.n_layers} layers, d_model={self.d_model}, "
            f"vocab={self.vocab_size}, {str(self.dtype).removeprefix('torch.')} on {self.input_device})"
        )

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    @property
    def d_model(self) -> int:
        return int(self.model.config.get_text_config().hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.lm_head.weight.shape[0])

    @property
    def model_type(self) -> str:
        return str(self.model.config.model_type)

    @property
    def input_device(self) -> torch.device:
        return execution_device(self.model.get_input_embeddings())

    @property
    def head_device(self) -> torch.device:
        return execution_device(self.lm_head)

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def base_model(self) -> nn.Module:
        """The decoder stack without the LM head (saves the vocab projection when only h is needed)."""
        return decoder_stack(self.model, self.adapter)

    def head(self, residual: torch.Tensor) -> torch.Tensor:
        """Logits from a residual-stream state: Head(FinalNorm(h)), soft-capping included."""
        return self.head_of_normed(self.final_norm(residual.to(self.head_device)))

    def head_of_normed(self, normed: torch.Tensor) -> torch.Tensor:
        """Logits from a state the final norm has already been applied to."""
        normed = normed.to(self.head_device)
        logits = self.lm_head(self.head_transform(normed) if self.head_transform is not None else normed)
        if self.logit_scale is not None:
            logits = logits * self.logit_scale
        if self.logit_softcap:
            logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
        return logits

    def head_into(
        self, residual: torch.Tensor, out: torch.Tensor, product_dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """``head(residual)`` as float32 written into the preallocated ``out`` ``[token, vocab]``
        (reusing one buffer across layers avoids re-faulting fresh pages for every layer).
        ``product_dtype=torch.bfloat16`` (float32 weights only): the head matmul alone takes bfloat16
        inputs — the normed residual and a bfloat16 copy of the head made once — and its bfloat16
        output is widened into ``out``; the norm, bias, scale and soft-cap stay float32."""
        out = out[: residual.shape[0]]
        normed = self.final_norm(residual.to(self.head_device))
        if self.head_transform is not None:
            normed = self.head_transform(normed)
        weight = self.lm_head.weight
        # offloaded, the weight is a meta tensor until lm_head's own forward loads it
        plain = weight.dtype == torch.float32 and out.dtype == torch.float32 and weight.device == out.device
        if plain and product_dtype == torch.bfloat16:
            made = (weight.data_ptr(), weight._version)  # a weight edited in place is copied again
            if getattr(self, "_head_bf16", (None,))[0] != made:
                self._head_bf16 = (made, weight.detach().to(torch.bfloat16))
            out.copy_(torch.matmul(normed.to(torch.bfloat16), self._head_bf16[1].t()))
            if getattr(self.lm_head, "bias", None) is not None:
                out.add_(self.lm_head.bias)
        elif plain:
            torch.matmul(normed, weight.t(), out=out)
            if getattr(self.lm_head, "bias", None) is not None:
                out.add_(self.lm_head.bias)
        else:
            out.copy_(self.lm_head(normed))
        if self.logit_scale is not None:
            out.mul_(self.logit_scale)
        if self.logit_softcap:
            out.div_(self.logit_softcap).tanh_().mul_(self.logit_softcap)
        return out

    def sublayers(self, layer: int) -> tuple[nn.Module, nn.Module]:
        """The modules whose outputs are the attention and MLP contributions of ``layer``."""
        block = self.layers[layer]
        return _get(block, self.adapter.attn_out), _get(block, self.adapter.mlp_out)

    def write_modules(self, layer: int) -> tuple[tuple[nn.Module, ...], tuple[nn.Module, ...]]:
        """Every module whose output ``layer`` adds to the residual: (the attention's group, the rest)."""
        return write_modules(self.layers[layer], self.adapter)

    def residual_scale(self, layer: int) -> torch.Tensor | None:
        """What ``layer`` multiplies its output by (``Adapter.residual_scale``), or None."""
        return residual_scale(self.layers[layer], self.adapter)

    def encode(self, text: str) -> torch.Tensor:
        """Token ids of ``text`` as the model's tokenizer (with its special tokens) gives them."""
        if self.tokenizer is None:
            raise EffdepthError(
                f"model {self.name!r} has no tokenizer; pass tokenizer= (with a transformers model) or token id "
                "tensors instead of text"
            )
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise EffdepthError(
                "a prompt holds a lone surrogate (an unpaired \\ud800-\\udfff), no text a tokenizer can read; fix the "
                "string (text.encode('utf-16', 'surrogatepass').decode('utf-16') joins a split pair)"
            ) from None
        ids = self.tokenizer(text, add_special_tokens=True)["input_ids"]
        return torch.tensor(ids, dtype=torch.long)


def execution_device(module: nn.Module) -> torch.device:
    """Where ``module`` computes: accelerate's execution device for a dispatched module (offloaded
    weights sit on the meta device until its hook loads them for a forward), else its weights'."""
    hook = getattr(module, "_hf_hook", None)
    for part in getattr(hook, "hooks", (hook,)):  # a SequentialHook wraps several
        device = getattr(part, "execution_device", None)
        if device is not None:
            return torch.device(device)
    tensor = next(itertools.chain(module.parameters(), module.buffers()), None)
    return tensor.device if tensor is not None else torch.device("cpu")


def readable_name(name_or_path: str, model_type: str) -> str:
    """A model's label from where transformers loaded it: a hub id as it is; a folder by its name, an
    offline alias's cached copy (``…/models/<alias>/dequantized-float32``) by its alias."""
    if not name_or_path:
        return model_type
    path = Path(name_or_path).expanduser()
    if not (path.is_absolute() or name_or_path.startswith((".", "~")) or exists(path)):
        return name_or_path  # a hub id
    parts = path.parts
    if len(parts) >= 3 and parts[-3] == "models" and parts[-2] in ZOO:
        return parts[-2]
    return path.name or name_or_path


def wrap_model(
    model: nn.Module, tokenizer: object | None = None, name: str | None = None, adapter: Adapter | None = None
) -> LoadedModel:
    """Describe an already-built HF causal LM: its layout from the adapter table, from ``adapter``
    (where a model keeps its layers, final norm and sublayer writes, for an architecture effdepth
    does not know), or inferred; whichever it is, it is verified on a probe input (the attention and
    MLP writes add up to each block's change, the final norm and head give the model's logits) and
    refused in one line when it does not fit. The model is put in eval mode with its parameters'
    gradients off — the probes differentiate activations, never parameters; ``measure`` restores the
    caller's state afterwards, a direct caller of ``wrap_model`` may call ``model.train()`` again.

    Args:
        model: a transformers causal LM (any ``nn.Module`` with ``config`` and the layout's modules).
        tokenizer: its tokenizer (None: probes then take token-id tensors only).
        name: the label of the model in results (None: its ``name_or_path``).
        adapter: the layout, for an architecture the table does not know.

    Returns:
        The verified ``LoadedModel``.

    Raises:
        UnsupportedModelError: a layout that does not verify, in one line saying what is off.
    """
    if hasattr(model, "peft_config") and hasattr(model, "get_base_model"):  # PEFT wraps the model it adapts
        raise UnsupportedModelError(
            f"{type(model).__name__} is a PEFT model: its adapters change the layers effdepth reads; merge them "
            "into the model first (model = model.merge_and_unload()) and measure that"
        )
    check_tokenizer(tokenizer)
    config = getattr(model, "config", None)
    if config is None:
        raise UnsupportedModelError(
            f"wrap_model takes a transformers causal LM (a model with a .config), got {type(model).__name__}"
        )
    model_type = str(getattr(config, "model_type", "unknown"))
    name = name or readable_name(str(getattr(config, "_name_or_path", "") or ""), model_type)
    if model_type in _REJECTED or getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(_unsupported_message(model_type, name))
    lm_head = model.get_output_embeddings()
    if lm_head is None:
        raise UnsupportedModelError(f"model {name!r} has no output head; load it as a causal LM")
    model.eval()  # before any check runs the model: dropout would move what the checks compare
    model.requires_grad_(False)  # probes differentiate activations, never parameters
    adapter, padding = _checked_layout(model, adapter, model_type, name)
    max_positions = getattr(config.get_text_config(), "max_position_embeddings", None)
    if not padding:
        from .errors import EffdepthWarning

        warnings.warn(
            f"model {name!r} changes a prompt's hidden states when it shares a padded batch (its attention reads "
            "padded positions); effdepth measures it one prompt at a time",
            EffdepthWarning,
            stacklevel=2,
        )
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        adapter=adapter,
        layers=_get(model, adapter.layers),
        final_norm=_get(model, adapter.final_norm),
        lm_head=lm_head,
        logit_softcap=getattr(config.get_text_config(), "final_logit_softcapping", None),
        head_transform=_get(model, adapter.head_transform) if adapter.head_transform else None,
        max_positions=int(max_positions) if max_positions else None,
        pads_safely=padding,
        padding_key=attention_key(model),
        write_scale=float(adapter.write_scale(config.get_text_config())) if adapter.write_scale else None,
        logit_scale=float(adapter.logit_scale(config.get_text_config())) if adapter.logit_scale else None,
    )


# model -> (what its checks saw, its name, the layout, whether it pads safely, the warnings they gave):
# a model wrapped again unchanged (a probe called on a plain model, call after call) is not checked again
_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _held(obj: object) -> object:
    """``obj`` as a key part that never matches another object: a weak reference (dead once the
    object is freed, so a new object at the same address differs), else the object's id and type."""
    if obj is None:
        return None
    try:
        return weakref.ref(obj)
    except TypeError:
        return (id(obj), type(obj))


def _what_checks_see(model: nn.Module, adapter: Adapter | None) -> tuple:
    """What a layout check's outcome depends on, cheaply: the adapter asked for; the config, with
    the attention and experts implementations of it and of each sub-config and the kernels
    registered under those names (``attention_key``; its digest leaves them out); each module's
    settings, class (the class object and its ``forward``, so a class patched or redefined in place
    counts), identity, own or compiled ``forward`` and hooks; torch's global module hooks; every
    weight's storage, dtype and version counter. What these miss (an edit of a module-level function
    the forward calls, a closure cell, a hook's function replaced under its id) the check's canary
    sees (``_check_canary``)."""
    from torch.nn.modules import module as torch_module

    modules = tuple(
        (_held(m), _held(type(m)), _held(type(m).forward), _held(vars(m).get("forward")),
         _held(vars(m).get("_compiled_call_impl")), tuple(m._forward_hooks), tuple(m._forward_pre_hooks))
        for m in model.modules()
    )  # fmt: skip
    global_hooks = (tuple(torch_module._global_forward_hooks), tuple(torch_module._global_forward_pre_hooks))
    implementations = attention_key(model)  # the kernels the registries hold under those names too
    return (adapter, implementations, config_digest(model), weights_state(model), modules, global_hooks)


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


def _verify_or_diagnose(model: nn.Module, adapter: Adapter, name: str, what: str) -> None:
    """``verify_adapter``, whose refusal, where the writes miss the blocks' change, also says what
    the blocks' outputs show the model is (``read_blocks``: post-norm, a third write, several
    residual streams…), as an inferred layout's refusal does."""
    try:
        verify_adapter(model, adapter, name, what)
    except UnsupportedModelError as exc:
        if "miss each block's change" not in str(exc):
            raise
        try:
            reading = read_blocks(model, 1.0, execution_device(model))
        except Exception:  # the diagnosis is extra: the refusal stands without it
            raise exc from None
        if reading.reason:
            raise UnsupportedModelError(f"{exc}; read off its blocks: {reading.reason}") from None
        raise


def _check_canary(model: nn.Module) -> str | None:
    """What the model computes now on the layout check's probe input (9 tokens of ids 1..): the sha256
    of its logits at every position, bit for bit. A checked-once verdict is reused only while this
    is unchanged, so what fingerprints miss — a forward replaced through a closure cell, a hook's
    function replaced under the same id, a module-level function edited — is seen by recomputing.
    Cost: one forward pass of 9 tokens. None where the forward fails (the checks then run again)."""
    import hashlib

    vocab = int(getattr(model.config, "vocab_size", 8) or 8)
    ids = (torch.arange(9) % max(vocab - 1, 1) + 1)[None]
    try:
        with torch.inference_mode():
            # the logits at every position: any change of any layer reaches them (output_hidden_states is
            # not asked: transformers records hidden states with hooks it leaves on the model)
            tensors = [model(input_ids=ids.to(execution_device(model)), use_cache=False).logits]
    except Exception:  # a forward that cannot run here: no canary, so no verdict is reused
        return None
    digest = hashlib.sha256()
    for tensor in tensors:
        data = tensor.detach().float().cpu().contiguous()
        digest.update(f"{tuple(data.shape)};".encode())
        digest.update(data.numpy().tobytes())
    return digest.hexdigest()


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


@contextmanager
def as_the_caller_had(model: nn.Module):
    """Restore the training mode of ``model`` and of each submodule, and its parameters'
    ``requires_grad``, on exit (``wrap_model``
    puts the model in eval mode with gradients off; a caller's model is left as it was given)."""
    modes = [(module, module.training) for module in model.modules()]  # each submodule's own mode
    grads = [(p, p.requires_grad) for p in model.parameters()]
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training
        for p, requires_grad in grads:
            p.requires_grad_(requires_grad)


def _nearest_keyword(exc: TypeError, signature: inspect.Signature) -> str:
    """ " (did you mean skip_variants?)" for a keyword that is another spelling of a parameter."""
    import re

    found = re.search(r"keyword argument '(\w+)'", str(exc))
    close = nearest_name(found.group(1), list(signature.parameters)) if found else None
    return f" (did you mean {close}?)" if close else ""


def check_tokenizer(tokenizer: object) -> None:
    """One line for a ``tokenizer=`` that is no tokenizer: a name, a number, anything not callable."""
    if isinstance(tokenizer, str | Path):
        raise EffdepthError(
            f"tokenizer= takes a tokenizer object, not its name {str(tokenizer)!r}: pass "
            f"AutoTokenizer.from_pretrained({str(tokenizer)!r})"
        )
    if tokenizer is not None and not callable(tokenizer):
        raise EffdepthError(
            f"tokenizer= takes the model's tokenizer object (AutoTokenizer.from_pretrained(...)), got "
            f"{type(tokenizer).__name__} {tokenizer!r:.40}"
        )


def with_tokenizer(loaded: LoadedModel, tokenizer: object, caller: str) -> LoadedModel:
    """``loaded`` with ``tokenizer`` where it has none; refused where it has another one."""
    import dataclasses

    check_tokenizer(tokenizer)

    if loaded.tokenizer is None:
        return dataclasses.replace(loaded, tokenizer=tokenizer)
    if loaded.tokenizer is not tokenizer:
        raise EffdepthError(
            f"{caller}(): {loaded.name!r} was loaded with its own tokenizer; tokenizer= would measure other token "
            "ids under its name: drop tokenizer=, or wrap the model again with this one (wrap_model(model, tokenizer))"
        )
    return loaded


def takes_plain_models(*names: str):
    """Let a function whose parameters ``names`` (default: the first) take a ``LoadedModel`` also
    take a plain transformers causal LM, with ``tokenizer=`` (a keyword this adds): the model is
    wrapped (``wrap_model``) for the call and left in the state the caller gave it."""

    def decorate(fn):
        signature = inspect.signature(fn)
        params = list(signature.parameters.values())
        wanted = names or (params[0].name,)
        adds_tokenizer = "tokenizer" not in signature.parameters
        if adds_tokenizer:
            keyword = inspect.Parameter(
                "tokenizer", inspect.Parameter.KEYWORD_ONLY, default=None, annotation="object | None"
            )
            at = next((i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params))
            params.insert(at, keyword)

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            tokenizer = kwargs.pop("tokenizer", None) if adds_tokenizer else kwargs.get("tokenizer")
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise EffdepthError(f"{fn.__name__}(): {exc}{_nearest_keyword(exc, signature)}") from None
            # warnings (the model's own included) are re-raised at the caller's line, also on an error
            caught: list = []
            try:
                with warnings.catch_warnings(record=True) as caught, contextlib.ExitStack() as stack:
                    warnings.simplefilter("always")
                    for name in wanted:
                        value = bound.arguments.get(name)
                        if value is None:
                            if adds_tokenizer and tokenizer is not None and len(wanted) == 1:
                                raise EffdepthError(
                                    f"{fn.__name__}(): tokenizer= goes with a model given in memory ({name}=), "
                                    "and none was given"
                                )
                            continue
                        if isinstance(value, LoadedModel):
                            if adds_tokenizer and tokenizer is not None:
                                bound.arguments[name] = with_tokenizer(value, tokenizer, fn.__name__)
                            continue
                        if not isinstance(value, nn.Module):
                            raise EffdepthError(
                                f"{fn.__name__}() takes a model (a transformers causal LM, or load_model/"
                                f"wrap_model's result) as {name}, got {type(value).__name__}"
                            )
                        stack.enter_context(as_the_caller_had(value))
                        bound.arguments[name] = wrap_model(value, tokenizer)
                    return fn(*bound.args, **bound.kwargs)
            finally:
                for warning in caught:
                    warnings.warn(warning.message, warning.category, stacklevel=2)

        wrapper.__signature__ = signature.replace(parameters=params)
        return wrapper

    return decorate


def truncate_layers(loaded: LoadedModel, n_layers: int) -> LoadedModel:
    """A copy of ``loaded`` that keeps only its first ``n_layers`` decoder layers (weights shared,
    final norm and head kept): for benchmarks that compare cost against depth."""
    import copy

    if not 1 <= n_layers <= loaded.n_layers:
        raise ValueError(f"n_layers must be in 1..{loaded.n_layers}, got {n_layers}")
    model = copy.copy(loaded.model)  # shallow: parameters are shared
    model.config = copy.deepcopy(loaded.model.config)
    model.config.num_hidden_layers = n_layers
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = model.config.layer_types[:n_layers]
    parent_path, _, attr = loaded.adapter.layers.rpartition(".")
    parent = copy.copy(_get(model, parent_path))
    parent.config = model.config
    object.__setattr__(parent, "_modules", dict(parent._modules))
    parent._modules[attr] = nn.ModuleList(list(loaded.layers)[:n_layers])
    object.__setattr__(model, "_modules", dict(model._modules))
    model._modules[parent_path.split(".")[0]] = parent
    return wrap_model(model, loaded.tokenizer, name=f"{loaded.name}[:{n_layers}]")


def check_device(device: str) -> None:
    """One-line error for a device torch cannot name (before anything loads)."""
    import re

    if device in ("auto", "cpu", "mps") or re.fullmatch(r"cuda(:\d+)?", device):
        if device == "mps" and not torch.backends.mps.is_available():
            raise ModelNotFoundError("--device mps was asked for but this torch has no MPS backend; use --device cpu")
        return
    raise ModelNotFoundError(f"unknown --device {device!r}; use auto, cpu, cuda, cuda:N or mps")


def resolve_device(device: str) -> str:
    """``auto`` → cuda when available, else cpu."""
    check_device(device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelNotFoundError("--device cuda was asked for but torch sees no CUDA GPU; use --device cpu")
    return device


def resolve_dtype(dtype: str | torch.dtype, device: str) -> torch.dtype:
    """``auto`` → bfloat16 on a GPU, float32 on the CPU."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in table:
        raise ModelNotFoundError(f"unknown dtype {dtype!r}; use one of auto, {', '.join(table)}")
    return table[dtype]


def _check_config(source: str, name: str, **kwargs) -> None:
    """Fail early, with a clear message, on an architecture the probes do not support."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(source, **kwargs)
    model_type = str(getattr(config, "model_type", "unknown"))
    if model_type in _REJECTED or getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(_unsupported_message(model_type, name))


def quiet_libraries(progress: bool = True) -> None:
    """Keep library warnings (config checks, hub retries) out of effdepth's own messages, and
    transformers' loading bars too when ``progress`` is off."""
    import logging
    import os

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    if not progress:
        hf_logging.disable_progress_bar()
        os.environ["TQDM_DISABLE"] = "1"  # loaders that use tqdm directly (GGUF dequantization)


@contextlib.contextmanager
def _loading_bars(progress: bool):
    """transformers' own loading bar ("Loading weights") only when ``progress``; the caller's
    setting is put back afterwards."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    if not progress and was_on:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if not progress and was_on:
            hf_logging.enable_progress_bar()


def _looks_like_path(spec: str) -> bool:
    return Path(spec).suffix == ".gguf" or spec.startswith((".", "/", "~")) or spec.count("/") > 1


def preflight_model(spec: str) -> dict:
    """Check, without loading weights, that ``spec`` can name a model; returns what is known of it
    already (``vocab_size``, ``n_layers``, ``model_type``; None where only loading tells)."""
    aliases = ", ".join(ZOO)
    if spec in ZOO:
        entry = ZOO[spec]
        return {"vocab_size": entry.vocab_size, "n_layers": entry.n_layers, "model_type": None}
    path = user_path(spec)
    if exists(path, "dir"):
        config_path = path / "config.json"
        if not config_path.is_file():
            raise ModelNotFoundError(f"directory {spec!r} has no config.json; is it a Hugging Face model folder?")
        try:
            config = read_json(config_path, what="model config")
        except (OSError, ValueError, EffdepthError) as exc:
            raise ModelNotFoundError(f"{config_path} is not a readable JSON model config ({exc})") from exc
        if not isinstance(config, dict):
            raise ModelNotFoundError(f"{config_path} is not a JSON object; is {spec!r} a Hugging Face model folder?")
        model_type = str(config.get("model_type", "unknown"))
        if model_type in _REJECTED or config.get("is_encoder_decoder"):  # others: inferred and verified at load
            raise UnsupportedModelError(_unsupported_message(model_type, spec))
        vocab, layers = config.get("vocab_size"), config.get("num_hidden_layers")
        return {
            "vocab_size": vocab if isinstance(vocab, int) else None,
            "n_layers": layers if isinstance(layers, int) else None,
            "model_type": model_type,
        }
    if path.is_file():
        if not is_gguf(path):
            raise ModelNotFoundError(
                f"{spec!r} is a file but not a GGUF model (no GGUF header); pass a .gguf file, a Hugging Face "
                f"model folder, an offline alias ({aliases}) or a hub id"
            )
        return {"vocab_size": None, "n_layers": None, "model_type": None}
    if path.exists():
        raise ModelNotFoundError(f"{spec!r} is neither a model file nor a model folder")
    if _looks_like_path(spec):
        raise ModelNotFoundError(f"no such model file or directory: {spec!r}. Offline aliases: {aliases}")
    return {"vocab_size": None, "n_layers": None, "model_type": None}  # a hub id: only loading tells


def load_model(
    spec: str,
    device: str = "auto",
    dtype: str | torch.dtype = "auto",
    device_map: str | dict[str, str | int] | None = None,
    progress: bool = True,
    cached_weights: bool = True,
    max_memory: dict[str | int, int | str] | None = None,
    offload_folder: str | Path | None = None,
    tokenizer: object | None = None,
    **from_pretrained: object,
) -> LoadedModel:
    """Load ``spec``: an offline alias (see ``effdepth models``), a local HF directory, a ``.gguf``
    file, or a Hugging Face hub id. ``device_map="auto"`` spreads a large model over devices (with
    ``max_memory`` per device and ``offload_folder`` for the layers that fit nowhere: accelerate).
    A GGUF model is parsed and dequantized once: its weights are cached as safetensors (per dtype,
    next to the GGUF; ``acquire.dequantized_dir``) and later loads read them (``cached_weights=False``
    parses the GGUF again). Where the weights come from is ``acquire.resolve_model``'s to say.
    ``tokenizer``: a tokenizer, or where to load one from (a folder without tokenizer files);
    ``from_pretrained``: passed to transformers (``revision``, ``trust_remote_code``, ``token``,
    ``attn_implementation``, ``quantization_config``…; the tokenizer gets the hub ones).

    Args:
        spec: what to load, as above.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``.
        dtype: ``"auto"`` (bfloat16 on a GPU, float32 on a CPU), a name (``"float16"``…) or a dtype.
        device_map, max_memory, offload_folder: accelerate's placement, as above.
        progress: show download and dequantization progress.
        cached_weights: read a GGUF's dequantized safetensors when they exist.
        tokenizer: as above.
        **from_pretrained: as above.

    Returns:
        The ``LoadedModel`` (verified layout, tokenizer, name).

    Raises:
        EffdepthError: a spec that names nothing loadable, or an architecture that is refused.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    tokenizer_given = tokenizer is not None
    preflight_model(spec)
    name = spec
    path = user_path(spec)
    resolved = resolve_model(spec, torch_dtype, cached_weights and device_map is None, progress)
    source, kwargs = resolved.source, resolved.kwargs
    hub = {k: v for k, v in from_pretrained.items() if k in ("revision", "trust_remote_code", "token", "cache_dir")}
    try:
        _check_config(source, name, **kwargs, **hub)
        load_kwargs = dict(kwargs, dtype=torch_dtype, **from_pretrained)
        if device_map is not None:
            load_kwargs["device_map"] = device_map
            if max_memory is not None:
                load_kwargs["max_memory"] = max_memory
            if offload_folder is not None:
                load_kwargs["offload_folder"] = str(offload_folder)
        with _loading_bars(progress):
            model = AutoModelForCausalLM.from_pretrained(source, **load_kwargs)
        if tokenizer is None or isinstance(tokenizer, str | Path):
            where = str(tokenizer) if tokenizer is not None else source
            try:
                tokenizer = AutoTokenizer.from_pretrained(where, **(kwargs if tokenizer is None else {}), **hub)
            except Exception as exc:  # a folder without tokenizer files: one line, and the way out
                raise ModelNotFoundError(
                    f"cannot load a tokenizer for {spec!r} from {where} ({type(exc).__name__}); pass "
                    "tokenizer= (a tokenizer, or the folder or hub id to load one from)"
                ) from exc
    except (UnsupportedModelError, ModelNotFoundError):
        raise
    except Exception as exc:  # loaders raise many types for a broken file; all mean "not loadable"
        if source == spec and not path.exists():
            raise hub_error(spec, exc) from exc
        first_line = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ModelNotFoundError(f"cannot load model {spec!r} ({type(exc).__name__}: {first_line})") from exc
    if resolved.keep_in is not None:
        folder, sha256 = resolved.keep_in
        save_dequantized(model, tokenizer, folder, torch_dtype, sha256)
    if device_map is None:
        model = model.to(device)
    loaded = wrap_model(model, tokenizer, name=name)
    # the name says what was loaded only with load_model's defaults: another revision, tokenizer or
    # transformers argument (quantization, attention kernel) is another model, keyed by its weights
    loaded.source = spec if not from_pretrained and not tokenizer_given else None
    loaded.loaded_weights = weights_state(model)
    loaded.loaded_config = config_digest(model)
    loaded.loaded_tokenizer = tokenizer
    return loaded


STATE_SAMPLE = 64  # values per tensor summed into its state: cheap at any size


def weights_state(model: nn.Module) -> tuple:
    """Each parameter's and buffer's storage, dtype, in-place version counter and the sum of a
    strided sample of ``STATE_SAMPLE`` of its values: cheap, and changed by any edit of a weight
    through autograd's view (``mul_``, ``copy_``, ``load_state_dict``), a cast (``.to``,
    ``.half()``), and — through the sample — most edits that bypass the counter (``.data.mul_``, a
    numpy write); an edit of a few unsampled values escapes it (a full hash at every call would cost
    seconds per billion weights)."""
    state = []
    for tensor in (*model.parameters(), *model.buffers()):
        flat = tensor.detach().reshape(-1)
        sample = 0.0
        if flat.numel() and flat.device.type != "meta":
            sample = float(flat[:: max(1, flat.numel() // STATE_SAMPLE)][:STATE_SAMPLE].double().sum())
        try:
            version = tensor._version
        except RuntimeError:  # an inference tensor (made under inference_mode) keeps no counter
            version = -1
        state.append((tensor.data_ptr(), tensor.dtype, version, sample))
    return tuple(state)


_CONFIG_IGNORED = ("_name_or_path", "transformers_version", "_commit_hash")  # where it came from, not what it is


_PLAIN = (bool, int, float, str, type(None), torch.dtype)


def _plain(value: object) -> bool:
    return isinstance(value, _PLAIN) or (isinstance(value, tuple | list) and all(isinstance(v, _PLAIN) for v in value))


def module_settings(model: nn.Module) -> list:
    """Each module's class and its own plain settings (``vars`` entries that are numbers, strings,
    dtypes or tuples of them: a norm's ``variance_epsilon``, an attention's ``scaling``,
    a rotary embedding's ``rope_type``), in module order: what a config digest misses when a
    setting is edited on a module in place, or a module is swapped for another class."""
    found = []
    for name, module in model.named_modules():
        settings = sorted(
            (key, repr(value)) for key, value in vars(module).items() if not key.startswith("_") and _plain(value)
        )
        found.append((name, f"{type(module).__module__}.{type(module).__qualname__}", settings))
    return found


def config_digest(model: nn.Module) -> str:
    """The sha256 of a model's full configuration (every field that can change a number: activation,
    norm epsilon, rope, soft-caps, …) and of its modules' own settings (``module_settings``), not
    where it was loaded from."""
    import hashlib
    import json

    config = getattr(model, "config", None)
    fields = config.to_dict() if config is not None and hasattr(config, "to_dict") else {}
    fields = {k: v for k, v in fields.items() if k not in _CONFIG_IGNORED}
    text = json.dumps([fields, module_settings(model)], sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def tokenizer_digest(tokenizer: object | None) -> str:
    """The sha256 of what a tokenizer does: a fast tokenizer's whole serialized pipeline, else its
    class, vocabulary and special tokens (None: no tokenizer, token ids only)."""
    import hashlib
    import json

    if tokenizer is None:
        return "none"
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "to_str"):
        text = backend.to_str()
    else:
        vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
        special = getattr(tokenizer, "special_tokens_map", {})
        text = json.dumps([type(tokenizer).__name__, sorted(vocab.items()), special], sort_keys=True, default=repr)
    extra = [getattr(tokenizer, name, None) for name in ("add_bos_token", "add_eos_token", "padding_side")]
    return hashlib.sha256((text + json.dumps(extra, default=repr)).encode()).hexdigest()


def user_hooks(model: nn.Module) -> str | None:
    """Where a hook is registered on the model (``"layers.3 (forward)"``), or None: a hook can change
    every number a probe reads, and nothing about it can be keyed."""
    import torch.nn.modules.module as module_state

    kinds = {
        "forward": "_forward_hooks",
        "forward pre": "_forward_pre_hooks",
        "backward": "_backward_hooks",
        "backward pre": "_backward_pre_hooks",
    }
    for name, module in model.named_modules():
        for kind, attribute in kinds.items():
            if any(not _library_hook(hook) for hook in (getattr(module, attribute, None) or {}).values()):
                return f"{name or 'the model'} ({kind} hook)"
        if "forward" in vars(module) and not _placement_only(module):  # forward replaced on the instance
            return f"{name or 'the model'} (its forward replaced)"
    for kind, attribute in {"forward": "_global_forward_hooks", "forward pre": "_global_forward_pre_hooks",
                            "backward": "_global_backward_hooks",
                            "backward pre": "_global_backward_pre_hooks"}.items():  # fmt: skip
        if getattr(module_state, attribute, None):
            return f"every module (a global {kind} hook)"
    return None


PLACEMENT_HOOKS = ("AlignDevicesHook", "CpuOffload", "UserCpuOffloadHook")  # accelerate's device_map dispatch


def _placement_only(module: nn.Module) -> bool:
    """Whether a module's replaced forward is accelerate's device placement (``device_map``) and
    nothing else: its ``_hf_hook`` moves tensors between devices, it computes nothing."""
    hook = getattr(module, "_hf_hook", None)
    hooks = getattr(hook, "hooks", (hook,)) if hook is not None else ()
    return bool(hooks) and all(type(h).__name__ in PLACEMENT_HOOKS for h in hooks)


LIBRARY_HOOKS = ("transformers.", "accelerate.")  # their hooks record outputs or place tensors


@functools.cache
def _library_roots() -> tuple[Path, ...]:
    """The folders of the packages whose hooks are machinery (``LIBRARY_HOOKS``) where installed."""
    import importlib.util

    roots = []
    for package in LIBRARY_HOOKS:
        spec = importlib.util.find_spec(package.rstrip("."))
        if spec is not None and spec.origin:
            roots.append(Path(spec.origin).resolve().parent)
    return tuple(roots)


def _library_hook(hook: object) -> bool:
    """Whether a hook is transformers' or accelerate's own machinery (transformers 5 records
    ``output_hidden_states`` through forward hooks it leaves on every layer), not a user's: judged
    by the file its code is in — a name or ``__module__`` can claim anything."""
    function = getattr(hook, "func", hook)  # a functools.partial
    call = type(function).__call__ if callable(function) else None  # a callable object's method
    code = getattr(function, "__code__", None) or getattr(call, "__code__", None)
    filename = getattr(code, "co_filename", None)
    if not filename:
        return False
    where = Path(filename).resolve()
    return any(where.is_relative_to(root) for root in _library_roots())


def model_fingerprint(loaded: LoadedModel) -> str:
    """What keys a run of a model given in memory: the sha256 of its weights (``weights_fingerprint``),
    its full configuration (``config_digest``), its tokenizer (``tokenizer_digest``) and the layout
    the probes read it by (the adapter's module names and scales: another adapter reads other writes)."""
    import hashlib
    import json

    layout = {  # every field of the adapter; its callables by the values they give this model
        field.name: getattr(loaded.adapter, field.name) for field in dataclasses.fields(loaded.adapter)
    }
    layout.update(write_scale=loaded.write_scale, logit_scale=loaded.logit_scale)
    parts = (
        weights_fingerprint(loaded),
        config_digest(loaded.model),
        tokenizer_digest(loaded.tokenizer),
        hashlib.sha256(json.dumps(layout, sort_keys=True).encode()).hexdigest(),
    )
    return hashlib.sha256(":".join(parts).encode()).hexdigest()


def weights_fingerprint(loaded: LoadedModel) -> str:
    """The sha256 of a model's parameters and buffers (names, dtypes, shapes and bytes): what keys a
    run of a model given in memory, whose name says nothing of its weights."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in [*loaded.model.named_parameters(), *loaded.model.named_buffers()]:
        data = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}:{data.dtype}:{tuple(data.shape)};".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return digest.hexdigest()
