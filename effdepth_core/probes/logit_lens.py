"""Logit lens: decode each layer's input with the model's own head (method.md §2), streamed; with
a tuned lens (method.md §7a), each layer's residual is translated first."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
import torch
from tqdm import tqdm

from ..errors import EffdepthError
from ..models import LoadedModel
from ..trace import Batch, LayerTrace, forward, iter_batches, require_finite, tokenize, trace_layers
from .reduce import per_example_frame, token_weighted_mean
from .spec import KEY_ALWAYS, KEY_NEVER, Chart, Context, Option, ProbeSpec, Rule, Shape

if TYPE_CHECKING:
    from .tuned_lens import TunedLens

LENS_METRICS = ("kl", "overlap")


def _chunk_rows(vocab: int, budget_bytes: int) -> int:
    # rows of the head matmul; past ~256 rows larger chunks only cost memory (measured on a 2-core
    # CPU before cache blocking: 64 rows 24.0 s, 256 rows 18.4 s, 1024 rows 19.3 s for one lens run)
    return max(1, min(256, budget_bytes // (8 * vocab)))


_BLOCK_ROWS = 16  # rows of vocabulary-sized work kept in cache together (measured: 16 fastest)


def lens_token_metrics(
    loaded: LoadedModel,
    residual: torch.Tensor,
    final_logp: torch.Tensor,
    final_top: torch.Tensor,
    buffers: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """KL(q || p) and top-k overlap per token of ``residual`` ``[token, d_model]`` decoded with
    the lens; ``final_logp`` ``[token, vocab]`` and ``final_top`` ``[token, k]`` describe p.
    Returns ``[token, 2]``. The vocabulary is only ever held in ``buffers``: a ``[chunk, vocab]``
    float32 tensor for the head matmul (large chunks use the head matrix well) and a
    ``[block, vocab]`` scratch tensor for the softmax/KL/top-k passes, done a few rows at a time so
    that they run in cache. Memory does not depend on the number of tokens or layers."""
    logits_buffer, scratch = buffers
    chunk, block = logits_buffer.shape[0], scratch.shape[0]
    k = final_top.shape[-1]
    out = torch.empty(residual.shape[0], 2, device=final_logp.device)
    for start in range(0, residual.shape[0], chunk):
        logits = loaded.head_into(residual[start : start + chunk], logits_buffer)  # [rows, vocab] float32
        for first in range(0, logits.shape[0], block):
            rows = slice(start + first, start + min(first + block, logits.shape[0]))
            z = logits[first : first + block]
            top_q = z.topk(k, dim=-1).indices  # same order as log q
            # KL(q||p) = Σ q (z − log p) − logsumexp(z) with q = softmax(z): one exp, no log q buffer
            peak = z.amax(dim=-1, keepdim=True)
            weights = torch.sub(z, peak, out=scratch[: z.shape[0]]).exp_()  # q up to its normaliser
            normaliser = weights.sum(-1)
            log_normaliser = peak.squeeze(-1) + normaliser.log()
            cross = torch.linalg.vecdot(weights, z.sub_(final_logp[rows]))
            out[rows, 0] = (cross / normaliser - log_normaliser).clamp_min_(0.0)  # ≥ 0 up to rounding
            hits = (top_q[:, :, None] == final_top[rows, None, :]).any(-1).sum(-1)
            out[rows, 1] = hits.float() / k
    return out


def _batch_sums(
    loaded: LoadedModel,
    batch: Batch,
    top_k: int,
    buffers: tuple[torch.Tensor, torch.Tensor],
    lens: TunedLens | None = None,
) -> torch.Tensor:
    """Token sums of KL and overlap for each row of a batch, ``[batch, layer 0..L, metric]``."""
    n_layers = loaded.n_layers
    mask = batch.mask
    owner = torch.arange(len(batch.examples), device=mask.device)[:, None].expand_as(mask)[mask].cpu()  # [token]
    sums = torch.zeros(len(batch.examples), n_layers + 1, len(LENS_METRICS))
    chunk = buffers[0].shape[0]
    # pass 1: the final distribution p of every real token
    with trace_layers(loaded, lambda trace: None, sublayers=False):  # names a layer that gives NaN/inf
        final = forward(loaded, batch).last_hidden_state[mask]  # [token, d_model], final norm applied
    final_logp = torch.empty(final.shape[0], loaded.vocab_size, device=loaded.head_device)
    with torch.inference_mode():
        for start in range(0, final.shape[0], chunk):
            logits = loaded.head_of_normed(final[start : start + chunk])
            final_logp[start : start + chunk] = torch.log_softmax(logits.float(), dim=-1)
    require_finite(final_logp, "the final distribution (final norm + LM head on the last layer's output)", loaded.name)
    final_top = final_logp.topk(top_k, dim=-1).indices  # [token, k]

    # pass 2: decode each layer's input as the forward pass reaches it
    def decode(layer: int, residual: torch.Tensor) -> None:
        states = residual[mask] if lens is None else lens.translate(layer, residual[mask])
        per_token = lens_token_metrics(loaded, states, final_logp, final_top, buffers)
        what = "logit-lens decode (final norm + LM head)" if lens is None else "tuned-lens decode"
        require_finite(per_token, f"the {what} of layer {layer}'s input", loaded.name)
        sums[:, layer].index_add_(0, owner, per_token.cpu())

    def on_layer(trace: LayerTrace) -> None:
        decode(trace.layer, trace.h_in)
        if trace.layer == n_layers - 1:
            decode(n_layers, trace.h_out)

    with trace_layers(loaded, on_layer, sublayers=False):
        forward(loaded, batch)
    return sums


def logit_lens(
    loaded: LoadedModel,
    prompts: Sequence[str | torch.Tensor],
    top_k: int = 5,
    batch_size: int = 4,
    memory_budget_mb: int = 512,
    progress: bool = False,
    lens: TunedLens | None = None,
) -> pl.DataFrame:
    """Per-example KL(q_l || p) and top-k overlap for layers 0..L (layer L decodes the final
    residual, so it gives KL 0 and overlap 1 by construction). With ``lens`` (a tuned lens of this
    model), q_l decodes T_l(h_l) instead of h_l.

    Two passes per batch: one to get the final distribution p, one that decodes each layer's
    input as the forward pass reaches it. Peak extra memory is p for the batch plus one token
    chunk of vocabulary-sized temporaries, independent of the number of layers.
    """
    if top_k < 1 or top_k > loaded.vocab_size:
        raise EffdepthError(f"--top-k must be in 1..{loaded.vocab_size} (the vocabulary of {loaded.name}), got {top_k}")
    token_lists = tokenize(loaded, prompts)
    sums = torch.zeros(len(token_lists), loaded.n_layers + 1, len(LENS_METRICS))  # [example, layer, metric]
    counts = torch.tensor([ids.numel() for ids in token_lists])
    budget = memory_budget_mb << 20
    chunk = _chunk_rows(loaded.vocab_size, budget // 2)
    # p for a batch costs 4·vocab bytes per token: bound the real tokens per batch by half the budget
    max_tokens = max(1, (budget // 2) // (4 * loaded.vocab_size))
    buffers = tuple(torch.empty(rows, loaded.vocab_size, device=loaded.head_device) for rows in (chunk, _BLOCK_ROWS))
    if lens is not None and lens.n_layers != loaded.n_layers:
        raise EffdepthError(
            f"the tuned lens has {lens.n_layers} translators but {loaded.name} has {loaded.n_layers} layers"
        )
    desc = "logit lens" if lens is None else "tuned lens"
    with tqdm(total=len(token_lists), desc=desc, unit="prompt", disable=not progress) as bar:
        for batch in iter_batches(token_lists, batch_size, loaded.input_device, max_tokens=max_tokens):
            sums[batch.examples] = _batch_sums(loaded, batch, top_k, buffers, lens)
            bar.update(len(batch.examples))
    return per_example_frame(sums, counts, LENS_METRICS)


# --- effective depth from the lens (method.md §2) ----------------------------------------------

KL_FRACTION = 0.5
OVERLAP_THRESHOLD = 0.3
LENSES = ("logit", "tuned", "both")  # --lens: which lens the lens probe and early exit decode with


def ed_kl(kl: np.ndarray, fraction: float = KL_FRACTION) -> int | None:
    """First l in 0..L-2 with kl[l] < fraction · max kl (max over layers 0..L-1)."""
    kl = np.asarray(kl, dtype=float)
    below = np.flatnonzero(kl[:-1] < fraction * kl.max())
    return int(below[0]) if below.size else None


def ed_overlap(overlap: np.ndarray, threshold: float = OVERLAP_THRESHOLD) -> int | None:
    """First l in 0..L-2 with overlap[l] > threshold."""
    above = np.flatnonzero(np.asarray(overlap, dtype=float)[:-1] > threshold)
    return int(above[0]) if above.size else None


def lens_rules(prefix: str, label: str) -> tuple[Rule, Rule]:
    """The two lens rules for a lens probe: ``<prefix>_kl`` and ``<prefix>_overlap``."""

    def kl(curves: Mapping[str, np.ndarray], settings) -> int | None:
        return ed_kl(curves["kl"], settings.kl_fraction)

    def overlap(curves: Mapping[str, np.ndarray], settings) -> int | None:
        return ed_overlap(curves["overlap"], settings.overlap_threshold)

    return (
        Rule(
            f"{prefix}_kl",
            f"{label} KL",
            ("kl",),
            kl,
            lambda s: f"KL never falls below {s.kl_fraction} of its maximum",
            thresholds=("kl_fraction", (0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7)),
        ),
        Rule(
            f"{prefix}_overlap",
            f"{label} overlap",
            ("overlap",),
            overlap,
            lambda s: f"top-k overlap never exceeds {s.overlap_threshold}",
            thresholds=("overlap_threshold", (0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5)),
        ),
    )


TOP_K = Option(
    "top_k", 5, "logit-lens overlap k (the final top-k tokens compared)", type=int, minimum=1, key=KEY_ALWAYS
)
KL_FRACTION_OPTION = Option(
    "kl_fraction",
    KL_FRACTION,
    "the lens-KL rule's fraction of the maximum KL",
    type=float,
    minimum=0,
    maximum=1,
    open_interval=True,
    key=KEY_NEVER,
)
OVERLAP_THRESHOLD_OPTION = Option(
    "overlap_threshold",
    OVERLAP_THRESHOLD,
    "the lens-overlap rule's threshold",
    type=float,
    minimum=0,
    maximum=1,
    open_interval=True,
    key=KEY_NEVER,
)
LENS = Option("lens", "logit", "the lens of logit_lens and early_exit: logit, tuned or both", choices=LENSES)


def check_top_k(settings, facts: Mapping) -> None:
    vocab = facts.get("vocab_size")
    if vocab is not None and settings.top_k > vocab:
        raise EffdepthError(f"--top-k {settings.top_k} exceeds the vocabulary of {settings.model} ({vocab})")


def _expand(settings) -> tuple[str, ...]:
    """``--lens`` chooses the lens of the lens probe: the logit lens, the tuned lens, or both."""
    LENS.check(settings.lens)
    return {"logit": ("logit_lens",), "tuned": ("tuned_lens",), "both": ("logit_lens", "tuned_lens")}[settings.lens]


def _compute(loaded: LoadedModel, examples: Sequence, context: Context) -> pl.DataFrame:
    settings = context.settings
    prompts = [getattr(e, "prompt", e) for e in examples]
    return logit_lens(loaded, prompts, top_k=settings.top_k, batch_size=settings.batch_size, progress=context.progress)


def _work(shape: Shape, settings, lengths) -> float:
    return (shape.forward + shape.n_layers * shape.unembed) * sum(lengths)  # one decode per layer and token


SPEC = ProbeSpec(
    name="logit_lens",
    title="logit lens",
    compute=_compute,
    options=(TOP_K, KL_FRACTION_OPTION, OVERLAP_THRESHOLD_OPTION),  # --lens belongs to early exit (and expand)
    aggregate=token_weighted_mean,
    rules=lens_rules("logit_lens", "lens"),
    charts=(Chart("lens", "lens_curves", "logit_lens"),),
    reusable=True,
    check=check_top_k,
    expand=_expand,
    description="each layer's residual decoded by the final norm and head: KL to the output, top-k overlap (§2)",
    work=_work,  # its operations, for the grid's cost model
)
