"""Residual contributions and their cosine similarity with the residual stream (method.md §1)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl
import torch

from ..trace import LayerTrace, require_finite
from ..wrapping import LoadedModel, takes_plain_models
from .shared.activations import PassPart, each_batch, shared_pass_means
from .shared.reduce import token_weighted_mean
from .spec import Chart, ProbeSpec, Rule, on_prompts

RESIDUAL_METRICS = ("cos_attn", "cos_mlp", "cos_layer", "rel_attn", "rel_mlp", "rel_layer")
COSINE_PARTS = ("cos_attn", "cos_mlp", "cos_layer")  # the cosine rule averages these three
_EPS = 1e-12


def _cos_rel(x: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos(x, ref) and |x|/|ref| per token, ``[batch, token]``, in float32."""
    x_norm, ref_norm = x.norm(dim=-1), ref.norm(dim=-1)
    cos = (x * ref).sum(-1) / (x_norm * ref_norm).clamp_min(_EPS)
    return cos, x_norm / ref_norm.clamp_min(_EPS)


def contribution_metrics(trace: LayerTrace) -> torch.Tensor:
    """The six §1 metrics per token for one layer, ``[batch, token, 6]`` in RESIDUAL_METRICS order."""
    h = trace.h_in.float()
    attn = trace.attn.float()
    mlp = trace.mlp.float()
    delta = trace.h_out.float() - h
    cos_attn, rel_attn = _cos_rel(attn, h)
    cos_mlp, rel_mlp = _cos_rel(mlp, h + attn)
    cos_layer, rel_layer = _cos_rel(delta, h)
    return torch.stack([cos_attn, cos_mlp, cos_layer, rel_attn, rel_mlp, rel_layer], dim=-1)


@takes_plain_models()
def residual_cosine(
    loaded: LoadedModel,
    prompts: Sequence[str | torch.Tensor],
    batch_size: int = 4,
    progress: bool | None = None,
) -> pl.DataFrame:
    """Per-example, per-layer mean of cos/rel of attention, MLP and whole-layer contributions.

    Returns columns ``example, layer, metric, value, n_tokens``; collapse with
    ``token_weighted_mean`` for the curves of method.md §1. One forward pass; nothing per layer is kept.

    Args:
        loaded: a ``LoadedModel`` (``load_model``/``wrap_model``) or a transformers causal LM.
        prompts: texts, or token-id tensors ``[token]``, one per example.
        batch_size: prompts per forward pass.
        progress: show progress bars (None: when attached to a terminal or notebook).
        tokenizer: the tokenizer of a plain transformers model (a ``LoadedModel`` has its own).

    Returns:
        The long frame above (metrics ``cos_attn``, ``cos_mlp``, ``cos_layer``, ``rel_*``).
    """

    return shared_pass_means(loaded, prompts, [residual_cosine_part(loaded)], batch_size, progress)[0]


def residual_cosine_part(loaded: LoadedModel) -> PassPart:
    """``residual_cosine``'s measurement, as a part of a forward pass other probes may share."""

    def measure(trace: LayerTrace) -> list[tuple[int, torch.Tensor]]:
        metrics = contribution_metrics(trace)  # [batch, token, metric]
        require_finite(metrics, f"the residual metrics of layer {trace.layer}", loaded.name)
        return [(trace.layer, metrics)]

    return PassPart(RESIDUAL_METRICS, loaded.n_layers, each_batch(measure), "residual cosine", sublayers=True)


def ed_cosine(mean_cos: np.ndarray) -> int | None:
    """Last l in 0..L-2 with c[l] < 0 and c[l+1] >= 0 (c: mean of the three cosines per layer; method.md §1)."""
    c = np.asarray(mean_cos, dtype=float)
    crossings = np.flatnonzero((c[:-1] < 0) & (c[1:] >= 0))
    return int(crossings[-1]) if crossings.size else None


def crossing_cosine(mean_cos: np.ndarray) -> float | None:
    """``ed_cosine``'s crossing read between layers: l + the share of the way from c[l] < 0 to
    c[l+1] >= 0 at which the straight line between them reaches 0 (in (l, l+1])."""
    c = np.asarray(mean_cos, dtype=float)
    ed = ed_cosine(c)
    return None if ed is None else ed - c[ed] / (c[ed + 1] - c[ed])


def ed_cosine_rows(mean_cos: np.ndarray) -> np.ndarray:
    """``ed_cosine`` of each row of ``[row, layer]``: ``[row]``, NaN where there is no crossing."""
    c = np.asarray(mean_cos, dtype=float)
    up = (c[:, :-1] < 0) & (c[:, 1:] >= 0)  # [row, layer - 1]
    if not up.shape[1]:  # a one-layer curve has no pair of layers to cross between
        return np.full(c.shape[0], np.nan)
    last = up.shape[1] - 1 - np.argmax(up[:, ::-1], axis=1)
    return np.where(up.any(axis=1), last, np.nan)


def crossing_cosine_rows(mean_cos: np.ndarray) -> np.ndarray:
    """``crossing_cosine`` of each row of ``[row, layer]``: ``[row]``, NaN where there is no crossing."""
    c = np.asarray(mean_cos, dtype=float)
    ed = ed_cosine_rows(c)
    found = ~np.isnan(ed)
    if not found.any():  # no row crosses (a one-layer curve among them): nothing to read between layers
        return np.full(c.shape[0], np.nan)
    at = np.where(found, ed, 0).astype(int)
    rows = np.arange(c.shape[0])
    below, above = c[rows, at], c[rows, at + 1]
    with np.errstate(divide="ignore", invalid="ignore"):  # rows without a crossing are NaN anyway
        return np.where(found, at - below / (above - below), np.nan)


def _mean_cosine(curves: Mapping[str, np.ndarray], settings) -> np.ndarray:
    # the crossing is of 0 (SPEC §1); the book's robustness rule moves that level (``cosine_zero``)
    return np.mean([curves[name] for name in COSINE_PARTS], axis=0) - getattr(settings, "cosine_zero", 0.0)


def _cosine_rule(curves: Mapping[str, np.ndarray], settings) -> int | None:
    return ed_cosine(_mean_cosine(curves, settings))


SPEC = ProbeSpec(
    name="cosine",
    title="residual cosine",
    compute=on_prompts(residual_cosine),
    aggregate=token_weighted_mean,
    rules=(
        Rule(
            "cosine",
            "cosine",
            COSINE_PARTS,
            _cosine_rule,
            lambda settings: "the mean cosine never crosses from negative to non-negative",
            thresholds=("cosine_zero", (-0.03, -0.02, -0.01, 0.0, 0.01, 0.02, 0.03)),
            crossing=lambda curves, settings: crossing_cosine(_mean_cosine(curves, settings)),
            find_rows=lambda curves, settings: ed_cosine_rows(_mean_cosine(curves, settings)),
            crossing_rows=lambda curves, settings: crossing_cosine_rows(_mean_cosine(curves, settings)),
        ),
    ),
    charts=(Chart("cosine", "contribution_bars", "cosine"),),
    reusable=True,
    pass_part=lambda loaded, context: residual_cosine_part(loaded),
    description="cosine and relative norm of what attention, MLP and each layer write into the residual (§1)",
)
