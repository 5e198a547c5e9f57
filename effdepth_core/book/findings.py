"""What the numbers say: the findings paragraphs of the book, generated from the results (never
typed by hand), one per question of the paper — scale, long-CoT training, task difficulty.

Each function takes the long ED summary (``Study.summary()``: model, task, rule, ed, ratio,
ci_low, ci_high, ratio_low, ratio_high, n_layers, n_params, n_examples) and returns Markdown that
states our numbers beside the paper's claim and says plainly whether they agree, disagree, or
cannot tell. The yardsticks are written here once:

- a ratio is *stable* across models or data sets when its spread (max − min) is within the
  paper's own spread for that rule plus ``SAMPLING_SLACK`` (our samples are small); beyond twice
  that it is not; in between, unclear;
- a lens-KL ED of at most ``KL_ARTEFACT`` layers is the half-maximum rule firing at the first
  layers (the paper's own table has one: 1 for DeepSeek-R1-Distill-Qwen-1.5B on GSM8K); such
  cells are named and left out of the verdicts, for the paper's numbers and ours alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import polars as pl

from ..labels import format_ed
from .reference import RULE_LABELS

TASK_ORDER = ("hellaswag", "gsm8k", "aime24")  # the paper's difficulty order
TASK_NAMES = {"hellaswag": "HellaSwag", "gsm8k": "GSM8K", "aime24": "AIME24"}
CLAIMS = {
    "scale": "the number of effective layers grows with model size while the ratio (ED + 1) / L stays stable",
    "long_cot": "long-CoT (R1-distilled) models show no increase in effective depth over their base models",
    "difficulty": "effective depth stays consistent from HellaSwag to GSM8K to AIME24",
}
SAMPLING_SLACK = 0.05
KL_ARTEFACT = 2
MINUS = "−"


def _name(task: str) -> str:
    return TASK_NAMES.get(task, task)


def _signed(value: int) -> str:
    return f"+{value}" if value > 0 else f"{MINUS}{-value}" if value < 0 else "±0"


def _artefact() -> pl.Expr:
    return (pl.col("rule") == RULE_LABELS["logit_lens_kl"]) & (pl.col("ed") <= KL_ARTEFACT)


def _defined(summary: pl.DataFrame) -> pl.DataFrame:
    return summary.filter(pl.col("ed").is_not_null())


def paper_spread(paper: pl.DataFrame, rule: str, by: str) -> float:
    """The paper's own spread of the ratio for ``rule``: across its models (``by="model"``, each
    model's mean over the data sets) or across the data sets (``by="task"``, the largest within
    one model). Rule artefacts are left out."""
    rows = paper.filter(pl.col("rule") == rule).filter(~_artefact())
    if by == "model":
        means = rows.group_by("model").agg(pl.col("ratio").mean())["ratio"]
        return float(means.max() - means.min())
    spreads = rows.group_by("model").agg((pl.col("ratio").max() - pl.col("ratio").min()).alias("s"))["s"]
    return float(spreads.max())


def _verdict(spread: float, tolerance: float) -> str:
    if spread <= tolerance:
        return "**we agree**"
    return "**we disagree**" if spread > 2 * tolerance else "**unclear**"


def _range_words(low: float, high: float, p_low: float, p_high: float) -> str:
    if p_low - 1e-9 <= low and high <= p_high + 1e-9:
        return "inside"
    return "outside" if high < p_low or low > p_high else "partly inside"


def scale_finding(summary: pl.DataFrame, paper: pl.DataFrame | None = None) -> str:
    """Is the ED ratio stable across our models (ordered by size), and does absolute ED grow? With
    one model: where its ratios fall against the paper's."""
    rows = _defined(summary).filter(pl.col("task").is_in(TASK_ORDER))
    artefacts = rows.filter(_artefact())
    rows = rows.filter(~_artefact())
    text = [f"**Model scale.** The paper finds that {CLAIMS['scale']}."]
    models = rows.select("model", "n_params", "n_layers").unique().sort("n_params", "model")
    if models.height == 0:
        return text[0] + " We have no defined ED to compare: **cannot tell**."
    clean_paper = paper.filter(~_artefact()) if paper is not None else None
    if models.height == 1:
        model, _, n_layers = models.row(0)
        parts = []
        for rule in RULE_LABELS.values():
            mine = rows.filter(pl.col("rule") == rule)["ratio"]
            if not mine.len():
                continue
            low, high = float(mine.min()), float(mine.max())
            where = ""
            if clean_paper is not None:
                theirs = clean_paper.filter(pl.col("rule") == rule)["ratio"]
                p_low, p_high = float(theirs.min()), float(theirs.max())
                where = f", {_range_words(low, high, p_low, p_high)} the paper's {p_low:.2f}–{p_high:.2f}"
            parts.append(f"{rule} {low:.2f}–{high:.2f}{where}")
        text.append(
            f"One model cannot show a trend: {model} (L = {n_layers}) has ED ratios {'; '.join(parts)}. "
            "**Cannot tell** from this page; the comparison page sets the four models side by side."
        )
    else:
        parts = []
        for rule in RULE_LABELS.values():
            per_model = rows.filter(pl.col("rule") == rule)
            if per_model["model"].n_unique() < 2:
                continue
            means = (
                per_model.group_by("model", "n_params", "n_layers")
                .agg(pl.col("ratio").mean(), pl.col("ed").mean())
                .sort("n_params", "model")
            )
            spread = float(means["ratio"].max() - means["ratio"].min())
            tolerance = (paper_spread(paper, rule, "model") if paper is not None else 0.0) + SAMPLING_SLACK
            rho = (
                pl.DataFrame({"size": means["n_params"], "ed": means["ed"]})
                .select(pl.corr("size", "ed", method="spearman"))
                .item()
            )
            listing = ", ".join(f"{m} {r:.2f}" for m, r in zip(means["model"], means["ratio"], strict=True))
            grows = "grows" if rho is not None and rho >= 0.8 else "does not grow steadily"
            rho_text = "n/a" if rho is None else f"{rho:.2f}"
            parts.append(
                f"{rule}: ratios {listing} (spread {spread:.2f} against a tolerance of {tolerance:.2f}) — "
                f"{_verdict(spread, tolerance)} on a stable ratio; absolute ED {grows} with size (Spearman {rho_text})"
            )
        text.append("Our models by size, mean over the data sets: " + "; ".join(parts) + ".")
    if artefacts.height:
        cells = ", ".join(f"{r['model']} {_name(r['task'])} ({r['ed']})" for r in artefacts.iter_rows(named=True))
        text.append(f"Left out as a rule artefact (lens-KL ED ≤ {KL_ARTEFACT}): {cells}.")
    return " ".join(text)


def _trend(by_task: Mapping[str, Mapping], order: Sequence[str], tolerance: float) -> str:
    present = [t for t in order if t in by_task]
    ratios = [by_task[t]["ratio"] for t in present]
    spread = max(ratios) - min(ratios)
    if spread <= tolerance:
        return f"spread {spread:.2f}: consistent — **we agree**"
    if ratios == sorted(ratios) and spread > 2 * tolerance:
        return f"spread {spread:.2f}: rises with difficulty — **we disagree**"
    if ratios == sorted(ratios, reverse=True) and spread > 2 * tolerance:
        return f"spread {spread:.2f}: falls with difficulty — **we disagree**"
    return f"spread {spread:.2f}, no clear trend — **unclear**"


def difficulty_finding(
    summary: pl.DataFrame,
    order: Sequence[str] = TASK_ORDER,
    paper: pl.DataFrame | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """Does ED rise with the difficulty of the data set (in ``order``), per model and rule? ``groups``
    (name → ordered task labels, e.g. MATH levels) are summarized too."""
    rows = _defined(summary)
    text = [f"**Task difficulty.** The paper finds that {CLAIMS['difficulty']}."]
    if rows.filter(pl.col("task").is_in(list(order))).is_empty():
        return text[0] + " We have no defined ED on these data sets: **cannot tell**."
    for model in sorted(rows["model"].unique().to_list()):
        parts, artefacts = [], []
        for rule in RULE_LABELS.values():
            mine = rows.filter(pl.col("model") == model, pl.col("rule") == rule)
            by_task = {r["task"]: r for r in mine.iter_rows(named=True)}
            kept = {
                t: r
                for t, r in by_task.items()
                if not (rule == RULE_LABELS["logit_lens_kl"] and r["ed"] <= KL_ARTEFACT)
            }
            artefacts += [f"{_name(t)} ({by_task[t]['ed']})" for t in order if t in by_task and t not in kept]
            present = [t for t in order if t in kept]
            if len(present) < 2:
                continue
            tolerance = (paper_spread(paper, rule, "task") if paper is not None else 0.0) + SAMPLING_SLACK
            cells = " → ".join(
                f"{_name(t)} {format_ed(kept[t]['ed'], kept[t]['ratio'], kept[t]['ci_low'], kept[t]['ci_high'])}"
                for t in present
            )
            line = f"{rule} {cells} ({_trend(kept, present, tolerance)})"
            for name, levels in (groups or {}).items():
                within = {r["task"]: r for r in mine.iter_rows(named=True) if r["task"] in levels}
                ratios = [within[t]["ratio"] for t in levels if t in within]
                if len(ratios) >= 2:
                    line += f"; by {name} {min(ratios):.2f}–{max(ratios):.2f}"
            parts.append(line)
        n = rows.filter(pl.col("model") == model, pl.col("task").is_in(list(order)))["n_examples"]
        sentence = f"{model} (n = {n.min()}–{n.max()} prompts per data set): " + "; ".join(parts) + "."
        if artefacts:
            sentence += f" Left out as a rule artefact (lens-KL ED ≤ {KL_ARTEFACT}): {', '.join(artefacts)}."
        text.append(sentence)
    return " ".join(text)


def _reason(text: str) -> str:
    """The gist of a load error: its first clause after the model name."""
    core = text.split(": ", 1)[-1] if text.startswith("cannot load model") else text
    return core.split(". ")[0].rstrip(".")


def long_cot_finding(
    summary: pl.DataFrame,
    pairs: Sequence[Mapping],
    unavailable: Mapping[str, str] | None = None,
    paper: pl.DataFrame | None = None,
) -> str:
    """ED(long-CoT) − ED(base) per pair, rule and data set: ours where measured, the paper's always."""
    text = [f"**Long-CoT training.** The paper finds that {CLAIMS['long_cot']}."]
    unavailable = dict(unavailable or {})
    rows = _defined(summary)
    measured_any = False
    not_measured: dict[str, list[str]] = {}  # reason → models
    order = " / ".join(_name(t) for t in TASK_ORDER)
    for pair in pairs:
        base, long_cot = str(pair["base"]), str(pair["long_cot"])
        missing = [m for m in (base, long_cot) if m in unavailable or rows.filter(pl.col("model") == m).is_empty()]
        for m in missing:
            models = not_measured.setdefault(_reason(unavailable.get(m, "no results")), [])
            models += [m] if m not in models else []
        if missing:
            continue
        measured_any = True
        parts = []
        for rule in RULE_LABELS.values():
            deltas = []
            for task in TASK_ORDER:
                b = rows.filter(pl.col("model") == base, pl.col("rule") == rule, pl.col("task") == task)
                c = rows.filter(pl.col("model") == long_cot, pl.col("rule") == rule, pl.col("task") == task)
                if b.height and c.height:
                    deltas.append(_signed(c.row(0, named=True)["ed"] - b.row(0, named=True)["ed"]))
            if deltas:
                parts.append(f"{rule} {'/'.join(deltas)}")
        text.append(f"Ours, {long_cot} − {base} ({order}): " + "; ".join(parts) + ".")
    for reason, models in not_measured.items():
        text.append(f"Not measured here ({len(models)} model(s): {reason}).")
    largest = None
    if paper is not None and pairs:
        from .reference import pair_deltas

        deltas = pair_deltas(paper, list(pairs))
        if deltas.height:
            by_pair = []
            for (base, long_cot), frame in deltas.group_by("base", "long_cot", maintain_order=True):
                values = []
                for rule in RULE_LABELS.values():
                    cells = {r["task"]: r for r in frame.filter(pl.col("rule") == rule).iter_rows(named=True)}
                    marks = [
                        _signed(cells[t]["delta"])
                        + (
                            "*"
                            if min(cells[t]["ed_base"], cells[t]["ed_long_cot"]) <= KL_ARTEFACT
                            and rule == RULE_LABELS["logit_lens_kl"]
                            else ""
                        )
                        for t in TASK_ORDER
                        if t in cells
                    ]
                    values.append(f"{rule} {'/'.join(marks)}")
                by_pair.append(f"{long_cot} − {base}: {'; '.join(values)}")
            clean = deltas.filter(pl.min_horizontal("ed_base", "ed_long_cot") > KL_ARTEFACT)
            largest = int(clean["delta"].abs().max()) if clean.height else None
            star = (
                f" (* a lens-KL ED ≤ {KL_ARTEFACT}: the rule fires at the first layers; an artefact, left out)"
                if deltas.height > clean.height
                else ""
            )
            text.append(f"The paper's deltas ({order}): " + " | ".join(by_pair) + star + ".")
    if not measured_any:
        tail = "" if largest is None else f"; apart from artefacts its changes are at most {largest} layer(s)"
        text.append(f"With no pair measured here, **we cannot tell**: the verdict rests on the paper alone{tail}.")
    return " ".join(text)


# --- beyond the paper (method.md §7–§7b) ----------------------------------------------------------
# Yardsticks: two EDs *agree* when their ratios differ by at most SAMPLING_SLACK or their bootstrap
# intervals overlap; a layer choice for pruning *wins* when its ΔNLL is the least of the three
# rules; a small layer's best big layer is *on the diagonal* when it lies within STRETCH_SLACK of
# L_big (at least one layer) of equal relative depth.
STRETCH_SLACK = 0.1
LENS_PAIRS = {"KL": ("lens KL", "tuned KL"), "overlap": ("lens overlap", "tuned overlap")}


def _overlaps(a: Mapping, b: Mapping) -> bool:
    if abs(a["ratio"] - b["ratio"]) <= SAMPLING_SLACK:
        return True
    if None in (a["ci_low"], a["ci_high"], b["ci_low"], b["ci_high"]):
        return False
    return a["ci_low"] <= b["ci_high"] and b["ci_low"] <= a["ci_high"]


def lens_finding(summary: pl.DataFrame, fit: pl.DataFrame | None = None) -> str:
    """Is ED an artefact of the logit lens? Logit- vs tuned-lens ED per model, task and rule, and how
    well the translators fit (held-out KL per layer)."""
    rows = _defined(summary)
    models = [m for m in rows["model"].unique(maintain_order=True) if rows.filter(model=m, rule="tuned KL").height]
    if not models:
        return "**Is ED an artefact of the logit lens?** No tuned lens was run on this page: **cannot tell**."
    parts, agree, differ, earlier = [], 0, 0, 0
    for model in models:
        cells = []
        for task in rows.filter(model=model)["task"].unique(maintain_order=True):
            for name, (logit_rule, tuned_rule) in LENS_PAIRS.items():
                logit = rows.filter(model=model, task=task, rule=logit_rule)
                tuned = rows.filter(model=model, task=task, rule=tuned_rule)
                if not (logit.height and tuned.height):
                    continue
                a, b = logit.row(0, named=True), tuned.row(0, named=True)
                cell = (
                    f"{_name(task)} {name} {format_ed(a['ed'], a['ratio'], a['ci_low'], a['ci_high'])} → "
                    f"{format_ed(b['ed'], b['ratio'], b['ci_low'], b['ci_high'])}"
                )
                if name == "KL" and a["ed"] <= KL_ARTEFACT:  # the logit lens's early-layer artefact: not counted
                    cells.append(cell + " (the logit lens's KL artefact, left out)")
                    continue
                same = _overlaps(a, b)
                agree += same
                differ += not same
                earlier += (not same) and b["ed"] < a["ed"]
                cells.append(cell)
        parts.append(f"{model}: " + "; ".join(cells))
    if agree + differ == 0:
        verdict = "**cannot tell**: every comparison is a logit-lens artefact"
    elif differ == 0:
        verdict = "**no**: with the tuned lens every ED lands where the logit lens put it"
    elif agree == 0:
        later = differ - earlier
        moves = " and ".join(f"{n} {side}" for n, side in ((earlier, "earlier"), (later, "later")) if n)
        verdict = (
            f"**yes**: no tuned-lens ED agrees with the logit lens's ({moves}), so where ED lands depends on the "
            "lens that reads the residual stream"
        )
    else:
        verb = "does" if differ == 1 else "do"
        verdict = f"**unclear**: {agree} of {agree + differ} comparisons agree, {differ} {verb} not"
    text = (
        "**Is ED an artefact of the logit lens?** ED by the logit lens → by the tuned lens (ED (ratio) "
        f"[interval]): {' | '.join(parts)}. Verdict: {verdict}."
    )
    if fit is not None and fit.height:
        sentences = []
        for model in models:
            wide = (
                fit.filter(model=model)
                .unique(["layer", "metric"])
                .pivot(on="metric", index="layer", values="value")
                .sort("layer")
            )
            if not wide.height:
                continue
            better = int((wide["heldout_kl_tuned"] < wide["heldout_kl_logit"]).sum())
            sentences.append(
                f"{model} {better} of {wide.height} layers (mean {wide['heldout_kl_logit'].mean():.2f} → "
                f"{wide['heldout_kl_tuned'].mean():.2f} nats)"
            )
        text += " The translators lower the held-out KL to the final distribution on " + "; ".join(sentences) + "."
    return text


def pruning_finding(comparison: pl.DataFrame, ed_rule: str = "lens overlap") -> str:
    """Is the block right after ED (of ``ed_rule``, one rule so that the verdict is not the best of
    several tries) cheaper to cut than the layers angular distance or block influence choose, budget
    by budget? ``comparison``: ``rule_comparison`` rows with ``model`` and ``task`` columns. The same
    layers chosen by two rules are a tie."""
    after_ed = f"after ED ({ed_rule})"
    others = ("angular distance", "block influence")
    if not comparison.height or not comparison.filter(choice=after_ed).height:
        return "**Is the block right after ED the cheapest to cut?** Not measured here: **cannot tell**."
    cells, wins, ties, total = [], 0, 0, 0
    for (model, task), group in comparison.group_by(["model", "task"], maintain_order=True):
        for _, rows in group.group_by("k", maintain_order=True):
            mine, rest = rows.filter(choice=after_ed), rows.filter(pl.col("choice").is_in(others))
            if not (mine.height and rest.height):
                continue
            best = rest.sort("delta_nll").row(0, named=True)
            total += 1
            if mine["removed"][0] == best["removed"] or abs(mine["delta_nll"][0] - best["delta_nll"]) <= 1e-9:
                ties += 1
            else:
                wins += mine["delta_nll"][0] < best["delta_nll"]
        largest = group.filter(pl.col("k") == group["k"].max(), pl.col("choice").is_in([after_ed, *others]))
        listing = ", ".join(f"{r['choice']} {r['delta_nll']:+.2f}" for r in largest.iter_rows(named=True))
        cells.append(f"{model} {_name(task)}, {largest['k'][0]} layers: {listing}")
    decided = total - ties
    if decided == 0:
        verdict = "**a tie**: every rule picks the same layers"
    elif wins == decided:
        verdict = "**yes**" + (f" ({ties} ties)" if ties else "")
    elif wins == 0:
        verdict = "**no**" + (f" ({ties} ties)" if ties else "")
    else:
        verdict = f"**sometimes** (cheapest in {wins} of {total} budgets, {ties} ties)"
    return (
        f"**Is the block right after ED ({ed_rule}) the cheapest to cut?** Δ answer NLL in nats when the largest "
        f"budget of layers is removed: {' | '.join(cells)}. After ED beats angular distance and block influence: "
        f"{verdict}."
    )


def early_exit_finding(exits: pl.DataFrame, summary: pl.DataFrame, rule: str = "lens overlap") -> str:
    """What exiting right after ED buys (layers saved) and costs (tokens whose top-1 changes, answer NLL)."""
    if not exits.height:
        return "**What does exiting at ED cost?** The early-exit probe was not run here: **cannot tell**."
    cells = []
    for (model, task), group in exits.group_by(["model", "task"], maintain_order=True):
        ed = _defined(summary).filter(model=model, task=task, rule=rule)
        if not ed.height:
            continue
        ed_value, n_layers = int(ed["ed"][0]), int(ed["n_layers"][0])
        layer = ed_value + 1
        for lens in group["lens"].unique(maintain_order=True):
            rows = group.filter(lens=lens)
            at = {m: rows.filter(layer=layer, metric=m)["value"] for m in ("agreement", "answer_nll")}
            full = rows.filter(layer=n_layers, metric="answer_nll")["value"]
            if not (len(at["agreement"]) and len(full)):
                continue
            cells.append(
                f"{model} {_name(task)} ({lens} lens, exit after layer {ed_value} of {n_layers}, saving "
                f"{1 - layer / n_layers:.0%} of the layers): {at['agreement'][0]:.0%} of tokens keep their top-1, "
                f"answer NLL {full[0]:.2f} → {at['answer_nll'][0]:.2f}"
            )
    if not cells:
        return "**What does exiting at ED cost?** No ED to exit at: **cannot tell**."
    return f"**What does exiting at ED (the {rule} rule) cost?** " + "; ".join(cells) + "."


def map_finding(mapped: pl.DataFrame, small: str, big: str) -> str:
    """Does the big model stretch the small one? Where each small layer's best big layer lies
    against equal relative depth, and how good the maps are."""
    if not {"small_layer", "big_layer", "metric", "value"} <= set(mapped.columns):
        return "**Does the deeper model stretch the shallower one?** The map was not computed: **cannot tell**."
    best = mapped.filter(metric="best_big_layer").sort("small_layer")
    equal = mapped.filter(metric="equal_depth_layer").sort("small_layer")
    errors = mapped.filter(metric="relative_error")
    if not best.height:
        return "**Does the deeper model stretch the shallower one?** The map was not computed: **cannot tell**."
    n_small = int(best["small_layer"].max())
    n_big = int(errors["big_layer"].max())
    slack = max(1.0, STRETCH_SLACK * n_big)
    inner = [m for m in range(1, n_small)]
    on = [
        m
        for m in inner
        if abs(best.filter(small_layer=m)["value"][0] - equal.filter(small_layer=m)["value"][0]) <= slack
    ]
    share = len(on) / max(len(inner), 1)
    order = pl.DataFrame({"m": inner, "best": [best.filter(small_layer=m)["value"][0] for m in inner]})
    rho = order.select(pl.corr("m", "best", method="spearman")).item() if len(inner) > 2 else None
    best_error = [errors.filter(small_layer=m).sort("value")["value"][0] for m in inner]
    verdict = "**yes**" if share >= 2 / 3 else "**partly**" if share >= 1 / 3 else "**no**"
    counts = mapped.filter(metric="n_train_prompts")["value"]
    n_train = f" (maps fitted on {counts[0]:.0f} prompts)" if len(counts) else ""
    return (
        f"**Does {big} stretch the computation of {small}?** For {len(on)} of the {len(inner)} inner layers of {small} "
        f"the best-predicted layer of {big} lies within {slack:.1f} layers of equal relative depth "
        f"(Spearman between small layer and best big layer {'n/a' if rho is None else f'{rho:.2f}'}); "
        "the held-out relative error there is "
        f"{min(best_error):.2f}–{max(best_error):.2f}{n_train}. Verdict: {verdict}, the deeper model "
        + (
            "stretches the shallower one's computation along its depth."
            if share >= 1 / 3
            else "does not map layer for layer onto equal relative depth."
        )
    )


def beyond_finding(
    summary: pl.DataFrame,
    fit: pl.DataFrame,
    comparison: pl.DataFrame,
    exits: pl.DataFrame,
    mapped: pl.DataFrame | None = None,
    pair: Mapping | None = None,
) -> str:
    """The paragraphs of a "beyond the paper" page: the map's, or the lens, pruning and early-exit ones."""
    paragraphs = []
    if pair:
        paragraphs.append(map_finding(mapped if mapped is not None else pl.DataFrame(), pair["small"], pair["big"]))
    if summary.height:
        paragraphs += [lens_finding(summary, fit), pruning_finding(comparison), early_exit_finding(exits, summary)]
    return "\n\n".join(paragraphs) or "Nothing was measured on this page."
