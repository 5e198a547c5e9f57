"""The lens, shared by the logit lens, the tuned lens and early exit: decode a layer's residual
(method.md §2) — translated first by a tuned lens (§7a) when one is given — and compare it with
the model's output (KL, top-k overlap), streamed so that no ``[layer, token, vocab]`` is held; the
lens ED rules and the options they share."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import polars as pl
import torch

from ....devices import HEAD_DTYPES, PRODUCT_DTYPES, head_dtype_of_run, resolve_head_dtype
from ....errors import EffdepthError
from ....options import MAX_VOCAB
from ....topk import largest
from ...trace import Batch, LayerTrace, forward, require_finite, trace_layers
from ...wrapping import LoadedModel, takes_plain_models
from ..spec import KEY_ALWAYS, KEY_NEVER, Option, Rule, spelled
from .activations import LayerMeasure, PassPart, shared_pass_means
from .output_change import exp_shifted_


class Translator(Protocol):
    """What the lens decodes through besides the head: a tuned lens's per-layer translators."""

    n_layers: int

    def translate(self, layer: int, hidden: torch.Tensor) -> torch.Tensor: ...


LENS_METRICS = ("kl", "overlap")


def _chunk_rows(vocab: int, budget_bytes: int, device: torch.device) -> int:
    # rows of the head matmul; on a CPU past ~256 rows larger chunks only cost memory (measured on
    # a 2-core CPU before cache blocking: 64 rows 24.0 s, 256 rows 18.4 s, 1024 rows 19.3 s for one
    # lens run); a GPU is kept busy by thousands
    cap = 256 if device.type == "cpu" else 8192
    return max(1, min(cap, budget_bytes // (8 * vocab)))


_BLOCK_ROWS = 16  # CPU: rows of vocabulary-sized work kept in cache together (measured: 16 fastest)
DEFAULT_BUDGET_MB = {"cpu": 512}  # the lens's memory budget by device type; 4096 MB elsewhere


def lens_token_metrics(
    loaded: LoadedModel,
    residual: torch.Tensor,
    final_logp: torch.Tensor,
    final_top: torch.Tensor,
    buffers: tuple[torch.Tensor, torch.Tensor],
    product_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """KL(q || p) and top-k overlap per token of ``residual`` ``[token, d_model]`` decoded with
    the lens; ``final_logp`` ``[token, vocab]`` and ``final_top`` ``[token, k]`` describe p.
    Returns ``[token, 2]``. The vocabulary is only ever held in ``buffers``: a ``[chunk, vocab]``
    float32 tensor for the head matmul (large chunks use the head matrix well) and a
    ``[block, vocab]`` scratch tensor for the softmax/KL passes, done a few rows at a time so that
    they run in cache (the top-k: per chunk). Memory does not depend on the number of tokens or layers.
    ``product_dtype``: the head matmul's (``LoadedModel.head_into``); the rest is float32."""
    logits_buffer, scratch = buffers
    chunk, block = logits_buffer.shape[0], scratch.shape[0]
    k = final_top.shape[-1]
    out = torch.empty(residual.shape[0], 2, device=final_logp.device)
    for start in range(0, residual.shape[0], chunk):
        logits = loaded.head_into(residual[start : start + chunk], logits_buffer, product_dtype)  # [rows, vocab]
        top_q = largest(logits, k)  # the whole chunk at once: few small operations per row
        for first in range(0, logits.shape[0], block):  # the peaks: each row's maximum, exactly, [rows, 1]
            z, peak = logits[first : first + block], top_q.values[first : first + block, :1]
            rows = slice(start + first, start + first + z.shape[0])
            top = top_q.indices[first : first + block]  # [rows, k]; the overlap's [rows, k, k] per block
            out[rows, 1] = (top[:, :, None] == final_top[rows, None, :]).any(-1).sum(-1).float() / k
            # KL(q||p) = Σ q (z − log p) − logsumexp(z) with q = softmax(z): one exp, no log q buffer
            weights = exp_shifted_(torch.sub(z, peak, out=scratch[: z.shape[0]]))  # q up to its normaliser
            normaliser = weights.sum(-1)
            log_normaliser = peak.squeeze(-1) + normaliser.log()
            cross = weights.mul_(z.sub_(final_logp[rows])).sum(-1)  # what vecdot computes, in place
            kl = (cross / normaliser - log_normaliser).nan_to_num_(nan=torch.nan, neginf=torch.nan)  # -inf: an error
            out[rows, 0] = kl.clamp_min_(0.0)  # ≥ 0 up to rounding
    return out


def finite_ends(values: torch.Tensor) -> torch.Tensor:
    """``values``' least and greatest entries ``[2]`` (zeros when empty), where any NaN or inf shows."""
    return torch.stack(torch.aminmax(values)) if values.numel() else values.new_zeros(2)


def _final_distribution(
    loaded: LoadedModel, final: torch.Tensor, top_k: int, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p ``[token, vocab]`` of the final-normed states ``final`` ``[token, d_model]``, decoded in
    the weights' dtype (float32 for a float32 model), and its top-k ``[token, k]``."""
    final_logp = torch.empty(final.shape[0], loaded.vocab_size, device=loaded.head_device)
    with torch.inference_mode():
        for start in range(0, final.shape[0], chunk):
            logits = loaded.head_of_normed(final[start : start + chunk])
            final_logp[start : start + chunk] = torch.log_softmax(logits.float(), dim=-1)
    what = "the final distribution (final norm + LM head on the last layer's output)"
    require_finite(finite_ends(final_logp), what, loaded.name)
    return final_logp, largest(final_logp, top_k).indices


def _decode_measure(
    loaded: LoadedModel,
    batch: Batch,
    top_k: int,
    buffers: tuple[torch.Tensor, torch.Tensor],
    lens: Translator | None = None,
    product_dtype: torch.dtype = torch.float32,
    spare_bytes: int = 0,
) -> LayerMeasure:
    """For one batch, the per-layer measurement that decodes each layer's input (and the final
    residual) against the final distribution p of every real token: KL and overlap per real token
    ``[token, metric]``. p is always decoded in the weights' dtype (float32 for a float32 model);
    ``product_dtype`` is the per-layer decodes' head matmul.

    One forward pass when p and the batch's residuals h_0..h_L of its real tokens fit in
    ``spare_bytes`` (what the memory budget leaves beside ``buffers``): each layer's input is kept
    as the pass reaches it and decoded once the pass has returned p. Otherwise two: a first pass
    for p, then one that decodes each layer as it reaches it (memory independent of depth). Both
    decode the same tensors against the same p: equal numbers."""
    n_layers = loaded.n_layers
    mask = batch.mask
    chunk = buffers[0].shape[0]
    # the real tokens' rows of a [batch, token, d] tensor: indices found once per batch, then
    # gathered per layer without the host synchronisation a boolean mask costs on a GPU
    real = mask.flatten().nonzero().squeeze(1)
    one_pass = real.numel() * ((n_layers + 1) * loaded.d_model + loaded.vocab_size) * 4 <= spare_bytes
    distribution: list[torch.Tensor] = []  # [log p, its top-k], once known

    def decode(layer: int, states: torch.Tensor) -> tuple[int, torch.Tensor]:
        states = states if lens is None else lens.translate(layer, states)
        per_token = lens_token_metrics(loaded, states, *distribution, buffers, product_dtype)
        what = "logit-lens decode (final norm + LM head)" if lens is None else "tuned-lens decode"
        require_finite(per_token, f"the {what} of layer {layer}'s input", loaded.name)
        return layer, per_token

    def real_rows(residual: torch.Tensor) -> torch.Tensor:
        return residual.flatten(0, 1).index_select(0, real.to(residual.device))  # [token, d_model]

    if not one_pass:
        with trace_layers(loaded, lambda trace: None, sublayers=False):  # names a layer that gives NaN/inf
            final = forward(loaded, batch).last_hidden_state[mask]  # [token, d_model], final norm applied
        distribution.extend(_final_distribution(loaded, final, top_k, chunk))
    kept: dict[int, torch.Tensor] = {}  # one pass: layer → [token, d_model], h_0..h_L of the real tokens

    def measure(trace: LayerTrace) -> list[tuple[int, torch.Tensor]]:
        states = {trace.layer: real_rows(trace.h_in)}
        if trace.layer == n_layers - 1:
            states[n_layers] = real_rows(trace.h_out)
        if one_pass:
            kept.update(states)
            return []
        return [decode(layer, state) for layer, state in states.items()]

    def after_forward(output) -> list[tuple[int, torch.Tensor]]:
        distribution.extend(_final_distribution(loaded, output.last_hidden_state[mask], top_k, chunk))
        with torch.inference_mode():  # as the two-pass decodes run inside the forward pass
            return [decode(layer, kept.pop(layer)) for layer in range(n_layers + 1)]  # each freed once decoded

    if one_pass:
        measure.after_forward = after_forward
    return measure


@takes_plain_models()
def logit_lens(
    loaded: LoadedModel,
    prompts: Sequence[str | torch.Tensor],
    top_k: int = 5,
    batch_size: int = 4,
    memory_budget_mb: int | None = None,
    progress: bool | None = None,
    lens: Translator | None = None,
    head_dtype: str = "float32",
) -> pl.DataFrame:
    """Per-example KL(q_l || p) and top-k overlap for layers 0..L (layer L decodes the final
    residual, so it gives KL 0 and overlap 1 by construction with a float32 head product; a
    bfloat16 one rounds its logits there too). With ``lens`` (a tuned lens of this
    model), q_l decodes T_l(h_l) instead of h_l.

    One forward pass per batch, keeping each layer's input of the real tokens and decoding them
    once the pass has given the final distribution p, when p, those residuals and one token chunk
    of vocabulary-sized temporaries fit in ``memory_budget_mb`` (default 512 MB on a CPU, 4096 MB
    on a GPU); else two passes: one for p, one that decodes each layer's input as the pass reaches
    it, whose memory (p plus the temporaries) is independent of the number of layers. Both give the
    same numbers; the vocabulary is never held per layer.

    Args:
        loaded: a ``LoadedModel`` (``load_model``/``wrap_model``) or a transformers causal LM.
        prompts: texts, or token-id tensors ``[token]``, one per example.
        top_k: the k of the top-k overlap with the final distribution.
        batch_size: prompts per forward pass.
        memory_budget_mb: as above.
        progress: show progress bars (None: when attached to a terminal or notebook).
        lens: a ``TunedLens`` of this model, or None.
        head_dtype: the per-layer decodes' head matmul for a float32 model: ``float32`` (exact, the
            default here), ``bfloat16`` (bfloat16 inputs, float32 norm, softmax, KL and top-k; the
            final distribution p stays float32), or ``auto`` (bfloat16 where ``fast_bfloat16``).
            ``effdepth run`` and ``measure`` take it as their ``head_dtype`` setting, ``auto`` by
            default there (the run records what it resolved to; the book pins float32).
        tokenizer: the tokenizer of a plain transformers model (a ``LoadedModel`` has its own).

    Returns:
        A long frame ``example, layer, metric, value, n_tokens`` (metrics ``kl``, ``overlap``).
    """
    part = logit_lens_part(loaded, top_k, memory_budget_mb, lens, head_dtype)
    return shared_pass_means(loaded, prompts, [part], batch_size, progress)[0]


def logit_lens_part(
    loaded: LoadedModel,
    top_k: int = 5,
    memory_budget_mb: int | None = None,
    lens: Translator | None = None,
    head_dtype: str = "float32",
) -> PassPart:
    """``logit_lens``'s measurement (its arguments as there), as a part of a forward pass other
    probes may share: its batches hold at most the real tokens whose p fits half the budget."""
    _check_top_k(top_k, loaded.vocab_size, loaded.name)
    HEAD_DTYPE.check(head_dtype)
    product_dtype = PRODUCT_DTYPES[resolve_head_dtype(head_dtype, loaded.head_device, loaded.dtype)]
    device = loaded.head_device
    if memory_budget_mb is None:
        memory_budget_mb = DEFAULT_BUDGET_MB.get(device.type, 4096)
    budget = memory_budget_mb << 20
    chunk = _chunk_rows(loaded.vocab_size, budget // 2, device)
    block = _BLOCK_ROWS if device.type == "cpu" else chunk  # a GPU's softmax/KL/top-k pass takes the whole chunk
    # p for a batch costs 4·vocab bytes per token: bound the real tokens per batch by half the budget
    max_tokens = max(1, (budget // 2) // (4 * loaded.vocab_size))
    buffers = tuple(torch.empty(rows, loaded.vocab_size, device=device) for rows in (chunk, block))
    spare = budget - sum(buffer.numel() * 4 for buffer in buffers)
    check_lens(lens)
    if lens is not None and lens.n_layers != loaded.n_layers:
        raise EffdepthError(
            f"the tuned lens has {lens.n_layers} translators but {loaded.name} has {loaded.n_layers} layers"
        )
    return PassPart(
        LENS_METRICS,
        loaded.n_layers + 1,
        lambda batch: _decode_measure(loaded, batch, top_k, buffers, lens, product_dtype, spare),
        "logit lens" if lens is None else "tuned lens",
        max_tokens=max_tokens,
    )


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


def crossing_kl(kl: np.ndarray, fraction: float = KL_FRACTION) -> float | None:
    """``ed_kl`` read between layers: where the straight line from kl[l-1] to kl[l] = the first
    value below the threshold reaches it (in (l-1, l]; 0 when layer 0 is already below)."""
    kl = np.asarray(kl, dtype=float)
    ed, threshold = ed_kl(kl, fraction), fraction * kl.max()
    if ed is None or ed == 0:
        return None if ed is None else 0.0
    return ed - 1 + (kl[ed - 1] - threshold) / (kl[ed - 1] - kl[ed])


def crossing_overlap(overlap: np.ndarray, threshold: float = OVERLAP_THRESHOLD) -> float | None:
    """``ed_overlap`` read between layers, as ``crossing_kl`` (a rising curve)."""
    ov = np.asarray(overlap, dtype=float)
    ed = ed_overlap(ov, threshold)
    if ed is None or ed == 0:
        return None if ed is None else 0.0
    return ed - 1 + (threshold - ov[ed - 1]) / (ov[ed] - ov[ed - 1])


def first_true_rows(hit: np.ndarray) -> np.ndarray:
    """The first True column of each row of ``[row, column]``: ``[row]``, NaN where there is none."""
    if not hit.shape[1]:  # no column (a one-layer curve): none anywhere
        return np.full(hit.shape[0], np.nan)
    return np.where(hit.any(axis=1), np.argmax(hit, axis=1), np.nan)


def line_crossing_rows(values: np.ndarray, ed: np.ndarray, threshold: np.ndarray) -> np.ndarray:
    """Where the straight line from values[ed-1] to values[ed] reaches ``threshold`` (each row;
    0 where ed is 0, NaN where it is NaN): the row form of ``crossing_kl`` / ``crossing_overlap``."""
    found = ~np.isnan(ed)
    if not found.any():  # no row crosses (a one-layer curve among them)
        return np.full(values.shape[0], np.nan)
    at = np.where(found, ed, 1).astype(int)
    rows = np.arange(values.shape[0])
    before, after = values[rows, np.maximum(at - 1, 0)], values[rows, at]
    with np.errstate(divide="ignore", invalid="ignore"):  # rows with ed NaN or 0 are replaced below
        between = at - 1 + (before - threshold) / (before - after)
    return np.where(found, np.where(at == 0, 0.0, between), np.nan)


def ed_kl_rows(kl: np.ndarray, fraction: float = KL_FRACTION) -> np.ndarray:
    """``ed_kl`` of each row of ``[row, layer]``: ``[row]``, NaN where none is below."""
    kl = np.asarray(kl, dtype=float)
    return first_true_rows(kl[:, :-1] < fraction * kl.max(axis=1, keepdims=True))


def ed_overlap_rows(overlap: np.ndarray, threshold: float = OVERLAP_THRESHOLD) -> np.ndarray:
    """``ed_overlap`` of each row of ``[row, layer]``: ``[row]``, NaN where none is above."""
    return first_true_rows(np.asarray(overlap, dtype=float)[:, :-1] > threshold)


def crossing_kl_rows(kl: np.ndarray, fraction: float = KL_FRACTION) -> np.ndarray:
    """``crossing_kl`` of each row of ``[row, layer]``: ``[row]``, NaN where it is undefined."""
    kl = np.asarray(kl, dtype=float)
    return line_crossing_rows(kl, ed_kl_rows(kl, fraction), fraction * kl.max(axis=1))


def crossing_overlap_rows(overlap: np.ndarray, threshold: float = OVERLAP_THRESHOLD) -> np.ndarray:
    """``crossing_overlap`` of each row of ``[row, layer]`` (a rising curve: both signs flip)."""
    ov = np.asarray(overlap, dtype=float)
    return line_crossing_rows(-ov, ed_overlap_rows(ov, threshold), np.full(ov.shape[0], -threshold))


def centroid_kl(kl: np.ndarray) -> float | None:
    """The mean layer at which the KL to the output is removed: layer l (it turns h_l into h_{l+1})
    weighs max(kl[l] − kl[l+1], 0) for l = 0..L-1, with kl[L] = 0 (the output itself). None when
    no layer removes any (a curve that is 0 throughout)."""
    k = np.append(np.asarray(kl, dtype=float), 0.0)
    weights = np.maximum(k[:-1] - k[1:], 0.0)
    total = weights.sum()
    return float(np.arange(weights.size) @ weights / total) if total > 0 else None


def centroid_overlap(overlap: np.ndarray) -> float | None:
    """The mean layer at which the top-k overlap with the output is gained: layer l weighs
    max(ov[l+1] − ov[l], 0), with ov[L] = 1."""
    o = np.append(np.asarray(overlap, dtype=float), 1.0)
    weights = np.maximum(o[1:] - o[:-1], 0.0)
    total = weights.sum()
    return float(np.arange(weights.size) @ weights / total) if total > 0 else None


def _centroid_rows(weights: np.ndarray) -> np.ndarray:
    """The centroids' last step on each row of ``weights`` ``[row, layer]`` → ``[row]`` (NaN where
    a row weighs nothing): the dot product row by row, as the one-curve form computes it (a matrix
    product would sum in another order)."""
    total = weights.sum(axis=1)
    layers = np.arange(weights.shape[1])
    dots = np.array([layers @ row for row in weights], dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, dots / total, np.nan)


def centroid_kl_rows(kl: np.ndarray) -> np.ndarray:
    """``centroid_kl`` of each row of ``[row, layer]``: ``[row]``, NaN where no layer removes any."""
    k = np.concatenate([np.asarray(kl, dtype=float), np.zeros((len(kl), 1))], axis=1)
    return _centroid_rows(np.maximum(k[:, :-1] - k[:, 1:], 0.0))


def centroid_overlap_rows(overlap: np.ndarray) -> np.ndarray:
    """``centroid_overlap`` of each row of ``[row, layer]``: ``[row]``, NaN where none is gained."""
    o = np.concatenate([np.asarray(overlap, dtype=float), np.ones((len(overlap), 1))], axis=1)
    return _centroid_rows(np.maximum(o[:, 1:] - o[:, :-1], 0.0))


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
            crossing=lambda curves, settings: crossing_kl(curves["kl"], settings.kl_fraction),
            centroid=lambda curves: centroid_kl(curves["kl"]),
            find_rows=lambda curves, settings: ed_kl_rows(curves["kl"], settings.kl_fraction),
            crossing_rows=lambda curves, settings: crossing_kl_rows(curves["kl"], settings.kl_fraction),
            centroid_rows=lambda curves: centroid_kl_rows(curves["kl"]),
        ),
        Rule(
            f"{prefix}_overlap",
            f"{label} overlap",
            ("overlap",),
            overlap,
            lambda s: f"top-k overlap never exceeds {s.overlap_threshold}",
            thresholds=("overlap_threshold", (0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5)),
            crossing=lambda curves, settings: crossing_overlap(curves["overlap"], settings.overlap_threshold),
            centroid=lambda curves: centroid_overlap(curves["overlap"]),
            find_rows=lambda curves, settings: ed_overlap_rows(curves["overlap"], settings.overlap_threshold),
            crossing_rows=lambda curves, settings: crossing_overlap_rows(curves["overlap"], settings.overlap_threshold),
            centroid_rows=lambda curves: centroid_overlap_rows(curves["overlap"]),
        ),
    )


TOP_K = Option(
    "top_k",
    5,
    "logit-lens overlap k (the final top-k tokens compared)",
    type=int,
    minimum=1,
    maximum=MAX_VOCAB,  # then at most the model's vocabulary (check_top_k)
    key=KEY_ALWAYS,
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


# --- the head product's dtype (--head-dtype) -----------------------------------------------------


HEAD_DTYPE = Option(
    "head_dtype",
    "auto",  # measured (benchmarks/head_dtype.py, four models, GSM8K and HellaSwag): every lens ED equal to
    # float32's and each continuous statistic within 0.04 layer, the lens 1.7-1.9x faster; README's main run
    # prints the same table either way. The book pins float32 (effdepth_book.study.BOOK_HEAD_DTYPE).
    "the logit lens's per-layer head matmul for a float32 model: float32, bfloat16 (float32 norm, softmax, KL, "
    "top-k and final distribution), or auto (bfloat16 where the hardware has it: AMX/AVX512-BF16 CPUs, CUDA ≥ 8.0)",
    choices=HEAD_DTYPES,
    resolve=head_dtype_of_run,
    key_absent="float32",  # runs before the option multiplied in float32: their keys stay
)


def check_lens(lens: object) -> None:
    """One line for a ``lens=`` that is neither None (the logit lens) nor a tuned lens object."""
    if lens is not None and not (hasattr(lens, "translate") and isinstance(getattr(lens, "n_layers", None), int)):
        shown = repr(lens) if isinstance(lens, str | int | float) else type(lens).__name__
        raise EffdepthError(
            f"lens= takes a TunedLens (effdepth_core.measurement.probes.cached_tuned_lens(name, loaded)) or None for "
            f"the logit lens, got {shown}; the name 'tuned' is a setting of measure(..., lens='tuned') and "
            "effdepth run --lens"
        )


def _check_top_k(top_k: int, vocab: int, model: str) -> None:
    """One line for a k that is not a whole number of at least 1 within the vocabulary."""
    import numbers

    from ....errors import OptionError

    if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral):
        raise OptionError(f"{spelled('top_k')} must be a whole number of at least 1, got {top_k!r}")
    if top_k < 1:
        raise EffdepthError(f"{spelled('top_k')} must be at least 1, got {top_k}")
    if top_k > vocab:
        raise EffdepthError(
            f"{spelled('top_k', top_k)} exceeds the vocabulary of {model} ({vocab}): use at most {vocab}"
        )


def check_top_k(settings, facts: Mapping) -> None:
    """The spec's check before the model loads (the vocabulary size known from its config)."""
    if facts.get("vocab_size") is not None:
        _check_top_k(settings.top_k, facts["vocab_size"], settings.model)
