"""Evidence beyond the paper, with intervals over prompts: the cross-model map's statistic (its
chance level and column-bias check), what cutting the layers after ED costs against the best other
choice per budget, and what exiting right after ED costs."""

from __future__ import annotations

import numpy as np
import polars as pl

from effdepth_core.measurement.depth import N_BOOTSTRAP, N_BOOTSTRAP_RUN, interval, resample_weights
from effdepth_core.measurement.probes.prune import FINAL_KEPT, after_ed_block

from ...study import Study, pruning_comparison

# a small layer's best big layer is *on the diagonal* when it lies within STRETCH_SLACK of L_big (at
# least one layer) of equal relative depth; the map *beats* the baseline at a layer when its error
# there is below BASELINE_MARGIN of the shuffled-pairing map's
STRETCH_SLACK = 0.1
BASELINE_MARGIN = 0.9


def map_statistic(mapped: pl.DataFrame, n_bootstrap: int = N_BOOTSTRAP_RUN, seed: int = 0) -> dict | None:
    """The map's statistics — the share of the small model's inner layers (1..L_small-1) whose best
    big layer lies on the diagonal, on the mean over test prompts of the per-prompt errors (point and
    95 % bootstrap interval from the same statistic) — and what qualifies it:
    the share of inner layers where the map beats the shuffled baseline, the
    errors at the best layers (map and baseline), the self-map's largest diagonal error, the counts;
    the share a best layer drawn uniformly would reach (``chance``); and the same share with each big
    layer's mean error over the small layers removed (``centred_*``, the verdict's statistic: a big
    layer that is easy to predict from any small layer — a column bias — must not make the diagonal
    by itself)."""
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

    prompt_mean = cube.mean(axis=0)  # the statistic the resamples draw: the mean over prompts, point and interval alike
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
        "share": on_diagonal(prompt_mean),
        "low": float(np.percentile(shares, 2.5)),
        "high": float(np.percentile(shares, 97.5)),
        "chance": chance,
        "centred_share": on_diagonal(centred(prompt_mean)),
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
    alternative's; ``holds_final`` when it removes the final layer; ``percentile``, the share of the
    run's ``blocks`` contiguous blocks of k layers that cost less (0: the cheapest of them); ``counted``
    when the run has at least ``MIN_PRUNE_N`` prompts."""
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
        n_layers = int(r.result.summary["n_layers"])
        other_eds = _threshold_eds(study, r.model, r.label, rule)
        for k in sorted(mine["k"].unique().to_list()):
            budget = mine.filter(k=k)
            others = budget.filter(pl.col("choice").is_in(PRUNE_ALTERNATIVES))
            if not others.height:
                continue
            alt = np.stack([deltas(x) for x in others["removed"]])  # [alternative, example]
            # every contiguous block of k layers the run cut, with its mean ΔNLL: the after-ED block's rank
            blocks = r.result.curves["prune"].filter(rule="block", k=k, metric="delta_nll").select("removed", "value")
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
                classes, stats_, why = [], {}, None
                for s, w in draws.items():
                    mine_draws = w @ d / w.sum(axis=1)
                    best_draws = (w @ alt.T / w.sum(axis=1, keepdims=True)).min(axis=1)
                    diff = interval(point - best, mine_draws - best_draws)
                    classes.append(_prune_class(diff["low"], diff["high"]))
                    if why is None and classes[-1] != classes[0]:
                        why = f"under bootstrap seed {s}"
                    if s == seed:
                        best_at_seed = best_draws  # the other thresholds' blocks are judged against it
                        ratio = mine_draws / best_draws if (best_draws > 0).all() else None
                        stats_ = {
                            "difference": point - best,
                            "low": diff["low"],
                            "high": diff["high"],
                            "ratio": point / best if best > 0 else None,
                            "ratio_low": None if ratio is None else float(np.percentile(ratio, 2.5)),
                            "ratio_high": None if ratio is None else float(np.percentile(ratio, 97.5)),
                        }
                for what, ed in other_eds.items():  # the block after the ED of every other threshold
                    start = after_ed_block(ed, int(k), n_layers, keep_final=bool(variant))
                    if start is None or start == int(removed.split(",")[0]):
                        continue
                    block = ",".join(str(layer) for layer in range(start, start + int(k)))
                    if not per.filter(pl.col("removed") == block, pl.col("rule") != "none").height:
                        continue  # not measured (a budget the run did not cut at every start)
                    other, w = deltas(block), draws[seed]
                    diff = interval(
                        float(other @ tokens / tokens.sum()) - best, w @ other / w.sum(axis=1) - best_at_seed
                    )
                    classes.append(_prune_class(diff["low"], diff["high"]))
                    if why is None and classes[-1] != classes[0]:
                        why = what
                same = removed in others["removed"].to_list()
                cost = blocks.filter(pl.col("removed") == removed)["value"]
                cheaper_blocks = int((blocks["value"] < cost[0]).sum()) if cost.len() else None
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
                        "why": why,
                        "same_layers": same,
                        "holds_final": str(int(r.result.summary["n_layers"]) - 1) in removed.split(","),
                        "percentile": None if cheaper_blocks is None else cheaper_blocks / blocks.height,
                        "blocks": blocks.height,
                        "n": n,
                        "counted": n >= MIN_PRUNE_N,
                    }
                )
    schema = {
        "model": pl.String, "task": pl.String, "k": pl.Int64, "variant": pl.String, "removed": pl.String,
        "delta_nll": pl.Float64, "best_alternative": pl.String, "best_delta_nll": pl.Float64,
        "difference": pl.Float64, "low": pl.Float64, "high": pl.Float64, "ratio": pl.Float64,
        "ratio_low": pl.Float64, "ratio_high": pl.Float64, "verdict": pl.String, "seed_stable": pl.Boolean,
        "why": pl.String, "same_layers": pl.Boolean, "holds_final": pl.Boolean, "percentile": pl.Float64,
        "blocks": pl.Int64, "n": pl.Int64, "counted": pl.Boolean,
    }  # fmt: skip
    return pl.DataFrame(rows, schema=schema)


def early_exit_costs(
    study: Study, summary: pl.DataFrame, rule: str = "lens overlap", n_bootstrap: int = N_BOOTSTRAP, seed: int = 0
) -> pl.DataFrame:
    """Per early-exit run and lens, exiting right after the ED of ``rule`` (the ED the book counts
    for that model and task, from ``summary``): the share of layers ``saved``, the share of tokens
    whose top-1 stays the final one (``kept``), and the answer-NLL increase over the full model
    (``cost``), each mean with a 95 % bootstrap interval over prompts (token-weighted as the
    curves); ``positive`` when the cost's interval lies above zero under this seed and the next two,
    exiting after the ED of every threshold of the rule's range too (``exit_low``–``exit_high``;
    ``why`` names the first check that failed); ``counted`` with at least ``MIN_PRUNE_N`` prompts."""
    rows = []
    for r in study.finished:
        if not r.asked("early_exit"):
            continue
        ed = summary.filter(model=r.model, task=r.label, rule=rule)
        if not ed.height or ed["ed"][0] is None:
            continue
        exit_at, n_layers = int(ed["ed"][0]) + 1, int(r.result.summary["n_layers"])
        exits = {"": exit_at, **{w: ed + 1 for w, ed in _threshold_eds(study, r.model, r.label, rule).items()}}
        frame = r.result.per_example["early_exit"]
        lenses = frame["lens"].unique(maintain_order=True).to_list() if "lens" in frame.columns else [None]
        for lens in lenses:
            rows_ = frame if lens is None else frame.filter(lens=lens)

            def column(layer: int, metric: str, rows_: pl.DataFrame = rows_) -> tuple[np.ndarray, np.ndarray]:
                picked = rows_.filter(layer=layer, metric=metric).sort("example")
                return picked["value"].to_numpy(), picked["n_tokens"].to_numpy().astype(float)

            nll_full, answer_tokens = column(n_layers, "answer_nll")
            if not nll_full.size:
                continue
            n, why, found = nll_full.size, None, None
            for what, layer in exits.items():  # the book's exit first, then each threshold's
                nll_exit, _ = column(layer, "answer_nll")
                agree, all_tokens = column(layer, "agreement")
                cost = nll_exit - nll_full
                for s in (seed, seed + 1, seed + 2):
                    w = resample_weights(n, n_bootstrap, s)  # [boot, prompt]
                    cost_draws = (w * answer_tokens) @ cost / ((w * answer_tokens).sum(axis=1))
                    cost_i = interval(float(cost @ answer_tokens / answer_tokens.sum()), cost_draws)
                    if found is None:  # the book's own exit and seed: what the page reports
                        kept_draws = (w * all_tokens) @ agree / ((w * all_tokens).sum(axis=1))
                        found = (cost_i, interval(float(agree @ all_tokens / all_tokens.sum()), kept_draws))
                    if why is None and not cost_i["low"] > 0:
                        why = what or (f"under bootstrap seed {s}" if s != seed else "at the book's settings")
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
                    "positive": why is None,
                    "why": why,
                    "exit_low": min(exits.values()),
                    "exit_high": max(exits.values()),
                    "n": n,
                    "counted": n >= MIN_PRUNE_N,
                }
            )
    schema = {
        "model": pl.String, "task": pl.String, "lens": pl.String, "exit_layer": pl.Int64, "n_layers": pl.Int64,
        "saved": pl.Float64, "kept": pl.Float64, "kept_low": pl.Float64, "kept_high": pl.Float64,
        "cost": pl.Float64, "cost_low": pl.Float64, "cost_high": pl.Float64, "positive": pl.Boolean,
        "why": pl.String, "exit_low": pl.Int64, "exit_high": pl.Int64, "n": pl.Int64, "counted": pl.Boolean,
    }  # fmt: skip
    return pl.DataFrame(rows, schema=schema)


def _threshold_eds(study: Study, model: str, task: str, rule: str) -> dict[str, int]:
    """The ED of ``rule`` at every other threshold of its range (the robustness rule's checks):
    ``{"at overlap threshold 0.2": ed, …}`` from the ED run's own curves; an ED that is a rule
    artefact there (``depth.artefact``: it fires in the first layers) is no depth, and no check."""
    from effdepth_core.measurement.depth import artefact, ed_samples, variants

    from ...evidence import _frames, _rule

    record, frame = _frames(study, model, task, rule)
    if record is None:
        return {}
    _, found = _rule(rule)
    one = np.ones((1, int(frame["example"].n_unique())))
    n_layers = int(record.result.summary["n_layers"])
    out = {}
    for what, settings, _ in variants(found, record.settings, 0):
        if what.startswith("at "):
            ed, _ = ed_samples(found, frame, n_layers, settings, one)
            if ed is not None and artefact(int(ed), n_layers) is None:
                out[what] = int(ed)
    return out
