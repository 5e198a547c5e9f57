"""The book's tables, built with great_tables (Polars' ``DataFrame.style``): column groups, row
groups, two decimals throughout, notes as footnotes. Each function returns a ``Table``: the table as
HTML (the book, JupyterLab, VS Code, GitHub) and as aligned text (``text/plain``: a terminal, a diff,
a reader that shows no HTML)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import polars as pl
from great_tables import GT, loc, style

from effdepth_core.labels import CELL_LEGEND, format_ed

from .findings import TASK_NAMES, TASK_ORDER
from .reference import COMPARABLE, OURS, PAPER, RULE_LABELS, TUNED_RULE_LABELS

HIGHLIGHT = "#fff3cd"


class Table:
    """A great_tables table with the frame it shows, for a readable ``text/plain``."""

    def __init__(self, gt: GT, frame: pl.DataFrame):
        self.gt, self.frame = gt, frame

    def as_raw_html(self) -> str:
        return self.gt.as_raw_html()

    def text(self) -> str:
        frame = self.frame.with_columns(pl.col(c).round(3) for c, t in self.frame.schema.items() if t.is_float())
        cells = [[str(c) for c in frame.columns]] + [
            ["—" if v is None else str(v) for v in row] for row in frame.iter_rows()
        ]
        widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))] if cells[0] else []
        lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
        return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return {"text/html": self.as_raw_html(), "text/plain": self.text()}


def _compact(gt: GT) -> GT:
    """Small type and padding, so that a wide table fits the book's content column."""
    return gt.tab_options(
        table_font_size="12px",
        data_row_padding="2px",
        column_labels_padding="2px",
        row_group_padding="2px",
        heading_padding="2px",
        source_notes_font_size="11px",
        table_width="100%",
    )


def _cell_column(rule: str, task: str) -> str:
    return f"{rule}|{task}"


def table1(ours: pl.DataFrame, paper: pl.DataFrame, comparable: Mapping[str, str] = COMPARABLE) -> Table:
    """Table 1 beside ours: rows grouped by source (ours, the paper), a column group per ED rule
    with one column per data set, each cell "ED (ratio)"; the like-for-like pair highlighted."""
    keep = ["model", "n_layers", "task", "rule", "ed", "ratio"]
    degenerate = pl.col("degenerate") if "degenerate" in ours.columns else pl.lit(None, pl.String)
    marked = ours.select(*keep, degenerate.alias("degenerate"))
    long = pl.concat(
        [
            marked.with_columns(pl.lit(OURS).alias("source")),
            paper.select(keep).with_columns(pl.lit(None, pl.String).alias("degenerate"), pl.lit(PAPER).alias("source")),
        ]
    ).filter(pl.col("task").is_in(TASK_ORDER))
    # "16 (.61)": the ratio without its leading zero, so that 12 rule × data-set columns fit the column
    cell = pl.struct("ed", "ratio").map_elements(
        lambda c: format_ed(c["ed"], c["ratio"]).replace("(0.", "(."),
        return_dtype=pl.String,
    )
    dagger = pl.when(pl.col("degenerate").is_not_null()).then(pl.lit(" †")).otherwise(pl.lit(""))
    long = long.with_columns(
        pl.concat_str(cell, dagger).alias("cell"), pl.concat_str("rule", pl.lit("|"), "task").alias("column")
    )
    columns = [_cell_column(r, t) for r in RULE_LABELS.values() for t in TASK_ORDER]
    wide = long.pivot(on="column", index=["source", "model", "n_layers"], values="cell", aggregate_function="first")
    present = [c for c in columns if c in wide.columns]
    n_column = []
    tasks = [t for t in TASK_ORDER if t in set(ours["task"].to_list())]
    if "n_examples" in ours.columns and tasks:  # how many prompts each of our cells rests on, one column: "20/20/4"
        counts = (
            ours.filter(pl.col("task").is_in(tasks))
            .group_by("model", "task")
            .agg(pl.col("n_examples").first())
            .pivot(on="task", index="model", values="n_examples")
        )
        parts = [pl.col(t).cast(pl.String).fill_null("—") if t in counts.columns else pl.lit("—") for t in tasks]
        counts = counts.select("model", pl.concat_str(parts, separator="/").alias("n"))
        wide = wide.join(counts, on="model", how="left")
        n_column = ["n"]
    wide = wide.select("source", "model", pl.col("n_layers").alias("L"), *present, *n_column)
    labels = {c: TASK_NAMES[c.split("|")[1]] for c in present}
    if n_column:
        labels["n"] = "n"
    gt = GT(wide, rowname_col="model", groupname_col="source").cols_label(**labels, L="L").sub_missing(missing_text="—")
    for rule in RULE_LABELS.values():
        group = [c for c in present if c.startswith(f"{rule}|")]
        if group:
            gt = gt.tab_spanner(label=rule, columns=group)
    rows = wide.with_row_index()
    present_models = set(rows["model"].to_list())
    both = {a: b for a, b in comparable.items() if a in present_models and b in present_models}
    pair_rows = rows.filter(pl.col("model").is_in([*both, *both.values()]))["index"].to_list()
    if pair_rows:  # only when both rows of a like-for-like pair are in the table
        gt = gt.tab_style(style=style.fill(color=HIGHLIGHT), locations=loc.body(rows=pair_rows))
        pairs = "; ".join(f"{a} (ours) and {b} (the paper)" for a, b in both.items())
        gt = gt.tab_footnote(
            f"Highlighted: the like-for-like pair, same architecture and depth — {pairs}.",
            locations=loc.stub(rows=pair_rows[:1]),
            placement="right",
        )
    paper_rows = rows.filter(pl.col("source") == PAPER)["index"].to_list()
    for column in [c for c in present if c.startswith("lens KL|")]:  # the paper's first-layer lens-KL EDs
        low = rows.filter(pl.col("index").is_in(paper_rows), pl.col(column).str.contains(r"^[0-2] \("))
        if low.height:
            gt = gt.tab_footnote(
                "The paper's lens-KL ED ≤ 2: the half-maximum rule fires at the first layers; read it as an artefact "
                "of the rule, not as a shallow model (the findings leave such cells out).",
                locations=loc.body(columns=column, rows=low["index"].to_list()),
                placement="right",
            )
    gt = gt.tab_style(style=style.css("white-space: nowrap"), locations=loc.body())
    note = (
        "Each cell: ED (ratio (ED + 1) / L, its leading zero dropped); † a degenerate ED of ours "
        "(see the methods page), left out of every verdict. "
        "n: our prompts per data set, in the order of the columns (the paper used 10, AIME24 5); intervals and "
        "their widths are in the ED table below."
    )
    return Table(_compact(gt.tab_source_note(note)), wide)


def ed_summary(summary: pl.DataFrame) -> Table:
    """Our ED per model and data set: a column per rule, "ED (ratio) [95 % interval] ±half-width"
    (a degenerate ED marked †, an interval from fewer than 20 prompts marked *), the number of prompts
    kept, where the sample-size rule stopped, and the reason where a rule found no layer."""
    rows = []
    keys = ["model", "task", "n_layers", "n_examples"]
    flags: dict[str, int] = {"†": 0, "*": 0}
    for (model, task, n_layers, n_examples), frame in summary.group_by(keys, maintain_order=True):
        stopped = frame["precision"][0] if "precision" in frame.columns else None
        row = {"model": model, "task": task, "L": n_layers, "n": n_examples, "n set by": stopped or "fixed"}
        reasons = []
        for r in frame.iter_rows(named=True):
            cell = format_ed(r["ed"], r["ratio"], r["ci_low"], r["ci_high"])
            if r.get("width") is not None and r["ed"] is not None:
                cell += f" ±{r['width'] / 2:g}"
            if r.get("depth") is not None:  # the statistic the verdicts read first, the paper's ED beside it
                low, high = r.get("depth_low"), r.get("depth_high")
                interval = f" [{low:.1f}–{high:.1f}]" if low is not None and high is not None else ""
                cell = f"{r['depth']:.1f}{interval} · ED {cell}"
            if r.get("interval_counts") is False and r["ed"] is not None:
                cell += "*"
                flags["*"] += 1
            if r.get("degenerate"):
                cell += " †"
                flags["†"] += 1
                reasons.append(f"{r['rule']} degenerate: {r['degenerate']}")
            row[r["rule"]] = cell
            if r["ed"] is None and r.get("reason"):
                reasons.append(f"{r['rule']}: {r['reason']}")
        row["note"] = "; ".join(reasons)
        rows.append(row)
    frame = pl.DataFrame(rows)
    order = [
        "cosine",
        "lens KL",
        TUNED_RULE_LABELS["tuned_lens_kl"],
        "lens overlap",
        TUNED_RULE_LABELS["tuned_lens_overlap"],
    ]
    columns = [c for c in order if c in frame.columns]  # each tuned-lens rule beside its logit-lens rule
    frame = frame.select("model", "task", "L", "n", "n set by", *columns, "note")
    # word joiners keep "[12–17]" whole: a cell may wrap at its spaces, never inside its interval
    shown = frame.with_columns(pl.col("task").replace(TASK_NAMES), pl.col(columns).str.replace("–", "\u2060–\u2060"))
    gt = GT(shown, rowname_col="task", groupname_col="model").sub_missing(missing_text="—")
    label = "primary depth statistic [95 %] · the paper's integer ED (ratio) [95 %]"
    gt = gt.tab_spanner(label=label, columns=columns).cols_label(n="prompts")
    gt = gt.cols_hide("note")  # a wide, mostly empty column: its rows become notes under the table
    notes = [CELL_LEGEND + "; ± half the interval's width"]
    for r in shown.filter(pl.col("note").str.len_chars() > 0).iter_rows(named=True):
        notes.append(f"{r['model']}, {r['task']}: {r['note']}")
    if flags["*"]:
        notes.append("* fewer than 20 prompts: the interval does not count (a bootstrap over so few looks precise)")
    if flags["†"]:
        notes.append("† degenerate (see the methods page): left out of every verdict")
    notes.append(
        "n set by: met (every primary statistic's interval within ±0.5 layer, at no fewer than the "
        "pre-registered n), cap (the cap reached), data (the data set ran out), pending (its next step not yet "
        "computed: the largest n committed is shown)"
    )
    for text in notes:
        gt = gt.tab_source_note(text)
    return Table(_compact(gt), frame)


def status(models: Sequence[str], unavailable: Mapping[str, str]) -> Table:
    """Which models were measured here, and why the others were not."""
    frame = pl.DataFrame(
        {
            "model": list(models),
            "status": ["not measured" if m in unavailable else "measured" for m in models],
            "why": [unavailable.get(m, "") for m in models],
        }
    )
    gt = GT(frame, rowname_col="model")
    missing = frame.with_row_index().filter(pl.col("status") == "not measured")["index"].to_list()
    if missing:
        gt = gt.tab_style(style=style.text(color="#b23a48"), locations=loc.body(columns="status", rows=missing))
    return Table(gt, frame)


def frame_table(frame: pl.DataFrame, caption: str | None = None, decimals: int = 2) -> Table:
    """Any small frame: floats with ``decimals`` decimals, nulls as —."""
    gt = GT(frame).sub_missing(missing_text="—")
    floats = [c for c, t in frame.schema.items() if t.is_float()]
    if floats:
        gt = gt.fmt_number(columns=floats, decimals=decimals)
    return Table(gt.tab_header(title=caption) if caption else gt, frame)


def deltas(frame: pl.DataFrame) -> Table:
    """ED(long-CoT) − ED(base) per pair, source, data set and rule (``reference.pair_deltas``), with a
    footnote on changes beyond ±10 layers (the paper's single lens-KL value of 1)."""
    gt = GT(frame.with_columns(pl.col("task").replace(TASK_NAMES)), groupname_col="source").sub_missing(
        missing_text="—"
    )
    gt = gt.cols_label(ed_base="ED base", ed_long_cot="ED long-CoT", delta="long-CoT − base")
    big = frame.with_row_index().filter(pl.col("delta").abs() > 10)["index"].to_list()
    if big:
        gt = gt.tab_footnote(
            "Beyond ±10 layers: the paper's lens-KL ED of 1 for one long-CoT model, where the half-maximum rule "
            "fires at the first layers — an outlier of the rule, not a shallower model.",
            locations=loc.body(columns="delta", rows=big),
        )
    return Table(gt, frame)


def _layer_list(removed: str) -> str:
    """ "3,4,5,9" → "3–5, 9": runs of consecutive layers as ranges."""
    layers = [int(x) for x in removed.split(",") if x]
    parts, start = [], None
    for i, layer in enumerate(layers):
        start = layer if start is None else start
        if i + 1 == len(layers) or layers[i + 1] != layer + 1:
            parts.append(str(start) if start == layer else f"{start}–{layer}")
            start = None
    return ", ".join(parts)


def pruning_rules(comparison: pl.DataFrame) -> Table:
    """Per model, task and budget k: the Δ answer NLL of the layers each rule removes ("+0.42 (22–29)")."""
    frame = comparison.with_columns(
        pl.format(
            "{} ({})", pl.col("delta_nll").round(3), pl.col("removed").map_elements(_layer_list, pl.String)
        ).alias("cell"),
        pl.concat_str([pl.col("model"), pl.col("task")], separator=" · ").alias("run"),
    )
    wide = frame.pivot(on="choice", index=["run", "k"], values="cell").sort("run", "k")
    gt = GT(wide, rowname_col="k", groupname_col="run").sub_missing(missing_text="—")
    gt = gt.tab_stubhead(label="layers removed").tab_spanner(
        label="Δ answer NLL (removed layers) by the rule that chooses them",
        columns=[c for c in wide.columns if c not in ("run", "k")],
    )
    return Table(_compact(gt), wide)


def _length_cell(r: Mapping) -> str:
    """The comparison under the exact length control (each text's first N tokens), and whether it
    changes the primary verdict."""
    if r.get("length_verdict") is None or r.get("length_low") is None:
        return "—"
    changed = "" if r["length_verdict"] == r["verdict"] else " (changes the verdict)"
    window = f"first {r['length_positions']} tokens: " if r.get("length_positions") else ""
    interval = f"{r['length_point']:+.3f} [{r['length_low']:+.3f}, {r['length_high']:+.3f}]"
    return f"{window}{r['length_verdict']}: {interval}{changed}"


def specification_table(summary: pl.DataFrame, analysis) -> Table:
    """The specification curve's summary (``specification.summarize``): per comparison and rule the
    primary verdict with its 95 % interval, the equivalence bound (in the comparison's unit and in
    layers), the share of the other specifications that agree, and robust or the deciding choice."""

    def interval(r: Mapping) -> str:
        if r["low"] is None:
            return "—"
        return f"{r['point']:+.3f} [{r['low']:+.3f}, {r['high']:+.3f}]"

    rows = [
        {
            "comparison": r["comparison"],
            "rule": r["rule"],
            "primary verdict": r["verdict"],
            "difference [95 %]": interval(r),
            "margin": "—" if r["margin"] is None else f"±{r['margin']:.3f}",
            "equivalent within": "—" if r["bound"] is None else f"±{r['bound']:.3f} ({r['bound_layers']:.1f} layers)",
            "others agreeing": f"{r['share_agreeing']:.0%} of {r['specifications'] - 1}",
            "robust?": "robust" if r["robust"] else f"depends on the {r['decided_by']}",
            "same positions only": _length_cell(r),
        }
        for r in summary.iter_rows(named=True)
    ]
    frame = pl.DataFrame(rows)
    caption = (
        f"Primary analysis (params/common.yml): {analysis.statistic} statistic, {analysis.window}, overlap anchored "
        f"at the {analysis.anchor}, {analysis.zero_levels} cosine zero levels, the {analysis.cell} cell, "
        f"{analysis.length}, margin "
        f"{analysis.margin}, seed {analysis.seed}; robust when ≥ {analysis.robust_share:.0%} of the other "
        "specifications agree. Same positions only: the primary analysis on the length-control cells (each "
        "text cut to its first tokens, params/common.yml length_tasks), where both sides have one"
    )
    table = frame_table(frame, caption)
    return Table(_compact(table.gt), frame)
