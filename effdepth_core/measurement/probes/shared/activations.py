"""The batch loop of every probe that reads activations and averages a per-token measurement over
each prompt's tokens (residual cosine, residual norm, the lenses): tokenize, batch, trace the
layers during one forward pass, sum each prompt's tokens, return the per-example long frame. A
probe supplies only its measurement (a ``PassPart``); several probes' parts may share each
batch's forward pass (``shared_pass_means``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import polars as pl
import torch

from ....terminal import progress_bar
from ...trace import (
    Batch,
    LayerTrace,
    batch_groups,
    finite_checks_deferred,
    forward,
    padded_batch,
    require_finite,
    show_progress,
    tokenize,
    trace_layers,
)
from ...wrapping import LoadedModel
from .reduce import per_example_frame

# per traced layer: (its row in the output's layer axis, the measurement per token), the
# measurement either ``[batch, token, metric]`` (padded positions are left out here, NaN or not) or ``[real token,
# metric]`` (the batch's real tokens in order, as ``tensor[batch.mask]`` lists them). A measure may
# also carry ``after_forward(output)``: more such rows, once the batch's forward pass has returned
# (the one-pass lens decodes its stored layers there, against the output's final distribution)
LayerMeasure = Callable[[LayerTrace], Iterable[tuple[int, torch.Tensor]]]


@dataclass(frozen=True)
class PassPart:
    """One probe's share of a forward pass: its ``metrics`` on ``n_rows`` rows (layers), ``measure(batch)``
    (called once per batch, the probe's setup for it, e.g. the final distribution) giving the per-layer
    measurement, and what the trace must read: the sublayers' writes, the attention weights (eager
    kernel), at most ``max_tokens`` real tokens per batch."""

    metrics: Sequence[str]
    n_rows: int
    measure: Callable[[Batch], LayerMeasure]
    title: str
    sublayers: bool = False
    attention: bool = False
    max_tokens: int | None = None


def per_token_means(
    loaded: LoadedModel,
    prompts: Sequence[str | torch.Tensor],
    metrics: Sequence[str],
    n_rows: int,
    measure: Callable[[Batch], LayerMeasure],
    title: str,
    batch_size: int = 4,
    progress: bool | None = None,
    sublayers: bool = False,
    max_tokens: int | None = None,
    attention: bool = False,
) -> pl.DataFrame:
    """Per example and row (layer) the mean over the prompt's tokens of ``measure``: ``example,
    layer, metric, value, n_tokens``. ``measure(batch)`` is called once per batch (a probe's setup
    for that batch, e.g. the final distribution) and returns the per-layer measurement. Padded
    positions are left out whatever they hold (a ratio's 0/0 there is no error), and what the
    prompts' own tokens give must be finite (``NonFiniteActivationError`` otherwise). With
    ``attention``, each ``LayerTrace`` holds the layer's attention weights (``trace_layers``)."""
    part = PassPart(metrics, n_rows, measure, title, sublayers, attention, max_tokens)
    return shared_pass_means(loaded, prompts, [part], batch_size, progress)[0]


def shared_pass_means(
    loaded: LoadedModel,
    prompts: Sequence[str | torch.Tensor],
    parts: Sequence[PassPart],
    batch_size: int = 4,
    progress: bool | None = None,
) -> list[pl.DataFrame]:
    """``per_token_means`` of each of ``parts``: the parts whose batches come out the same (their
    ``max_tokens``) and that read the same attention kernel are read during one forward pass per
    batch (the trace reads the sublayers where any of them needs them); each frame equals its part's
    alone, bit for bit (the hooks only read; the batches are its own)."""
    return shared_passes(loaded, prompts, parts, batch_size, progress)[0]


def shared_passes(
    loaded: LoadedModel,
    prompts: Sequence[str | torch.Tensor],
    parts: Sequence[PassPart],
    batch_size: int = 4,
    progress: bool | None = None,
) -> tuple[list[pl.DataFrame], list[list[int]]]:
    """``shared_pass_means``, and which parts shared each pass (indices into ``parts``)."""
    token_lists = tokenize(loaded, prompts)
    counts = torch.tensor([ids.numel() for ids in token_lists])
    per_batch = loaded.rows(batch_size, token_lists)  # 1 where padding these prompts changes their numbers
    passes: dict[tuple, list[int]] = {}
    for index, part in enumerate(parts):
        passes.setdefault((batch_groups(token_lists, per_batch, part.max_tokens), part.attention), []).append(index)
    frames: list[pl.DataFrame] = [None] * len(parts)  # type: ignore[list-item]
    for (groups, _), members in passes.items():
        together = [parts[i] for i in members]
        sums = [torch.zeros(len(token_lists), p.n_rows, len(p.metrics)) for p in together]  # [example, layer, metric]
        title = " + ".join(part.title for part in together)
        shown = show_progress(progress)
        with progress_bar(total=len(token_lists), desc=title, unit="prompt", disable=not shown) as bar:
            for group in groups:
                batch = padded_batch(token_lists, group, loaded.input_device)
                # sums kept on the device and finite checks deferred until the batch ends (the batch's
                # setup, the lens's first pass, included): no host synchronisation per layer
                with finite_checks_deferred():
                    measures = [part.measure(batch) for part in together]
                    rows = _batch_sums(loaded, batch, together, measures)
                    for part, part_rows in zip(together, rows, strict=True):  # padding left out
                        require_finite(part_rows, f"the {part.title} of a prompt's tokens", loaded.name)
                for part_sums, part_rows in zip(sums, rows, strict=True):
                    part_sums[batch.examples] = part_rows.cpu()
                bar.update(len(batch.examples))
        for index, part, part_sums in zip(members, together, sums, strict=True):
            frames[index] = per_example_frame(part_sums, counts, part.metrics)
    return frames, list(passes.values())


def _batch_sums(
    loaded: LoadedModel, batch: Batch, parts: Sequence[PassPart], measures: Sequence[LayerMeasure]
) -> list[torch.Tensor]:
    """Each part's token sums per prompt of its measurement ``[batch, layer, metric]``, on the device,
    from one forward pass."""
    mask = batch.mask  # [batch, token]
    sums = [torch.zeros(len(batch.examples), p.n_rows, len(p.metrics), device=loaded.head_device) for p in parts]
    owner = torch.arange(len(batch.examples), device=mask.device)[:, None].expand_as(mask)[mask].to(sums[0].device)

    def add(rows: torch.Tensor, measured: Iterable[tuple[int, torch.Tensor]]) -> None:
        for row, values in measured:
            if values.dim() == 3:  # [batch, token, metric]; padding left out, whatever it holds (0/0 there too)
                kept = torch.where(mask.to(values.device)[..., None], values, 0.0)
                rows[:, row] = kept.sum(1).to(rows.device)
            else:  # [real token, metric]
                rows[:, row].index_add_(0, owner, values.to(rows.device, rows.dtype))

    def on_layer(trace: LayerTrace) -> None:
        for rows, of_batch in zip(sums, measures, strict=True):
            add(rows, of_batch(trace))

    sublayers, attention = any(p.sublayers for p in parts), any(p.attention for p in parts)
    with trace_layers(loaded, on_layer, sublayers=sublayers, attention=attention):
        output = forward(loaded, batch)
    for rows, of_batch in zip(sums, measures, strict=True):
        after_forward = getattr(of_batch, "after_forward", None)
        if after_forward is not None:
            add(rows, after_forward(output))
    return sums


def each_batch(per_layer: LayerMeasure) -> Callable[[Batch], LayerMeasure]:
    """``measure`` for a probe that needs no per-batch setup."""
    return lambda batch: per_layer
