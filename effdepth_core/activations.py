"""The public activation cache: each prompt's residual states, sublayer writes and (optionally)
attention patterns, read by the hooks every probe uses, for a notebook user's own analysis."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .errors import EffdepthError
from .measurement.trace import LayerTrace, Prompts, forward, iter_batches, tokenize, trace_layers
from .measurement.wrapping import LoadedModel, takes_plain_models


@dataclass
class ActivationCache:
    """One prompt's activations, float32 on the CPU: ``residual[l]`` is h_l for l in 0..L
    (``[L+1, token, d_model]``), ``attn[l]`` and ``mlp[l]`` what layer l's attention and MLP add to
    the residual (``[L, token, d_model]``, method.md §1), ``attention[l]`` its attention weights per
    head (``[L, head, token, token]``, with ``attention=True``). ``layers`` lists the layers kept:
    the rows of ``attn``, ``mlp`` and ``attention`` are theirs, ``residual``'s are each one's input
    h_l and, last, the last one's output (all layers: h_0..h_L)."""

    tokens: torch.Tensor  # [token] ids
    layers: list[int]
    residual: torch.Tensor
    attn: torch.Tensor | None
    mlp: torch.Tensor | None
    attention: torch.Tensor | None = None


DEFAULT_CACHE_BYTES = 2**30  # what run_with_cache may hold at once unless told otherwise: 1 GiB


@takes_plain_models()
def run_with_cache(
    loaded: LoadedModel,
    prompts: Prompts,
    layers: Sequence[int] | None = None,
    writes: bool = True,
    attention: bool = False,
    batch_size: int = 4,
    max_bytes: int = DEFAULT_CACHE_BYTES,
) -> list[ActivationCache]:
    """Each prompt's residual states, sublayer writes and optionally attention patterns, read by
    the same hooks as every probe (``trace_layers``) in batches as every probe forms them (padded
    only where that keeps each prompt's numbers, ``LoadedModel.rows``). Memory-bounded: what it would
    hold (float32, ``layers`` only) is counted before any forward pass and refused in one line over
    ``max_bytes`` (ask for fewer layers or prompts, no writes or attention, or raise it).

    Args:
        loaded: a ``LoadedModel`` (``load_model``/``wrap_model``) or a transformers causal LM.
        prompts: text, token ids, or a list of them (``as_prompts``).
        layers: the layers to keep (None: all); ``residual`` keeps their inputs and the last one's output.
        writes: keep what each layer's attention and MLP add to the residual.
        attention: keep each layer's attention weights per head (eager kernel for these passes).
        batch_size: prompts per forward pass.
        max_bytes: the most it may hold.
        tokenizer: the tokenizer of a plain transformers model (a ``LoadedModel`` has its own).

    Returns:
        One ``ActivationCache`` per prompt, in order.
    """
    token_lists = tokenize(loaded, prompts)
    kept = sorted(set(range(loaded.n_layers) if layers is None else layers))
    if not kept or kept[0] < 0 or kept[-1] >= loaded.n_layers:
        raise EffdepthError(f"layers must be in 0..{loaded.n_layers - 1}, got {list(layers or [])}")
    heads = int(getattr(loaded.model.config.get_text_config(), "num_attention_heads", 0) or 0)
    need = 4 * sum(
        (len(kept) + 1) * n * loaded.d_model
        + (2 * len(kept) * n * loaded.d_model if writes else 0)
        + (len(kept) * heads * n * n if attention else 0)
        for n in (int(ids.numel()) for ids in token_lists)
    )
    if need > max_bytes:
        raise EffdepthError(
            f"run_with_cache would hold {need / 2**20:.0f} MiB for these {len(token_lists)} prompts, over max_bytes="
            f"{max_bytes / 2**20:.0f} MiB: keep fewer layers (layers=…), writes=False or attention=False, fewer "
            "prompts, or raise max_bytes"
        )
    caches: list[ActivationCache] = [None] * len(token_lists)  # type: ignore[list-item]
    wanted = set(kept)
    for batch in iter_batches(token_lists, loaded.rows(batch_size, token_lists), loaded.input_device):
        seen: dict[int, LayerTrace] = {}

        def on_layer(trace: LayerTrace, seen: dict = seen) -> None:
            if trace.layer in wanted:
                seen[trace.layer] = LayerTrace(
                    trace.layer,
                    trace.h_in.float().cpu(),
                    trace.attn.float().cpu() if writes and trace.attn is not None else None,
                    trace.mlp.float().cpu() if writes and trace.mlp is not None else None,
                    trace.h_out.float().cpu() if trace.layer == kept[-1] else trace.h_in[:0].float().cpu(),
                    trace.attention.float().cpu() if trace.attention is not None else None,
                )

        with trace_layers(loaded, on_layer, sublayers=writes, attention=attention):
            forward(loaded, batch)
        for row, example in enumerate(batch.examples):
            n = int(token_lists[example].numel())
            traces = [seen[layer] for layer in kept]
            caches[example] = ActivationCache(
                tokens=token_lists[example],
                layers=kept,
                residual=torch.stack([t.h_in[row, :n] for t in traces] + [traces[-1].h_out[row, :n]]),
                attn=torch.stack([t.attn[row, :n] for t in traces]) if writes else None,
                mlp=torch.stack([t.mlp[row, :n] for t in traces]) if writes else None,
                attention=torch.stack([t.attention[row, :, :n, :n] for t in traces]) if attention else None,
            )
    return caches
