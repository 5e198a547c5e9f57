"""The pre-registered primary analysis and the specification curve (Simonsohn, Simmons & Nelson,
*Specification curve analysis*, Nat. Hum. Behav. 2020): every comparison a verdict rests on,
recomputed under each reasonable analysis choice, with the share of specifications that agree with
the primary one and, where they do not, the choice that decides it (docs/method.md §13).

The choices (``CHOICES``), each with the primary value first:

- ``statistic``: the rule's primary statistic (the lens centroids, the cosine crossing averaged
  over its zero levels), its threshold-averaged crossing (lens rules), or the paper's integer ED;
- ``window``: all layers, or without the first max(2, ⌈0.1 L⌉) layers, where method.md §10
  distrusts the lens (the curves cut there; a statistic is read on the rest and shifted back);
- ``anchor`` (the overlap centroid): the final step anchored at the output (ov[L] = 1), or the
  observed layers only;
- ``zero levels`` (the cosine crossing): 7 levels −0.03 … +0.03, or 31 (a finer grid of the same
  range: the crossing is bimodal where the mean cosine hovers at zero);
- ``cell``: the largest n committed, or its first 20 prompts (the walk's first step);
- ``length``: every position of each text, or only its first N tokens (the exact length control:
  the cells of ``length_tasks``, run with ``positions``; a causal model's states there are those of
  the whole text, so both sides then average the same positions, whatever their texts' lengths);
- ``margin``: one layer of the (deeper) model — claim-independent, the resolution of a layer
  statistic — or the paper's median or largest spread of the same rule (its Table 1, artefacts out);
- ``seed``: the bootstrap's seed: the book's (``bootstrap_seed``) and the next three.

The primary specification is fixed in ``params/common.yml`` (``analysis``) before any number; a
verdict is **robust** when at least ``robust_share`` of the other specifications give the primary
verdict, else it **depends on the analysis**, and the choice whose values split the verdicts most
is named. Every comparison also carries its **equivalence bound**: the smallest margin at which its
primary interval would lie inside ±margin (max(|low|, |high|)), in ratio and in layers, so a reader
can apply any margin.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import polars as pl

from effdepth_core.measurement.depth import (
    N_BOOTSTRAP,
    _matrix,
    compare,
    early_layers,
    interval,
    primary_statistic,
    resample_weights,
    statistic_of,
    statistic_rows,
)

# every choice with its values, the primary first (params/common.yml's ``analysis`` may pick another)
CHOICES: dict[str, tuple[Any, ...]] = {
    "statistic": ("primary", "crossing", "integer ED"),
    "window": ("all layers", "without the first layers"),
    "anchor": ("output", "observed layers"),
    "zero levels": (7, 31),
    "cell": ("largest n", "first 20"),
    "length": ("all positions", "first positions"),
    "margin": ("one layer", "paper median", "paper max"),
    "seed": (0, 1, 2, 3),  # the book's bootstrap seed plus these (``Analysis.choices``)
}
FIRST_CELL = 20  # the precision walk's first step: the smallest n whose interval counts


@dataclass(frozen=True)
class Analysis:
    """The pre-registered primary analysis (``params/common.yml``: ``analysis``): one value of each
    choice, and the share of other specifications that must agree for a verdict to be robust."""

    statistic: str = "primary"
    window: str = "all layers"
    anchor: str = "output"
    zero_levels: int = 7
    cell: str = "largest n"
    length: str = "all positions"
    margin: str = "one layer"
    seed: int = 0
    robust_share: float = 0.8

    @classmethod
    def from_params(cls, value: Mapping | None) -> Analysis:
        """The analysis a params mapping declares (``None``: the defaults above)."""
        if not value:
            return cls()
        names = {f.name.replace("_", " "): f.name for f in fields(cls)}
        unknown = sorted(set(value) - set(names) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"unknown analysis key(s) {', '.join(unknown)}; use {', '.join(sorted(names))}")
        chosen = cls(**{names.get(k, k): v for k, v in value.items()})
        if not isinstance(chosen.seed, int) or isinstance(chosen.seed, bool) or chosen.seed < 0:
            raise ValueError(f"analysis seed must be a whole number >= 0, got {chosen.seed!r}")
        for name, values in chosen.choices().items():
            if chosen.choice(name) not in values:
                raise ValueError(f"analysis {name}: {chosen.choice(name)!r} is not one of {list(values)}")
        if not 0 < chosen.robust_share <= 1:
            raise ValueError(f"analysis robust_share must be in (0, 1], got {chosen.robust_share!r}")
        return chosen

    def choice(self, name: str) -> Any:
        return getattr(self, name.replace(" ", "_"))

    def choices(self) -> dict[str, tuple[Any, ...]]:
        """``CHOICES`` with the seeds counted from this analysis's own (the book's bootstrap seed)."""
        return {**CHOICES, "seed": tuple(self.seed + k for k in CHOICES["seed"])}


# --- a rule read under a specification ---------------------------------------------------------


def _shifted(value: Any, start: int) -> Any:
    """A layer (or rows of layers) read on curves cut at ``start``, in the full model's layers."""
    if value is None:
        return None
    return value + start


def windowed(rule, start: int):
    """``rule`` read on its curves without their first ``start`` layers (every statistic shifted
    back into the model's layers): the early-layer window."""
    if start <= 0:
        return rule

    def cut(curves: Mapping[str, Any]) -> dict[str, Any]:
        return {metric: np.asarray(curve)[..., start:] for metric, curve in curves.items()}

    def two(f: Callable | None) -> Callable | None:
        return None if f is None else (lambda curves, settings: _shifted(f(cut(curves), settings), start))

    def one(f: Callable | None) -> Callable | None:
        return None if f is None else (lambda curves: _shifted(f(cut(curves)), start))

    return replace(
        rule,
        find=two(rule.find),
        crossing=two(rule.crossing),
        centroid=one(rule.centroid),
        find_rows=two(rule.find_rows),
        crossing_rows=two(rule.crossing_rows),
        centroid_rows=one(rule.centroid_rows),
    )


def observed_overlap_centroid(overlap: np.ndarray) -> np.ndarray | float | None:
    """The overlap centroid over the observed layers only (no final step to ov[L] = 1): layer l
    weighs max(ov[l+1] − ov[l], 0) for l = 0..L−2; rows ``[row, layer]`` → ``[row]`` (NaN where
    none is gained), one curve → a float (None where none is gained)."""
    o = np.asarray(overlap, dtype=float)
    weights = np.maximum(o[..., 1:] - o[..., :-1], 0.0)
    total = weights.sum(axis=-1)
    layers = np.arange(weights.shape[-1], dtype=float)
    if o.ndim == 1:
        return float(layers @ weights / total) if total > 0 else None
    dots = np.array([layers @ row for row in weights], dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(total > 0, dots / total, np.nan)


def specified_rule(rule, spec: Mapping[str, Any], n_layers: int):
    """``rule`` as a specification reads it: its zero-level grid, its overlap anchor, its window."""
    if rule.thresholds is not None and rule.thresholds[0] == "cosine_zero" and spec["zero levels"] != 7:
        low, high = rule.thresholds[1][0], rule.thresholds[1][-1]
        grid = tuple(float(v) for v in np.round(np.linspace(low, high, int(spec["zero levels"])), 6))
        rule = replace(rule, thresholds=(rule.thresholds[0], grid))
    if rule.centroid is not None and rule.metrics == ("overlap",) and spec["anchor"] == "observed layers":
        rule = replace(
            rule,
            centroid=lambda curves: observed_overlap_centroid(curves["overlap"]),
            centroid_rows=lambda curves: observed_overlap_centroid(curves["overlap"]),
        )
    if spec["window"] != "all layers":
        rule = windowed(rule, early_layers(n_layers) + 1)
    return rule


def statistic_name(rule, spec: Mapping[str, Any]) -> str | None:
    """The statistic a specification reads (None where the rule has no such statistic)."""
    if spec["statistic"] == "integer ED":
        return "ed"
    if spec["statistic"] == "crossing":
        return "crossing" if rule.crossing is not None and primary_statistic(rule) != "crossing" else None
    return primary_statistic(rule)


def applies(rule, name: str, value: Any, primary: Analysis) -> bool:
    """Whether a choice's value is a distinct specification for ``rule`` (the overlap anchor reads
    only the overlap centroid; the zero levels only the cosine crossing)."""
    if value == primary.choice(name):
        return True
    if name == "anchor":
        return rule.centroid is not None and rule.metrics == ("overlap",)
    if name == "zero levels":
        return rule.thresholds is not None and rule.thresholds[0] == "cosine_zero"
    return True


def specifications(rule, primary: Analysis) -> list[dict[str, Any]]:
    """Every distinct specification of one rule's comparison, the primary first. A choice that
    cannot matter to a statistic (the anchor for the integer ED, the zero levels for a centroid)
    stays at its primary value there, so no specification is counted twice."""
    names, choices = list(CHOICES), primary.choices()
    values = [
        [primary.choice(n), *[v for v in choices[n] if v != primary.choice(n) and applies(rule, n, v, primary)]]
        for n in names
    ]
    out, seen = [], set()
    for combo in itertools.product(*values):
        spec = dict(zip(names, combo, strict=True))
        statistic = statistic_name(rule, spec)
        if statistic is None:
            continue
        if statistic != "centroid":
            spec["anchor"] = primary.anchor
        if statistic != "crossing":
            spec["zero levels"] = primary.zero_levels
        key = tuple(spec.values())
        if key not in seen:
            seen.add(key)
            out.append(spec)
    return out


# --- margins --------------------------------------------------------------------------------------


def paper_margins(paper: pl.DataFrame | None, rule_label: str, by: str) -> dict[str, float | None]:
    """The paper's median and largest spread of one rule's ratio (Table 1, its artefacts left out):
    across the data sets within each model (``by="task"``), or between its models' mean ratios
    (``by="model"``: every pair's absolute difference)."""
    if paper is None:
        return {"paper median": None, "paper max": None}
    from .findings import clean_paper

    rows = clean_paper(paper).filter(pl.col("rule") == rule_label)
    if by == "task":
        spreads = rows.group_by("model").agg((pl.col("ratio").max() - pl.col("ratio").min()).alias("s"))["s"]
        values = spreads.to_numpy()
    else:
        means = rows.group_by("model").agg(pl.col("ratio").mean())["ratio"].to_numpy()
        values = np.array([abs(a - b) for a, b in itertools.combinations(means, 2)])
    if not values.size:
        return {"paper median": None, "paper max": None}
    return {"paper median": float(np.median(values)), "paper max": float(values.max())}


def margin_of(name: str, n_layers: int, paper: Mapping[str, float | None], ratio: bool = True) -> float | None:
    """A margin by name, in ratio (``ratio``) or in layers of an ``n_layers``-layer model; a paper
    spread is floored at one layer, which no layer statistic resolves below (method.md §12)."""
    layer = 1 / n_layers if ratio else 1.0
    if name == "one layer":
        return layer
    value = paper.get(name)
    if value is None:
        return None
    return max(value if ratio else value * n_layers, layer)


def equivalence_bound(low: float | None, high: float | None) -> float | None:
    """The smallest margin within which ``[low, high]`` lies (the comparison would be called
    equivalent at any margin at least this): max(|low|, |high|)."""
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return None
    return max(abs(low), abs(high))


# --- one comparison's curve -----------------------------------------------------------------------

_SCHEMA = {
    "comparison": pl.String,
    "rule": pl.String,
    **{name: pl.String for name in CHOICES},
    "primary": pl.Boolean,
    "point": pl.Float64,
    "low": pl.Float64,
    "high": pl.Float64,
    "margin_value": pl.Float64,
    "layer": pl.Float64,  # one layer of the deeper model in the comparison's unit (ratio or layers)
    "verdict": pl.String,
    "positions": pl.Int64,  # the window of the length control (each text's first N tokens); null: all
}


@dataclass(frozen=True)
class Side:
    """One side of a comparison: a rule's per-example frame on one run and the model's depth."""

    rule: Any
    frame: pl.DataFrame
    n_layers: int
    # the same model and data set on each text's first N tokens, by N (the length control's cells)
    windowed: Mapping[int, Side] | None = None


def common_window(first: Side, second: Side) -> int | None:
    """The length control's window of a comparison: the smallest N both sides were cut at (the
    strictest control they share: HellaSwag → GSM8K at 32 tokens, GSM8K → AIME24 at 128), or None."""
    common = set(first.windowed or {}) & set(second.windowed or {})
    return min(common) if common else None


def comparison_curve(
    name: str,
    rule_label: str,
    first: Side,
    second: Side,
    settings: Any,
    paired: bool,
    ratio: bool,
    paper: Mapping[str, float | None],
    primary: Analysis,
    n_bootstrap: int = N_BOOTSTRAP,
) -> pl.DataFrame:
    """``statistic(first) − statistic(second)`` (ratios (x + 1) / L with ``ratio``, else layers)
    under every specification of the rule: one row per specification (``point, low, high``: the
    95 % bootstrap interval), judged against its margin (``verdict``: ``depth.compare``'s). A margin
    the comparison has no value for (the paper's spreads of a question the paper did not ask) is no
    specification."""
    deeper = max(first.n_layers, second.n_layers)
    matrices = _Matrices()
    rows = []
    for spec in specifications(first.rule, primary):
        if spec["margin"] != primary.margin:
            continue  # the interval is the margin's to judge: computed once, judged under each below
        sides, window = (first, second), None
        if spec["length"] != "all positions":
            window = common_window(first, second)
            if window is None:
                continue  # no length-control cells both sides share: no such specification
            sides = (first.windowed[window], second.windowed[window])
        point, draws = _difference(*sides, spec, settings, paired, ratio, n_bootstrap, matrices)
        found = interval(point, draws)
        judged_at: set[float] = set()
        for margin_name in (primary.margin, *[m for m in CHOICES["margin"] if m != primary.margin]):
            margin = margin_of(margin_name, deeper, paper, ratio)
            if margin is None or margin in judged_at:
                continue  # no value, or the same margin as one judged already: no other specification
            judged_at.add(margin)
            judged = {**spec, "margin": margin_name}
            rows.append(
                {
                    "comparison": name,
                    "rule": rule_label,
                    **{n: str(judged[n]) for n in CHOICES},
                    "primary": all(judged[n] == primary.choice(n) for n in CHOICES),
                    "point": found["point"],
                    "low": found["low"],
                    "high": found["high"],
                    "margin_value": margin,
                    "layer": 1 / deeper if ratio else 1.0,
                    "verdict": compare(found["low"], found["high"], margin).verdict,
                    "positions": window,
                }
            )
    return pl.DataFrame(rows, schema=_SCHEMA)


class _Matrices:
    """Each side's per-example token sums ``[example, layer]`` and counts ``[example]`` per metric,
    pivoted once for all the specifications of a comparison."""

    def __init__(self) -> None:
        self._found: dict = {}

    def weights(self, n_examples: int, n_bootstrap: int, seed: int) -> np.ndarray:
        """``depth.resample_weights`` as floats, drawn once per (n, seed)."""
        key = ("weights", n_examples, n_bootstrap, seed)
        if key not in self._found:
            self._found[key] = resample_weights(n_examples, n_bootstrap, seed).astype(float)
        return self._found[key]

    def get(self, frame: pl.DataFrame, metric: str, layers: int) -> tuple[np.ndarray, np.ndarray]:
        key = (id(frame), metric, layers)
        if key not in self._found:
            self._found[key] = _matrix(frame, metric, layers)
        return self._found[key]


def _samples(side: Side, rule, spec, settings, weights: np.ndarray, rows: int, statistic: str, matrices: _Matrices):
    """``depth.depth_samples`` on the first ``rows`` prompts of one side, from its pivoted matrices
    (the weights as floats: one matrix product per metric)."""
    layers = side.n_layers + 1 if rule.needs_final_layer else side.n_layers
    sums = {m: matrices.get(side.frame, m, layers) for m in rule.metrics}
    counts = next(iter(sums.values()))[1][:rows]
    mean = {m: s[:rows].sum(0) / counts.sum() for m, (s, _) in sums.items()}
    point = statistic_of(rule, mean, settings, statistic)
    total = weights @ counts  # [boot]
    curves = {m: (weights @ s[:rows]) / total[:, None] for m, (s, _) in sums.items()}
    return point, statistic_rows(rule, curves, settings, statistic)


def _difference(first: Side, second: Side, spec, settings, paired, ratio, n_bootstrap, matrices):
    """``depth.difference_draws`` of one specification: the rules as it reads them, its cell, its seed."""
    n_first, n_second = first.frame["example"].n_unique(), second.frame["example"].n_unique()
    if spec["cell"] == "first 20":
        n_first, n_second = min(n_first, FIRST_CELL), min(n_second, FIRST_CELL)
    seed = int(spec["seed"])
    if paired:
        n_first = n_second = min(n_first, n_second)
        weights = other = matrices.weights(n_first, n_bootstrap, seed)
    else:
        weights = matrices.weights(n_first, n_bootstrap, seed)
        other = matrices.weights(n_second, n_bootstrap, seed + 1)
    statistic = statistic_name(first.rule, spec)
    rule_a = specified_rule(first.rule, spec, first.n_layers)
    rule_b = specified_rule(second.rule, spec, second.n_layers)
    a, draws_a = _samples(first, rule_a, spec, settings, weights, n_first, statistic, matrices)
    b, draws_b = _samples(second, rule_b, spec, settings, other, n_second, statistic, matrices)
    if a is None or b is None:
        return None, np.full(n_bootstrap, np.nan)

    def scale(values, layers: int):
        return (values + 1) / layers if ratio else values

    return (
        float(scale(np.float64(a), first.n_layers) - scale(np.float64(b), second.n_layers)),
        scale(draws_a, first.n_layers) - scale(draws_b, second.n_layers),
    )


# --- a question's verdict across its specifications -----------------------------------------------


def verdict_family(verdict: str) -> str:
    """A verdict as the robustness rule counts it: agreement (with or without a small difference)
    is one family."""
    return "agree" if verdict.startswith("a small difference") else verdict


def summarize(curve: pl.DataFrame, primary: Analysis) -> pl.DataFrame:
    """Per comparison and rule: the primary verdict with its interval and equivalence bound (ratio
    and layers), the share of the other specifications that agree, and whether it is robust or
    which choice decides it."""
    rows = []
    for (comparison, rule), group in curve.group_by(["comparison", "rule"], maintain_order=True):
        own = group.filter(pl.col("primary"))
        if not own.height:
            continue
        first = own.row(0, named=True)
        others = group.filter(~pl.col("primary"))
        family = verdict_family(first["verdict"])
        agreeing = [verdict_family(v) == family for v in others["verdict"]]
        share = float(np.mean(agreeing)) if agreeing else 1.0
        robust = share >= primary.robust_share
        bound = equivalence_bound(first["low"], first["high"])
        layers = None if bound is None else bound / first["layer"]
        control = _length_control(group, primary)
        rows.append(
            {
                "comparison": comparison,
                "rule": rule,
                "verdict": first["verdict"],
                "point": first["point"],
                "low": first["low"],
                "high": first["high"],
                "margin": first["margin_value"],
                "bound": bound,
                "bound_layers": layers,
                "specifications": group.height,
                "share_agreeing": share,
                "robust": robust,
                "decided_by": None if robust else deciding_choice(group, family),
                "length_verdict": None if control is None else control["verdict"],
                "length_point": None if control is None else control["point"],
                "length_low": None if control is None else control["low"],
                "length_high": None if control is None else control["high"],
                "length_positions": None if control is None else control["positions"],
            }
        )
    schema = {"comparison": pl.String, "rule": pl.String, "verdict": pl.String, "point": pl.Float64,
              "low": pl.Float64, "high": pl.Float64, "margin": pl.Float64, "bound": pl.Float64,
              "bound_layers": pl.Float64, "specifications": pl.Int64, "share_agreeing": pl.Float64,
              "robust": pl.Boolean, "decided_by": pl.String, "length_verdict": pl.String,
              "length_point": pl.Float64, "length_low": pl.Float64, "length_high": pl.Float64,
              "length_positions": pl.Int64}  # fmt: skip
    return pl.DataFrame(rows, schema=schema)


def _length_control(group: pl.DataFrame, primary: Analysis) -> dict | None:
    """The comparison under the exact length control: the primary specification in every choice but
    ``length`` (None where a side has no length-control cell)."""
    others = [name for name in CHOICES if name != "length"]
    match = group.filter(
        pl.col("length") != str(primary.length),
        *[pl.col(name) == str(primary.choice(name)) for name in others],
    )
    return match.row(0, named=True) if match.height else None


def deciding_choice(group: pl.DataFrame, family: str) -> str:
    """The choice whose values split the verdicts most: for each choice, the spread between its
    values' shares of specifications agreeing with ``family``; the largest names it, with each
    value's share (``margin: one layer 20 %, paper median 10 %, paper max 95 %``)."""
    agree = group.with_columns(
        pl.col("verdict").map_elements(lambda v: verdict_family(v) == family, return_dtype=pl.Boolean).alias("a")
    )
    best, text = -1.0, "no single choice"
    for name in CHOICES:
        shares = agree.group_by(name, maintain_order=True).agg(pl.col("a").mean().alias("s"))
        if shares.height < 2:
            continue
        spread = float(shares["s"].max() - shares["s"].min())
        if spread > best + 1e-12:
            values = ", ".join(f"{v} {s:.0%}" for v, s in shares.iter_rows())
            best, text = spread, f"{name} ({values} agree)"
    return text


# --- the book's questions -------------------------------------------------------------------------


def _side(study, model: str, task: str, label: str, windowed=None) -> tuple[Any, Side] | tuple[None, None]:
    """One side, with its length-control cells from ``windowed`` (a study of ``length_tasks`` and its
    summary: the same model, data set, level and token cap, run with ``positions``) that count, by N."""
    from .evidence import _excluded, _frames, _rule

    record, frame = _frames(study, model, task, label)
    if record is None:
        return None, None
    windows = {}
    if windowed is not None:
        windowed, summary = windowed

        def cell(s):
            return s.task, s.level, s.max_tokens

        for other in windowed.finished:
            if (
                other.model != model
                or cell(other.settings) != cell(record.settings)
                or other.settings.positions is None
            ):
                continue
            _, cut = _frames(windowed, model, other.label, label)
            if cut is not None and _excluded(summary, [(model, other.label)], label) is None:
                windows[other.settings.positions] = Side(_rule(label)[1], cut, int(other.result.summary["n_layers"]))
    return record, Side(_rule(label)[1], frame, int(record.result.summary["n_layers"]), windows or None)


def difficulty_curve(
    study,
    model: str,
    order: Sequence[str],
    paper: pl.DataFrame | None,
    primary: Analysis,
    rules: Sequence[str],
    n_bootstrap: int = N_BOOTSTRAP,
    windowed=None,
) -> pl.DataFrame:
    """Each step of ``order`` (ratio of the harder data set − the easier, independent prompts) per
    rule, under every specification; comparisons the evidence excludes (degenerate, n < 20) are left
    out, as they are from the verdicts."""
    from .evidence import _excluded

    summary, parts = study.summary(), []
    windowed = None if windowed is None else (windowed, windowed.summary())
    for label in rules:
        present = [t for t in order if _side(study, model, t, label)[0] is not None]
        for easier, harder in itertools.pairwise(present):
            if _excluded(summary, [(model, easier), (model, harder)], label) is not None:
                continue
            (_, a), (rb, b) = _side(study, model, easier, label, windowed), _side(study, model, harder, label, windowed)
            name = f"{model}: {easier} → {harder}"
            margins = paper_margins(paper, label, "task")
            parts.append(comparison_curve(name, label, b, a, rb.settings, False, True, margins, primary, n_bootstrap))
    return pl.concat(parts) if parts else pl.DataFrame(schema=_SCHEMA)


def scale_curve(
    study,
    small: str,
    big: str,
    tasks: Sequence[str],
    paper: pl.DataFrame | None,
    primary: Analysis,
    rules: Sequence[str],
    n_bootstrap: int = N_BOOTSTRAP,
    windowed=None,
) -> pl.DataFrame:
    """ratio(big) − ratio(small) per data set and rule on the prompts both share (paired), under
    every specification."""
    from .evidence import _excluded

    summary, parts = study.summary(), []
    windowed = None if windowed is None else (windowed, windowed.summary())
    for label in rules:
        for task in tasks:
            (_, s), (rb, b) = _side(study, small, task, label, windowed), _side(study, big, task, label, windowed)
            if s is None or b is None or _excluded(summary, [(small, task), (big, task)], label) is not None:
                continue
            name = f"{big} − {small}: {task}"
            margins = paper_margins(paper, label, "model")
            parts.append(comparison_curve(name, label, b, s, rb.settings, True, True, margins, primary, n_bootstrap))
    return pl.concat(parts) if parts else pl.DataFrame(schema=_SCHEMA)


def lens_curve(study, primary: Analysis, n_bootstrap: int = N_BOOTSTRAP) -> pl.DataFrame:
    """Tuned − logit lens per run that measured both, per lens rule (the same prompts: paired, in
    layers), under every specification; margin one layer (the paper asks no such question, so its
    spreads give none). ``disagree``: the tuned lens moves the depth by more than the margin."""
    from .evidence import LENS_PAIRS, _excluded, _rule

    summary, parts = study.summary(), []
    for r in study.finished:
        if not {"tuned_lens", "logit_lens"} <= set(r.probes):
            continue
        n_layers = int(r.result.summary["n_layers"])
        for logit_label, tuned_label in LENS_PAIRS.values():
            if _excluded(summary, [(r.model, r.label)], logit_label) or _excluded(
                summary, [(r.model, r.label)], tuned_label
            ):
                continue
            tuned = Side(_rule(tuned_label)[1], r.result.per_example["tuned_lens"], n_layers)
            logit = Side(_rule(logit_label)[1], r.result.per_example["logit_lens"], n_layers)
            name = f"{r.model} {r.label}: tuned − logit"
            none = {"paper median": None, "paper max": None}
            parts.append(comparison_curve(name, logit_label, tuned, logit, r.settings, True, False, none, primary,
                                          n_bootstrap))  # fmt: skip
    return pl.concat(parts) if parts else pl.DataFrame(schema=_SCHEMA)
