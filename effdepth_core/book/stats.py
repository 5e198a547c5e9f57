"""The statistics behind the book's claims, pure functions of the per-example frames:

- ``artefact``: the one test of a rule artefact, applied alike to our EDs and the paper's (method.md
  §10): the rule fires in the first layers;
- ``degenerate``: when an ED says nothing about the depth a model uses: an artefact, or its
  bootstrap interval spans more than half the depth (the sample cannot locate it);
- ``robust``: the robustness rule (method.md §11): one verdict from the same comparison at every
  threshold of its rule's range and under other bootstrap seeds, else cannot tell, saying why;
- ``ed_difference``: a bootstrap interval of the difference of two EDs (or ratios) — paired when
  both are measured on the same prompts (two lenses of one run), independent otherwise (two tasks);
- ``spearman_test``: a rank correlation with its exact permutation p-value (and the smallest p
  the number of points allows, so that "too few to test" is a number, not a feeling);
- ``threshold_sensitivity``: ED as a rule's threshold varies, per run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from ..depth import difference_draws, interval, resample_weights, with_setting
from ..probes.shared.reduce import token_weighted_mean
from ..probes.spec import Rule

EARLY_SHARE = 0.1  # "the first layers": the first tenth of the depth (at least 2 layers)
ALPHA = 0.05
N_BOOTSTRAP = 2000  # resamples per interval: with 2000 the 2.5 % tail holds 50 draws
OTHER_SEEDS = 2  # a verdict must also hold under the next two bootstrap seeds


def early_layers(n_layers: int) -> int:
    """The last layer index counted as "the first layers" of an L-layer model."""
    return max(2, math.ceil(EARLY_SHARE * n_layers))


def curves(rule: Rule, frame: pl.DataFrame, n_layers: int) -> dict[str, np.ndarray]:
    """The token-weighted mean curve of each metric the rule reads (layers 0..L-1, or 0..L)."""
    layers = n_layers + 1 if rule.needs_final_layer else n_layers
    mean = token_weighted_mean(frame) if "example" in frame.columns else frame
    out = {}
    for metric in rule.metrics:
        values = mean.filter(pl.col("metric") == metric, pl.col("layer") < layers).sort("layer")["value"]
        out[metric] = values.to_numpy()
    return out


def artefact(ed: int | None, n_layers: int) -> str | None:
    """Why an ED is a rule artefact (None when it is not): its rule fires in the first layers (at or
    before ``early_layers``). There a rule reads where its threshold falls against the first layers'
    outliers — a lens-KL maximum at the embeddings, an overlap hovering under its threshold from layer
    0 — not the depth a model uses. The paper's cells carry only ED and L, so this test needs nothing
    else: one rule for its cells and ours."""
    if ed is not None and ed <= early_layers(n_layers):
        return f"it fires at layer {_layer(ed)}, in the first layers (0–{early_layers(n_layers)} of {n_layers})"
    return None


def degenerate(ed: float | None, ci_low: float | None, ci_high: float | None, n_layers: int) -> str | None:
    """Why a depth of ours is degenerate (None when it is not): an ``artefact``, or an interval wider
    than half the depth. One rule for the integer ED and the primary (continuous) statistic."""
    if ed is None:
        return None
    if ci_low is not None and ci_high is not None and ci_high - ci_low > n_layers / 2:
        return f"its interval [{_layer(ci_low)}–{_layer(ci_high)}] spans more than half the {n_layers} layers"
    return artefact(ed, n_layers)


def _layer(value: float) -> str:
    """A layer index as written: whole layers as integers, a continuous statistic to one decimal."""
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def robust(checks: Sequence[tuple[str, str]]) -> tuple[str, str | None]:
    """The robustness rule: ``checks`` are (what was varied, verdict) for one comparison, the book's
    own threshold and seed first. A verdict stands only when every check gives it; otherwise the
    verdict is cannot tell and the reason names the first check that gave another."""
    if not checks:
        return "cannot tell", "nothing to compare"
    main = checks[0][1]
    for what, verdict in checks[1:]:
        if verdict != main:
            return "cannot tell", f"{main} at the book's settings, {verdict} {what}"
    return main, None


def ed_difference(*args, **kwargs) -> dict:
    """``interval`` of ``difference_draws`` (same arguments): the point, its 95 % bootstrap interval,
    the share of draws defined."""
    return interval(*difference_draws(*args, **kwargs))


def spearman_test(x: Sequence[float], y: Sequence[float], n_permutations: int = 20000, seed: int = 0) -> dict:
    """Spearman's rho of ``x`` and ``y``, the two-sided permutation p-value (exact for up to 8
    points), and ``min_p``: the smallest p-value that many points can give (4 points: 1/12 — a
    test at 5 % cannot reject with fewer than 5)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = x.size
    if n < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return {"rho": None, "p": None, "min_p": None, "n": n}
    rx, ry = _ranks(x), _ranks(y)
    rho = _pearson(rx, ry)
    if n <= 8:
        values = np.array([_pearson(rx, ry[list(p)]) for p in itertools.permutations(range(n))])
    else:
        rng = np.random.default_rng(seed)
        values = np.array([_pearson(rx, ry[rng.permutation(n)]) for _ in range(n_permutations)])
    p = float(np.mean(np.abs(values) >= abs(rho) - 1e-12))
    # the smallest p these values allow: the share of orderings as extreme as the most extreme one
    # (exact up to 8 points, ties included; 2/n! without ties), else the permutation test's resolution
    min_p = float(np.mean(np.abs(values) >= np.abs(values).max() - 1e-12)) if n <= 8 else 1 / n_permutations
    return {"rho": float(rho), "p": p, "min_p": min_p, "n": n}


def _ranks(values: np.ndarray) -> np.ndarray:
    order = values.argsort(kind="stable")
    ranks = np.empty(values.size)
    ranks[order] = np.arange(values.size, dtype=float)
    for value in np.unique(values):  # ties share their mean rank
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    denominator = math.sqrt(float((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / denominator) if denominator else 0.0


def threshold_sensitivity(rule: Rule, frame: pl.DataFrame, n_layers: int, settings: Any) -> pl.DataFrame:
    """ED of ``rule`` on the run's curve as its threshold setting takes each of ``rule.thresholds``:
    ``threshold, ed, ratio`` (null where the rule finds no layer)."""
    if rule.thresholds is None:
        return pl.DataFrame(schema={"threshold": pl.Float64, "ed": pl.Int64, "ratio": pl.Float64})
    name, values = rule.thresholds
    curve = curves(rule, frame, n_layers)
    rows = []
    for value in values:
        changed = with_setting(settings, name, value)
        ed = rule.find(curve, changed)
        rows.append((float(value), ed, None if ed is None else (ed + 1) / n_layers))
    return pl.DataFrame(rows, schema={"threshold": pl.Float64, "ed": pl.Int64, "ratio": pl.Float64}, orient="row")


def variants(rule: Rule, settings: Any, seed: int, thresholds: bool = True) -> list[tuple[str, Any, int]]:
    """The robustness rule's checks of one comparison: (what was varied, settings, bootstrap seed) —
    the book's own first, then every other threshold of the rule's range (unless ``thresholds`` is
    False: a threshold-free statistic, which no threshold can move), then the other seeds."""
    out = [("", settings, seed)]
    if thresholds and rule.thresholds is not None:
        name, values = rule.thresholds
        own = getattr(settings, name, None)
        words = name.replace("_", " ")
        shown = {v: f"{v:g}".replace("-", "−") for v in values}  # the typographic minus, as in the findings
        out += [
            (f"at {words} {shown[v]}", with_setting(settings, name, v), seed) for v in values if own is None or v != own
        ]
    out += [(f"under bootstrap seed {seed + k}", settings, seed + k) for k in range(1, OTHER_SEEDS + 1)]
    return out


def curve_bands(per_example: pl.DataFrame, n_bootstrap: int = 1000, seed: int = 0) -> pl.DataFrame:
    """Each curve's token-weighted mean per layer with its 95 % bootstrap band over prompts (the
    resamples the ED intervals draw: whole prompts, token-weighted): ``model, task, metric, layer,
    value, low, high, n`` from a per-example frame (``example, layer, metric, value, n_tokens`` and
    ``model``/``task``)."""
    rows = []
    for (model, task, metric), part in per_example.group_by("model", "task", "metric", maintain_order=True):
        wide = part.pivot(on="layer", index=["example", "n_tokens"], values="value").sort("example")
        layers = sorted(int(c) for c in wide.columns if c not in ("example", "n_tokens"))
        counts = wide["n_tokens"].to_numpy().astype(float)  # [example]
        sums = wide.select([str(layer) for layer in layers]).to_numpy() * counts[:, None]  # [example, layer]
        weights = resample_weights(counts.size, n_bootstrap, seed)  # [boot, example]
        means = (weights @ sums) / (weights @ counts)[:, None]  # [boot, layer]
        low, high = np.percentile(means, [2.5, 97.5], axis=0)
        mean = sums.sum(0) / counts.sum()
        rows += [
            (model, task, metric, layer, float(mean[i]), float(low[i]), float(high[i]), int(counts.size))
            for i, layer in enumerate(layers)
        ]
    schema = {"model": pl.String, "task": pl.String, "metric": pl.String, "layer": pl.Int64, "value": pl.Float64,
              "low": pl.Float64, "high": pl.Float64, "n": pl.Int64}  # fmt: skip
    return pl.DataFrame(rows, schema=schema, orient="row")
