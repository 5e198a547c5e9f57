"""What a layout is and how a model is read by it: the ``Adapter`` (where a decoder keeps its layers,
norms, sublayer writes and head) and the helpers that find those modules in a model."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..errors import UnsupportedModelError


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


def decoder_stack(model: nn.Module, adapter: Adapter) -> nn.Module:
    """The module that holds the decoder layers (``model.layers`` → ``model``): run alone, it gives
    the last hidden state without the head. (``base_model`` is not always it: a multimodal causal
    LM's may be the whole model.)"""
    parent = adapter.layers.rpartition(".")[0]
    return _get(model, parent) if parent else model


# config fields naming how many keys a sparse-attention indexer keeps per query (DeepSeek V3.2's DSA
def _exists(model: nn.Module, path: str) -> bool:
    try:
        _get(model, path)
    except (AttributeError, IndexError, KeyError, TypeError):
        return False
    return True


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
