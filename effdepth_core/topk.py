"""The k largest entries of each row of a wide tensor (a vocabulary's logits), as fast as the device
allows: on a CPU from span maxima, elsewhere ``torch.topk`` (benchmarks/topk_cost.py)."""

from __future__ import annotations

import torch

_SPAN = 128  # CPU top-k: vocabulary entries per span whose maximum is taken (measured on 49,152-wide rows)
_SPAN_MIN_VOCAB = 4096  # narrower rows: topk itself


def largest(values: torch.Tensor, k: int):
    """``values.topk(k)`` along the last dimension; for k = 1 the max. On a CPU a wide row is read
    once for the maxima of its spans of ``_SPAN`` entries, and the top-k taken among the k spans
    with the largest maxima (they hold the k largest entries): several times faster than ``topk``
    (benchmarks/topk_cost.py). The same values; on an exact tie, any of the tied indices (as
    ``topk``, which names none)."""
    if k == 1:
        found, indices = values.max(dim=-1, keepdim=True)
        return torch.return_types.topk((found, indices))
    vocab = values.shape[-1]
    full = vocab // _SPAN * _SPAN
    if values.device.type != "cpu" or vocab < _SPAN_MIN_VOCAB or full // _SPAN < 4 * k:  # a GPU: topk until timed
        return values.topk(k, dim=-1)
    rows = values.reshape(-1, vocab)  # [row, vocab]
    maxima = rows[:, :full].view(len(rows), full // _SPAN, _SPAN).amax(-1)  # [row, span]
    if full < vocab:  # the last, shorter span
        maxima = torch.cat([maxima, rows[:, full:].amax(-1, keepdim=True)], dim=1)
    spans = maxima.topk(k, dim=-1).indices  # [row, k]
    candidates = (spans[..., None] * _SPAN + torch.arange(_SPAN)).flatten(1)  # [row, k·span]
    outside = candidates >= vocab
    candidates.clamp_(max=vocab - 1)
    found = rows.gather(1, candidates).masked_fill_(outside, float("-inf")).topk(k, dim=-1)
    shape = (*values.shape[:-1], k)
    return torch.return_types.topk((found.values.view(shape), candidates.gather(1, found.indices).view(shape)))
