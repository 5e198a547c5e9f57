"""Effective depth (ED) from probe curves (method.md §1–2), with bootstrap intervals over prompts."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import polars as pl

COSINE_PARTS = ("cos_attn", "cos_mlp", "cos_layer")
KL_FRACTION = 0.5
OVERLAP_THRESHOLD = 0.3


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


def _result(ed: int | None, n_layers: int, reason: str) -> DepthResult:
    if ed is None:
        return DepthResult(None, None, reason)
    return DepthResult(ed, (ed + 1) / n_layers)


def ed_cosine(mean_cos: np.ndarray) -> int | None:
    """Last l in 0..L-2 with c[l] < 0 and c[l+1] >= 0 (c: mean of the three cosines per layer)."""
    c = np.asarray(mean_cos, dtype=float)
    crossings = np.flatnonzero((c[:-1] < 0) & (c[1:] >= 0))
    return int(crossings[-1]) if crossings.size else None


def ed_kl(kl: np.ndarray, fraction: float = KL_FRACTION) -> int | None:
    """First l in 0..L-2 with kl[l] < fraction · max kl (max over layers 0..L-1)."""
    kl = np.asarray(kl, dtype=float)
    below = np.flatnonzero(kl[:-1] < fraction * kl.max())
    return int(below[0]) if below.size else None


def ed_overlap(overlap: np.ndarray, threshold: float = OVERLAP_THRESHOLD) -> int | None:
    """First l in 0..L-2 with overlap[l] > threshold."""
    above = np.flatnonzero(np.asarray(overlap, dtype=float)[:-1] > threshold)
    return int(above[0]) if above.size else None


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


def _cosine_rule(curves: dict[str, np.ndarray], n_layers: int) -> DepthResult:
    mean_cos = np.mean([curves[name] for name in COSINE_PARTS], axis=0)
    return _result(ed_cosine(mean_cos), n_layers, "the mean cosine never crosses from negative to non-negative")


def _kl_rule(curves: dict[str, np.ndarray], n_layers: int, fraction: float) -> DepthResult:
    return _result(ed_kl(curves["kl"], fraction), n_layers, f"KL never falls below {fraction} of its maximum")


def _overlap_rule(curves: dict[str, np.ndarray], n_layers: int, threshold: float) -> DepthResult:
    return _result(ed_overlap(curves["overlap"], threshold), n_layers, f"top-k overlap never exceeds {threshold}")


def effective_depth(
    cosine: pl.DataFrame | None,
    logit_lens: pl.DataFrame | None,
    n_layers: int,
    kl_fraction: float = KL_FRACTION,
    overlap_threshold: float = OVERLAP_THRESHOLD,
    n_bootstrap: int = 1000,
    seed: int = 0,
    tuned_lens: pl.DataFrame | None = None,
) -> dict[str, DepthResult]:
    """ED and ratio (ED+1)/L for each rule whose probe ran.

    Takes per-example frames (``example, layer, metric, value, n_tokens``) so it can bootstrap
    over prompts; aggregated frames (``layer, metric, value``) give ED without intervals.
    Keys: ``cosine``, ``logit_lens_kl``, ``logit_lens_overlap``, and with a tuned-lens frame the same
    lens rules as ``tuned_lens_kl``, ``tuned_lens_overlap`` (method.md §7a).
    """
    rules: list[tuple[str, pl.DataFrame, tuple[str, ...], object]] = []
    if cosine is not None:
        rules.append(("cosine", cosine, COSINE_PARTS, lambda c: _cosine_rule(c, n_layers)))
    for prefix, frame in (("logit_lens", logit_lens), ("tuned_lens", tuned_lens)):
        if frame is not None:
            rules.append((f"{prefix}_kl", frame, ("kl",), lambda c: _kl_rule(c, n_layers, kl_fraction)))
            rules.append(
                (f"{prefix}_overlap", frame, ("overlap",), lambda c: _overlap_rule(c, n_layers, overlap_threshold))
            )
    results: dict[str, DepthResult] = {}
    for key, frame, metrics, rule in rules:
        if "example" not in frame.columns:
            results[key] = rule({m: _curve(frame, m, n_layers) for m in metrics})
            continue
        sums_counts = {m: _matrix(frame, m, n_layers) for m in metrics}
        counts = next(iter(sums_counts.values()))[1]
        point = rule({m: s.sum(0) / counts.sum() for m, (s, _) in sums_counts.items()})
        if n_bootstrap > 0 and counts.size > 1:
            _bootstrap(point, rule, sums_counts, counts, n_bootstrap, seed)
        results[key] = point
    return results


def _bootstrap(point: DepthResult, rule, sums_counts, counts: np.ndarray, n_bootstrap: int, seed: int) -> None:
    """Fill ``point``'s interval from ED on prompts resampled with replacement."""
    rng = np.random.default_rng(seed)
    weights = rng.multinomial(counts.size, np.full(counts.size, 1 / counts.size), size=n_bootstrap)  # [boot, ex]
    total = weights @ counts  # [boot]
    curves = {m: (weights @ s) / total[:, None] for m, (s, _) in sums_counts.items()}  # [boot, layer]
    eds = [rule({m: c[b] for m, c in curves.items()}).ed for b in range(n_bootstrap)]
    defined = np.array([e for e in eds if e is not None])
    point.undefined_fraction = 1 - defined.size / n_bootstrap
    if defined.size:
        point.ci_low = int(np.percentile(defined, 2.5, method="lower"))
        point.ci_high = int(np.percentile(defined, 97.5, method="higher"))
