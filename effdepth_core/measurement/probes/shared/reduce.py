"""Shared reductions of per-example probe frames."""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl
import torch


def per_example_frame(
    sums: torch.Tensor, counts: torch.Tensor, metrics: Sequence[str], first_example: int = 0
) -> pl.DataFrame:
    """Long frame from per-example token sums ``[example, layer, metric]`` and token counts ``[example]``.

    ``value`` is the example's mean over its tokens; ``n_tokens`` lets callers re-weight.
    """
    n_examples, n_layers, n_metrics = sums.shape
    means = (sums / counts.clamp_min(1).view(-1, 1, 1)).double().cpu()
    example = torch.arange(n_examples).view(-1, 1, 1).expand_as(means) + first_example
    layer = torch.arange(n_layers).view(1, -1, 1).expand_as(means)
    metric = torch.arange(n_metrics).view(1, 1, -1).expand_as(means)
    n_tokens = counts.view(-1, 1, 1).expand_as(means).cpu()
    return pl.DataFrame(
        {
            "example": example.reshape(-1).numpy(),
            "layer": layer.reshape(-1).numpy(),
            "metric": [metrics[i] for i in metric.reshape(-1).tolist()],
            "value": means.reshape(-1).numpy(),
            "n_tokens": n_tokens.reshape(-1).numpy(),
        },
        schema={"example": pl.Int64, "layer": pl.Int64, "metric": pl.String, "value": pl.Float64, "n_tokens": pl.Int64},
    )


def token_weighted_mean(per_example: pl.DataFrame, by: Sequence[str] | None = None) -> pl.DataFrame:
    """Collapse a per-example frame to one value per (layer, metric) — or per ``by``, sorted by it:
    the mean over all tokens of all prompts (each example weighted by its token count).

    Args:
        per_example: a frame with ``example, layer, metric, value, n_tokens``.
        by: the columns to group by (None: ``layer, metric``).

    Returns:
        A frame of the grouping columns and ``value``.
    """
    keys = list(by) if by is not None else ["layer", "metric"]
    mean = per_example.group_by(keys).agg(
        ((pl.col("value") * pl.col("n_tokens")).sum() / pl.col("n_tokens").sum()).alias("value")
    )
    if by is not None:
        return mean.sort(keys, nulls_last=True)
    return mean.sort("metric", "layer").select("layer", "metric", "value")
