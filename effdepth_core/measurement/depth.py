"""Effective depth (ED) from probe curves, with bootstrap intervals over prompts: the machinery
every ED rule shares — the paper's integer ED and the continuous statistics beside it (method.md
§12): a rule's crossing read between layers and averaged over its threshold range, and the lens
centroids, threshold-free. The rules themselves are declared by their probes (``probes/*.py``:
``Rule``; method.md §1–2 defines the paper's three).

The book's statistics live here too, so every interval, artefact rule and verdict rule has one home
(the book only calls them):

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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import polars as pl

if TYPE_CHECKING:
    from .probes.spec import Rule

# Bootstrap resamples, the two counts of the whole project. A run's own interval (stored in its
# summary, shown in tables and charts) uses N_BOOTSTRAP_RUN: it describes one measurement, and its
# 2.5 % tail holds 25 draws. A comparison that decides a verdict (a difference of two EDs or ratios,
# the book's evidence) uses N_BOOTSTRAP: its 2.5 % tail holds 50 draws, so the verdict's interval
# end moves less between seeds. Changing N_BOOTSTRAP_RUN changes every stored summary's interval.
N_BOOTSTRAP_RUN = 1000
N_BOOTSTRAP = 2000


@dataclass
class DepthResult:
    """ED of one rule: ``ed`` is None (with ``reason``) when the rule finds no layer."""

    ed: int | None
    ratio: float | None
    reason: str | None = None
    ci_low: int | None = None  # bootstrap percentile interval of ED over resampled prompts
    ci_high: int | None = None
    undefined_fraction: float | None = None  # share of resamples where the rule found no layer
    # the primary, continuous statistic (``primary_statistic``): its name, value in layers, ratio
    # (value + 1) / L and 95 % bootstrap interval in layers
    statistic: str | None = None
    depth: float | None = None
    depth_ratio: float | None = None
    depth_low: float | None = None
    depth_high: float | None = None

    def to_json(self) -> dict:
        return {key: value for key, value in asdict(self).items() if value is not None or key in ("ed", "ratio")}


def depth_table(depths: Mapping[str, DepthResult]) -> pl.DataFrame:
    """EDs as a frame, one row per rule: the paper's integer ED (``ed, ratio, ci_low, ci_high,
    reason``) and the primary continuous statistic (``statistic, depth, depth_ratio, depth_low,
    depth_high``)."""
    rows = [{"rule": rule, **asdict(result)} for rule, result in depths.items()]
    schema = {"rule": pl.String, "ed": pl.Int64, "ratio": pl.Float64, "reason": pl.String, "ci_low": pl.Int64,
              "ci_high": pl.Int64, "undefined_fraction": pl.Float64, "statistic": pl.String, "depth": pl.Float64,
              "depth_ratio": pl.Float64, "depth_low": pl.Float64, "depth_high": pl.Float64}  # fmt: skip
    columns = ("rule", "ed", "ratio", "ci_low", "ci_high", "reason", *list(schema)[7:])
    return pl.DataFrame(rows, schema=schema).select(columns)


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


Statistic = Literal["ed", "crossing", "centroid"]
STATISTICS: tuple[str, ...] = ("ed", "crossing", "centroid")


class _Setting:
    """``settings`` with one attribute replaced (a rule read at another threshold)."""

    def __init__(self, settings: Any, name: str, value: Any) -> None:
        self._settings, self._name, self._value = settings, name, value

    def __getattr__(self, name: str) -> Any:
        return self._value if name == self._name else getattr(self._settings, name)


def with_setting(settings: Any, name: str, value: Any) -> Any:
    """``settings`` with one attribute replaced (a rule reads its threshold from its settings)."""
    return _Setting(settings, name, value)


def averaged_crossing(rule: Rule, curves: Mapping[str, np.ndarray], settings: Any) -> float | None:
    """The rule's crossing read between layers (``Rule.crossing``), averaged over its threshold
    range (``Rule.thresholds``; the settings' own threshold where it declares none) — over the
    thresholds at which it is defined; None where it is defined at none."""
    if rule.crossing is None:
        return None
    if rule.thresholds is None:
        return rule.crossing(curves, settings)
    name, values = rule.thresholds
    found = [rule.crossing(curves, with_setting(settings, name, value)) for value in values]
    found = [value for value in found if value is not None]
    return float(np.mean(found)) if found else None


def primary_statistic(rule: Rule) -> Statistic | None:
    """The statistic the book decides with: the centroid where the rule has one (threshold-free),
    else the threshold-averaged crossing; None for a rule with neither."""
    if rule.centroid is not None:
        return "centroid"
    return "crossing" if rule.crossing is not None else None


def statistic_of(rule: Rule, curves: Mapping[str, np.ndarray], settings: Any, statistic: Statistic) -> float | None:
    """One statistic of a rule on mean curves, in layers (None where it is undefined)."""
    if statistic == "ed":
        found = rule.find(curves, settings)
        return None if found is None else float(found)
    if statistic == "crossing":
        value = averaged_crossing(rule, curves, settings)
    elif statistic == "centroid":
        value = None if rule.centroid is None else rule.centroid(curves)
    else:
        raise ValueError(f"statistic must be one of {', '.join(STATISTICS)}, got {statistic!r}")
    return value if value is not None and np.isfinite(value) else None  # never a NaN into a summary


def _mean_of_defined(values: np.ndarray) -> np.ndarray:
    """The mean of each row's defined (non-NaN) values ``[row, k]`` → ``[row]`` (NaN where none
    is), summed in order from 0 — as ``np.mean`` sums fewer than 8 values, so a row equals
    ``averaged_crossing``'s mean exactly; more values are averaged row by row with ``np.mean``."""
    if values.shape[1] >= 8:  # numpy sums 8 or more values pairwise: the same call keeps them equal
        return np.array([np.mean(row[~np.isnan(row)]) if (~np.isnan(row)).any() else np.nan for row in values])
    total, count = np.zeros(values.shape[0]), np.zeros(values.shape[0], dtype=int)
    for column in values.T:
        defined = ~np.isnan(column)
        total, count = total + np.where(defined, column, 0.0), count + defined
    with np.errstate(invalid="ignore"):  # 0 / 0 where no value is defined: NaN
        return np.where(count > 0, total / count, np.nan)


def statistic_rows(rule: Rule, curves: Mapping[str, np.ndarray], settings: Any, statistic: Statistic) -> np.ndarray:
    """``statistic_of`` on each row of ``curves`` (``{metric: [row, layer]}``) → ``[row]``, NaN
    where it is undefined: at once where the rule declares ``find_rows``/``crossing_rows``/
    ``centroid_rows`` (equal to ``find``/``crossing``/``centroid`` row by row), else row by row."""
    finite = np.all([np.isfinite(c).all(axis=1) for c in curves.values()], axis=0)  # [row]
    if not finite.all():  # rows with NaN or inf take the one-curve path, whose rules treat them their own way
        rows = np.full(len(finite), np.nan)
        if finite.any():
            rows[finite] = statistic_rows(rule, {m: c[finite] for m, c in curves.items()}, settings, statistic)
        for i in np.flatnonzero(~finite):
            value = statistic_of(rule, {m: c[i] for m, c in curves.items()}, settings, statistic)
            rows[i] = np.nan if value is None else value
        return rows
    rows = None
    if statistic == "ed" and rule.find_rows is not None:
        rows = np.asarray(rule.find_rows(curves, settings), dtype=float)
    elif statistic == "crossing" and rule.crossing_rows is not None:
        if rule.thresholds is None:
            rows = np.asarray(rule.crossing_rows(curves, settings), dtype=float)
        else:
            name, values = rule.thresholds
            each = [rule.crossing_rows(curves, with_setting(settings, name, value)) for value in values]
            rows = _mean_of_defined(np.column_stack(each).astype(float))  # [row, threshold]
    elif statistic == "centroid" and rule.centroid_rows is not None:
        rows = np.asarray(rule.centroid_rows(curves), dtype=float)
    if rows is not None and statistic != "ed":
        rows = np.where(np.isfinite(rows), rows, np.nan)  # never a NaN or inf into a summary
    if rows is not None:
        return rows
    n_rows = len(next(iter(curves.values())))
    values = [statistic_of(rule, {m: c[i] for m, c in curves.items()}, settings, statistic) for i in range(n_rows)]
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def _resampled_curves(
    rule: Rule, frame: pl.DataFrame, n_layers: int, weights: np.ndarray
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The mean curves of the rule's metrics ``{metric: [layer]}`` and on each bootstrap resample
    ``{metric: [boot, layer]}`` (token-weighted, as the rule reads them)."""
    layers = n_layers + 1 if rule.needs_final_layer else n_layers
    sums_counts = {m: _matrix(frame, m, layers) for m in rule.metrics}
    counts = next(iter(sums_counts.values()))[1]
    if weights.shape[1] != counts.size:
        raise ValueError(f"{weights.shape[1]} resampling weights for {counts.size} examples")
    mean = {m: s.sum(0) / counts.sum() for m, (s, _) in sums_counts.items()}
    total = weights @ counts  # [boot]
    return mean, {m: (weights @ s) / total[:, None] for m, (s, _) in sums_counts.items()}


def depth_samples(
    rule: Rule,
    frame: pl.DataFrame,
    n_layers: int,
    settings: Any,
    weights: np.ndarray,
    statistic: Statistic = "ed",
) -> tuple[float | None, np.ndarray]:
    """``statistic`` of ``rule`` on a per-example frame, and on each bootstrap resample ``weights``
    ``[boot, example]`` (NaN where it is undefined). Two frames of the same examples resampled
    with the same ``weights`` give paired draws (e.g. two lenses on one run)."""
    mean, curves = _resampled_curves(rule, frame, n_layers, weights)
    point = statistic_of(rule, mean, settings, statistic)
    if not len(weights):
        return point, np.zeros(0)
    return point, statistic_rows(rule, curves, settings, statistic)


def per_prompt(
    rule: Rule, frame: pl.DataFrame, n_layers: int, settings: Any, statistic: Statistic = "ed"
) -> tuple[np.ndarray, np.ndarray]:
    """``statistic`` of ``rule`` on each prompt's own curves ``[example]`` (NaN where it is
    undefined there) and each prompt's token count ``[example]``, in the frame's example order."""
    layers = n_layers + 1 if rule.needs_final_layer else n_layers
    sums_counts = {m: _matrix(frame, m, layers) for m in rule.metrics}
    counts = next(iter(sums_counts.values()))[1]
    curves = {m: s / counts[:, None] for m, (s, _) in sums_counts.items()}  # [example, layer] per-prompt means
    return statistic_rows(rule, curves, settings, statistic), counts


def ed_samples(
    rule: Rule, frame: pl.DataFrame, n_layers: int, settings: Any, weights: np.ndarray
) -> tuple[int | None, np.ndarray]:
    """The integer ED of ``rule`` and its bootstrap draws (``depth_samples`` with ``"ed"``)."""
    point, draws = depth_samples(rule, frame, n_layers, settings, weights, "ed")
    return (None if point is None else int(point)), draws


def n_examples(frame: pl.DataFrame) -> int:
    return int(frame["example"].n_unique())


def rule_depth(
    rule: Rule, frame: pl.DataFrame, n_layers: int, settings: Any, n_bootstrap: int = N_BOOTSTRAP_RUN, seed: int = 0
) -> DepthResult:
    """ED and ratio (ED+1)/L of one rule on a probe's frame, and its primary continuous statistic
    (``primary_statistic``) with its ratio: per-example (``example, layer, metric, value,
    n_tokens``, with bootstrap intervals over prompts, both statistics from the same resamples)
    or aggregated (``layer, metric, value``: no interval)."""
    layers = n_layers + 1 if rule.needs_final_layer else n_layers

    def result(ed: int | None) -> DepthResult:
        if ed is None:
            return DepthResult(None, None, rule.reason(settings))
        return DepthResult(int(ed), (int(ed) + 1) / n_layers)

    statistic = primary_statistic(rule)

    def with_primary(depth: DepthResult, curves: Mapping[str, np.ndarray]) -> DepthResult:
        value = None if statistic is None else statistic_of(rule, curves, settings, statistic)
        if value is not None:
            depth.statistic, depth.depth, depth.depth_ratio = statistic, value, (value + 1) / n_layers
        return depth

    if "example" not in frame.columns:
        curves = {m: _curve(frame, m, layers) for m in rule.metrics}
        return with_primary(result(rule.find(curves, settings)), curves)
    count = n_examples(frame)
    boots = n_bootstrap if n_bootstrap > 0 and count >= 2 else 0
    weights = resample_weights(count, boots, seed) if boots else np.ones((0, count), dtype=int)
    mean, resampled = _resampled_curves(rule, frame, n_layers, weights)
    depth = with_primary(result(rule.find(mean, settings)), mean)
    if not boots:
        return depth
    draws = statistic_rows(rule, resampled, settings, "ed")
    defined = draws[~np.isnan(draws)]
    depth.undefined_fraction = 1 - defined.size / draws.size
    if defined.size:
        depth.ci_low = int(np.percentile(defined, 2.5, method="lower"))
        depth.ci_high = int(np.percentile(defined, 97.5, method="higher"))
    if depth.depth is not None:
        values = statistic_rows(rule, resampled, settings, statistic)
        values = values[~np.isnan(values)]
        if values.size:
            depth.depth_low, depth.depth_high = (float(v) for v in np.percentile(values, [2.5, 97.5]))
    return depth


def effective_depths(
    frames: Mapping[str, pl.DataFrame],
    rules: Iterable[tuple[str, Rule]],
    n_layers: int,
    settings: Any,
    n_bootstrap: int = N_BOOTSTRAP_RUN,
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


# --- comparisons: a difference of two runs' statistics, and the two tests that judge it -------------


def difference_draws(
    rule: Rule,
    first: pl.DataFrame,
    second: pl.DataFrame,
    n_layers: tuple[int, int],
    settings: Any,
    paired: bool,
    ratio: bool = False,
    n_bootstrap: int = N_BOOTSTRAP,
    seed: int = 0,
    other_rule: Rule | None = None,
    statistic: Statistic = "ed",
) -> tuple[float | None, np.ndarray]:
    """``statistic``(first) − ``statistic``(second) (or the difference of their ratios (x + 1) / L)
    and its bootstrap draws (NaN where a rule found no layer). ``paired``: the same prompts,
    resampled together (only the prompts both frames have, from the first, are used); otherwise
    the two are resampled independently. ``other_rule`` reads ``second`` (e.g. the tuned-lens rule
    beside the logit-lens one)."""
    if paired:
        shared = min(n_examples(first), n_examples(second))
        first = first.filter(pl.col("example") < shared)
        second = second.filter(pl.col("example") < shared)
        weights = other = resample_weights(shared, n_bootstrap, seed)
    else:
        weights = resample_weights(n_examples(first), n_bootstrap, seed)
        other = resample_weights(n_examples(second), n_bootstrap, seed + 1)
    a, draws_a = depth_samples(rule, first, n_layers[0], settings, weights, statistic)
    b, draws_b = depth_samples(other_rule or rule, second, n_layers[1], settings, other, statistic)

    def scale(values, layers: int):
        return (values + 1) / layers if ratio else values

    if a is None or b is None:
        return None, np.full(n_bootstrap, np.nan)
    point = float(scale(np.float64(a), n_layers[0]) - scale(np.float64(b), n_layers[1]))
    return point, scale(draws_a, n_layers[0]) - scale(draws_b, n_layers[1])


def interval(point: float | None, draws: np.ndarray) -> dict:
    """The point, the 95 % percentile interval of the defined draws, and the share of them defined."""
    defined = draws[~np.isnan(draws)]
    if point is None or not defined.size:
        return {"point": point, "low": None, "high": None, "defined": float(defined.size / max(draws.size, 1))}
    return {
        "point": point,
        "low": float(np.percentile(defined, 2.5)),
        "high": float(np.percentile(defined, 97.5)),
        "defined": float(defined.size / draws.size),
    }


def margin(paper_spread: float, n_layers: int) -> float:
    """The "no change" margin of a comparison of ratios: the paper's own spread, but never less than
    one layer of the deeper model (1/L), which no layer statistic can resolve below."""
    if not (isinstance(n_layers, int) and n_layers >= 1) or not math.isfinite(paper_spread) or paper_spread < 0:
        raise ValueError(f"a margin needs a spread >= 0 and L >= 1, got {paper_spread!r} and {n_layers!r}")
    return max(float(paper_spread), 1.0 / n_layers)


@dataclass(frozen=True)
class Comparison:
    """The two tests of one difference, stated separately (method.md §12): ``different`` (its
    interval excludes 0) and ``equivalent`` (its interval lies within ±margin), and the verdict:
    ``agree`` (equivalent, no difference shown), ``a small difference within the margin``
    (both), ``disagree`` (the whole interval beyond the margin on one side), else ``cannot tell``,
    with ``reason`` naming the test that failed."""

    low: float | None
    high: float | None
    margin: float
    different: bool
    equivalent: bool
    verdict: str
    reason: str | None


def compare(low: float | None, high: float | None, margin: float) -> Comparison:
    """Judge a difference's 95 % interval ``[low, high]`` against 0 and against ±``margin``.

    Args:
        low, high: the interval's ends (None or NaN: the statistic is undefined).
        margin: the "no change" margin (``margin``), finite and >= 0.

    Returns:
        The ``Comparison``: both tests and the verdict.

    Raises:
        ValueError: a reversed interval, or a margin that is negative or not finite.
    """
    if not (isinstance(margin, int | float) and math.isfinite(margin) and margin >= 0):
        raise ValueError(f"the margin must be a finite number >= 0, got {margin!r}")
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return Comparison(low, high, margin, False, False, "cannot tell", "the statistic is undefined")
    if low > high:
        raise ValueError(f"the interval is reversed: [{low}, {high}]")
    different = low > 0 or high < 0
    equivalent = -margin <= low and high <= margin
    if equivalent:
        verdict = "a small difference within the margin" if different else "agree"
        return Comparison(low, high, margin, different, equivalent, verdict, None)
    if low > margin or high < -margin:
        return Comparison(low, high, margin, different, equivalent, "disagree", None)
    reason = (
        "the interval excludes 0 but reaches past the margin: a difference of unsettled size"
        if different
        else "the interval reaches past the margin and includes 0: too wide to tell"
    )
    return Comparison(low, high, margin, different, equivalent, "cannot tell", reason)


# --- the book's statistics: artefacts, robustness, differences, correlations, bands ---

EARLY_SHARE = 0.1  # "the first layers": the first tenth of the depth (at least 2 layers)
ALPHA = 0.05
OTHER_SEEDS = 2  # a verdict must also hold under the next two bootstrap seeds


def early_layers(n_layers: int) -> int:
    """The last layer index counted as "the first layers" of an L-layer model."""
    return max(2, math.ceil(EARLY_SHARE * n_layers))


def curves(rule: Rule, frame: pl.DataFrame, n_layers: int) -> dict[str, np.ndarray]:
    """The token-weighted mean curve of each metric the rule reads (layers 0..L-1, or 0..L)."""
    layers = n_layers + 1 if rule.needs_final_layer else n_layers
    from .probes.shared.reduce import token_weighted_mean  # torch: loaded when a curve is read

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


def curve_bands(per_example: pl.DataFrame, n_bootstrap: int = N_BOOTSTRAP_RUN, seed: int = 0) -> pl.DataFrame:
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
