"""The batch loop of every probe that reads activations and averages a per-token measurement over
each prompt's tokens (residual cosine, residual norm, the lenses): tokenize, batch, trace the
layers during one forward pass, sum each prompt's tokens, return the per-example long frame. A
probe supplies only its measurement."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import polars as pl
import torch

from ....terminal import progress_bar
from ...trace import (
    Batch,
    LayerTrace,
    finite_checks_deferred,
    forward,
    iter_batches,
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
    token_lists = tokenize(loaded, prompts)
    sums = torch.zeros(len(token_lists), n_rows, len(metrics))  # [example, layer, metric]
    counts = torch.tensor([ids.numel() for ids in token_lists])
    per_batch = loaded.rows(batch_size, token_lists)  # 1 where padding these prompts changes their numbers
    with progress_bar(total=len(token_lists), desc=title, unit="prompt", disable=not show_progress(progress)) as bar:
        for batch in iter_batches(token_lists, per_batch, loaded.input_device, max_tokens=max_tokens):
            # sums kept on the device and finite checks deferred until the batch ends (the batch's
            # setup, the lens's first pass, included): no host synchronisation per layer
            with finite_checks_deferred():
                rows = _batch_sums(loaded, batch, n_rows, len(metrics), measure(batch), sublayers, attention)
                require_finite(rows, f"the {title} of a prompt's tokens", loaded.name)  # padding left out
            sums[batch.examples] = rows.cpu()
            bar.update(len(batch.examples))
    return per_example_frame(sums, counts, metrics)


def _batch_sums(
    loaded: LoadedModel,
    batch: Batch,
    n_rows: int,
    n_metrics: int,
    of_batch: LayerMeasure,
    sublayers: bool,
    attention: bool = False,
) -> torch.Tensor:
    """Each prompt's token sums of the measurement ``[batch, layer, metric]``, on the device."""
    mask = batch.mask  # [batch, token]
    rows = torch.zeros(len(batch.examples), n_rows, n_metrics, device=loaded.head_device)
    owner = torch.arange(len(batch.examples), device=mask.device)[:, None].expand_as(mask)[mask].to(rows.device)

    def add(measured: Iterable[tuple[int, torch.Tensor]]) -> None:
        for row, values in measured:
            if values.dim() == 3:  # [batch, token, metric]; padding left out, whatever it holds (0/0 there too)
                kept = torch.where(mask.to(values.device)[..., None], values, 0.0)
                rows[:, row] = kept.sum(1).to(rows.device)
            else:  # [real token, metric]
                rows[:, row].index_add_(0, owner, values.to(rows.device, rows.dtype))

    with trace_layers(loaded, lambda trace: add(of_batch(trace)), sublayers=sublayers, attention=attention):
        output = forward(loaded, batch)
    after_forward = getattr(of_batch, "after_forward", None)
    if after_forward is not None:
        add(after_forward(output))
    return rows


def each_batch(per_layer: LayerMeasure) -> Callable[[Batch], LayerMeasure]:
    """``measure`` for a probe that needs no per-batch setup."""
    return lambda batch: per_layer
