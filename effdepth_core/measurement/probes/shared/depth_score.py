"""Depth score (method.md §6, Csordás): d = Σ_l l·e_l / Σ_m e_m, with e_l a layer's importance — the
effect on the output of skipping it (future tokens, whole layer, max over positions)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl

from ....errors import OptionError


def depth_score(importance: Sequence[float]) -> float:
    """Importance-weighted mean layer index; NaN when every importance is 0."""
    e = np.asarray(importance, dtype=float)
    total = e.sum()
    return float((np.arange(e.size) * e).sum() / total) if total > 0 else float("nan")


def _importance(skip: pl.DataFrame, variant: str, part: str) -> pl.DataFrame:
    """Per example and layer: max output effect over positions."""
    rows = skip.filter(pl.col("metric") == "output_effect", pl.col("variant") == variant, pl.col("part") == part)
    if rows.is_empty():
        raise OptionError(f"the skip frame has no output effects for variant {variant!r}, part {part!r}")
    return rows.group_by("example", "skipped_layer").agg(pl.col("value").max()).sort("example", "skipped_layer")


def depth_scores(
    skip: pl.DataFrame, groups: Mapping[int, str] | None = None, variant: str = "future", part: str = "layer"
) -> pl.DataFrame:
    """Depth score per example and per group (``groups``: example → label, e.g. a MATH level).

    Long frame ``group, example, metric, value``: ``depth_score`` per example; per group (example
    null) ``depth_score`` of the group's importance (max over its prompts, as method.md §3 reduces),
    and ``depth_score_mean`` / ``depth_score_std`` over its examples. A value that is not defined
    (no layer matters; the std of one example) is null.
    """
    importance = _importance(skip, variant, part)
    labels = groups or {}
    per_example = {
        int(ex): np.asarray(frame.sort("skipped_layer")["value"])
        for (ex,), frame in importance.group_by("example", maintain_order=True)
    }
    rows: list[tuple] = []
    for example, e in per_example.items():
        rows.append((labels.get(example, "all"), example, "depth_score", depth_score(e)))
    by_group: dict[str, list[int]] = {}
    for example in per_example:
        by_group.setdefault(labels.get(example, "all"), []).append(example)
    for group, members in by_group.items():
        stacked = np.stack([per_example[m] for m in members])
        scores = [depth_score(per_example[m]) for m in members]
        rows.append((group, None, "depth_score", depth_score(stacked.max(axis=0))))
        rows.append((group, None, "depth_score_mean", float(np.nanmean(scores))))
        rows.append(
            (group, None, "depth_score_std", float(np.nanstd(scores, ddof=1)) if len(scores) > 1 else float("nan"))
        )
    schema = {"group": pl.String, "example": pl.Int64, "metric": pl.String, "value": pl.Float64}
    defined = [(*row[:3], row[3] if np.isfinite(row[3]) else None) for row in rows]  # undefined: null, never NaN
    return pl.DataFrame(defined, schema=schema, orient="row")
