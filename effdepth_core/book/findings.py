"""What the numbers say: the findings paragraphs of the book, generated from the results (never
typed by hand), one per question of the paper — scale, long-CoT training, task difficulty.

Each function takes the long ED summary (``Study.summary()``: model, task, rule, ed, ratio,
ci_low, ci_high, ratio_low, ratio_high, n_layers, n_examples) and returns Markdown that states our
numbers with their intervals beside the paper's claim, and says plainly whether they agree,
disagree, or cannot tell. "Differ" always means: bootstrap intervals that do not overlap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations

import polars as pl

from ..labels import RULE_LABELS, format_ed

TASK_ORDER = ("hellaswag", "gsm8k", "aime24")  # the paper's difficulty order
TASK_NAMES = {"hellaswag": "HellaSwag", "gsm8k": "GSM8K", "aime24": "AIME24"}
CLAIMS = {
    "scale": "the number of effective layers grows with model size while the ratio (ED + 1) / L stays stable",
    "long_cot": "long-CoT (R1-distilled) models show no increase in effective depth over their base models",
    "difficulty": "effective depth stays consistent from HellaSwag to GSM8K to AIME24",
}
CAVEAT = (
    "Our models are quantized GGUF checkpoints of other families than the paper's Qwen2.5 series, "
    "probed on few prompts, so agreement is about direction and size of effects, not exact layers."
)


def _cell(row: Mapping) -> str:
    return format_ed(row["ed"], row["ratio"], row.get("ci_low"), row.get("ci_high"))


def _ratio_range(row: Mapping) -> tuple[float, float]:
    low, high = row.get("ratio_low"), row.get("ratio_high")
    return (row["ratio"], row["ratio"]) if low is None or high is None else (low, high)


def _overlap(a: Mapping, b: Mapping) -> bool:
    (a_low, a_high), (b_low, b_high) = _ratio_range(a), _ratio_range(b)
    return a_low <= b_high and b_low <= a_high


def _defined(summary: pl.DataFrame) -> pl.DataFrame:
    return summary.filter(pl.col("ed").is_not_null())


def _name(task: str) -> str:
    return TASK_NAMES.get(task, task)


def scale_finding(summary: pl.DataFrame, paper: pl.DataFrame | None = None) -> str:
    """Does the ED ratio stay stable across our models (ordered by depth L), and does absolute ED
    grow with L? With one model: where its ratio falls against the paper's range."""
    rows = _defined(summary).filter(pl.col("task").is_in(TASK_ORDER))
    models = rows.select("model", "n_layers").unique().sort("n_layers", "model")
    text = [f"**Model scale.** The paper finds that {CLAIMS['scale']}."]
    if models.height == 0:
        return text[0] + " We have no defined ED to compare: **cannot tell**."
    paper_ranges = {}
    if paper is not None:
        for rule in RULE_LABELS.values():
            values = paper.filter(pl.col("rule") == rule)["ratio"]
            paper_ranges[rule] = (float(values.min()), float(values.max()))
    if models.height == 1:
        model, n_layers = models.row(0)
        parts = []
        for rule in RULE_LABELS.values():
            mine = rows.filter(pl.col("rule") == rule).sort("task")
            if not mine.height:
                continue
            low, high = float(mine["ratio"].min()), float(mine["ratio"].max())
            where = ""
            if rule in paper_ranges:
                p_low, p_high = paper_ranges[rule]
                inside = p_low - 1e-9 <= low and high <= p_high + 1e-9
                where = f" ({'inside' if inside else 'outside'} the paper's {p_low:.2f}–{p_high:.2f})"
            parts.append(f"{rule} {low:.2f}–{high:.2f}{where}")
        text.append(
            f"One model cannot test a trend: {model} (L = {n_layers}) has ED ratios {'; '.join(parts)} across "
            f"the three data sets — **cannot tell** from this page; the comparison page puts the four models side by "
            "side."
        )
        return " ".join([*text, CAVEAT])
    verdicts = []
    for rule in RULE_LABELS.values():
        per_model = rows.filter(pl.col("rule") == rule)
        if per_model["model"].n_unique() < 2:
            continue
        means = per_model.group_by("model", "n_layers").agg(pl.col("ratio").mean(), pl.col("ed").mean())
        means = means.sort("n_layers", "model")
        differing = [
            f"{a['model']} vs {b['model']} on {_name(a['task'])}"
            for task in TASK_ORDER
            for a, b in combinations(per_model.filter(pl.col("task") == task).iter_rows(named=True), 2)
            if not _overlap(a, b)
        ]
        spread = float(means["ratio"].max() - means["ratio"].min())
        listing = ", ".join(f"{m} {r:.2f}" for m, r in zip(means["model"], means["ratio"], strict=True))
        trend = pl.DataFrame({"L": means["n_layers"], "ed": means["ed"]}).select(pl.corr("L", "ed", method="spearman"))
        rho = trend.item()
        grows = "grows" if rho is not None and rho > 0.5 else "does not grow consistently"
        verdict = "agree" if not differing else "disagree"
        paper_note = ""
        if rule in paper_ranges:
            p_low, p_high = paper_ranges[rule]
            paper_note = f"; the paper's ratios span {p_low:.2f}–{p_high:.2f}"
        verdicts.append(
            f"{rule}: mean ratio over the data sets {listing} (spread {spread:.2f}{paper_note}); absolute ED {grows} "
            f"with L (Spearman {rho:.2f})"
            + (
                f"; intervals do not overlap for {len(differing)} pair(s), e.g. {differing[0]} — **we disagree**"
                if differing
                else " — every pair's intervals overlap: **we agree** on a stable ratio"
            )
            if rho is not None
            else f"{rule}: {listing} — **{verdict}**"
        )
    return " ".join([*text, "By rule (models ordered by depth L): " + "; ".join(verdicts) + ".", CAVEAT])


def difficulty_finding(summary: pl.DataFrame, order: Sequence[str] = TASK_ORDER) -> str:
    """Does ED rise with the difficulty of the data set (in ``order``), per model and rule?"""
    rows = _defined(summary).filter(pl.col("task").is_in(list(order)))
    text = [f"**Task difficulty.** The paper finds that {CLAIMS['difficulty']}."]
    if rows.height == 0:
        return text[0] + " We have no defined ED on these data sets: **cannot tell**."
    for model in sorted(rows["model"].unique().to_list()):
        parts = []
        for rule in RULE_LABELS.values():
            mine = rows.filter(pl.col("model") == model, pl.col("rule") == rule)
            by_task = {r["task"]: r for r in mine.iter_rows(named=True)}
            present = [t for t in order if t in by_task]
            if len(present) < 2:
                continue
            cells = " → ".join(f"{_name(t)} {_cell(by_task[t])}" for t in present)
            first, last = by_task[present[0]], by_task[present[-1]]
            eds = [by_task[t]["ed"] for t in present]
            if all(_overlap(by_task[a], by_task[b]) for a, b in combinations(present, 2)):
                verdict = "intervals overlap: consistent — **we agree**"
            elif eds == sorted(eds) and last["ed"] > first["ed"]:
                verdict = "rises with difficulty, intervals apart — **we disagree**"
            elif eds == sorted(eds, reverse=True) and last["ed"] < first["ed"]:
                verdict = "falls with difficulty, intervals apart — **we disagree**"
            else:
                verdict = "changes without a monotone trend — **unclear**"
            parts.append(f"{rule} {cells} ({verdict})")
        n = rows.filter(pl.col("model") == model)["n_examples"]
        text.append(f"{model} (n = {n.min()}–{n.max()} prompts per data set): " + "; ".join(parts) + ".")
    return " ".join([*text, CAVEAT])


def long_cot_finding(
    summary: pl.DataFrame,
    pairs: Sequence[Mapping],
    unavailable: Mapping[str, str] | None = None,
    paper: pl.DataFrame | None = None,
) -> str:
    """ED(long-CoT) − ED(base) per pair, rule and data set, ours where measured, else the paper's."""
    text = [f"**Long-CoT training.** The paper finds that {CLAIMS['long_cot']}."]
    unavailable = dict(unavailable or {})
    rows = _defined(summary)
    measured_any = False
    not_measured: dict[str, list[str]] = {}  # reason → models
    for pair in pairs:
        base, long_cot = str(pair["base"]), str(pair["long_cot"])
        missing = [m for m in (base, long_cot) if m in unavailable or rows.filter(pl.col("model") == m).is_empty()]
        if missing:
            for m in missing:
                models = not_measured.setdefault(unavailable.get(m, "no results"), [])
                models += [m] if m not in models else []
            continue
        measured_any = True
        parts = []
        for rule in RULE_LABELS.values():
            deltas = []
            for task in TASK_ORDER:
                b = rows.filter(pl.col("model") == base, pl.col("rule") == rule, pl.col("task") == task)
                c = rows.filter(pl.col("model") == long_cot, pl.col("rule") == rule, pl.col("task") == task)
                if b.height and c.height:
                    b_row, c_row = b.row(0, named=True), c.row(0, named=True)
                    apart = "" if _overlap(b_row, c_row) else " (intervals apart)"
                    deltas.append(f"{_name(task)} {c_row['ed'] - b_row['ed']:+d}{apart}")
            if deltas:
                parts.append(f"{rule} {', '.join(deltas)}")
        text.append(f"Ours, {long_cot} − {base}: " + "; ".join(parts) + ".")
    for reason, models in not_measured.items():
        text.append(f"Not measured here: {', '.join(models)} — {reason}.")
    largest = None
    if paper is not None and pairs:
        from .reference import pair_deltas

        deltas = pair_deltas(paper, list(pairs)).with_columns(
            pl.col("task").replace_strict({t: i for i, t in enumerate(TASK_ORDER)}, default=9).alias("order")
        )
        if deltas.height:
            by_pair = []
            for (base, long_cot), frame in deltas.group_by("base", "long_cot", maintain_order=True):
                ordered = frame.sort("rule", "order").iter_rows(named=True)
                values = ", ".join(f"{r['rule']} {_name(r['task'])} {r['delta']:+d}" for r in ordered)
                by_pair.append(f"{long_cot} − {base}: {values}")
            outlier = deltas.filter(pl.col("delta").abs() > 10)
            typical = deltas.filter(pl.col("delta").abs() <= 10)["delta"].abs()
            largest = int(typical.max()) if typical.len() else None
            note = (
                f" (the {outlier.height} change(s) beyond ±10 layers come from a single lens-KL value of 1 in the "
                "paper's table, where the half-maximum rule fires at the first layers: an outlier, not deeper use)"
                if outlier.height
                else ""
            )
            text.append("The paper's own deltas: " + "; ".join(by_pair) + note + ".")
    if not measured_any:
        tail = "" if largest is None else f", whose other changes are at most {largest} layer(s) either way"
        text.append(f"With no pair measurable here, **we cannot tell**: the verdict rests on the paper alone{tail}.")
    return " ".join(text)
