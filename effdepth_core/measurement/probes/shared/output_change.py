"""The change in output distributions caused by an intervention, shared by skip and erasure."""

from __future__ import annotations

import torch

from ....errors import EffdepthError
from ...wrapping import LoadedModel
from ..spec import Option

HEAD_TOKENS = 512  # tokens per head matmul
# exp's argument (logits − their row's max) held ≥ EXP_FLOOR: below ln(smallest normal float32) = -87.34 a
# CPU's exp is ~40x slower (measured; ~70 % of smollm2-135m's layer-0 lens entries) and subnormal results
# slow each later product; an entry < 1.7e-38 changes no float32 sum holding the peak's exp(0) = 1
EXP_FLOOR = -87.0
OUTPUT_METRICS = ("l2", "kl")  # how a change of the output distribution is measured (method.md §3)


OUTPUT_METRIC_OPTION = Option(
    "output_metric",
    "l2",
    "how the skip and erasure probes measure the change at the output: l2 (the paper's ‖y − ȳ‖₂) or kl "
    "(KL(ȳ ‖ y) in nats), each the max over the measured tokens",
    choices=OUTPUT_METRICS,
)


def check_output_metric(metric: str) -> None:
    if metric not in OUTPUT_METRICS:
        raise EffdepthError(f"output_metric must be one of {', '.join(OUTPUT_METRICS)}, got {metric!r}")


def change_of(clean_probs: torch.Tensor, logits: torch.Tensor, metric: str = "l2") -> torch.Tensor:
    """The oracle: max over tokens of ‖y − ȳ‖₂ (``l2``) or of KL(ȳ ‖ y) in nats (``kl``) between the
    clean probabilities ȳ ``[token, vocab]`` and the distributions of ``logits`` ``[..., token, vocab]``
    → ``[...]``."""
    if metric == "kl":
        log_q = torch.log_softmax(logits.float(), dim=-1)
        per_token = (torch.special.xlogy(clean_probs, clean_probs) - clean_probs * log_q).sum(dim=-1)
    else:
        per_token = (torch.softmax(logits.float(), dim=-1) - clean_probs).norm(dim=-1)
    return per_token.amax(dim=-1)


def exp_shifted_(shifted: torch.Tensor) -> torch.Tensor:
    return shifted.clamp_min_(EXP_FLOOR).exp_()  # exp in place of logits minus their row's max


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
    metric: str = "l2",
) -> torch.Tensor:
    """``change_of`` the clean probabilities ``[token, vocab]`` and those decoded from ``residual``
    ``[rows, token, d_model]`` → ``[rows]`` float32, on the head's device (the caller moves a whole
    map to the host once, not each call's rows): max over tokens of ‖y − ȳ‖₂ (``l2``, the paper's) or
    of KL(ȳ ‖ y) (``kl``).

    Rows are decoded together, up to ``max_tokens`` tokens per head matmul (one matmul per row
    would stream the whole head matrix for a handful of tokens: memory-bound on a CPU), in place
    in ``buffer`` (see ``head_buffer``) when given."""
    rows, tokens = residual.shape[:2]
    per_chunk = max(1, max_tokens // max(tokens, 1))
    if buffer is None or buffer.shape[0] < min(per_chunk, rows) * tokens:
        buffer = head_buffer(loaded, min(per_chunk, rows) * tokens)
    check_output_metric(metric)
    out = torch.empty(rows, device=buffer.device)
    if metric == "kl":  # Σ ȳ log ȳ per token, once: KL(ȳ ‖ y) = Σ ȳ log ȳ − Σ ȳ log y
        clean_neg_entropy = torch.special.xlogy(clean_probs, clean_probs).sum(dim=-1)  # [token]
    for start in range(0, rows, per_chunk):
        chunk = residual[start : start + per_chunk]  # [chunk, token, d]
        probs = loaded.head_into(chunk.reshape(-1, chunk.shape[-1]), buffer)  # [chunk·token, vocab] float32
        probs.sub_(probs.amax(dim=-1, keepdim=True))  # shifted logits x
        if metric == "kl":  # log y = x − log Σ exp x, so Σ ȳ log y = Σ ȳ x − log Σ exp x
            cross = torch.einsum("ctv,tv->ct", probs.view(chunk.shape[0], tokens, -1), clean_probs)
            log_total = exp_shifted_(probs).sum(dim=-1).log_().view(chunk.shape[0], tokens)
            out[start : start + per_chunk] = (clean_neg_entropy - cross + log_total).amax(dim=-1)
            continue
        exp_shifted_(probs)  # softmax in place
        probs.div_(probs.sum(dim=-1, keepdim=True))
        change = probs.view(chunk.shape[0], tokens, -1).sub_(clean_probs)
        out[start : start + per_chunk] = change.norm(dim=-1).amax(dim=-1)
    return out
