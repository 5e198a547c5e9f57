"""The long-CoT finding (does R1-style long-chain-of-thought training change ED over the base
model?): our pairs where their models can be loaded, the paper's own deltas beside them, and the
intro's one-line summary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import polars as pl

from effdepth_core.measurement.depth import artefact

from ...findings import CLAIMS, TASK_ORDER, WORDS, count_of, defined_cells, signed, task_name
from ...reference import RULE_LABELS


def long_cot_headline(pages: Sequence) -> dict:
    """The intro table's row of the long-CoT question over every family's page (no pair runs
    offline): the pairs counted over them all."""
    pairs = [pair for page in pages for pair in page.p.get("pairs") or []]
    return {
        "question": "Long-CoT training",
        "claim": "no increase in ED over the base model",
        "verdict": WORDS["cannot tell"],
        "models": f"{count_of(len(pairs), 'pair')} (hub models, not offline)",
        "effect": "— (the paper's own deltas are on its page)",
        "tolerance": "—",
        "caveat": "no base / R1-distilled pair can be loaded without internet",
    }


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
    rows = defined_cells(summary)
    measured_any = False
    not_measured: dict[str, list[str]] = {}  # reason → models
    order = " / ".join(task_name(t) for t in TASK_ORDER)
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
                    deltas.append(signed(c.row(0, named=True)["ed"] - b.row(0, named=True)["ed"]))
            if deltas:
                parts.append(f"{rule} {'/'.join(deltas)}")
        text.append(f"Ours, {long_cot} − {base} ({order}): " + "; ".join(parts) + ".")
    for reason, models in not_measured.items():
        text.append(f"Not measured here ({', '.join(models)}): {reason}.")
    largest = None
    if paper is not None and pairs:
        from ...reference import pair_deltas

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
                        signed(cells[t]["delta"]) + ("*" if cells[t]["artefact"] else "")
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
        tail = "" if largest is None else f"; apart from artefacts its changes are at most {count_of(largest, 'layer')}"
        text.append(f"With no pair measured here, **we cannot tell**: the verdict rests on the paper alone{tail}.")
    return " ".join(text)


# --- beyond the paper (method.md §7–§7b) ----------------------------------------------------------
# A pruning choice *wins* when its ΔNLL is the least of the three rules (the fourth section).
