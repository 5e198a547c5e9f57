"""The k largest entries of each row of a wide tensor (a vocabulary's logits) under one tie rule on
every device — on an exact tie the lower index comes first — from span maxima: each row is read
once for the maxima of its spans, and the k largest are taken among the k best spans' entries
(benchmarks/topk_cost.py)."""

from __future__ import annotations

import torch

_SPAN = 128  # entries per span whose maximum is taken (measured on 49,152-wide rows)
_SPAN_MIN_VOCAB = 4096  # narrower rows: sorted whole
_SORT_ROWS = 16  # rows sorted together (memory: two [16, vocab] copies, as the lens's block)


def _first_k(values: torch.Tensor, k: int) -> torch.Tensor:
    """Where the k largest of each row of ``[row, n]`` are, on a tie the lower positions, in
    position order: ``[row, k]``. (The k-th largest value is ``topk``'s whatever its ties.) NaN
    ranks above every number, as in a descending sort; NaNs tie with each other."""
    kth = values.topk(k, dim=-1).values[:, -1:]  # [row, 1]
    nan, kth_nan = values.isnan(), kth.isnan()  # == and > are False for NaN: each NaN placed here
    above, tied = (values > kth) | (nan & ~kth_nan), (values == kth) | (nan & kth_nan)
    chosen = above | (tied & (tied.cumsum(-1) <= k - above.sum(-1, keepdim=True)))
    return chosen.nonzero()[:, 1].view(len(values), k)


def largest(values: torch.Tensor, k: int):
    """``values.topk(k)`` along the last dimension with a defined tie rule: the lower index first
    (``topk`` names none; a bfloat16 head product's logits tie often); for k = 1 the max. A wide
    floating row: the k best spans by their maxima, then the k largest of their entries — the first
    k of a stable descending sort of the whole row, several times faster than ``topk`` on a CPU."""
    if k == 1:
        found, indices = values.max(dim=-1, keepdim=True)  # the first maximal index
        return torch.return_types.topk((found, indices))
    vocab = values.shape[-1]
    full = vocab // _SPAN * _SPAN
    if not values.is_floating_point() or vocab < _SPAN_MIN_VOCAB or full // _SPAN < 4 * k:
        rows = values.reshape(-1, vocab)  # sorted _SORT_ROWS at a time: a whole sorted copy is never held
        parts = [part.sort(dim=-1, descending=True, stable=True) for part in rows.split(_SORT_ROWS)]
        found = torch.cat([part.values[:, :k] for part in parts]) if parts else rows[:, :k]
        indices = torch.cat([part.indices[:, :k] for part in parts]) if parts else rows[:, :k].long()
        shape = (*values.shape[:-1], min(k, vocab))
        return torch.return_types.topk((found.view(shape), indices.view(shape)))
    rows = values.reshape(-1, vocab)  # [row, vocab]
    maxima = rows[:, :full].view(len(rows), full // _SPAN, _SPAN).amax(-1)  # [row, span]
    if full < vocab:  # the last, shorter span
        maxima = torch.cat([maxima, rows[:, full:].amax(-1, keepdim=True)], dim=1)
    spans = _first_k(maxima, k)  # [row, k], in index order
    candidates = (spans[..., None] * _SPAN + torch.arange(_SPAN, device=rows.device)).flatten(1)  # [row, k·span]
    outside = candidates >= vocab  # the short span's padding: -inf, after every real entry
    picked = rows.gather(1, candidates.clamp(max=vocab - 1)).masked_fill_(outside, float("-inf"))
    at = _first_k(picked, k)  # [row, k] in index order
    found = picked.gather(1, at)
    order = found.sort(dim=-1, descending=True, stable=True).indices  # by value, ties kept in index order
    shape = (*values.shape[:-1], k)
    indices = candidates.gather(1, at.gather(1, order))
    return torch.return_types.topk((found.gather(1, order).view(shape), indices.view(shape)))
