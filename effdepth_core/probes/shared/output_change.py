"""The change in output distributions caused by an intervention, shared by skip and erasure."""

from __future__ import annotations

import torch

from ...models import LoadedModel

HEAD_TOKENS = 512  # tokens per head matmul


def head_buffer(loaded: LoadedModel, tokens: int = HEAD_TOKENS) -> torch.Tensor:
    """A float32 ``[tokens, vocab]`` scratch buffer for ``output_change``, to reuse across calls:
    a fresh one per call would fault in tens of MB of new pages every time."""
    return torch.empty(tokens, loaded.vocab_size, device=loaded.head_device)


def output_change(
    loaded: LoadedModel,
    clean_probs: torch.Tensor,
    residual: torch.Tensor,
    max_tokens: int = HEAD_TOKENS,
    buffer: torch.Tensor | None = None,
) -> torch.Tensor:
    """max over tokens of ‖y − ȳ‖₂ between the clean probabilities ``[token, vocab]`` and those
    decoded from ``residual`` ``[rows, token, d_model]`` → ``[rows]`` float32, on the head's device
    (the caller moves a whole map to the host once, not each call's rows).

    Rows are decoded together, up to ``max_tokens`` tokens per head matmul (one matmul per row
    would stream the whole head matrix for a handful of tokens: memory-bound on a CPU), in place
    in ``buffer`` (see ``head_buffer``) when given."""
    rows, tokens = residual.shape[:2]
    per_chunk = max(1, max_tokens // max(tokens, 1))
    if buffer is None or buffer.shape[0] < min(per_chunk, rows) * tokens:
        buffer = head_buffer(loaded, min(per_chunk, rows) * tokens)
    out = torch.empty(rows, device=buffer.device)
    for start in range(0, rows, per_chunk):
        chunk = residual[start : start + per_chunk]  # [chunk, token, d]
        probs = loaded.head_into(chunk.reshape(-1, chunk.shape[-1]), buffer)  # [chunk·token, vocab] float32
        probs.sub_(probs.amax(dim=-1, keepdim=True)).exp_()  # softmax in place
        probs.div_(probs.sum(dim=-1, keepdim=True))
        change = probs.view(chunk.shape[0], tokens, -1).sub_(clean_probs)
        out[start : start + per_chunk] = change.norm(dim=-1).amax(dim=-1)
    return out
