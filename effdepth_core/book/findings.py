"""What the numbers say: the findings of the book, generated from the results (never typed by
hand), one paragraph per question — scale, long-CoT training, task difficulty, and the questions of
the fourth section.

Each paragraph opens with one claim sentence (we agree / we disagree / we cannot tell, against the
paper's claim), then its evidence in numbers with 95 % bootstrap intervals, then the qualifications;
sentences stay short. The yardsticks are written here once:

- a *ratio difference* (ED + 1) / L is "no change" when its whole interval lies within ± the paper's
  own spread for that rule (across its models for scale, across its data sets for difficulty), a
  change when its whole interval lies beyond it, and cannot tell otherwise (``stats.interval_verdict``);
- an ED difference *grows* when its whole interval lies above 0;
- a rule artefact (``stats.artefact``: the rule fires in the first layers) never decides a verdict,
  the paper's cells and ours alike; nor does an interval over half the depth or from fewer than 20
  prompts — they are named as qualifications;
- the robustness rule (``stats.robust``): a verdict stands only when the same comparison gives it at
  every threshold of its rule's range and under two other bootstrap seeds; else cannot tell, and the
  sentence says which check it failed;
- a rank correlation over models or levels counts only when its permutation test can reach 5 %.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import polars as pl

from ..probes.pruning import FINAL_KEPT
from .reference import COMPARABLE, RULE_LABELS
from .stats import ALPHA, artefact, interval_verdict, robust

TASK_ORDER = ("hellaswag", "gsm8k", "aime24")  # the paper's difficulty order
TASK_NAMES = {"hellaswag": "HellaSwag", "gsm8k": "GSM8K", "aime24": "AIME24"}
CLAIMS = {
    "scale": "the number of effective layers grows with model size while the ratio (ED + 1) / L stays stable",
    "long_cot": "long-CoT (R1-distilled) models show no increase in effective depth over their base models",
    "difficulty": "effective depth stays consistent from HellaSwag to GSM8K to AIME24",
}
MINUS = "−"
WORDS = {"agree": "we agree", "disagree": "we disagree", "cannot tell": "we cannot tell"}


def _name(task: str) -> str:
    return TASK_NAMES.get(task, task)


def _signed(value: float, digits: int = 0) -> str:
    text = f"{abs(value):.{digits}f}"
    return f"+{text}" if value > 0 else f"{MINUS}{text}" if value < 0 else f"±{text}"


def _spread(tolerance: float) -> str:
    """The yardstick of a ratio difference, said where it is used."""
    return f"(no change within the paper's own spread, ±{tolerance:.2f})"


def _count(n: int, noun: str) -> str:
    """``1 model``, ``3 models``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _rho(value: float) -> str:
    """A correlation with its sign (the typographic minus), 0 unsigned."""
    return _signed(value, 2).replace("±", "")


def _range(low: float, high: float, digits: int = 2) -> str:
    """``0.37–0.61``, or one value when both ends are equal at that precision."""
    a, b = f"{low:.{digits}f}", f"{high:.{digits}f}"
    return a if a == b else f"{a}–{b}"


def _interval(row: Mapping, digits: int = 2) -> str:
    """``+0.03 [−0.02, +0.08]``."""
    if row.get("point") is None:
        return "undefined"
    if row.get("low") is None:
        return f"{_signed(row['point'], digits)} (no interval)"
    return f"{_signed(row['point'], digits)} [{_signed(row['low'], digits)}, {_signed(row['high'], digits)}]"


def _is_artefact(frame: pl.DataFrame, ed: str = "ed", n_layers: str = "n_layers") -> pl.Series:
    """``stats.artefact`` of each row (the paper's cells or ours: ED and L are all it reads)."""
    return pl.Series(
        [artefact(e, n) is not None for e, n in zip(frame[ed], frame[n_layers], strict=True)], dtype=pl.Boolean
    )


def clean_paper(paper: pl.DataFrame) -> pl.DataFrame:
    """The paper's cells without its rule artefacts."""
    return paper.filter(~_is_artefact(paper))


def decide(rows: pl.DataFrame, judge: Callable[[Mapping], str]) -> tuple[str, str | None, dict]:
    """The robustness rule over every check of one comparison (``rows``: an evidence frame's rows of
    it, ``variant`` "" the book's own): the verdict, why it is cannot tell (None when it stands),
    and the book's own row."""
    own = rows.filter(pl.col("variant") == "") if "variant" in rows.columns else rows
    others = rows.filter(pl.col("variant") != "") if "variant" in rows.columns else rows.clear()
    ordered = [*own.iter_rows(named=True), *others.iter_rows(named=True)]
    verdict, why = robust([(r.get("variant") or "", judge(r)) for r in ordered])
    return verdict, why, ordered[0]


def _own(frame: pl.DataFrame) -> pl.DataFrame:
    """The rows at the book's own threshold and seed."""
    return frame.filter(pl.col("variant") == "") if "variant" in frame.columns else frame


def _defined(summary: pl.DataFrame) -> pl.DataFrame:
    return summary.filter(pl.col("ed").is_not_null())


def _usable(summary: pl.DataFrame) -> pl.DataFrame:
    """Defined, not degenerate (when the summary says which are)."""
    rows = _defined(summary)
    return rows.filter(pl.col("degenerate").is_null()) if "degenerate" in rows.columns else rows


def paper_spread(paper: pl.DataFrame, rule: str, by: str) -> float:
    """The paper's own spread of the ratio for ``rule``: across its models (``by="model"``, each
    model's mean over the data sets) or across the data sets (``by="task"``, the largest within
    one model). Its rule artefacts are left out."""
    rows = clean_paper(paper).filter(pl.col("rule") == rule)
    if by == "model":
        means = rows.group_by("model").agg(pl.col("ratio").mean())["ratio"]
        return float(means.max() - means.min())
    spreads = rows.group_by("model").agg((pl.col("ratio").max() - pl.col("ratio").min()).alias("s"))["s"]
    return float(spreads.max())


def _combine(verdicts: Sequence[str]) -> str:
    """One verdict from several: any disagreement decides; all agreeing agrees; else cannot tell."""
    if not verdicts:
        return "cannot tell"
    if "disagree" in verdicts:
        return "disagree"
    return "agree" if all(v == "agree" for v in verdicts) else "cannot tell"


def degenerate_sentence(summary: pl.DataFrame) -> str | None:
    """The qualification naming every degenerate ED of a summary (left out of every verdict)."""
    if "degenerate" not in summary.columns:
        return None
    rows = summary.filter(pl.col("degenerate").is_not_null())
    if not rows.height:
        return None
    cells = "; ".join(f"{r['model']} {_name(r['task'])} {r['rule']} ED {r['ed']}" for r in rows.iter_rows(named=True))
    return f"Degenerate (see the methods page) and left out of the verdicts: {cells}."


def _test_words(row: Mapping, what: str, unit: str = "level") -> str:
    """A rank correlation with its test, or why it cannot be tested."""
    if row.get("same_ed") is not None:
        return f"{what}: the same ED ({row['same_ed']}) at all {row['levels']} {unit}s, no trend"
    if row.get("rho") is None:
        return f"{what}: too few points to rank"
    rho = _rho(row["rho"])
    if row.get("min_p") is not None and row["min_p"] > ALPHA:
        return f"{what} ρ = {rho}, untestable (smallest possible p {row['min_p']:.2f})"
    return f"{what} ρ = {rho} (permutation p = {row['p']:.2f})"


def _within_verdict(within: pl.DataFrame, paper: pl.DataFrame | None) -> tuple[str, list[str]]:
    """The within-family verdict — per rule, ED grows and the ratio stays within the paper's spread,
    pooled over the tasks, under every check of the robustness rule — and its evidence sentences."""
    verdicts, evidence = [], []
    if "variant" not in within.columns:  # one row per comparison: the book's own check only
        within = within.with_columns(pl.lit("").alias("variant"))
    for rule in RULE_LABELS.values():
        pooled = within.filter(rule=rule, task="all")
        if not pooled.filter(measure="ed").height or not pooled.filter(measure="ratio").height:
            continue
        tolerance = paper_spread(paper, rule, "model") if paper is not None else 0.05
        ed_rows = pooled.filter(measure="ed").select(pl.exclude("measure"))
        ratio_rows = pooled.filter(measure="ratio").select("variant", pl.col("low").alias("r_low"),
                                                           pl.col("high").alias("r_high"),
                                                           pl.col("point").alias("r_point"))  # fmt: skip
        joined = ed_rows.join(ratio_rows, on="variant", how="inner", maintain_order="left")

        def judge(r: Mapping, t: float = tolerance) -> str:
            grows = "agree" if r["low"] is not None and r["low"] > 0 else (
                "disagree" if r["high"] is not None and r["high"] < 0 else "cannot tell")  # fmt: skip
            return _combine([grows, interval_verdict(r["r_low"], r["r_high"], t)])

        verdict, why, own = decide(joined, judge)
        verdicts.append(verdict)
        ratio = {"point": own["r_point"], "low": own["r_low"], "high": own["r_high"]}
        evidence.append(
            f"{rule}: ED {_interval(own, 1)} layers, ratio {_interval(ratio)} {_spread(tolerance)}"
            + (f"; cannot tell: {why}" if why else "")
        )
    return _combine(verdicts), evidence


def _quantization(small: str, big: str) -> str:
    """ ", and the two are quantized differently (…)" where the offline models' quantizations differ."""
    from ..zoo import ZOO

    a, b = ZOO.get(small), ZOO.get(big)
    if a is None or b is None or a.quantization == b.quantization:
        return ""
    return f"; and the two are quantized differently ({small}: {a.quantization}; {big}: {b.quantization})"


def scale_finding(
    summary: pl.DataFrame,
    paper: pl.DataFrame | None = None,
    within: pl.DataFrame | None = None,
    across: pl.DataFrame | None = None,
) -> str:
    """Does ED grow with size while the ratio stays stable? Within one family (``within``:
    ``evidence.within_family``) and across families (``across``: ``evidence.across_models``) are
    separate statements; one model on its own page is placed against the paper's range."""
    rows = _usable(summary).filter(pl.col("task").is_in(TASK_ORDER))
    text = [f"**Model scale.** The paper finds that {CLAIMS['scale']}."]
    models = rows.select("model").unique()
    if models.height == 0:
        return text[0] + " We have no usable ED to compare: **we cannot tell**."
    clean = clean_paper(paper) if paper is not None else None
    if within is not None and within.height:
        small, big = within["small"][0], within["big"][0]
        verdict, evidence = _within_verdict(within, paper)
        per_task = _own(within).filter(pl.col("task") != "all", pl.col("measure") == "ed")
        pooled = [t for t in TASK_ORDER if per_task.filter(pl.col("task") == t, pl.col("excluded").is_null()).height]
        left = [t for t in TASK_ORDER if per_task.filter(pl.col("task") == t).height and t not in pooled]
        over = f", pooled over {' and '.join(_name(t) for t in pooled)}" if pooled else ""
        if left:
            over += f" ({', '.join(_name(t) for t in left)} not counted: too few prompts or degenerate)"
        text.append(
            f"Within one family, {small} → {big} on the same prompts{over}: **{WORDS[verdict]}**."
            if evidence
            else f"Within one family, {small} → {big}: no usable pair of EDs, **we cannot tell**."
        )
        text += [f"{line[0].upper()}{line[1:]}." for line in evidence]
        depth = summary.filter(pl.col("model") == big)["n_layers"]
        quantized = _quantization(small, big)
        if depth.len() and paper is not None:
            tolerance = paper_spread(paper, RULE_LABELS["cosine"], "model")
            text.append(
                f"The paper's spread is a wide margin: ±{tolerance:.2f} of the ratio is "
                f"±{tolerance * int(depth[0]):.1f} of {big}'s {int(depth[0])} layers{quantized}."
            )
    if across is not None and across.height and int(across["n_models"].max()) >= 2:
        n_models = int(across["n_models"].max())
        own_rows = across.filter(pl.col("against") == "parameters") if "against" in across.columns else across
        testable = [r for r in across.iter_rows(named=True) if r["min_p"] is not None and r["min_p"] <= ALPHA]
        verdict = (
            "cannot tell"
            if not testable
            else ("agree" if all(r["p"] <= ALPHA and r["rho"] > 0 for r in testable) else "cannot tell")
        )
        text.append(f"Across all {n_models} models: **{WORDS[verdict]}**.")
        for against in ("parameters", "layers"):
            rows_of = across.filter(pl.col("against") == against) if "against" in across.columns else across
            if not rows_of.height or (against == "layers" and "against" not in across.columns):
                continue
            what = "parameter count" if against == "parameters" else "depth L"
            untestable = [
                r["min_p"] for r in rows_of.iter_rows(named=True) if r["min_p"] is not None and r["min_p"] > ALPHA
            ]
            if untestable and len(untestable) == rows_of.height and rows_of["rho"].is_not_null().all():
                rhos = ", ".join(f"{r['rule']} {_rho(r['rho'])}" for r in rows_of.iter_rows(named=True))
                text.append(
                    f"Spearman ρ of mean ED with {what}: {rhos} — untestable with {n_models} models "
                    f"(no p below {min(untestable):.2f} is possible)."
                )
            else:
                tests = [_test_words(r, f"{r['rule']}") for r in rows_of.iter_rows(named=True)]
                text.append(f"Spearman of mean ED with {what}: " + "; ".join(tests) + ".")
        if "against" in across.columns:
            text.append(
                "Here L does not grow with size (the smallest model has the most layers), so ED follows depth L "
                "rather than parameter count, as a layer count must."
            )
        spreads = [
            f"{r['rule']} {_range(r['ratio_min'], r['ratio_max'])}"
            for r in own_rows.iter_rows(named=True)
            if r["ratio_min"] is not None
        ]
        if spreads:
            text.append(f"Their mean ratios span {'; '.join(spreads)} (cells of at least 20 prompts).")
    elif models.height == 1 and clean is not None:
        model = models["model"][0]
        parts = []
        for rule in RULE_LABELS.values():
            mine = rows.filter(pl.col("rule") == rule)
            if not mine.height:
                continue
            theirs = clean.filter(pl.col("rule") == rule)["ratio"]
            low, high = float(mine["ratio"].min()), float(mine["ratio"].max())
            p_low, p_high = float(theirs.min()), float(theirs.max())
            where = (
                "inside"
                if p_low - 1e-9 <= low and high <= p_high + 1e-9
                else ("outside" if high < p_low or low > p_high else "partly inside")
            )
            parts.append(f"{rule} {_range(low, high)}, {where} the paper's {_range(p_low, p_high)}")
        text.append(f"One model cannot show a trend: **we cannot tell** from {model} alone.")
        text.append(f"Its ratios: {'; '.join(parts)}.")
        twin = COMPARABLE.get(model)
        if twin is not None and paper is not None and paper.filter(pl.col("model") == twin).height:
            text.append(_like_for_like(rows, paper, model, twin))
    if models.height > 1 and paper is not None:
        for model in models["model"].to_list():
            twin = COMPARABLE.get(model)
            if twin is not None and paper.filter(pl.col("model") == twin).height:
                text.append(_like_for_like(rows, paper, model, twin))
    n = summary["n_examples"] if "n_examples" in summary.columns else None
    if n is not None and n.len():
        text.append(f"Prompts per cell: {int(n.min())}–{int(n.max())}; intervals count from 20 prompts.")
    qualification = degenerate_sentence(summary.filter(pl.col("task").is_in(TASK_ORDER)))
    if qualification:
        text.append(qualification)
    return " ".join(text)


def difficulty_finding(
    summary: pl.DataFrame,
    order: Sequence[str] = TASK_ORDER,
    paper: pl.DataFrame | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
    between: pl.DataFrame | None = None,
    trends: pl.DataFrame | None = None,
    scores: pl.DataFrame | None = None,
) -> str:
    """Does ED stay consistent across the data sets in ``order``? First within math (``trends``:
    ``evidence.level_trend`` rows with a ``group`` column; ``scores``: depth scores by level with
    intervals), then per model the ratio differences between successive data sets (``between``:
    ``evidence.between_tasks``, every check of the robustness rule) against the paper's own spread."""
    text = [f"**Task difficulty.** The paper finds that {CLAIMS['difficulty']}."]
    rows = _usable(summary)
    if rows.filter(pl.col("task").is_in(list(order))).is_empty():
        return text[0] + " We have no usable ED on these data sets: **we cannot tell**."
    if trends is not None and trends.height:
        for model in trends["model"].unique(maintain_order=True).to_list():
            for group, frame in trends.filter(model=model).group_by("group", maintain_order=True):
                what = "operand length" if "operand" in group[0] else "level"
                words = [_test_words(r, r["rule"], what) for r in frame.iter_rows(named=True)]
                text.append(
                    f"Within math, {model} by {group[0]}, rank correlation of {what} and ED: {'; '.join(words)}."
                )
    if scores is not None and scores.height:
        text.append(_depth_score_sentence(scores))
    per_model = []
    for model, decided in _task_steps(between, paper).items():
        verdicts, evidence, excluded = [], [], []
        for rule in RULE_LABELS.values():
            steps = []
            for step in (s for s in decided if s["rule"] == rule):
                if step["excluded"]:
                    excluded.append(f"{rule} {step['pair']} ({step['excluded'].split(': ', 1)[-1]})")
                    continue
                verdicts.append(step["verdict"])
                why = f" (cannot tell: {step['why']})" if step["why"] else ""
                steps.append(f"{step['pair']} {_interval(step['own'])}{why}")
            if steps:
                evidence.append(f"{rule} ratio {'; '.join(steps)} {_spread(decided[0]['tolerances'][rule])}")
        verdict = _combine(verdicts)
        per_model.append(verdict)
        text.append(f"{model}: **{WORDS[verdict]}**.")
        text += [f"{line[0].upper()}{line[1:]}." for line in evidence]
        if excluded:
            text.append(f"Not counted: {'; '.join(excluded)}.")
    if len(per_model) > 1:
        overall = per_model[0] if len(set(per_model)) == 1 else "cannot tell"
        text.append(f"Over the {len(per_model)} models: **{WORDS[overall]}**.")
    qualification = degenerate_sentence(summary)
    if qualification:
        text.append(qualification)
    return " ".join(text)


def _models_and_n(summary: pl.DataFrame) -> str:
    n = summary["n_examples"] if summary.height else None
    models = summary["model"].n_unique() if summary.height else 0
    return f"{_count(models, 'model')}, n {int(n.min())}–{int(n.max())}" if n is not None else "none"


def _ratio_cell(row: Mapping) -> str:
    return _interval(row) if row else "—"


def scale_headline(summary: pl.DataFrame, paper: pl.DataFrame | None, within: pl.DataFrame | None) -> dict:
    """The intro table's row of the scale question."""
    verdict, effect, tolerance = "cannot tell", "—", "—"
    if within is not None and within.height:
        verdict, _ = _within_verdict(within, paper)
        own = _own(within).filter(rule=RULE_LABELS["cosine"], task="all", measure="ratio")
        big = within["big"][0]
        depth = summary.filter(pl.col("model") == big)["n_layers"]
        if own.height:
            effect = f"cosine ratio {within['small'][0]} → {big}: {_interval(own.row(0, named=True))}"
        if paper is not None and depth.len():
            spread = paper_spread(paper, RULE_LABELS["cosine"], "model")
            tolerance = f"±{spread:.2f} ratio ≈ ±{spread * int(depth[0]):.1f} layers of {big}"
    return {
        "question": "Model scale",
        "claim": "ED grows with size, the ratio stays",
        "verdict": WORDS[verdict],
        "models": _models_and_n(_defined(summary)),
        "effect": effect,
        "tolerance": tolerance,
        "caveat": "one within-family pair, quantized differently; 4 models cannot reach p < 0.05 in a rank test",
    }


def difficulty_headline(summary: pl.DataFrame, between: pl.DataFrame | None, paper: pl.DataFrame | None) -> dict:
    """The intro table's row of the difficulty question."""
    effect, tolerance = "—", "—"
    if between is not None and between.height:
        steps = _own(between).filter(rule=RULE_LABELS["cosine"], first="hellaswag", second="gsm8k")
        points = [p for p in steps["point"].to_list() if p is not None]
        if points:
            effect = f"cosine ratio HellaSwag→GSM8K {_signed(min(points), 2)} to {_signed(max(points), 2)} over models"
    if paper is not None:
        spread = paper_spread(paper, RULE_LABELS["cosine"], "task")
        depth = summary["n_layers"] if summary.height else None
        if depth is not None:
            tolerance = f"±{spread:.2f} ratio ≈ ±{spread * int(depth.min()):.0f}–{spread * int(depth.max()):.0f} layers"
    return {
        "question": "Task difficulty",
        "claim": "ED stays consistent from HellaSwag to GSM8K to AIME24",
        "verdict": WORDS[difficulty_verdict(between, paper)],
        "models": _models_and_n(_defined(summary)),
        "effect": effect,
        "tolerance": tolerance,
        "caveat": "AIME24 at ≤ 400 tokens has 3–4 prompts (shown, not counted); a ≤ 1000-token cap on one model",
    }


def long_cot_headline(pairs: Sequence[Mapping], paper_pairs: pl.DataFrame | None) -> dict:
    """The intro table's row of the long-CoT question (no pair runs offline)."""
    return {
        "question": "Long-CoT training",
        "claim": "no increase in ED over the base model",
        "verdict": WORDS["cannot tell"],
        "models": f"{_count(len(pairs), 'pair')} (hub models, not offline)",
        "effect": "— (the paper's own deltas are on its page)",
        "tolerance": "—",
        "caveat": "no base / R1-distilled pair can be loaded without internet",
    }


HEADLINE_COLUMNS = {
    "question": "question",
    "claim": "the paper's claim",
    "verdict": "our verdict",
    "models": "models and n",
    "effect": "effect [95 % interval]",
    "tolerance": "tolerance",
    "caveat": "main caveat",
}


def headline_table(rows: Sequence[Mapping]) -> str:
    """The intro's one-screen summary: one Markdown row per question."""
    lines = ["| " + " | ".join(HEADLINE_COLUMNS.values()) + " |", "|" + "---|" * len(HEADLINE_COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(str(row[k]).replace("|", "/") for k in HEADLINE_COLUMNS) + " |")
    return "\n".join(lines)


def _task_steps(between: pl.DataFrame | None, paper: pl.DataFrame | None) -> dict[str, list[dict]]:
    """Per model, each step between two data sets per rule, decided by the robustness rule against
    the paper's spread: ``rule, pair, excluded, verdict, why, own`` (the book's own row) and the
    rules' ``tolerances``."""
    if between is None or not between.height:
        return {}
    tolerances = {r: paper_spread(paper, r, "task") if paper is not None else 0.05 for r in RULE_LABELS.values()}
    out: dict[str, list[dict]] = {}
    for model in between["model"].unique(maintain_order=True).to_list():
        steps = out.setdefault(model, [])
        for rule, tolerance in tolerances.items():
            for (first, second), checks in between.filter(model=model, rule=rule).group_by(
                ["first", "second"], maintain_order=True
            ):
                step = {"rule": rule, "pair": f"{_name(first)}→{_name(second)}", "tolerances": tolerances}
                own = _own(checks).row(0, named=True)
                if own["excluded"]:
                    steps.append({**step, "excluded": own["excluded"], "verdict": None, "why": None, "own": own})
                    continue
                verdict, why, own = decide(checks, lambda r, t=tolerance: interval_verdict(r["low"], r["high"], t))
                steps.append({**step, "excluded": None, "verdict": verdict, "why": why, "own": own})
    return out


def difficulty_verdict(between: pl.DataFrame | None, paper: pl.DataFrame | None) -> str:
    """The one verdict of the difficulty question over every model (the intro's table)."""
    per_model = [
        _combine([s["verdict"] for s in steps if not s["excluded"]]) for steps in _task_steps(between, paper).values()
    ]
    return per_model[0] if per_model and len(set(per_model)) == 1 else "cannot tell"


def _depth_score_sentence(scores: pl.DataFrame) -> str:
    """Depth score (share of the depth) per level with its interval, where the skip probe ran."""
    parts = []
    for r in scores.iter_rows(named=True):
        low, high = r.get("low"), r.get("high")
        interval = f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else ""
        parts.append(f"{r['task']} {r['value']:.2f}{interval} (n = {r['n']})")
    model = scores["model"][0]
    return (
        f"Depth score of {model} (the mean per prompt, as a share of the depth; skip probe) by level: "
        f"{'; '.join(parts)}."
    )


def _like_for_like(ours: pl.DataFrame, paper: pl.DataFrame, model: str, twin: str) -> str:
    """Our EDs beside the paper's model of the same architecture and depth, per rule and data set."""
    parts, gaps = [], []
    for rule in RULE_LABELS.values():
        mine, theirs = [], []
        for task in TASK_ORDER:
            a = ours.filter(pl.col("model") == model, pl.col("rule") == rule, pl.col("task") == task)
            b = paper.filter(pl.col("model") == twin, pl.col("rule") == rule, pl.col("task") == task)
            if a.height and b.height and a["ed"][0] is not None and b["ed"][0] is not None:
                mine.append(str(a["ed"][0]))
                theirs.append(str(b["ed"][0]))
                gaps.append(abs(int(a["ed"][0]) - int(b["ed"][0])))
        if mine:
            parts.append(f"{rule} {'/'.join(mine)} against {'/'.join(theirs)}")
    if not parts:
        return ""
    order = "/".join(_name(t) for t in TASK_ORDER)
    return (
        f"**Like for like:** beside the paper's {twin} (bf16; same architecture and depth), our {model} "
        f"(4-bit, coder-tuned) gives EDs ({order}) within {_count(max(gaps), 'layer')} of its: {'; '.join(parts)}."
    )


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
        text.append(f"Not measured here: {_count(len(models), 'model')}, {reason}.")
    largest = None
    if paper is not None and pairs:
        from .reference import pair_deltas

        depth = {str(m).rsplit("/", 1)[-1]: n for m, n in paper.select("model", "n_layers").unique().iter_rows()}
        deltas = pair_deltas(paper, list(pairs))
        deltas = deltas.with_columns(
            pl.Series(
                [
                    artefact(min(a, b), depth.get(base, 0)) is not None
                    for a, b, base in zip(deltas["ed_base"], deltas["ed_long_cot"], deltas["base"], strict=True)
                ],
                dtype=pl.Boolean,
            ).alias("artefact")
        )
        if deltas.height:
            by_pair = []
            for (base, long_cot), frame in deltas.group_by("base", "long_cot", maintain_order=True):
                values = []
                for rule in RULE_LABELS.values():
                    cells = {r["task"]: r for r in frame.filter(pl.col("rule") == rule).iter_rows(named=True)}
                    marks = [
                        _signed(cells[t]["delta"]) + ("*" if cells[t]["artefact"] else "")
                        for t in TASK_ORDER
                        if t in cells
                    ]
                    values.append(f"{rule} {'/'.join(marks)}")
                by_pair.append(f"{long_cot} − {base}: {'; '.join(values)}")
            clean = deltas.filter(~pl.col("artefact"))
            largest = int(clean["delta"].abs().max()) if clean.height else None
            star = (
                " (* an ED in the first layers: a rule artefact by the test applied to every cell, left out)"
                if deltas.height > clean.height
                else ""
            )
            text.append(f"The paper's deltas ({order}): " + " | ".join(by_pair) + star + ".")
    if not measured_any:
        tail = "" if largest is None else f"; apart from artefacts its changes are at most {_count(largest, 'layer')}"
        text.append(f"With no pair measured here, **we cannot tell**: the verdict rests on the paper alone{tail}.")
    return " ".join(text)


# --- beyond the paper (method.md §7–§7b) ----------------------------------------------------------
# A pruning choice *wins* when its ΔNLL is the least of the three rules (the fourth section).


def lens_finding(summary: pl.DataFrame, fit: pl.DataFrame | None = None, lenses: pl.DataFrame | None = None) -> str:
    """Is ED an artefact of the logit lens? The paired difference ED(tuned) − ED(logit) per model,
    task and lens rule (``lenses``: ``evidence.between_lenses``): no when every usable difference
    lies within ±1 layer, yes when every one lies beyond it, in part when some provably move and some
    provably stay, a qualified yes or no when the others' intervals reach across ±1, else cannot tell;
    degenerate EDs and
    intervals from fewer than 20 prompts never count. And how well the translators fit."""
    question = "**Is ED an artefact of the logit lens?**"
    if lenses is None or not lenses.height:
        return f"{question} No tuned lens was run on this page: **we cannot tell**."
    usable = lenses.filter(pl.col("excluded").is_null())
    decided = []  # (verdict, why, the book's own row) per model, task and lens rule
    for _, checks in usable.group_by(["model", "task", "lens_rule"], maintain_order=True):
        if _own(checks)["low"][0] is not None:
            decided.append(decide(checks, lambda r: interval_verdict(r["low"], r["high"], 1.0)))
    verdicts = [verdict for verdict, _, _ in decided]
    if not verdicts:
        answer = "**we cannot tell**: no usable pair of EDs"
    elif all(v == "agree" for v in verdicts):
        answer = "**no**: the tuned lens puts every usable ED within a layer of the logit lens's"
    elif all(v == "disagree" for v in verdicts):
        answer = "**yes**: every usable tuned-lens ED moves by more than a layer"
    else:
        moved = sum(v == "disagree" for v in verdicts)
        stayed = sum(v == "agree" for v in verdicts)
        unclear = len(verdicts) - moved - stayed  # intervals that reach across ±1 layer
        of = f"of {len(verdicts)} usable EDs"
        tail = f"; {unclear} cannot tell (an interval across ±1 layer, or a robustness check failed)" if unclear else ""
        if moved and stayed:  # some EDs provably move, some provably stay: a mixed answer
            stay = "stays" if stayed == 1 else "stay"
            answer = f"**in part**: {moved} {of} move by more than a layer, {stayed} {stay}{tail}"
        elif moved:  # the rest cannot be told apart from ±1: a yes as far as the intervals can tell
            answer = f"**yes, where the intervals can tell**: {moved} {of} move by more than a layer{tail}"
        elif stayed:
            answer = f"**no, where the intervals can tell**: {stayed} {of} stay within a layer{tail}"
        else:
            answer = f"**we cannot tell**: all {len(verdicts)} intervals reach across ±1 layer"
    text = [f"{question} {answer}."]
    for model in dict.fromkeys(own["model"] for _, _, own in decided):
        cells = [
            f"{_name(own['task'])} {own['lens_rule']} {_interval(own, 1)}" + (f" (cannot tell: {why})" if why else "")
            for _, why, own in decided
            if own["model"] == model
        ]
        text.append(f"{model}, tuned − logit in layers: {'; '.join(cells)}.")
    excluded = _own(lenses).filter(pl.col("excluded").is_not_null())
    if excluded.height:
        cells = [f"{r['model']} {_name(r['task'])} {r['lens_rule']}" for r in excluded.iter_rows(named=True)]
        text.append(f"Not counted (degenerate, or fewer than 20 prompts): {'; '.join(cells)}.")
    if fit is not None and fit.height:
        sentences = []
        for model in lenses["model"].unique(maintain_order=True):
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
                f"{model} at {better} of {wide.height} layers (mean {wide['heldout_kl_logit'].mean():.2f} → "
                f"{wide['heldout_kl_tuned'].mean():.2f} nats)"
            )
        if sentences:
            text.append(
                "The translators lower the held-out KL to the final distribution: " + "; ".join(sentences) + "."
            )
    return " ".join(text)


def _prune_verdict(rows: pl.DataFrame) -> str:
    """The verdict over a variant's counted budgets (``evidence.pruning_costs`` rows)."""
    counts = {v: rows.filter(verdict=v).height for v in ("cheaper", "costlier", "unclear", "tie")}
    total = rows.height
    ties = f", {_count(counts['tie'], 'tie')} (the same layers)" if counts["tie"] else ""
    if counts["cheaper"] == total:
        return f"**yes**: cheaper in {'the one budget' if total == 1 else f'all {total} budgets'}"
    if counts["cheaper"] and counts["costlier"]:
        return (
            f"**sometimes**: cheaper in {counts['cheaper']} and costlier in {counts['costlier']} of {total} "
            f"budgets{ties}"
        )
    if counts["costlier"] and not counts["cheaper"] and not counts["unclear"]:
        return f"**no**: costlier in {counts['costlier']} of {total} budgets{ties}"
    if counts["tie"] == total:
        return "**a tie**: every rule picks the same layers"
    return (
        f"**we cannot tell**: {counts['unclear']} of {total} budgets have an interval across zero or change with the "
        f"bootstrap seed (cheaper in {counts['cheaper']}, costlier in {counts['costlier']}{ties})"
    )


def pruning_finding(costs: pl.DataFrame, ed_rule: str = "lens overlap") -> str:
    """Is the block right after ED (of ``ed_rule``, one rule so that the verdict is not the best of
    several tries) cheaper to cut than the layers angular distance or block influence choose, budget
    by budget, with intervals over prompts? ``costs``: ``evidence.pruning_costs`` rows. The plain
    block and the one that keeps the final layer each get a verdict; runs with fewer prompts than
    ``evidence.MIN_PRUNE_N`` are named, never counted."""
    from .evidence import MIN_PRUNE_N

    question = (
        f"**Is the block right after ED ({ed_rule}) cheaper to cut than the layers angular distance or block "
        "influence choose?**"
    )
    if not costs.height:
        return f"{question} Not measured here: **we cannot tell**."
    counted = costs.filter("counted")
    if not counted.height:
        return (
            f"{question} Only runs of fewer than {MIN_PRUNE_N} prompts (n = {costs['n'].max()}), too few to resample: "
            "**we cannot tell**."
        )
    text = [question]
    for variant, name in (("", "The block after ED"), (FINAL_KEPT, "Kept off the final layer, it")):
        rows = counted.filter(variant=variant)
        if rows.height:
            text.append(f"{name}: {_prune_verdict(rows)}.")
    cells = []
    for (model, task), group in counted.filter(variant="").group_by(["model", "task"], maintain_order=True):
        largest = group.filter(k=group["k"].max()).row(0, named=True)
        kept = counted.filter(model=model, task=task, k=largest["k"], variant=FINAL_KEPT)

        def multiple(row: dict) -> str:
            if row["ratio"] is None:
                return f"{row['difference']:+.2f} nats [{row['low']:+.2f}, {row['high']:+.2f}] over it"
            spread = f" [{row['ratio_low']:.1f}, {row['ratio_high']:.1f}]" if row["ratio_low"] is not None else " [—]"
            return f"{row['ratio']:.1f}×{spread}"

        cell = (
            f"{model} {_name(task)}, {largest['k']} layers ({largest['removed']}): {multiple(largest)} the best "
            f"alternative's ΔNLL ({largest['best_alternative']} {largest['best_delta_nll']:+.2f} nats)"
        )
        if kept.height:
            cell += f", kept off the final layer ({kept['removed'][0]}) {multiple(kept.row(0, named=True))}"
        cells.append(cell + f", n = {largest['n']}")
    text.append(f"At the largest budget: {'; '.join(cells)} (95 % intervals over prompts).")
    plain = counted.filter(variant="")
    holding = plain.filter("holds_final").height
    if holding:
        text.append(
            f"Caveat: in {holding} of {plain.height} budgets the block after ED removes the final layer (it is "
            "moved back to end there when ED + k passes it); the kept-off variant ends one layer earlier."
        )
    few = costs.filter(~pl.col("counted")).select("model", "task", "n").unique(maintain_order=True)
    if few.height:
        named = ", ".join(f"{r['model']} {_name(r['task'])} (n = {r['n']})" for r in few.iter_rows(named=True))
        text.append(f"Shown, not counted (fewer than {MIN_PRUNE_N} prompts): {named}.")
    return " ".join(text)


def early_exit_finding(costs: pl.DataFrame, rule: str = "lens overlap") -> str:
    """What exiting right after ED buys (layers saved) and costs (tokens whose top-1 changes, the
    answer NLL), with intervals over prompts, and what it says of the layers after ED: if exiting
    there costs answer likelihood in every counted run, they are not idle. ``costs``:
    ``evidence.early_exit_costs`` rows."""
    from .evidence import MIN_PRUNE_N

    question = f"**What does exiting at ED (the {rule} rule) cost?**"
    if not costs.height:
        return f"{question} The early-exit probe was not run here, or no usable ED to exit at: **we cannot tell**."
    counted = costs.filter("counted")
    cells = [
        f"{r['model']} {_name(r['task'])} ({r['lens']} lens, exit after layer {r['exit_layer'] - 1} of "
        f"{r['n_layers']}): "
        f"saves {r['saved']:.0%}, {r['kept']:.0%} [{r['kept_low']:.0%}, {r['kept_high']:.0%}] of tokens keep their "
        f"final top-1, answer NLL {r['cost']:+.2f} [{r['cost_low']:+.2f}, {r['cost_high']:+.2f}] nats, n = {r['n']}"
        + ("" if r["counted"] else " (not counted)")
        for r in costs.iter_rows(named=True)
    ]
    if not counted.height:
        verdict = f"only runs of fewer than {MIN_PRUNE_N} prompts: **we cannot tell**"
    elif counted["positive"].all():
        verdict = (
            f"**the layers after ED are not idle**: exiting there raises the answer NLL in all "
            f"{_count(counted.height, 'counted run')}, every interval above zero under three bootstrap seeds"
        )
    else:
        verdict = (
            f"**we cannot tell** whether the layers after ED matter: in {counted.filter(~pl.col('positive')).height} "
            f"of {counted.height} counted runs the cost's interval reaches zero (or does under another seed)"
        )
    return f"{question} {verdict}. " + "; ".join(cells) + " (95 % intervals over prompts)."


def map_finding(mapped: pl.DataFrame, small: str, big: str, statistic: Mapping | None = None) -> str:
    """Does the big model stretch the small one? The share of the small model's inner layers whose
    best-predicted big layer lies within ``evidence.STRETCH_SLACK`` of equal relative depth, with its bootstrap
    interval over test prompts (``statistic``: ``evidence.map_statistic``), against the shuffled-pairing
    baseline and the self-map check."""
    question = f"**Does {big} stretch the computation of {small}?**"
    if not {"small_layer", "big_layer", "metric", "value"} <= set(mapped.columns) or statistic is None:
        return f"{question} The map was not computed: **we cannot tell**."
    share, low, high = statistic["share"], statistic["low"], statistic["high"]
    exact = statistic["self_max"] < 1e-3  # float64 normal equations: the identity to many digits

    def follows(low_: float, high_: float) -> str | None:
        return "yes" if low_ >= 2 / 3 else "no" if high_ <= 1 / 3 else None

    raw = follows(low, high)
    column_free = follows(statistic["centred_low"], statistic["centred_high"])
    if not exact:
        verdict = "**we cannot tell**: mapped onto itself the small model does not give the identity"
    elif statistic["beats_baseline"] < 0.5:
        verdict = "**we cannot tell**: the maps are no better than maps fitted on shuffled token pairs"
    elif raw is not None and raw != column_free:
        verdict = (
            "**we cannot tell**: with each big layer's mean error removed (the column-bias check) it does not hold"
        )
    elif raw == "yes":
        verdict = "**yes**: the best layers follow equal relative depth"
    elif raw == "no":
        verdict = "**no**: the best layers do not follow equal relative depth"
    else:
        verdict = "**we cannot tell**: the interval straddles both thresholds (⅓ and ⅔ of the layers)"
    text = [f"{question} {verdict}."]
    text.append(
        f"For {share:.0%} [{low:.0%}, {high:.0%}] of the {statistic['inner']} inner layers of {small} the best "
        f"{big} layer lies within {statistic['slack']:.1f} layers of equal relative depth; a best layer drawn "
        f"at random would do so for {statistic['chance']:.0%}."
    )
    text.append(
        f"Column bias: {big}'s layer {statistic['easiest_big_layer']} is the easiest to predict (mean error over "
        f"the small layers {statistic['column_low']:.2f}, the hardest {statistic['column_high']:.2f}); with each big "
        f"layer's mean removed the share is {statistic['centred_share']:.0%} "
        f"[{statistic['centred_low']:.0%}, {statistic['centred_high']:.0%}]."
    )
    text.append(
        f"Best-layer errors are {statistic['best_low']:.2f}–{statistic['best_high']:.2f}; shuffled pairs give "
        f"{statistic['baseline_low']:.2f}–{statistic['baseline_high']:.2f} there."
    )
    layer0 = statistic.get("self_layer0")
    embeddings = (
        f"; at layer 0, the token embeddings, {layer0:.2f}: test tokens the training prompts never held"
        if layer0 is not None and layer0 >= 1e-3
        else ""
    )
    text.append(
        f"Mapped onto itself by the same fit (ridge chosen per map), {small} gives at most "
        f"{statistic['self_max']:.1e} on the diagonal "
        "beyond layer 0"
        + (f" (the identity, as it must{embeddings})." if exact else ": not the identity, so the fit is in doubt.")
    )
    ratio = statistic["train_tokens"] / statistic["width"]
    text.append(
        f"The maps fit on {statistic['train_tokens']:.0f} tokens ({ratio:.0f}× the width of {small}), each map's ridge "
        f"chosen on held-out prompts; {statistic['test_prompts']:.0f} test prompts."
    )
    return " ".join(text)


def beyond_finding(
    summary: pl.DataFrame,
    fit: pl.DataFrame,
    costs: pl.DataFrame,
    exits: pl.DataFrame,
    mapped: pl.DataFrame | None = None,
    pair: Mapping | None = None,
    lenses: pl.DataFrame | None = None,
    statistic: Mapping | None = None,
) -> str:
    """The paragraphs of a "beyond the paper" page: the map's, or the lens, pruning and early-exit ones
    (``costs``: ``evidence.pruning_costs``; ``exits``: ``evidence.early_exit_costs``)."""
    paragraphs = []
    if pair:
        mapped = mapped if mapped is not None else pl.DataFrame()
        paragraphs.append(map_finding(mapped, pair["small"], pair["big"], statistic))
    if summary.height:
        paragraphs += [
            lens_finding(summary, fit, lenses),
            pruning_finding(costs),
            early_exit_finding(exits),
        ]
    return "\n\n".join(paragraphs) or "Nothing was measured on this page."
