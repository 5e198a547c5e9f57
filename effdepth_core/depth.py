"""Effective depth (ED) from probe curves, with bootstrap intervals over prompts: the machinery
every ED rule shares. The rules themselves are declared by their probes (``probes/*.py``:
``Rule``; method.md §1–2 defines the paper's three)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

if TYPE_CHECKING:
    from .probes.spec import Rule


@dataclass
class DepthResult:
    """ED of one rule: ``ed`` is None (with ``reason``) when the rule finds no layer."""

    ed: int | None
    ratio: float | None
    reason: str | None = None
    ci_low: int | None = None  # bootstrap percentile interval of ED over resampled prompts
    ci_high: int | None = None
    undefined_fraction: float | None = None  # share of resamples where the rule found no layer

    def to_json(self) -> dict:
        return {key: value for key, value in asdict(self).items() if value is not None or key in ("ed", "ratio")}


def depth_table(depths: Mapping[str, DepthResult]) -> pl.DataFrame:
    """EDs as a frame: ``rule, ed, ratio, ci_low, ci_high, reason`` (one row per rule)."""
    rows = [{"rule": rule, **asdict(result)} for rule, result in depths.items()]
    schema = {"rule": pl.String, "ed": pl.Int64, "ratio": pl.Float64, "reason": pl.String, "ci_low": pl.Int64,
              "ci_high": pl.Int64, "undefined_fraction": pl.Float64}  # fmt: skip
    return pl.DataFrame(rows, schema=schema).select("rule", "ed", "ratio", "ci_low", "ci_high", "reason")


def _curve(frame: pl.DataFrame, metric: str, n_layers: int) -> np.ndarray:
    rows = frame.filter(pl.col("metric") == metric, pl.col("layer") < n_layers).sort("layer")
    values = rows["value"].to_numpy()
    if values.size != n_layers:
        raise ValueError(f"curve {metric!r} has {values.size} layers, expected {n_layers}")
    return values


def _matrix(per_example: pl.DataFrame, metric: str, n_layers: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-example token sums ``[example, layer]`` and token counts ``[example]``."""
    rows = per_example.filter(pl.col("metric") == metric, pl.col("layer") < n_layers)
    wide = rows.pivot(on="layer", index=["example", "n_tokens"], values="value").sort("example")
    counts = wide["n_tokens"].to_numpy().astype(float)
    values = wide.select([str(layer) for layer in range(n_layers)]).to_numpy()
    return values * counts[:, None], counts


def resample_weights(n_examples: int, n_bootstrap: int, seed: int) -> np.ndarray:
    """How often each prompt is drawn in each bootstrap resample ``[boot, example]`` (with replacement)."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_examples, np.full(n_examples, 1 / n_examples), size=n_bootstrap)


def ed_samples(
    rule: Rule, frame: pl.DataFrame, n_layers: int, settings: Any, weights: np.ndarray
) -> tuple[int | None, np.ndarray]:
    """ED of ``rule`` on a per-example frame, and on each bootstrap resample ``weights``
    ``[boot, example]`` (NaN where the rule finds no layer). Two frames of the same examples
    resampled with the same ``weights`` give paired draws (e.g. two lenses on one run)."""
    layers = n_layers + 1 if rule.needs_final_layer else n_layers
    sums_counts = {m: _matrix(frame, m, layers) for m in rule.metrics}
    counts = next(iter(sums_counts.values()))[1]
    if weights.shape[1] != counts.size:
        raise ValueError(f"{weights.shape[1]} resampling weights for {counts.size} examples")
    point = rule.find({m: s.sum(0) / counts.sum() for m, (s, _) in sums_counts.items()}, settings)
    total = weights @ counts  # [boot]
    curves = {m: (weights @ s) / total[:, None] for m, (s, _) in sums_counts.items()}  # [boot, layer]
    draws = [rule.find({m: c[b] for m, c in curves.items()}, settings) for b in range(weights.shape[0])]
    return point, np.array([np.nan if d is None else float(d) for d in draws])


def n_examples(frame: pl.DataFrame) -> int:
    return int(frame["example"].n_unique())


def rule_depth(
    rule: Rule, frame: pl.DataFrame, n_layers: int, settings: Any, n_bootstrap: int = 1000, seed: int = 0
) -> DepthResult:
    """ED and ratio (ED+1)/L of one rule on a probe's frame: per-example (``example, layer, metric,
    value, n_tokens``, with a bootstrap interval over prompts) or aggregated (``layer, metric,
    value``: no interval)."""
    layers = n_layers + 1 if rule.needs_final_layer else n_layers

    def result(ed: int | None) -> DepthResult:
        if ed is None:
            return DepthResult(None, None, rule.reason(settings))
        return DepthResult(int(ed), (int(ed) + 1) / n_layers)

    if "example" not in frame.columns:
        return result(rule.find({m: _curve(frame, m, layers) for m in rule.metrics}, settings))
    count = n_examples(frame)
    if n_bootstrap <= 0 or count < 2:
        point, _ = ed_samples(rule, frame, n_layers, settings, np.ones((0, count), dtype=int))
        return result(point)
    point, draws = ed_samples(rule, frame, n_layers, settings, resample_weights(count, n_bootstrap, seed))
    depth = result(point)
    defined = draws[~np.isnan(draws)]
    depth.undefined_fraction = 1 - defined.size / draws.size
    if defined.size:
        depth.ci_low = int(np.percentile(defined, 2.5, method="lower"))
        depth.ci_high = int(np.percentile(defined, 97.5, method="higher"))
    return depth


def effective_depths(
    frames: Mapping[str, pl.DataFrame],
    rules: Iterable[tuple[str, Rule]],
    n_layers: int,
    settings: Any,
    n_bootstrap: int = 1000,
    seed: int = 0,
) -> dict[str, DepthResult]:
    """ED per rule whose probe's frame is in ``frames`` (probe → per-example frame): ``rules`` are
    (probe, rule) pairs, e.g. from the probe registry."""
    results: dict[str, DepthResult] = {}
    for probe, rule in rules:
        frame = frames.get(rule.frame or probe)
        if frame is not None:
            results[rule.key] = rule_depth(rule, frame, n_layers, settings, n_bootstrap, seed)
    return results
