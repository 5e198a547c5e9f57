"""The comparisons the findings rest on, computed from a study's per-example frames with the
statistics of ``stats.py`` — each a frame of numbers with intervals, so the findings are text made
from them and can be tested on frames made by hand:

- ``within_family``: for two sizes of one family on the same prompts, the paired bootstrap of the ED
  and ratio differences per rule and task, and pooled over the tasks;
- ``across_models``: per rule, the rank correlation of model size and ED over the models (with its
  permutation test) and the spread of their ratios;
- ``between_tasks``: per model and rule, the difference of the ED ratio between successive tasks
  (independent prompts: an unpaired bootstrap), and the rank correlation over ordered levels;
- ``between_lenses``: per model, task and rule, the paired difference tuned − logit lens.

Degenerate EDs (``stats.degenerate``) and intervals from fewer than ``MIN_INTERVAL_N`` prompts never
decide a comparison: their rows say so (``excluded``). Each comparison comes as several rows, one per
check of the robustness rule (``variant``: "" for the book's own threshold and bootstrap seed, then
each other threshold of the rule's range and each other seed, ``stats.variants``); the findings show
the first and decide on all of them.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

import numpy as np
import polars as pl

from .. import registry
from ..depth import resample_weights
from ..probes.pruning import FINAL_KEPT
from .reference import RULE_LABELS
from .stats import N_BOOTSTRAP, difference_draws, interval, spearman_test, variants
from .study import MIN_INTERVAL_N, RunRecord, Study, pruning_comparison

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
    for model, task in cells:
        row = summary.filter(model=model, task=task, rule=label)
        if not row.height or row["ed"][0] is None:
            return f"{model} {task}: no ED"
        if row["degenerate"][0] is not None:
            return f"{model} {task}: degenerate ({row['degenerate'][0]})"
        if not row["interval_counts"][0]:
            return f"{model} {task}: n = {row['n_examples'][0]} < {MIN_INTERVAL_N}, no interval that counts"
    return None


def _checks(
    rule, first, second, layers, settings, paired, ratio=False, seed=0, other_rule=None, n_bootstrap=N_BOOTSTRAP
):
    """``(variant, point, draws)`` of one difference under every check of the robustness rule."""
    out = []
    for what, changed, s in variants(rule, settings, seed):
        point, draws = difference_draws(
            rule, first, second, layers, changed, paired, ratio, n_bootstrap, s, other_rule=other_rule
        )
        out.append((what, point, draws))
    return out


_SCHEMA = {
    "variant": pl.String,
    "rule": pl.String,
    "task": pl.String,
    "measure": pl.String,  # ed or ratio
    "point": pl.Float64,
    "low": pl.Float64,
    "high": pl.Float64,
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
        for task in tasks:
            (rs, fs), (rb, fb) = _frames(study, small, task, label), _frames(study, big, task, label)
            if fs is None or fb is None:
                continue
            why = _excluded(summary, [(small, task), (big, task)], label)
            shared = min(fs["example"].n_unique(), fb["example"].n_unique())
            layers = (int(rb.result.summary["n_layers"]), int(rs.result.summary["n_layers"]))
            for measure in ("ed", "ratio"):
                checks = _checks(rule, fb, fs, layers, rb.settings, True, measure == "ratio", seed, None, n_bootstrap)
                for what, point, draws in checks:
                    rows.append(
                        {
                            "variant": what,
                            "rule": label,
                            "task": task,
                            "measure": measure,
                            **interval(point, draws),
                            "n": shared,
                            "excluded": why,
                        }
                    )
                    if why is None and point is not None:
                        pooled.setdefault((measure, what), []).append(draws)
                        points.setdefault((measure, what), []).append(point)
        for (measure, what), values in points.items():
            rows.append(
                {
                    "variant": what,
                    "rule": label,
                    "task": "all",
                    "measure": measure,
                    **interval(float(np.mean(values)), np.mean(pooled[(measure, what)], axis=0)),
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


def across_models(summary: pl.DataFrame, rules: Sequence[str] = tuple(RULE_LABELS.values())) -> pl.DataFrame:
    """Per rule and yardstick of size (``against``: ``parameters`` or ``layers``, L), over the models:
    the Spearman correlation of size with the mean ED over the tasks (degenerate cells and cells whose
    interval does not count left out), its permutation p-value and the smallest p the number of
    models allows, and the spread of the mean ratios."""
    rows = []
    counts = pl.col("interval_counts") if "interval_counts" in summary.columns else pl.lit(True)
    for label in rules:
        cells = summary.filter(
            pl.col("rule") == label, pl.col("ed").is_not_null(), pl.col("degenerate").is_null(), counts
        )
        means = (
            cells.group_by("model", "n_params", "n_layers")
            .agg(pl.col("ed").mean(), pl.col("ratio").mean())
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
            for what, point, draws in _checks(rule, fb, fa, layers, rb.settings, False, True, seed, None, n_bootstrap):
                rows.append(
                    {
                        "variant": what,
                        "rule": label,
                        "first": first,
                        "second": second,
                        **interval(point, draws),
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
        "excluded": pl.String,
    }
    return pl.DataFrame(rows, schema=schema).with_columns(pl.lit(model).alias("model"))


def level_trend(summary: pl.DataFrame, model: str, order: Sequence[str], rules: Sequence[str]) -> pl.DataFrame:
    """Per rule: Spearman of level rank (position in ``order``) with ED over the levels whose ED is
    defined and not degenerate, its permutation p-value and the smallest p the levels allow."""
    rows = []
    for label in rules:
        cells = summary.filter(model=model, rule=label).filter(
            pl.col("task").is_in(list(order)), pl.col("ed").is_not_null(), pl.col("degenerate").is_null()
        )
        rank = {t: i for i, t in enumerate(order)}
        ranked = sorted(cells.iter_rows(named=True), key=lambda r: rank[r["task"]])
        test = spearman_test([rank[r["task"]] for r in ranked], [r["ed"] for r in ranked])
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
                "same_ed": ranked[0]["ed"] if len(ranked) >= 3 and len({r["ed"] for r in ranked}) == 1 else None,
            }
        )
    schema = {
        "rule": pl.String,
        "levels": pl.Int64,
        "rho": pl.Float64,
        "p": pl.Float64,
        "min_p": pl.Float64,
        "left_out": pl.String,
        "same_ed": pl.Int64,
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
            for what, point, draws in checks:
                rows.append(
                    {
                        "variant": what,
                        "model": r.model,
                        "task": r.label,
                        "lens_rule": name,
                        **interval(point, draws),
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
        "n": pl.Int64,
        "excluded": pl.String,
    }
    return pl.DataFrame(rows, schema=schema)


# a small layer's best big layer is *on the diagonal* when it lies within STRETCH_SLACK of L_big (at
# least one layer) of equal relative depth; the map *beats* the baseline at a layer when its error
# there is below BASELINE_MARGIN of the shuffled-pairing map's
STRETCH_SLACK = 0.1
BASELINE_MARGIN = 0.9


def map_statistic(mapped: pl.DataFrame, n_bootstrap: int = 1000, seed: int = 0) -> dict | None:
    """The map's verdict statistic — the share of the small model's inner layers (1..L_small-1)
    whose best big layer lies on the diagonal — with its 95 % bootstrap interval over test prompts,
    and what qualifies it: the share of inner layers where the map beats the shuffled baseline, the
    errors at the best layers (map and baseline), the self-map's largest diagonal error, the counts;
    the share a best layer drawn uniformly would reach (``chance``); and the same share with each big
    layer's mean error over the small layers removed (``centred_*``: a big layer that is easy to
    predict from any small layer — a column bias — must not make the diagonal by itself)."""
    needed = {"relative_error", "baseline_error", "self_error"}
    if "prompt" not in mapped.columns or not needed <= set(mapped["metric"].unique().to_list()):
        return None
    overall = mapped.filter(pl.col("prompt").is_null())
    errors = overall.filter(metric="relative_error")
    n_small, n_big = int(errors["small_layer"].max()), int(errors["big_layer"].max())
    slack = max(1.0, STRETCH_SLACK * n_big)
    inner = np.arange(1, n_small)
    equal = inner * n_big / n_small

    def matrix(frame: pl.DataFrame) -> np.ndarray:
        return frame.sort("small_layer", "big_layer")["value"].to_numpy().reshape(n_small + 1, n_big + 1)

    table = matrix(errors)
    best = table[inner].argmin(axis=1)
    per_prompt = mapped.filter(pl.col("prompt").is_not_null(), metric="relative_error").sort(
        "prompt", "small_layer", "big_layer"
    )
    n_prompts = per_prompt["prompt"].n_unique()
    cube = per_prompt["value"].to_numpy().reshape(n_prompts, n_small + 1, n_big + 1)
    weights = resample_weights(n_prompts, n_bootstrap, seed)  # [boot, prompt]

    def on_diagonal(matrix_: np.ndarray) -> float:  # [small layer, big layer] errors
        return float(np.mean(np.abs(matrix_[inner].argmin(axis=1) - equal) <= slack))

    def centred(matrix_: np.ndarray) -> np.ndarray:
        return matrix_ - matrix_.mean(axis=0, keepdims=True)

    shares, centred_shares = [], []
    for w in weights:
        resampled = np.tensordot(w, cube, axes=1) / w.sum()
        shares.append(on_diagonal(resampled))
        centred_shares.append(on_diagonal(centred(resampled)))
    layers = np.arange(n_big + 1)
    chance = float(np.mean([np.mean(np.abs(layers - e) <= slack) for e in equal]))
    column = table.mean(axis=0)  # [big layer]: mean error over the small layers
    baseline = matrix(overall.filter(metric="baseline_error"))
    at_best = table[inner, best]
    blind = baseline[inner, best]
    own = overall.filter(metric="self_error").sort("small_layer", "big_layer")["value"].to_numpy()
    own = own.reshape(n_small + 1, n_small + 1)

    def count(metric: str) -> float:
        values = mapped.filter(metric=metric)["value"]
        return float(values[0]) if values.len() else float("nan")

    return {
        "share": on_diagonal(table),
        "low": float(np.percentile(shares, 2.5)),
        "high": float(np.percentile(shares, 97.5)),
        "chance": chance,
        "centred_share": on_diagonal(centred(table)),
        "centred_low": float(np.percentile(centred_shares, 2.5)),
        "centred_high": float(np.percentile(centred_shares, 97.5)),
        "easiest_big_layer": int(column.argmin()),
        "column_low": float(column.min()),
        "column_high": float(column.max()),
        "inner": int(inner.size),
        "slack": slack,
        "beats_baseline": float(np.mean(at_best < BASELINE_MARGIN * blind)),
        "best_low": float(at_best.min()),
        "best_high": float(at_best.max()),
        "baseline_low": float(blind.min()),
        "baseline_high": float(blind.max()),
        # beyond layer 0: the token embeddings of test tokens the training prompts never held are
        # outside the span the map was fitted on, so even the identity is not recovered there
        "self_max": float(np.abs(np.diagonal(own)[1:]).max()) if own.shape[0] > 1 else float(own[0, 0]),
        "self_layer0": float(own[0, 0]),
        "train_tokens": count("n_train_tokens"),
        "width": count("small_width"),
        "test_prompts": float(n_prompts),
    }


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


# a pruning cell's ΔNLL intervals need prompts to resample: fewer are shown, not counted
MIN_PRUNE_N = 10
PRUNE_ALTERNATIVES = ("angular distance", "block influence")


def _prune_class(low: float, high: float) -> str:
    return "cheaper" if high < 0 else "costlier" if low > 0 else "unclear"


def pruning_costs(
    study: Study, rule: str = "lens overlap", n_bootstrap: int = N_BOOTSTRAP, seed: int = 0
) -> pl.DataFrame:
    """Per pruning run and budget k, the answer-NLL increase of cutting the block after ED (of
    ``rule``; ``variant`` "" the plain block, "final layer kept" the one ending at L-2) against the
    best alternative (the lesser of angular distance's and block influence's, per resample): the
    ``difference`` in nats and the ``ratio``, each with a 95 % bootstrap interval over the prompts
    (answer-token weighted, as the curves), ``ratio_low``/``ratio_high`` null when a resample's
    best alternative costs nothing; ``verdict`` cheaper/costlier/unclear from the difference's
    interval, "unclear" unless the next two seeds agree; ``same_layers`` when the block is the
    alternative's; ``holds_final`` when it removes the final layer; ``counted`` when the run has at
    least ``MIN_PRUNE_N`` prompts."""
    comparison = pruning_comparison(study)
    rows = []
    for r in study.finished:
        if not r.asked("prune") or not comparison.height:
            continue
        per = r.result.per_example["prune"].filter(metric="answer_nll")
        clean = per.filter(rule="none").sort("example")
        tokens = clean["n_tokens"].to_numpy().astype(float)  # [example] answer tokens
        base = clean["value"].to_numpy()
        n = tokens.size
        draws = {s: resample_weights(n, n_bootstrap, s) * tokens for s in (seed, seed + 1, seed + 2)}  # [boot, ex]

        def deltas(removed: str, per: pl.DataFrame = per, base: np.ndarray = base) -> np.ndarray:  # [example]
            picked = per.filter(pl.col("removed") == removed, pl.col("rule") != "none")
            return picked.unique("example", keep="first").sort("example")["value"].to_numpy() - base

        mine = comparison.filter(model=r.model, task=r.label)
        for k in sorted(mine["k"].unique().to_list()):
            budget = mine.filter(k=k)
            others = budget.filter(pl.col("choice").is_in(PRUNE_ALTERNATIVES))
            if not others.height:
                continue
            alt = np.stack([deltas(x) for x in others["removed"]])  # [alternative, example]
            for variant in ("", FINAL_KEPT):
                choice = f"after ED ({rule})" + (f", {variant}" if variant else "")
                row = budget.filter(choice=choice)
                if not row.height:
                    continue
                removed = row["removed"][0]
                d = deltas(removed)
                point_alt = alt @ tokens / tokens.sum()
                best = float(point_alt.min())
                point = float(d @ tokens / tokens.sum())
                classes, stats_ = [], {}
                for s, w in draws.items():
                    mine_draws = w @ d / w.sum(axis=1)
                    best_draws = (w @ alt.T / w.sum(axis=1, keepdims=True)).min(axis=1)
                    diff = interval(point - best, mine_draws - best_draws)
                    classes.append(_prune_class(diff["low"], diff["high"]))
                    if s == seed:
                        ratio = mine_draws / best_draws if (best_draws > 0).all() else None
                        stats_ = {
                            "difference": point - best,
                            "low": diff["low"],
                            "high": diff["high"],
                            "ratio": point / best if best > 0 else None,
                            "ratio_low": None if ratio is None else float(np.percentile(ratio, 2.5)),
                            "ratio_high": None if ratio is None else float(np.percentile(ratio, 97.5)),
                        }
                same = removed in others["removed"].to_list()
                rows.append(
                    {
                        "model": r.model,
                        "task": r.label,
                        "k": int(k),
                        "variant": variant,
                        "removed": removed,
                        "delta_nll": point,
                        "best_alternative": others["choice"][int(point_alt.argmin())],
                        "best_delta_nll": best,
                        **stats_,
                        "verdict": "tie" if same else classes[0] if len(set(classes)) == 1 else "unclear",
                        "seed_stable": len(set(classes)) == 1,
                        "same_layers": same,
                        "holds_final": str(int(r.result.summary["n_layers"]) - 1) in removed.split(","),
                        "n": n,
                        "counted": n >= MIN_PRUNE_N,
                    }
                )
    schema = {
        "model": pl.String, "task": pl.String, "k": pl.Int64, "variant": pl.String, "removed": pl.String,
        "delta_nll": pl.Float64, "best_alternative": pl.String, "best_delta_nll": pl.Float64,
        "difference": pl.Float64, "low": pl.Float64, "high": pl.Float64, "ratio": pl.Float64,
        "ratio_low": pl.Float64, "ratio_high": pl.Float64, "verdict": pl.String, "seed_stable": pl.Boolean,
        "same_layers": pl.Boolean, "holds_final": pl.Boolean, "n": pl.Int64, "counted": pl.Boolean,
    }  # fmt: skip
    return pl.DataFrame(rows, schema=schema)


def early_exit_costs(
    study: Study, summary: pl.DataFrame, rule: str = "lens overlap", n_bootstrap: int = N_BOOTSTRAP, seed: int = 0
) -> pl.DataFrame:
    """Per early-exit run and lens, exiting right after the ED of ``rule`` (the ED the book counts
    for that model and task, from ``summary``): the share of layers ``saved``, the share of tokens
    whose top-1 stays the final one (``kept``), and the answer-NLL increase over the full model
    (``cost``), each mean with a 95 % bootstrap interval over prompts (token-weighted as the
    curves); ``positive`` when the cost's interval lies above zero under this seed and the next two;
    ``counted`` with at least ``MIN_PRUNE_N`` prompts."""
    rows = []
    for r in study.finished:
        if not r.asked("early_exit"):
            continue
        ed = summary.filter(model=r.model, task=r.label, rule=rule)
        if not ed.height or ed["ed"][0] is None:
            continue
        exit_at, n_layers = int(ed["ed"][0]) + 1, int(r.result.summary["n_layers"])
        frame = r.result.per_example["early_exit"]
        lenses = frame["lens"].unique(maintain_order=True).to_list() if "lens" in frame.columns else [None]
        for lens in lenses:
            rows_ = frame if lens is None else frame.filter(lens=lens)

            def column(layer: int, metric: str, rows_: pl.DataFrame = rows_) -> tuple[np.ndarray, np.ndarray]:
                picked = rows_.filter(layer=layer, metric=metric).sort("example")
                return picked["value"].to_numpy(), picked["n_tokens"].to_numpy().astype(float)

            nll_exit, answer_tokens = column(exit_at, "answer_nll")
            nll_full, _ = column(n_layers, "answer_nll")
            agree, all_tokens = column(exit_at, "agreement")
            if not nll_exit.size:
                continue
            cost, n = nll_exit - nll_full, nll_exit.size
            positive = []
            for s in (seed, seed + 1, seed + 2):
                w = resample_weights(n, n_bootstrap, s)  # [boot, prompt]
                cost_draws = (w * answer_tokens) @ cost / ((w * answer_tokens).sum(axis=1))
                kept_draws = (w * all_tokens) @ agree / ((w * all_tokens).sum(axis=1))
                cost_i = interval(float(cost @ answer_tokens / answer_tokens.sum()), cost_draws)
                positive.append(cost_i["low"] > 0)
                if s == seed:
                    kept_i = interval(float(agree @ all_tokens / all_tokens.sum()), kept_draws)
                    found = (cost_i, kept_i)
            cost_i, kept_i = found
            rows.append(
                {
                    "model": r.model,
                    "task": r.label,
                    "lens": lens or "logit",
                    "exit_layer": exit_at,
                    "n_layers": n_layers,
                    "saved": 1 - exit_at / n_layers,
                    "kept": kept_i["point"],
                    "kept_low": kept_i["low"],
                    "kept_high": kept_i["high"],
                    "cost": cost_i["point"],
                    "cost_low": cost_i["low"],
                    "cost_high": cost_i["high"],
                    "positive": all(positive),
                    "n": n,
                    "counted": n >= MIN_PRUNE_N,
                }
            )
    schema = {
        "model": pl.String, "task": pl.String, "lens": pl.String, "exit_layer": pl.Int64, "n_layers": pl.Int64,
        "saved": pl.Float64, "kept": pl.Float64, "kept_low": pl.Float64, "kept_high": pl.Float64,
        "cost": pl.Float64, "cost_low": pl.Float64, "cost_high": pl.Float64, "positive": pl.Boolean,
        "n": pl.Int64, "counted": pl.Boolean,
    }  # fmt: skip
    return pl.DataFrame(rows, schema=schema)
