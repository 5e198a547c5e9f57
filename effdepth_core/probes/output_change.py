"""The change in output distributions caused by an intervention, shared by skip and erasure."""

from __future__ import annotations

import torch

from ..models import LoadedModel


def output_change(
    loaded: LoadedModel, clean_probs: torch.Tensor, residual: torch.Tensor, max_tokens: int = 512
) -> torch.Tensor:
    """max over tokens of ‖y − ȳ‖₂ between the clean probabilities ``[token, vocab]`` and those
    decoded from ``residual`` ``[rows, token, d_model]`` → ``[rows]``.

    Rows are decoded together, up to ``max_tokens`` tokens per head matmul: one matmul per row
    would stream the whole head matrix for a handful of tokens (memory-bound on a CPU).
    """
    rows, tokens = residual.shape[:2]
    per_chunk = max(1, max_tokens // max(tokens, 1))
    out = torch.empty(rows)
    for start in range(0, rows, per_chunk):
        chunk = residual[start : start + per_chunk]  # [chunk, token, d]
        probs = torch.softmax(loaded.head(chunk).float(), dim=-1)  # [chunk, token, vocab]
        out[start : start + per_chunk] = (probs - clean_probs).norm(dim=-1).amax(dim=-1).cpu()
    return out
