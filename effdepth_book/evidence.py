"""The comparisons the findings rest on, computed from a study's per-example frames with the
statistics of ``depth.py`` — each a frame of numbers with intervals, so the findings are text made
from them and can be tested on frames made by hand:

- ``within_family``: for two sizes of one family on the same prompts, the paired bootstrap of the ED
  and ratio differences per rule and task, and pooled over the tasks;
- ``across_models``: per rule, the rank correlation of model size and ED over the models (with its
  permutation test) and the spread of their ratios;
- ``between_tasks``: per model and rule, the difference of the ED ratio between successive tasks
  (independent prompts: an unpaired bootstrap), and the rank correlation over ordered levels;
- ``between_lenses``: per model, task and rule, the paired difference tuned − logit lens.

Every comparison is of the rule's primary statistic (``depth.primary_statistic``: the lens
centroids, the cosine crossing interpolated and averaged over its threshold range — threshold-free,
so no threshold can move it), in ``point, low, high``; the paper's integer ED beside it, from the same
resamples, in ``ed_point, ed_low, ed_high`` (a panel: it decides nothing). Degenerate depths
(``depth.degenerate`` of the primary statistic) and intervals from fewer than ``MIN_INTERVAL_N``
prompts never decide a comparison: their rows say so (``excluded``). Each comparison comes as several
rows, one per check of the robustness rule (``variant``: "" for the book's own bootstrap seed, then
each other seed, ``depth.variants``); the findings show the first and decide on all of them.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl

from effdepth_core.measurement import registry
from effdepth_core.measurement.depth import (
    N_BOOTSTRAP,
    difference_draws,
    interval,
    per_prompt,
    primary_statistic,
    resample_weights,
    spearman_test,
    variants,
)

from .reference import RULE_LABELS
from .study import MIN_INTERVAL_N, RunRecord, Study

_SIZE = re.compile(r"[-_ ]?\d+(\.\d+)?[bmk]\b", re.IGNORECASE)


def family(model: str) -> str:
    """A model's family: its name without the size (``qwen2.5-coder-0.5b`` → ``qwen2.5-coder``)."""
    name = model.rsplit("/", 1)[-1]
    return _SIZE.sub("", name).strip("-_ ").lower()


def _rule(label: str):
    for spec, rule in registry.rules().values():
        if rule.label == label:
            return spec, rule
    raise KeyError(label)


def _frames(study: Study, model: str, task: str, label: str) -> tuple[RunRecord, pl.DataFrame] | tuple[None, None]:
    spec, rule = _rule(label)
    record = study.record(model, task, rule.frame or spec.name)
    if record is None:
        return None, None
    return record, record.result.per_example[rule.frame or spec.name]


def _excluded(summary: pl.DataFrame, cells: Sequence[tuple[str, str]], label: str) -> str | None:
    """Why any of ``cells`` (model, task) cannot decide a comparison of rule ``label``."""
    primary = "depth" in summary.columns  # the statistic that decides; a legacy summary has only the ED
    value, flag = ("depth", "depth_degenerate") if primary else ("ed", "degenerate")
    for model, task in cells:
        row = summary.filter(model=model, task=task, rule=label)
        if not row.height or row[value][0] is None:
            return f"{model} {task}: no {'depth statistic' if primary else 'ED'}"
        if row[flag][0] is not None:
            return f"{model} {task}: degenerate ({row[flag][0]})"
        if not row["interval_counts"][0]:
            return f"{model} {task}: n = {row['n_examples'][0]} < {MIN_INTERVAL_N}, no interval that counts"
    return None


def _checks(
    rule, first, second, layers, settings, paired, ratio=False, seed=0, other_rule=None, n_bootstrap=N_BOOTSTRAP
) -> list[tuple[str, dict, dict, np.ndarray]]:
    """One difference under every check of the robustness rule: ``(variant, primary, ed, draws)``,
    the primary statistic's ``interval`` and the integer ED's (``ed_point, ed_low, ed_high``), both
    from the same resamples, and the primary statistic's draws."""
    statistic = primary_statistic(rule) or "ed"
    out = []
    for what, changed, s in variants(rule, settings, seed, thresholds=statistic == "ed"):
        common = (rule, first, second, layers, changed, paired, ratio, n_bootstrap, s)
        point, draws = difference_draws(*common, other_rule=other_rule, statistic=statistic)
        ed = interval(*difference_draws(*common, other_rule=other_rule, statistic="ed"))
        shown = {f"ed_{k}": ed[k] for k in ("point", "low", "high")}
        out.append((what, interval(point, draws), shown, draws))
    return out


_SCHEMA = {
    "variant": pl.String,
    "rule": pl.String,
    "task": pl.String,
    "measure": pl.String,  # ed or ratio
    "point": pl.Float64,
    "low": pl.Float64,
    "high": pl.Float64,
    "ed_point": pl.Float64,
    "ed_low": pl.Float64,
    "ed_high": pl.Float64,
    "n": pl.Int64,
    "excluded": pl.String,
}


def within_family(
    study: Study,
    small: str,
    big: str,
    tasks: Sequence[str],
    rules: Sequence[str] = tuple(RULE_LABELS.values()),
    n_bootstrap: int = N_BOOTSTRAP,
    seed: int = 0,
) -> pl.DataFrame:
    """ED(big) − ED(small) and ratio(big) − ratio(small) per rule and task, paired over the prompts
    both runs share, and pooled over the tasks (``task`` = ``all``: the mean of the per-task draws)."""
    summary = study.summary()
    rows = []
    for label in rules:
        _, rule = _rule(label)
        pooled: dict[tuple[str, str], list[np.ndarray]] = {}
        points: dict[tuple[str, str], list[float]] = {}
        eds: dict[tuple[str, str], list[float | None]] = {}
        for task in tasks:
            (rs, fs), (rb, fb) = _frames(study, small, task, label), _frames(study, big, task, label)
            if fs is None or fb is None:
                continue
            why = _excluded(summary, [(small, task), (big, task)], label)
            shared = min(fs["example"].n_unique(), fb["example"].n_unique())
            layers = (int(rb.result.summary["n_layers"]), int(rs.result.summary["n_layers"]))
            for measure in ("ed", "ratio"):
                checks = _checks(rule, fb, fs, layers, rb.settings, True, measure == "ratio", seed, None, n_bootstrap)
                for what, primary, ed, draws in checks:
                    rows.append(
                        {
                            "variant": what,
                            "rule": label,
                            "task": task,
                            "measure": measure,
                            **primary,
                            **ed,
                            "n": shared,
                            "excluded": why,
                        }
                    )
                    if why is None and primary["point"] is not None:
                        pooled.setdefault((measure, what), []).append(draws)
                        points.setdefault((measure, what), []).append(primary["point"])
                        eds.setdefault((measure, what), []).append(ed["ed_point"])
        for (measure, what), values in points.items():
            rows.append(
                {
                    "variant": what,
                    "rule": label,
                    "task": "all",
                    "measure": measure,
                    **interval(float(np.mean(values)), np.mean(pooled[(measure, what)], axis=0)),
                    "ed_point": _mean_or_none(eds[(measure, what)]),
                    "ed_low": None,
                    "ed_high": None,
                    "n": None,
                    "excluded": None,
                }
            )
    frame = (
        pl.DataFrame(rows, schema={**_SCHEMA, "defined": pl.Float64})
        if rows
        else pl.DataFrame(schema={**_SCHEMA, "defined": pl.Float64})
    )
    return frame.with_columns(pl.lit(small).alias("small"), pl.lit(big).alias("big"))


def _mean_or_none(values: Sequence[float | None]) -> float | None:
    return None if any(v is None for v in values) else float(np.mean(values))


def across_models(summary: pl.DataFrame, rules: Sequence[str] = tuple(RULE_LABELS.values())) -> pl.DataFrame:
    """Per rule and yardstick of size (``against``: ``parameters`` or ``layers``, L), over the models:
    the Spearman correlation of size with the mean depth (the primary statistic) over the tasks
    (degenerate cells and cells whose interval does not count left out), its permutation p-value and
    the smallest p the number of models allows, and the spread of the mean ratios."""
    rows = []
    counts = pl.col("interval_counts") if "interval_counts" in summary.columns else pl.lit(True)
    # the primary statistic where the summary has it (a legacy summary: the integer ED)
    value, ratio, flag = (
        ("depth", "depth_ratio", "depth_degenerate") if "depth" in summary.columns else ("ed", "ratio", "degenerate")
    )
    for label in rules:
        cells = summary.filter(pl.col("rule") == label, pl.col(value).is_not_null(), pl.col(flag).is_null(), counts)
        means = (
            cells.group_by("model", "n_params", "n_layers")
            .agg(pl.col(value).mean().alias("ed"), pl.col(ratio).mean().alias("ratio"))
            .sort("n_params", "model")
        )
        for against, column in (("parameters", "n_params"), ("layers", "n_layers")):
            test = spearman_test(means[column].to_list(), means["ed"].to_list())
            rows.append(
                {
                    "rule": label,
                    "against": against,
                    "n_models": means.height,
                    "rho": test["rho"],
                    "p": test["p"],
                    "min_p": test["min_p"],
                    "ratio_min": means["ratio"].min() if means.height else None,
                    "ratio_max": means["ratio"].max() if means.height else None,
                }
            )
    schema = {
        "rule": pl.String,
        "against": pl.String,
        "n_models": pl.Int64,
        "rho": pl.Float64,
        "p": pl.Float64,
        "min_p": pl.Float64,
        "ratio_min": pl.Float64,
        "ratio_max": pl.Float64,
    }
    return pl.DataFrame(rows, schema=schema)


def between_tasks(
    study: Study,
    model: str,
    order: Sequence[str],
    rules: Sequence[str] = tuple(RULE_LABELS.values()),
    n_bootstrap: int = N_BOOTSTRAP,
    seed: int = 0,
) -> pl.DataFrame:
    """Per rule: ratio(next task) − ratio(task) for each successive pair of ``order`` present
    (different prompts: an unpaired bootstrap), rows ``variant, rule, first, second, point, low,
    high, excluded``."""
    summary = study.summary()
    rows = []
    for label in rules:
        _, rule = _rule(label)
        present = [t for t in order if _frames(study, model, t, label)[1] is not None]
        for first, second in itertools.pairwise(present):
            (ra, fa), (rb, fb) = _frames(study, model, first, label), _frames(study, model, second, label)
            layers = (int(rb.result.summary["n_layers"]), int(ra.result.summary["n_layers"]))
            why = _excluded(summary, [(model, first), (model, second)], label)
            for what, primary, ed, _ in _checks(
                rule, fb, fa, layers, rb.settings, False, True, seed, None, n_bootstrap
            ):
                rows.append(
                    {
                        "variant": what,
                        "rule": label,
                        "first": first,
                        "second": second,
                        **primary,
                        **ed,
                        "n_first": int(ra.result.summary["n_examples"]),
                        "n_second": int(rb.result.summary["n_examples"]),
                        "n_layers": max(layers),
                        "excluded": why,
                    }
                )
    schema = {
        "variant": pl.String,
        "rule": pl.String,
        "first": pl.String,
        "second": pl.String,
        "point": pl.Float64,
        "low": pl.Float64,
        "high": pl.Float64,
        "defined": pl.Float64,
        "ed_point": pl.Float64,
        "ed_low": pl.Float64,
        "ed_high": pl.Float64,
        "n_first": pl.Int64,
        "n_second": pl.Int64,
        "n_layers": pl.Int64,
        "excluded": pl.String,
    }
    return pl.DataFrame(rows, schema=schema).with_columns(pl.lit(model).alias("model"))


def length_control(
    study: Study,
    model: str,
    first: str,
    second: str,
    rules: Sequence[str] = tuple(RULE_LABELS.values()),
    n_bootstrap: int = N_BOOTSTRAP,
    seed: int = 0,
) -> pl.DataFrame:
    """The prompt-length control of a step between two data sets: per rule, the mean per-prompt
    primary statistic's ratio, ``second`` − ``first`` (``raw``), and the same difference less what
    prompt length predicts (``adjusted``): the within-task slope of the per-prompt ratio on
    log(tokens), pooled over both tasks, times the difference of their mean log lengths. Where the
    two tasks' lengths do not overlap (HellaSwag ≤ 120 tokens, GSM8K ≥ 137 here), no matched pair
    exists and this slope is the control. 95 % intervals resample prompts within each task; rows
    ``rule, raw, raw_low, raw_high, adjusted, adjusted_low, adjusted_high, slope, n_first, n_second,
    tokens_first, tokens_second``."""
    rows = []
    for label in rules:
        _, rule = _rule(label)
        (ra, fa), (rb, fb) = _frames(study, model, first, label), _frames(study, model, second, label)
        if fa is None or fb is None:
            continue
        statistic = primary_statistic(rule) or "ed"
        sides = []
        for record, frame in ((ra, fa), (rb, fb)):
            n_layers = int(record.result.summary["n_layers"])
            values, tokens = per_prompt(rule, frame, n_layers, record.settings, statistic)
            kept = np.isfinite(values)
            sides.append(((values[kept] + 1) / n_layers, np.log(tokens[kept]), tokens[kept]))
        (ya, xa, ta), (yb, xb, tb) = sides
        if ya.size < 2 or yb.size < 2:
            continue
        wa = resample_weights(ya.size, n_bootstrap, seed).astype(float)  # [boot, prompt]
        wb = resample_weights(yb.size, n_bootstrap, seed + 1).astype(float)
        raw, adjusted, slope = _length_effects(ya, xa, yb, xb, np.ones((1, ya.size)), np.ones((1, yb.size)))
        raws, adjusteds, _ = _length_effects(ya, xa, yb, xb, wa, wb)
        rows.append(
            {
                "rule": label,
                "raw": float(raw[0]),
                "raw_low": float(np.percentile(raws, 2.5)),
                "raw_high": float(np.percentile(raws, 97.5)),
                "adjusted": float(adjusted[0]),
                "adjusted_low": float(np.nanpercentile(adjusteds, 2.5)),
                "adjusted_high": float(np.nanpercentile(adjusteds, 97.5)),
                "slope": float(slope[0]),
                "n_first": int(ya.size),
                "n_second": int(yb.size),
                "tokens_first": f"{int(ta.min())}–{int(ta.max())}",
                "tokens_second": f"{int(tb.min())}–{int(tb.max())}",
            }
        )
    schema = {"rule": pl.String, "raw": pl.Float64, "raw_low": pl.Float64, "raw_high": pl.Float64,
              "adjusted": pl.Float64, "adjusted_low": pl.Float64, "adjusted_high": pl.Float64,
              "slope": pl.Float64, "n_first": pl.Int64, "n_second": pl.Int64, "tokens_first": pl.String,
              "tokens_second": pl.String}  # fmt: skip
    return pl.DataFrame(rows, schema=schema).with_columns(
        pl.lit(model).alias("model"), pl.lit(first).alias("first"), pl.lit(second).alias("second")
    )


def _length_effects(
    ya: np.ndarray, xa: np.ndarray, yb: np.ndarray, xb: np.ndarray, wa: np.ndarray, wb: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per weighting (rows of ``wa`` ``[boot, prompt]``, ``wb``): the raw difference of weighted
    means ``ȳb − ȳa``, that difference less ``slope · (x̄b − x̄a)``, and the pooled within-task slope."""

    def moments(w: np.ndarray, x: np.ndarray, y: np.ndarray):
        total = w.sum(axis=1)
        mx, my = w @ x / total, w @ y / total
        return mx, my, w @ (x * y) - total * mx * my, w @ (x * x) - total * mx * mx

    ax, ay, a_xy, a_xx = moments(wa, xa, ya)
    bx, by, b_xy, b_xx = moments(wb, xb, yb)
    spread = a_xx + b_xx
    slope = np.divide(a_xy + b_xy, spread, out=np.full_like(spread, np.nan), where=spread > 0)
    raw = by - ay
    return raw, raw - slope * (bx - ax), slope


def level_trend(summary: pl.DataFrame, model: str, order: Sequence[str], rules: Sequence[str]) -> pl.DataFrame:
    """Per rule: Spearman of level rank (position in ``order``) with the primary depth statistic (a
    legacy summary: the ED) over the levels where it is defined and not degenerate, its permutation
    p-value and the smallest p the levels allow."""
    rows = []
    value, flag = ("depth", "depth_degenerate") if "depth" in summary.columns else ("ed", "degenerate")
    for label in rules:
        cells = summary.filter(model=model, rule=label).filter(
            pl.col("task").is_in(list(order)), pl.col(value).is_not_null(), pl.col(flag).is_null()
        )
        rank = {t: i for i, t in enumerate(order)}
        ranked = sorted(cells.iter_rows(named=True), key=lambda r: rank[r["task"]])
        test = spearman_test([rank[r["task"]] for r in ranked], [r[value] for r in ranked])
        left_out = [t for t in order if t not in {r["task"] for r in ranked}]
        rows.append(
            {
                "rule": label,
                "levels": len(ranked),
                "rho": test["rho"],
                "p": test["p"],
                "min_p": test["min_p"],
                "left_out": ", ".join(left_out) or None,
                # the same ED at every level (at least 3): nothing to rank, and the plainest "no trend"
                "same_ed": ranked[0][value] if len(ranked) >= 3 and len({r[value] for r in ranked}) == 1 else None,
            }
        )
    schema = {
        "rule": pl.String,
        "levels": pl.Int64,
        "rho": pl.Float64,
        "p": pl.Float64,
        "min_p": pl.Float64,
        "left_out": pl.String,
        "same_ed": pl.Float64,
    }
    return pl.DataFrame(rows, schema=schema).with_columns(pl.lit(model).alias("model"))


LENS_PAIRS = {"KL": ("lens KL", "tuned KL"), "overlap": ("lens overlap", "tuned overlap")}


def between_lenses(study: Study, n_bootstrap: int = N_BOOTSTRAP, seed: int = 0) -> pl.DataFrame:
    """Per model, task and lens rule: ED(tuned lens) − ED(logit lens) on the same prompts of one run
    (paired), with ``excluded`` saying why a comparison cannot decide (either ED degenerate, n < 20)."""
    summary = study.summary()
    rows = []
    for r in study.finished:
        if not {"tuned_lens", "logit_lens"} <= set(r.probes):  # the runs that compare the lenses (not
            continue  # another run of the page whose directory also holds both, from earlier parameters)
        n_layers = int(r.result.summary["n_layers"])
        for name, (logit_label, tuned_label) in LENS_PAIRS.items():
            _, logit_rule = _rule(logit_label)
            _, tuned_rule = _rule(tuned_label)
            frames = (r.result.per_example["tuned_lens"], r.result.per_example["logit_lens"])
            checks = _checks(
                tuned_rule, *frames, (n_layers, n_layers), r.settings, True, False, seed, logit_rule, n_bootstrap
            )
            why = _excluded(summary, [(r.model, r.label)], logit_label) or _excluded(
                summary, [(r.model, r.label)], tuned_label
            )
            for what, primary, ed, _ in checks:
                rows.append(
                    {
                        "variant": what,
                        "model": r.model,
                        "task": r.label,
                        "lens_rule": name,
                        **primary,
                        **ed,
                        "n": int(r.result.summary["n_examples"]),
                        "excluded": why,
                    }
                )
    schema = {
        "variant": pl.String,
        "model": pl.String,
        "task": pl.String,
        "lens_rule": pl.String,
        "point": pl.Float64,
        "low": pl.Float64,
        "high": pl.Float64,
        "defined": pl.Float64,
        "ed_point": pl.Float64,
        "ed_low": pl.Float64,
        "ed_high": pl.Float64,
        "n": pl.Int64,
        "excluded": pl.String,
    }
    return pl.DataFrame(rows, schema=schema)


def depth_score_intervals(study: Study, n_bootstrap: int = N_BOOTSTRAP, seed: int = 0) -> pl.DataFrame:
    """Per model and level, the mean per-prompt depth score as a share of the depth, with its 95 %
    bootstrap interval over the prompts: ``model, task, value, low, high, n``."""
    rows = []
    for r in study.finished:
        if "depth_score" not in r.result.curves or not r.asked("depth_score"):
            continue
        n_layers = int(r.result.summary["n_layers"])
        per_prompt = (
            r.result.curves["depth_score"]
            .filter(pl.col("example").is_not_null(), pl.col("metric") == "depth_score")
            .sort("example")["value"]
            .to_numpy()
            / n_layers
        )
        if not per_prompt.size:
            continue
        weights = resample_weights(per_prompt.size, n_bootstrap, seed)  # [boot, prompt]
        means = weights @ per_prompt / weights.sum(axis=1)
        rows.append(
            {
                "model": r.model,
                "task": r.label,
                "value": float(per_prompt.mean()),
                "low": float(np.percentile(means, 2.5)),
                "high": float(np.percentile(means, 97.5)),
                "n": int(per_prompt.size),
            }
        )
    schema = {"model": pl.String, "task": pl.String, "value": pl.Float64, "low": pl.Float64, "high": pl.Float64,
              "n": pl.Int64}  # fmt: skip
    return pl.DataFrame(rows, schema=schema)


QUANTIZATION_FILE = "quantization_control.json"  # benchmarks/quantization_control.py --save writes it


def quantization_control(results_dir: Path, models: Sequence[str]) -> pl.DataFrame:
    """The quantization control's rows for ``models`` (``benchmarks/quantization_control.py --save``,
    kept in the book's results folder): per model, task and rule, the primary statistic before and
    after one more requantization, the paired shift and its 95 % interval (layers). Empty when it
    was not run for them."""
    from effdepth_core.cache import read_json

    schema = {"model": pl.String, "task": pl.String, "rule": pl.String, "quant": pl.String, "n": pl.Int64,
              "before": pl.Float64, "after": pl.Float64, "shift": pl.Float64, "low": pl.Float64,
              "high": pl.Float64, "ed_shift": pl.Float64}  # fmt: skip
    path = Path(results_dir) / QUANTIZATION_FILE
    if not path.is_file() or path.is_symlink():
        return pl.DataFrame(schema=schema)
    saved = read_json(path)
    found = saved.get("rows") if isinstance(saved, dict) else None
    rows = [{k: r.get(k) for k in schema} for r in found or [] if isinstance(r, dict) and r.get("model") in models]
    return pl.DataFrame(rows, schema=schema)
