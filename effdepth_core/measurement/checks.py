"""The load-time checks: a layout verified on a probe input (the writes add up to each block's change,
the final norm and head give the logits) and padding verified to leave each prompt's states as they are."""

from __future__ import annotations

import inspect
import math
from typing import NamedTuple

import torch
from torch import nn

from ..errors import UnsupportedModelError
from .block_reading import HALF_TOLERANCE, LAYOUT_TOLERANCE, read_blocks, share
from .identity import model_configs, user_hooks
from .layout import Adapter, _get, execution_device, residual_scale, write_modules

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


# and its relatives): past that many keys, which ones a padded batch keeps can differ from those the
# prompt alone keeps, batch by batch (with the batch's width and content: a tiny deepseek_v32 passed
# on its run's longest and shortest prompt padded together and failed on the run's whole batch), so
# no one padded batch verifies the rest (issue 45)
KEY_SELECTION_FIELDS = ("index_topk",)


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
