"""What the numbers say: the findings of the book, generated from the results (never typed by
hand), one paragraph per question — scale, long-CoT training, task difficulty, and the questions of
the fourth section.

Each paragraph opens with one claim sentence (we agree / we disagree / we cannot tell, against the
paper's claim), then its evidence in numbers with 95 % bootstrap intervals, then the qualifications;
sentences stay short. The yardsticks are written here once:

- every comparison is of each rule's primary statistic (``depth.primary_statistic``: threshold-free,
  continuous, in layers); the paper's integer ED stands beside it as a panel and decides nothing;
- a *ratio difference* (x + 1) / L faces two tests, stated separately (``depth.compare``): a
  difference (its interval excludes 0) and equivalence (its interval lies within ± the margin: the
  pre-registered one layer of the deeper model, 1/L (``params/common.yml``: ``analysis``), or, as an
  alternative of the specification curve, the paper's own spread for that rule — across its models
  for scale, across its data sets for difficulty — never less than one layer). Verdicts:
  agree, a small difference within the margin, disagree (the whole interval beyond it), or
  cannot tell;
- a depth difference *grows* when its whole interval lies above 0;
- a rule artefact (``depth.artefact``: the statistic sits in the first layers) never decides a
  verdict, the paper's cells and ours alike; nor does an interval over half the depth or from fewer
  than 20 prompts — they are named as qualifications;
- the robustness rule (``depth.robust``): a verdict stands only when the same comparison gives it
  under two other bootstrap seeds (no threshold can move a threshold-free statistic); else cannot
  tell, and the sentence says which check it failed;
- a rank correlation over models or levels counts only when its permutation test can reach 5 %.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import polars as pl

from effdepth_core.measurement.depth import ALPHA, artefact, compare, margin, robust

from .reference import COMPARABLE, RULE_LABELS

TASK_ORDER = ("hellaswag", "gsm8k", "aime24")  # the paper's difficulty order
TASK_NAMES = {"hellaswag": "HellaSwag", "gsm8k": "GSM8K", "aime24": "AIME24"}
CLAIMS = {
    "scale": "the number of effective layers grows with model size while the ratio (ED + 1) / L stays stable",
    "long_cot": "long-CoT (R1-distilled) models show no increase in effective depth over their base models",
    "difficulty": "effective depth stays consistent from HellaSwag to GSM8K to AIME24",
}
MINUS = "−"
SMALL = "a small difference within the margin"
WORDS = {"agree": "we agree", "disagree": "we disagree", "cannot tell": "we cannot tell", SMALL: f"we agree: {SMALL}"}


def task_name(task: str) -> str:
    return TASK_NAMES.get(task, task)


def signed(value: float, digits: int = 0) -> str:
    text = f"{abs(value):.{digits}f}"
    return f"+{text}" if value > 0 else f"{MINUS}{text}" if value < 0 else f"±{text}"


def _spread(tolerance: float, how: str = "one layer") -> str:
    """The yardstick of a ratio difference, said where it is used: a definition, never a verdict
    (the verdict is the bold phrase; a referee read the old "no change within …" as one)."""
    what = "one layer of the model, pre-registered" if how == "one layer" else f"the {how} spread, at least one layer"
    return f"(“no change” means within the margin ±{tolerance:.2f}: {what})"


def judge(low: float | None, high: float | None, tolerance: float) -> str:
    """The verdict of one ratio difference's interval against the margin (``depth.compare``)."""
    return compare(low, high, tolerance).verdict


def tolerance_of(spread: float, n_layers: int | None) -> float:
    """The margin of a ratio difference: the paper's spread, at least one layer of the deeper model."""
    return margin(spread, int(n_layers)) if n_layers else spread


def margin_for(paper: pl.DataFrame | None, rule: str, by: str, n_layers: int | None, how: str = "one layer") -> float:
    """The margin of a ratio difference under the pre-registered margin ``how``
    (``specification.CHOICES["margin"]``): one layer of the deeper model, or the paper's median or
    largest spread of the rule (across its models, ``by="model"``, or its data sets, ``by="task"``),
    at least one layer."""
    if how == "one layer" and n_layers:
        return 1 / int(n_layers)
    from .specification import paper_margins

    spreads = paper_margins(paper, rule, by)
    spread = spreads.get(how if how != "one layer" else "paper max")
    return tolerance_of(0.05 if spread is None else spread, n_layers)


def ed_panel(row: Mapping, digits: int = 2) -> str:
    """The paper's integer ED beside the primary statistic: ``; integer ED +4 [+4, +4]`` (an integer
    statistic's interval may be zero-width, and says so by its name)."""
    if row.get("ed_point") is None:
        return ""
    if row.get("ed_low") is None:
        return f"; the paper's integer ED {signed(row['ed_point'], digits)}"
    ends = f"[{signed(row['ed_low'], digits)}, {signed(row['ed_high'], digits)}]"
    return f"; the paper's integer ED {signed(row['ed_point'], digits)} {ends}"


def count_of(n: int, noun: str) -> str:
    """``1 model``, ``3 models``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _rho(value: float) -> str:
    """A correlation with its sign (the typographic minus), 0 unsigned."""
    return signed(value, 2).replace("±", "")


def _range(low: float, high: float, digits: int = 2) -> str:
    """``0.37–0.61``, or one value when both ends are equal at that precision."""
    a, b = f"{low:.{digits}f}", f"{high:.{digits}f}"
    return a if a == b else f"{a}–{b}"


def interval_text(row: Mapping, digits: int = 2) -> str:
    """``+0.03 [−0.02, +0.08]``."""
    if row.get("point") is None:
        return "undefined"
    if row.get("low") is None:
        return f"{signed(row['point'], digits)} (no interval)"
    return f"{signed(row['point'], digits)} [{signed(row['low'], digits)}, {signed(row['high'], digits)}]"


def _is_artefact(frame: pl.DataFrame, ed: str = "ed", n_layers: str = "n_layers") -> pl.Series:
    """``depth.artefact`` of each row (the paper's cells or ours: ED and L are all it reads)."""
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


def own_cells(frame: pl.DataFrame) -> pl.DataFrame:
    """The rows at the book's own threshold and seed."""
    return frame.filter(pl.col("variant") == "") if "variant" in frame.columns else frame


def defined_cells(summary: pl.DataFrame) -> pl.DataFrame:
    return summary.filter(pl.col("ed").is_not_null())


def _usable(summary: pl.DataFrame) -> pl.DataFrame:
    """Defined, not degenerate (when the summary says which are)."""
    rows = defined_cells(summary)
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
    """One verdict from several: any disagreement decides; all within the margin agree (with a
    small difference when any interval excludes 0); else cannot tell."""
    if not verdicts:
        return "cannot tell"
    if "disagree" in verdicts:
        return "disagree"
    if all(v in ("agree", SMALL) for v in verdicts):
        return SMALL if SMALL in verdicts else "agree"
    return "cannot tell"


def degenerate_sentence(summary: pl.DataFrame) -> str | None:
    """The qualification naming every degenerate depth of a summary: the primary statistic's (left
    out of every verdict) and the paper's integer ED's (its panel only)."""
    sentences = []
    for flag, value, what in (
        ("depth_degenerate", "depth", "Degenerate primary statistics (see the methods page), left out of the verdicts"),
        ("degenerate", "ed", "Degenerate integer EDs (the paper's rule; its panel only, the verdicts do not read it)"),
    ):
        if flag not in summary.columns:
            continue
        rows = summary.filter(pl.col(flag).is_not_null())
        if rows.height:
            cells = "; ".join(
                f"{r['model']} {task_name(r['task'])} {r['rule']} {'ED' if value == 'ed' else 'depth'} "
                f"{_number(r[value])}"
                for r in rows.iter_rows(named=True)
            )
            sentences.append(f"{what}: {cells}.")
    return " ".join(sentences) or None


def _with_details(head: Sequence[str], rest: Sequence[str]) -> str:
    """A finding a reader reads: the verdict sentences, then every number behind them folded in a
    details block (open it for the full account)."""
    if not rest:
        return " ".join(head)
    return (
        " ".join(head)
        + "\n\n<details><summary>The full account: every number behind the verdict</summary>\n\n"
        + (" ".join(rest) + "\n\n</details>")
    )


def opposite_directions(rows: Sequence[Mapping], name: Callable[[Mapping], str]) -> tuple[list[str], list[str]]:
    """The comparisons where the paper's integer ED and the primary statistic part ways: opposite
    signs (both moving), and an integer ED that does not move where the statistic's interval excludes
    0 (each named by ``name``)."""
    opposite, still = [], []
    for r in rows:
        point, ed = r.get("point"), r.get("ed_point")
        if point is None or ed is None:
            continue
        if point * ed < 0:
            opposite.append(f"{name(r)} (statistic {signed(point, 3)}, integer ED {signed(ed, 3)})")
        elif ed == 0 and r.get("low") is not None and (r["low"] > 0 or r["high"] < 0):
            still.append(f"{name(r)} (statistic {signed(point, 3)})")
    return opposite, still


def opposite_sentence(opposite: Sequence[str], still: Sequence[str]) -> str | None:
    """Where the integer ED and the statistic part ways, and why (method.md §12)."""
    parts = []
    if opposite:
        parts.append(f"move in opposite directions in {'; '.join(opposite)}")
    if still:
        parts.append(f"the integer ED does not move where the statistic does in {'; '.join(still)}")
    if not parts:
        return None
    return (
        f"The paper's integer ED and the primary statistic {', and '.join(parts)}: the integer ED reads one "
        "threshold at whole layers (its step can land on either side of a small shift), the statistic reads the "
        "whole curve between layers (method.md §12); the verdicts read the statistic."
    )


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def _test_words(row: Mapping, what: str, unit: str = "level") -> str:
    """A rank correlation with its test, or why it cannot be tested."""
    if row.get("same_ed") is not None:
        return f"{what}: the same depth ({_number(row['same_ed'])}) at all {row['levels']} {unit}s, no trend"
    if row.get("rho") is None:
        return f"{what}: too few points to rank"
    rho = _rho(row["rho"])
    if row.get("min_p") is not None and row["min_p"] > ALPHA:
        return f"{what} ρ = {rho}, untestable (smallest possible p {row['min_p']:.2f})"
    return f"{what} ρ = {rho} (permutation p = {row['p']:.2f})"


def _within_verdict(
    within: pl.DataFrame, paper: pl.DataFrame | None, n_layers: int | None = None, how: str = "one layer"
) -> tuple[str, list[str], str]:
    """The within-family verdict — per rule, the primary statistic grows (its interval in layers
    above 0) and the ratio stays within the margin (``how``: one of the ``n_layers`` of the deeper
    model, pre-registered, or a paper spread at least that), pooled over the tasks, under every check of the robustness
    rule — its evidence sentences, and the first rule's failed check (``""`` when none failed)."""
    verdicts, evidence, failed = [], [], ""
    if "variant" not in within.columns:  # one row per comparison: the book's own check only
        within = within.with_columns(pl.lit("").alias("variant"))
    for rule in RULE_LABELS.values():
        pooled = within.filter(rule=rule, task="all")
        if not pooled.filter(measure="ed").height or not pooled.filter(measure="ratio").height:
            continue
        tolerance = margin_for(paper, rule, "model", n_layers, how)
        ed_rows = pooled.filter(measure="ed").select(pl.exclude("measure"))
        ratio_rows = pooled.filter(measure="ratio").select(
            "variant",
            pl.col("low").alias("r_low"),
            pl.col("high").alias("r_high"),
            pl.col("point").alias("r_point"),
            *([pl.col("ed_point").alias("r_ed")] if "ed_point" in pooled.columns else []),
        )
        joined = ed_rows.join(ratio_rows, on="variant", how="inner", maintain_order="left")

        def judged(r: Mapping, t: float = tolerance) -> str:
            grows = "agree" if r["low"] is not None and r["low"] > 0 else (
                "disagree" if r["high"] is not None and r["high"] < 0 else "cannot tell")  # fmt: skip
            return _combine([grows, judge(r["r_low"], r["r_high"], t)])

        verdict, why, own = decide(joined, judged)
        if verdict == "cannot tell" and why is None:  # no check disagreed: say which test failed
            why = compare(own["r_low"], own["r_high"], tolerance).reason or "the depth's interval includes 0"
        if why and not failed:
            failed = f"{rule} fails a check ({why})"
        verdicts.append(verdict)
        ratio = {"point": own["r_point"], "low": own["r_low"], "high": own["r_high"], "ed_point": own.get("r_ed")}
        evidence.append(
            f"{rule}: depth {interval_text(own, 1)} layers, ratio {interval_text(ratio)} {_spread(tolerance, how)}"
            + ed_panel(ratio)
            + (f"; cannot tell: {why}" if why else "")
        )
    return _combine(verdicts), evidence, failed


def _quantization(small: str, big: str) -> str:
    """ ", and the two are quantized differently (…)" where the offline models' quantizations differ."""
    from effdepth_core.zoo import ZOO

    a, b = ZOO.get(small), ZOO.get(big)
    if a is None or b is None or a.quantization == b.quantization:
        return ""
    return f"; and the two are quantized differently ({small}: {a.quantization}; {big}: {b.quantization})"


def quantization_sentence(control: pl.DataFrame | None, pair: Sequence[str], how: str = "one layer") -> str | None:
    """How far one more requantization moves the primary statistic of the pair's members: the
    largest shift with its interval, the farthest any interval reaches, and the members and data
    sets it was measured on (None when the control was not run on any of them)."""
    if control is None or not control.height:
        return None
    moved = control.filter(pl.col("shift").is_not_null())
    if not moved.height:
        return None
    worst = moved.sort(pl.col("shift").abs(), descending=True).row(0, named=True)
    rule = {"cosine": "cosine", "logit_lens_kl": "lens KL", "logit_lens_overlap": "lens overlap"}.get(
        worst["rule"], worst["rule"]
    )
    reach = max(abs(v) for v in (*moved["low"].drop_nulls(), *moved["high"].drop_nulls(), *moved["shift"]))
    where = "; ".join(
        f"{m} on {', '.join(task_name(t) for t in moved.filter(model=m)['task'].unique(maintain_order=True))}"
        for m in pair
        if moved.filter(model=m).height
    )
    missing = [m for m in pair if not moved.filter(model=m).height]
    unmeasured = f"; not measured on {', '.join(missing)}" if missing else ""
    shift = {"point": worst["shift"], "low": worst["low"], "high": worst["high"]}
    quant = ", ".join(moved["quant"].unique(maintain_order=True).to_list())
    return (
        f"Quantization control: one more requantization ({quant}) of every weight matrix moves the pair's "
        f"primary statistics by up to {abs(worst['shift']):.2f} layers ({worst['model']} "
        f"{task_name(worst['task'])} {rule}: {interval_text(shift)}, n = {worst['n']} prompts), every interval "
        f"within ±{reach:.2f} layers (measured on {where}{unmeasured}), against the margin of {how}."
    )


def scale_finding(
    summary: pl.DataFrame,
    paper: pl.DataFrame | None = None,
    within: pl.DataFrame | None = None,
    across: pl.DataFrame | None = None,
    how: str = "one layer",
    quantization: pl.DataFrame | None = None,
) -> str:
    """Does ED grow with size while the ratio stays stable? Within one family (``within``:
    ``evidence.within_family``) and across families (``across``: ``evidence.across_models``) are
    separate statements; one model on its own page is placed against the paper's range. The
    quantization control (``quantization``: ``evidence.quantization_control`` of the pair) is stated
    beside the within-family verdict."""
    rows = _usable(summary).filter(pl.col("task").is_in(TASK_ORDER))
    text = [f"**Model scale.** The paper finds that {CLAIMS['scale']}."]
    head = {0}  # the sentences that carry a verdict; the rest is folded beneath them
    models = rows.select("model").unique()
    if models.height == 0:
        return text[0] + " We have no usable ED to compare: **we cannot tell**."
    clean = clean_paper(paper) if paper is not None else None
    if within is not None and within.height:
        small, big = within["small"][0], within["big"][0]
        deeper = summary.filter(pl.col("model") == big)["n_layers"]
        verdict, evidence, _ = _within_verdict(within, paper, int(deeper[0]) if deeper.len() else None, how)
        per_task = own_cells(within).filter(pl.col("task") != "all", pl.col("measure") == "ed")
        pooled = [t for t in TASK_ORDER if per_task.filter(pl.col("task") == t, pl.col("excluded").is_null()).height]
        left = [t for t in TASK_ORDER if per_task.filter(pl.col("task") == t).height and t not in pooled]
        sizes = {t: per_task.filter(pl.col("task") == t)["n"][0] for t in pooled}
        over = f", pooled over {' and '.join(f'{task_name(t)} (n = {sizes[t]})' for t in pooled)}" if pooled else ""
        if left:
            over += f" ({', '.join(task_name(t) for t in left)} not counted: too few prompts or degenerate)"
        head.add(len(text))
        text.append(
            f"Within one family, {small} → {big} on the same prompts{over}: **{WORDS[verdict]}**."
            if evidence
            else f"Within one family, {small} → {big}: no usable pair of EDs, **we cannot tell**."
        )
        control = quantization_sentence(quantization, (small, big), how)
        if control:
            head.add(len(text))
            text.append(control)
        text += [f"{line[0].upper()}{line[1:]}." for line in evidence]
        steps = own_cells(within).filter(pl.col("task") != "all", pl.col("measure") == "ratio")
        parted = opposite_sentence(
            *opposite_directions(list(steps.iter_rows(named=True)), lambda r: f"{r['rule']} {task_name(r['task'])}")
        )
        if parted:
            text.append(parted)
        depth = summary.filter(pl.col("model") == big)["n_layers"]
        quantized = _quantization(small, big)
        if depth.len() and paper is not None:
            tolerance = paper_spread(paper, RULE_LABELS["cosine"], "model")
            text.append(
                f"The paper's own spread across its models, the margin the specification curve also tries, is "
                f"wide: ±{tolerance:.2f} of the ratio is ±{tolerance * int(depth[0]):.1f} of {big}'s "
                f"{int(depth[0])} layers{quantized}."
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
        head.add(len(text))
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
                "Here L does not grow with size (the smallest model has the most layers), so a ranking by size "
                "is not a ranking by depth; which of the two ED follows is a question these rank tests cannot "
                "settle."
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
        counted = rows.filter(pl.col("interval_counts")) if "interval_counts" in rows.columns else rows
        for rule in RULE_LABELS.values():
            mine = counted.filter(pl.col("rule") == rule)  # cells that count (n ≥ 20): no n = 3 AIME24 cell
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
        head.add(len(text))
        text.append(f"One model cannot show a trend: **we cannot tell** from {model} alone.")
        text.append(f"Its ratios (integer ED, cells of at least 20 prompts): {'; '.join(parts)}.")
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
    return _with_details([t for i, t in enumerate(text) if i in head], [t for i, t in enumerate(text) if i not in head])


def difficulty_finding(
    summary: pl.DataFrame,
    order: Sequence[str] = TASK_ORDER,
    paper: pl.DataFrame | None = None,
    groups: Mapping[str, Sequence[str]] | None = None,
    between: pl.DataFrame | None = None,
    trends: pl.DataFrame | None = None,
    scores: pl.DataFrame | None = None,
    lengths: pl.DataFrame | None = None,
    how: str = "one layer",
) -> str:
    """Does ED stay consistent across the data sets in ``order``? First within math (``trends``:
    ``evidence.level_trend`` rows with a ``group`` column; ``scores``: depth scores by level with
    intervals), then per model the ratio differences between successive data sets (``between``:
    ``evidence.between_tasks``, every check of the robustness rule) against the margin ``how``
    (pre-registered: one layer)."""
    text = [f"**Task difficulty.** The paper finds that {CLAIMS['difficulty']}."]
    head = {0}  # the sentences that carry a verdict; the rest is folded beneath them
    parted: tuple[list[str], list[str]] = ([], [])
    rows = _usable(summary)
    if rows.filter(pl.col("task").is_in(list(order))).is_empty():
        return text[0] + " We have no usable ED on these data sets: **we cannot tell**."
    if trends is not None and trends.height:
        for model in trends["model"].unique(maintain_order=True).to_list():
            for group, frame in trends.filter(model=model).group_by("group", maintain_order=True):
                what = "operand length" if "operand" in group[0] else "level"
                words = [_test_words(r, r["rule"], what) for r in frame.iter_rows(named=True)]
                text.append(
                    f"Within math, {model} by {group[0]}, rank correlation of {what} and depth (the primary "
                    f"statistic): {'; '.join(words)}."
                )
    if scores is not None and scores.height:
        text.append(_depth_score_sentence(scores))
    per_model = []
    for model, decided in _task_steps(between, paper, how).items():
        verdicts, evidence, excluded = [], [], []
        for rule in RULE_LABELS.values():
            steps = []
            for step in (s for s in decided if s["rule"] == rule):
                if step["excluded"]:
                    excluded.append(f"{rule} {step['pair']} ({step['excluded'].split(': ', 1)[-1]})")
                    continue
                verdicts.append(step["verdict"])
                why = f" (cannot tell: {step['why']})" if step["why"] else ""
                own = step["own"]
                n = f" (n = {own['n_first']}/{own['n_second']})" if own.get("n_first") is not None else ""
                steps.append(f"{step['pair']} {interval_text(own)}{n}{ed_panel(own)}{why}")
                found = opposite_directions([own], lambda r, m=model, u=rule, s=step: f"{m} {u} {s['pair']}")
                parted[0].extend(found[0])
                parted[1].extend(found[1])
            if steps:
                evidence.append(f"{rule} ratio {'; '.join(steps)} {_spread(decided[0]['tolerances'][rule], how)}")
        verdict = _combine(verdicts)
        per_model.append(verdict)
        counted = list(dict.fromkeys(s["pair"] for s in decided if not s["excluded"]))
        scope = f", from {' and '.join(counted)} alone" if counted and len(counted) < len(order) - 1 else ""
        head.add(len(text))
        text.append(f"{model}{scope}: **{WORDS[verdict]}**.")
        text += [f"{line[0].upper()}{line[1:]}." for line in evidence]
        if excluded:
            text.append(f"Not counted: {'; '.join(excluded)}.")
        if lengths is not None and lengths.height:
            control = length_sentence(lengths.filter(model=model))
            if control:
                text.append(control)
    if len(per_model) > 1:
        overall = per_model[0] if len(set(per_model)) == 1 else _overall(per_model)
        why = ""
        if len(set(per_model)) > 1:
            tally = ", ".join(f"{per_model.count(v)} {v}" for v in dict.fromkeys(per_model))
            why = f" (the models' verdicts differ: {tally})"
        head.add(len(text))
        text.append(f"Over the {len(per_model)} models: **{WORDS[overall]}**{why}.")
    sentence = opposite_sentence(*parted)
    if sentence:
        head.add(len(text))
        counts = [f"{len(parted[0])} step(s) in opposite directions"] if parted[0] else []
        counts += [f"{len(parted[1])} where only the statistic moves"] if parted[1] else []
        text.append(f"The paper's integer ED parts from the statistic in {' and '.join(counts)} (named below).")
        text.append(sentence)
    qualification = degenerate_sentence(summary)
    if qualification:
        text.append(qualification)
    return _with_details([t for i, t in enumerate(text) if i in head], [t for i, t in enumerate(text) if i not in head])


def _models_and_n(summary: pl.DataFrame) -> str:
    """``4 models, n 20–100 (counted cells)``: the models, and the prompts of the cells that count
    (an interval from at least ``MIN_INTERVAL_N`` prompts, not degenerate)."""
    if not summary.height:
        return "none"
    models = count_of(summary["model"].n_unique(), "model")
    counted = summary
    if "interval_counts" in summary.columns:
        counted = counted.filter(pl.col("interval_counts"))
    flag = "depth_degenerate" if "depth_degenerate" in summary.columns else "degenerate"
    if flag in summary.columns:
        counted = counted.filter(pl.col(flag).is_null())
    if not counted.height:
        return f"{models}, no cell that counts"
    n = counted["n_examples"]
    return f"{models}, n {_range(int(n.min()), int(n.max()), 0)} (counted cells)"


def _per_rule(rows: pl.DataFrame, key: str = "rule") -> str:
    """``cosine +0.01 [−0.02, +0.04]; lens KL …``: one interval per rule, in the rules' order."""
    parts = []
    for rule in RULE_LABELS.values():
        row = rows.filter(pl.col(key) == rule)
        if row.height:
            parts.append(f"{rule} {interval_text(row.row(0, named=True))}")
    return "; ".join(parts) or "—"


def scale_headline(
    summary: pl.DataFrame, paper: pl.DataFrame | None, within: pl.DataFrame | None, how: str = "one layer"
) -> dict:
    """The intro table's row of the scale question: the within-family comparison on the primary
    statistic (every rule: the verdict combines them)."""
    verdict, effect, tolerance, failed, counted = "cannot tell", "—", "—", "", _models_and_n(summary)
    if within is not None and within.height:
        small, big = within["small"][0], within["big"][0]
        deeper = summary.filter(pl.col("model") == big)["n_layers"]
        depth = int(deeper[0]) if deeper.len() else None
        verdict, _, failed = _within_verdict(within, paper, depth, how)
        own = own_cells(within).filter(task="all", measure="ratio")
        effect = f"ratio {big} − {small}, paired: {_per_rule(own)}"
        if paper is not None:
            margins = [(r, margin_for(paper, r, "model", depth, how)) for r in RULE_LABELS.values()]
            tolerance = "; ".join(f"{r} ±{m:.2f}" for r, m in margins)
            if depth:
                tolerance += f" (the ratio; ±{margins[0][1] * depth:.1f} of {big}'s {depth} layers for cosine)"
        per_task = own_cells(within).filter(pl.col("task") != "all", pl.col("excluded").is_null())
        if per_task.height:
            tasks = " and ".join(task_name(t) for t in dict.fromkeys(per_task["task"].to_list()))
            counted += f"; the pair on {tasks}, n = {_range(int(per_task['n'].min()), int(per_task['n'].max()), 0)}"
    return {
        "question": "Model scale",
        "claim": "ED grows with size, the ratio stays",
        "verdict": WORDS[verdict],
        "models": counted,
        "effect": effect,
        "tolerance": tolerance,
        "caveat": (f"{failed}; " if failed else "")
        + "one within-family pair, quantized differently; 4 models cannot reach p < 0.05 in a rank test",
    }


def difficulty_headline(
    summary: pl.DataFrame, between: pl.DataFrame | None, paper: pl.DataFrame | None, how: str = "one layer"
) -> dict:
    """The intro table's row of the difficulty question: each model's steps between data sets on
    the primary statistic, the smallest and the largest counted effect."""
    effect, tolerance, tally = "—", "—", ""
    steps = _task_steps(between, paper, how)
    counted = [s for model_steps in steps.values() for s in model_steps if not s["excluded"]]
    if counted:
        ordered = sorted(counted, key=lambda s: s["own"]["point"])
        ends = [ordered[0], ordered[-1]] if len(ordered) > 1 else ordered
        effect = "ratio of the harder − the easier task: " + " to ".join(
            f"{interval_text(s['own'])} ({s['own']['model']} {s['rule']} {s['pair']})" for s in ends
        )
        per_model = {m: _combine([s["verdict"] for s in ss if not s["excluded"]]) for m, ss in steps.items()}
        families = [v.split(":")[0] for v in per_model.values()]
        tally = ", ".join(f"{families.count(v)} {v}" for v in dict.fromkeys(families)) + " of the models"
        margins: dict[str, list[float]] = {}
        for model_steps in steps.values():
            for rule, m in (model_steps[0]["tolerances"] if model_steps else {}).items():
                margins.setdefault(rule, []).append(m)
        tolerance = "; ".join(f"{r} ±{_range(min(m), max(m))}" for r, m in margins.items()) + " (the ratio)"
    return {
        "question": "Task difficulty",
        "claim": "ED stays consistent from HellaSwag to GSM8K to AIME24",
        "verdict": WORDS[difficulty_verdict(between, paper, how)] + (f" ({tally})" if tally else ""),
        "models": _models_and_n(summary),
        "effect": effect,
        "tolerance": tolerance,
        "caveat": "AIME24 at ≤ 400 tokens has 3–4 prompts (shown, not counted); its ≤ 1000-token cells count",
    }


HEADLINE_COLUMNS = {
    "question": "question",
    "verdict": "our verdict (primary analysis)",
    "bound": "equivalent within",
    "specifications": "other analyses agreeing",
    "models": "models and n",
    "caveat": "the caveat that decides",
}
HEADLINE_NOTE = (
    "Each verdict under the pre-registered primary analysis (the methods page: each rule's primary statistic, "
    "the largest n, a margin of one layer); *equivalent within*: the smallest margin at which every comparison "
    "of the question would be called equivalent (apply any margin you prefer); *other analyses agreeing*: the "
    "share of the specification curve's other specifications that give each comparison's primary verdict. The "
    "effects with their intervals open each finding below."
)


def specification_columns(summary: pl.DataFrame | None, unit: str = "ratio") -> dict[str, str]:
    """The intro table's specification-curve cells of one question (``specification.summarize``):
    the largest equivalence bound over its comparisons (the margin at which every one would be
    called equivalent), and the share of the other specifications agreeing with their primary
    verdicts, with the comparisons that are robust."""
    if summary is None or not summary.height or summary["bound"].drop_nulls().is_empty():
        return {"bound": "—", "specifications": "—"}
    worst = summary.sort("bound", descending=True, nulls_last=True).row(0, named=True)
    others = (summary["specifications"] - 1).clip(lower_bound=0)
    share = float((summary["share_agreeing"] * others).sum() / max(int(others.sum()), 1))
    robust = int(summary["robust"].sum())
    return {
        "bound": f"±{worst['bound']:.3f} of the ratio ({worst['bound_layers']:.1f} layers)"
        if unit == "ratio"
        else f"±{worst['bound']:.1f} layers",
        "specifications": f"{share:.0%}; robust in {robust} of {summary.height} comparisons{length_phrase(summary)}",
        **({"caveat": _deciding(summary)} if robust < summary.height else {}),
    }


def length_phrase(summary: pl.DataFrame) -> str:
    """``; same positions only: 1 of 4 verdicts change``: what the exact length control (each text's
    first tokens, ``specification`` choice ``length``) does to the comparisons that have its cells."""
    if "length_verdict" not in summary.columns:
        return ""
    controlled = summary.filter(pl.col("length_verdict").is_not_null())
    if not controlled.height:
        return ""
    changed = int((controlled["length_verdict"] != controlled["verdict"]).sum())
    return f"; same positions only: {changed} of {controlled.height} verdicts change"


def _deciding(summary: pl.DataFrame) -> str:
    """The caveat of a question whose comparisons are not all robust: how many depend on the
    analysis, and the choice that decides most of them."""
    fragile = summary.filter(~pl.col("robust"))
    choices = [str(c).split(" (", 1)[0] for c in fragile["decided_by"].drop_nulls().to_list()]
    most = max(set(choices), key=choices.count) if choices else "analysis"
    return f"{fragile.height} of {summary.height} comparisons depend on the analysis, most on the {most}"


def headline_table(rows: Sequence[Mapping]) -> str:
    """The intro's one-screen summary: one Markdown row per question."""
    header = "| " + " | ".join(HEADLINE_COLUMNS.values()) + " |"
    lines = [HEADLINE_NOTE, "", header, "|" + "---|" * len(HEADLINE_COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(k, "—")).replace("|", "/") for k in HEADLINE_COLUMNS) + " |")
    return "\n".join(lines)


def _task_steps(
    between: pl.DataFrame | None, paper: pl.DataFrame | None, how: str = "one layer"
) -> dict[str, list[dict]]:
    """Per model, each step between two data sets per rule, decided by the robustness rule against
    the margin ``how`` (pre-registered: one of the model's layers): ``rule, pair, excluded,
    verdict, why, own`` (the book's own row) and the rules' ``tolerances``."""
    if between is None or not between.height:
        return {}
    out: dict[str, list[dict]] = {}
    for model in between["model"].unique(maintain_order=True).to_list():
        steps = out.setdefault(model, [])
        rows = between.filter(model=model)
        depth = rows["n_layers"].drop_nulls().max() if "n_layers" in rows.columns else None
        tolerances = {r: margin_for(paper, r, "task", depth, how) for r in RULE_LABELS.values()}
        for rule, tolerance in tolerances.items():
            for (first, second), checks in rows.filter(rule=rule).group_by(["first", "second"], maintain_order=True):
                step = {"rule": rule, "pair": f"{task_name(first)}→{task_name(second)}", "tolerances": tolerances}
                own = own_cells(checks).row(0, named=True)
                if own["excluded"]:
                    steps.append({**step, "excluded": own["excluded"], "verdict": None, "why": None, "own": own})
                    continue
                verdict, why, own = decide(checks, lambda r, t=tolerance: judge(r["low"], r["high"], t))
                if verdict == "cannot tell" and why is None:  # no check disagreed: say which test failed
                    why = compare(own["low"], own["high"], tolerance).reason
                steps.append({**step, "excluded": None, "verdict": verdict, "why": why, "own": own})
    return out


def difference_steps(between: pl.DataFrame | None, paper: pl.DataFrame | None, how: str = "one layer") -> pl.DataFrame:
    """Each model's step between two data sets per rule at the book's own seed, with the margin it is
    judged against: ``model, rule, pair, point, low, high, margin, counted`` (the difficulty chart)."""
    rows = [
        {
            "model": model,
            "rule": s["rule"],
            "pair": s["pair"],
            "point": s["own"]["point"],
            "low": s["own"]["low"],
            "high": s["own"]["high"],
            "margin": s["tolerances"][s["rule"]],
            "counted": not s["excluded"],
        }
        for model, steps in _task_steps(between, paper, how).items()
        for s in steps
    ]
    schema = {"model": pl.String, "rule": pl.String, "pair": pl.String, "point": pl.Float64, "low": pl.Float64,
              "high": pl.Float64, "margin": pl.Float64, "counted": pl.Boolean}  # fmt: skip
    return pl.DataFrame(rows, schema=schema).filter(pl.col("point").is_not_null())


def length_sentence(rows: pl.DataFrame) -> str | None:
    """The prompt-length control beside a model's step (``evidence.length_control`` rows)."""
    if not rows.height:
        return None
    first, second = task_name(rows["first"][0]), task_name(rows["second"][0])
    parts = [
        f"{r['rule']} {interval_text({'point': r['raw'], 'low': r['raw_low'], 'high': r['raw_high']})}, adjusted "
        f"{interval_text({'point': r['adjusted'], 'low': r['adjusted_low'], 'high': r['adjusted_high']})}"
        for r in rows.iter_rows(named=True)
    ]
    r = rows.row(0, named=True)
    return (
        f"Length control ({first} prompts {r['tokens_first']} tokens, {second} {r['tokens_second']}; where they do "
        "not overlap no length-matched pair exists, so the within-task slope of each prompt's ratio on log length "
        f"stands in): the mean per-prompt ratio difference, raw and less what length predicts: {'; '.join(parts)} "
        "(a control stated beside the verdict, which it does not decide)."
    )


def _overall(per_model: Sequence[str]) -> str:
    """One verdict over models: theirs where they all give one, agreement where every model lies
    within the margin (some with a small difference), else cannot tell."""
    if not per_model:
        return "cannot tell"
    if len(set(per_model)) == 1:
        return per_model[0]
    return SMALL if set(per_model) <= {"agree", SMALL} else "cannot tell"


def difficulty_verdict(between: pl.DataFrame | None, paper: pl.DataFrame | None, how: str = "one layer") -> str:
    """The one verdict of the difficulty question over every model (the intro's table)."""
    per_model = [
        _combine([s["verdict"] for s in steps if not s["excluded"]])
        for steps in _task_steps(between, paper, how).values()
    ]
    return _overall(per_model)


def _depth_score_sentence(scores: pl.DataFrame) -> str:
    """Depth score (share of the depth) per level with its interval, where the skip probe ran; an
    interval from fewer than ``MIN_INTERVAL_N`` prompts is shown but said not to count."""
    from .study import MIN_INTERVAL_N

    parts, few = [], 0
    for r in scores.iter_rows(named=True):
        low, high = r.get("low"), r.get("high")
        interval = f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else ""
        few += bool(interval) and r["n"] < MIN_INTERVAL_N
        parts.append(f"{r['task']} {r['value']:.2f}{interval} (n = {r['n']})")
    model = scores["model"][0]
    caveat = ""
    if few:
        which = "every interval" if few == len(parts) else f"{few} of the {len(parts)} intervals"
        caveat = (
            f" ({which} from fewer than {MIN_INTERVAL_N} prompts: shown, not counted — a description, "
            "not a tested result)"
        )
    return (
        f"Depth score of {model} (the mean per prompt, as a share of the depth; skip probe) by level: "
        f"{'; '.join(parts)}{caveat}."
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
    order = "/".join(task_name(t) for t in TASK_ORDER)
    return (
        f"**Like for like:** beside the paper's {twin} (bf16; same architecture and depth), our {model} "
        f"(4-bit, coder-tuned) gives EDs ({order}) within {count_of(max(gaps), 'layer')} of its: {'; '.join(parts)}."
    )
