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


def rule_depth(
    rule: Rule, frame: pl.DataFrame, n_layers: int, settings: Any, n_bootstrap: int = 1000, seed: int = 0
) -> DepthResult:
    """ED and ratio (ED+1)/L of one rule on a probe's frame: per-example (``example, layer, metric,
    value, n_tokens``, with a bootstrap interval over prompts) or aggregated (``layer, metric,
    value``: no interval)."""
    layers = n_layers + 1 if rule.needs_final_layer else n_layers

    def find(curves: dict[str, np.ndarray]) -> DepthResult:
        ed = rule.find(curves, settings)
        if ed is None:
            return DepthResult(None, None, rule.reason(settings))
        return DepthResult(int(ed), (int(ed) + 1) / n_layers)

    if "example" not in frame.columns:
        return find({m: _curve(frame, m, layers) for m in rule.metrics})
    sums_counts = {m: _matrix(frame, m, layers) for m in rule.metrics}
    counts = next(iter(sums_counts.values()))[1]
    point = find({m: s.sum(0) / counts.sum() for m, (s, _) in sums_counts.items()})
    if n_bootstrap > 0 and counts.size > 1:
        _bootstrap(point, find, sums_counts, counts, n_bootstrap, seed)
    return point


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


def _bootstrap(point: DepthResult, find, sums_counts, counts: np.ndarray, n_bootstrap: int, seed: int) -> None:
    """Fill ``point``'s interval from ED on prompts resampled with replacement."""
    rng = np.random.default_rng(seed)
    weights = rng.multinomial(counts.size, np.full(counts.size, 1 / counts.size), size=n_bootstrap)  # [boot, ex]
    total = weights @ counts  # [boot]
    curves = {m: (weights @ s) / total[:, None] for m, (s, _) in sums_counts.items()}  # [boot, layer]
    eds = [find({m: c[b] for m, c in curves.items()}).ed for b in range(n_bootstrap)]
    defined = np.array([e for e in eds if e is not None])
    point.undefined_fraction = 1 - defined.size / n_bootstrap
    if defined.size:
        point.ci_low = int(np.percentile(defined, 2.5, method="lower"))
        point.ci_high = int(np.percentile(defined, 97.5, method="higher"))
