"""Hooks that read the residual stream of a decoder stack, always removed afterwards."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .errors import EffdepthError, NonFiniteActivationError
from .models import LoadedModel


@dataclass
class LayerTrace:
    """What one decoder layer read and wrote for a batch, each ``[batch, token, d_model]``."""

    layer: int
    h_in: torch.Tensor  # h_l
    attn: torch.Tensor | None  # a_l, what attention adds to the residual
    mlp: torch.Tensor | None  # m_l, what the MLP adds to the residual
    h_out: torch.Tensor  # h_{l+1}


def first_tensor(value) -> torch.Tensor:
    # Decoder layers and attention modules return a tensor in some transformers versions and a
    # tuple (tensor, extras...) in others.
    return value[0] if isinstance(value, (tuple, list)) else value


def require_finite(tensor: torch.Tensor, what: str, model: str) -> None:
    """Raise a one-line error naming ``what`` (a layer, module or probe value) if ``tensor`` holds
    NaN or inf: no probe reports or caches a non-finite number."""
    if not torch.isfinite(tensor).all():
        raise NonFiniteActivationError(
            f"{what} of model {model!r} contains NaN or inf; try --dtype float32 or check the weights"
        )


@contextmanager
def trace_layers(
    loaded: LoadedModel,
    on_layer: Callable[[LayerTrace], None],
    sublayers: bool = True,
    check_finite: bool = True,
) -> Iterator[None]:
    """Call ``on_layer`` once per decoder layer during every forward pass inside the block."""
    handles = []
    state: dict[int, dict[str, torch.Tensor]] = {}

    def pre_hook(index: int):
        def hook(module, args, kwargs):
            h_in = args[0] if args else kwargs["hidden_states"]
            if check_finite and index == 0:
                require_finite(h_in, "the embedding output", loaded.name)
            state[index] = {"h_in": h_in}

        return hook

    def sub_hook(index: int, key: str):
        def hook(module, args, output):
            state[index][key] = first_tensor(output)

        return hook

    def post_hook(index: int):
        def hook(module, args, kwargs, output):
            h_out = first_tensor(output)
            if check_finite:
                require_finite(h_out, f"the output of layer {index}", loaded.name)
            record = state.pop(index)
            on_layer(LayerTrace(index, record["h_in"], record.get("attn"), record.get("mlp"), h_out))

        return hook

    try:
        for index, layer in enumerate(loaded.layers):
            handles.append(layer.register_forward_pre_hook(pre_hook(index), with_kwargs=True))
            if sublayers:
                attn, mlp = loaded.sublayers(index)
                handles.append(attn.register_forward_hook(sub_hook(index, "attn")))
                handles.append(mlp.register_forward_hook(sub_hook(index, "mlp")))
            handles.append(layer.register_forward_hook(post_hook(index), with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()
        state.clear()


@dataclass
class Batch:
    """Right-padded token ids of several prompts (right padding keeps every real token's
    position, so causal attention makes batched and one-at-a-time results agree)."""

    input_ids: torch.Tensor  # [batch, token]
    attention_mask: torch.Tensor  # [batch, token], 1 for real tokens
    examples: list[int]  # index of each row in the caller's prompt list

    @property
    def mask(self) -> torch.Tensor:
        return self.attention_mask.bool()


def tokenize(loaded: LoadedModel, prompts: Sequence[str | torch.Tensor]) -> list[torch.Tensor]:
    """Token ids for each prompt (text is encoded; id tensors pass through); checks lengths."""
    if len(prompts) == 0:
        raise EffdepthError("no prompts to probe: the task gave 0 examples")
    token_lists = []
    for index, prompt in enumerate(prompts):
        ids = loaded.encode(prompt) if isinstance(prompt, str) else torch.as_tensor(prompt, dtype=torch.long)
        if ids.numel() == 0:
            raise EffdepthError(f"prompt {index} is empty after tokenization")
        if loaded.max_positions and ids.numel() > loaded.max_positions:
            raise EffdepthError(
                f"prompt {index} has {ids.numel()} tokens but model {loaded.name!r} takes at most "
                f"{loaded.max_positions}; use shorter prompts or a task filter"
            )
        token_lists.append(ids.flatten())
    return token_lists


def iter_batches(
    token_lists: Sequence[torch.Tensor],
    batch_size: int,
    device: torch.device | str,
    max_tokens: int | None = None,
) -> Iterator[Batch]:
    """Group prompts (in order) into right-padded batches of at most ``batch_size`` rows and, if
    given, at most ``max_tokens`` real tokens (a single longer prompt still gets its own batch)."""
    if batch_size < 1:
        raise EffdepthError(f"batch size must be at least 1, got {batch_size}")
    group: list[int] = []
    tokens = 0
    for index, ids in enumerate(token_lists):
        over_budget = max_tokens is not None and group and tokens + ids.numel() > max_tokens
        if len(group) == batch_size or over_budget:
            yield _pad(token_lists, group, device)
            group, tokens = [], 0
        group.append(index)
        tokens += ids.numel()
    if group:
        yield _pad(token_lists, group, device)


def _pad(token_lists: Sequence[torch.Tensor], group: list[int], device) -> Batch:
    width = max(token_lists[i].numel() for i in group)
    input_ids = torch.zeros(len(group), width, dtype=torch.long)
    attention_mask = torch.zeros(len(group), width, dtype=torch.long)
    for row, index in enumerate(group):
        ids = token_lists[index]
        input_ids[row, : ids.numel()] = ids
        attention_mask[row, : ids.numel()] = 1
    return Batch(input_ids.to(device), attention_mask.to(device), list(group))


def forward(loaded: LoadedModel, batch: Batch, head: bool = False):
    """One inference forward pass (no cache); without ``head`` only the decoder stack runs."""
    module = loaded.model if head else loaded.base_model()
    with torch.inference_mode():
        return module(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False)
