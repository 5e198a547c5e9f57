"""Residual norm per layer: the L2 norm of each layer's input h_l (and of the final residual),
averaged over tokens — the worked example of adding a probe (docs/probes.md). Its ED rule: the
first layer whose mean norm exceeds ``norm_fraction`` of the final one's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl
import torch

from ..trace import LayerTrace, require_finite
from ..wrapping import LoadedModel, takes_plain_models
from .shared.activations import PassPart, each_batch, shared_pass_means
from .shared.lens import first_true_rows, line_crossing_rows
from .shared.reduce import token_weighted_mean
from .spec import Chart, Option, ProbeSpec, Rule, on_prompts


@takes_plain_models()
def residual_norm(
    loaded: LoadedModel, prompts: Sequence[str | torch.Tensor], batch_size: int = 4, progress: bool | None = None
) -> pl.DataFrame:
    """Per example: the mean over tokens of ‖h_l‖₂ for l = 0..L (``example, layer, metric, value,
    n_tokens`` with metric ``norm``; layer L is the final residual, before the final norm).

    Args:
        loaded: a ``LoadedModel`` (``load_model``/``wrap_model``) or a transformers causal LM.
        prompts: texts, or token-id tensors ``[token]``, one per example.
        batch_size: prompts per forward pass.
        progress: show progress bars (None: when attached to a terminal or notebook).
        tokenizer: the tokenizer of a plain transformers model (a ``LoadedModel`` has its own).

    Returns:
        The long frame above.
    """

    return shared_pass_means(loaded, prompts, [residual_norm_part(loaded)], batch_size, progress)[0]


def residual_norm_part(loaded: LoadedModel) -> PassPart:
    """``residual_norm``'s measurement, as a part of a forward pass other probes may share."""

    def measure(trace: LayerTrace) -> list[tuple[int, torch.Tensor]]:  # one decoder layer, as it runs
        states = [(trace.layer, trace.h_in)]
        if trace.layer == loaded.n_layers - 1:
            states.append((loaded.n_layers, trace.h_out))  # and the final residual
        norms = [(layer, h.float().norm(dim=-1, keepdim=True)) for layer, h in states]  # [batch, token, 1]
        for layer, values in norms:
            require_finite(values, f"the residual norm at layer {layer}", loaded.name)
        return norms

    return PassPart(("norm",), loaded.n_layers + 1, each_batch(measure), "residual norm")


def ed_norm(norm: np.ndarray, fraction: float) -> int | None:
    """First l in 0..L-1 whose mean norm exceeds ``fraction`` of the final residual's (layer L)."""
    above = np.flatnonzero(np.asarray(norm, dtype=float)[:-1] > fraction * norm[-1])
    return int(above[0]) if above.size else None


def crossing_norm(norm: np.ndarray, fraction: float) -> float | None:
    """``ed_norm`` read between layers (the straight line from the last layer at or under the
    threshold to the first above it; 0 when layer 0 is already above)."""
    values = np.asarray(norm, dtype=float)
    ed, threshold = ed_norm(values, fraction), fraction * values[-1]
    if ed is None or ed == 0:
        return None if ed is None else 0.0
    return ed - 1 + (threshold - values[ed - 1]) / (values[ed] - values[ed - 1])


def ed_norm_rows(norm: np.ndarray, fraction: float) -> np.ndarray:
    """``ed_norm`` of each row of ``[row, layer]``: ``[row]``, NaN where none exceeds it."""
    values = np.asarray(norm, dtype=float)
    return first_true_rows(values[:, :-1] > fraction * values[:, -1:])


def crossing_norm_rows(norm: np.ndarray, fraction: float) -> np.ndarray:
    """``crossing_norm`` of each row of ``[row, layer]`` (a rising curve, as the overlap's)."""
    values = np.asarray(norm, dtype=float)
    return line_crossing_rows(-values, ed_norm_rows(values, fraction), -(fraction * values[:, -1]))


NORM_FRACTION = Option(
    "norm_fraction",
    0.5,
    "the residual-norm rule: the first layer whose mean norm exceeds this share of the final one's",
    type=float,
    minimum=0,
    maximum=1,
    open_interval=True,
)


def _rule(curves: Mapping[str, np.ndarray], settings) -> int | None:
    return ed_norm(curves["norm"], settings.norm_fraction)


SPEC = ProbeSpec(
    name="norm",
    title="residual norm",
    compute=on_prompts(residual_norm),
    options=(NORM_FRACTION,),
    aggregate=token_weighted_mean,
    rules=(
        Rule(
            "residual_norm",
            "norm",
            ("norm",),
            _rule,
            lambda s: f"the residual norm never exceeds {s.norm_fraction} of the final one before layer L",
            needs_final_layer=True,
            crossing=lambda curves, settings: crossing_norm(curves["norm"], settings.norm_fraction),
            find_rows=lambda curves, settings: ed_norm_rows(curves["norm"], settings.norm_fraction),
            crossing_rows=lambda curves, settings: crossing_norm_rows(curves["norm"], settings.norm_fraction),
        ),
    ),
    charts=(Chart("norm", "metric_curves", "norm"),),
    reusable=True,
    pass_part=lambda loaded, context: residual_norm_part(loaded),  # shares a forward pass with cosine and the lens
    description="the L2 norm of each layer's residual; ED: the first layer past a share of the final norm",
)
