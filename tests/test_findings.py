"""The book's findings text and tables are generated from the numbers: change the numbers and the
words change; the chart bugs readers met stay fixed."""

from __future__ import annotations

import csv
import io
import json
import re

import polars as pl
import pytest

from effdepth_book import findings, plots, reference, tables
from effdepth_book.sections.beyond import charts as beyond_charts
from effdepth_book.sections.beyond import findings as findings_beyond
from effdepth_book.sections.long_cot import findings as findings_long_cot


def _summary(rows: list[tuple]) -> pl.DataFrame:
    """(model, L, task, rule, ed, ci_low, ci_high) → a Study.summary()-like frame, the primary
    statistic equal to the ED with the same interval."""
    out = []
    for model, n_layers, task, rule, ed, low, high in rows:
        out.append(
            {
                "model": model,
                "task": task,
                "rule": rule,
                "ed": ed,
                "ratio": (ed + 1) / n_layers,
                "ci_low": low,
                "ci_high": high,
                "ratio_low": (low + 1) / n_layers,
                "ratio_high": (high + 1) / n_layers,
                "depth": float(ed),
                "depth_ratio": (ed + 1) / n_layers,
                "depth_low": float(low),
                "depth_high": float(high),
                "depth_degenerate": None,
                "reason": None,
                "n_layers": n_layers,
                "n_params": n_layers * 10**6,
                "n_examples": 10,
            }
        )
    return pl.DataFrame(out)


def _between(steps: list[tuple[str, str, float, float, float]], excluded: dict | None = None) -> pl.DataFrame:
    """``evidence.between_tasks`` rows for model m, rule cosine: (first, second, point, low, high)."""
    rows = [
        {
            "rule": "cosine",
            "first": a,
            "second": b,
            "point": p,
            "low": lo,
            "high": hi,
            "defined": 1.0,
            "excluded": (excluded or {}).get((a, b)),
            "model": "m",
        }
        for a, b, p, lo, hi in steps
    ]
    return pl.DataFrame(rows)


def _difficulty_summary() -> pl.DataFrame:
    tasks = ("hellaswag", "gsm8k", "aime24")
    return _summary([("m", 30, t, "cosine", e, e - 1, e + 1) for t, e in zip(tasks, (20, 20, 21), strict=True)])


def test_difficulty_finding_follows_the_intervals():
    paper = reference.paper_table1()
    tolerance = findings.paper_spread(paper, "cosine", "task")
    assert 0.05 < tolerance < 0.25  # the paper's own spread across data sets
    summary = _difficulty_summary()
    flat = findings.difficulty_finding(
        summary,
        paper=paper,
        between=_between([("hellaswag", "gsm8k", 0.0, -0.02, 0.02), ("gsm8k", "aime24", 0.01, -0.02, 0.03)]),
    )
    assert "m: **we agree**." in flat and "HellaSwag→GSM8K ±0.00 [−0.02, +0.02]" in flat
    rising = findings.difficulty_finding(
        summary,
        paper=paper,
        between=_between([("hellaswag", "gsm8k", 0.3, 0.25, 0.35), ("gsm8k", "aime24", 0.0, -0.1, 0.1)]),
    )
    assert "m: **we disagree**." in rising and "+0.30 [+0.25, +0.35]" in rising
    # the same centre with wider intervals: the verdict turns into cannot tell
    wide = findings.difficulty_finding(
        summary,
        paper=paper,
        between=_between([("hellaswag", "gsm8k", 0.0, -0.3, 0.3), ("gsm8k", "aime24", 0.01, -0.4, 0.4)]),
    )
    assert "m: **we cannot tell**." in wide
    assert "(cannot tell: the interval reaches past the margin and includes 0: too wide to tell)" in wide
    # a comparison whose cell rests on fewer than 20 prompts never decides; it is named
    small = findings.difficulty_finding(
        summary,
        paper=paper,
        between=_between(
            [("hellaswag", "gsm8k", 0.0, -0.02, 0.02), ("gsm8k", "aime24", 0.5, 0.4, 0.6)],
            {("gsm8k", "aime24"): "m aime24: n = 3 < 20, no interval that counts"},
        ),
    )
    assert (
        "m, from HellaSwag→GSM8K alone: **we agree**." in small
        and "Not counted: cosine GSM8K→AIME24 (n = 3 < 20" in small
    )
    flagged = pl.when(pl.col("task") == "aime24").then(pl.lit("it fires at layer 0")).otherwise(None)
    degenerate = summary.with_columns(flagged.alias("depth_degenerate"), flagged.alias("degenerate"))
    text = findings.difficulty_finding(degenerate, paper=paper, between=_between([]))
    assert (
        "Degenerate primary statistics (see the methods page), left out of the verdicts: m AIME24 cosine depth 21."
        in text
    )
    assert "Degenerate integer EDs (the paper's rule; its panel only, the verdicts do not read it): m AIME24" in text


def _checked(own: tuple[float, float, float], variant: str, other: tuple[float, float, float]) -> pl.DataFrame:
    """One HellaSwag→GSM8K comparison with the book's own row and one more check of the rule."""
    rows = _between([("hellaswag", "gsm8k", *own), ("hellaswag", "gsm8k", *other)])
    return rows.with_columns(pl.Series("variant", ["", variant]))


def test_the_robustness_rule_turns_a_verdict_into_cannot_tell_at_another_check():
    """(a) a gap beyond the paper's spread under the book's seed that falls within it under another
    is not a disagreement; an interval that excludes 0 inside the margin is the small difference."""
    paper = reference.paper_table1()
    summary = _difficulty_summary()
    moved = _checked((0.27, 0.20, 0.27), "under bootstrap seed 2", (0.07, 0.02, 0.10))
    text = findings.difficulty_finding(summary, paper=paper, between=moved)
    assert "m, from HellaSwag→GSM8K alone: **we cannot tell**." in text
    assert (
        "cannot tell: disagree at the book's settings, a small difference within the margin under "
        "bootstrap seed 2" in text
    )
    held = _checked((0.27, 0.20, 0.27), "under bootstrap seed 2", (0.30, 0.25, 0.35))
    assert "m, from HellaSwag→GSM8K alone: **we disagree**." in findings.difficulty_finding(
        summary, paper=paper, between=held
    )


def test_the_robustness_rule_turns_a_verdict_into_cannot_tell_under_another_seed():
    """(b) the same comparison whose interval reaches back into the spread under the next seed."""
    paper = reference.paper_table1()
    summary = _difficulty_summary()
    seeded = _checked((0.27, 0.20, 0.27), "under bootstrap seed 1", (0.27, 0.10, 0.27))
    text = findings.difficulty_finding(summary, paper=paper, between=seeded)
    assert "m, from HellaSwag→GSM8K alone: **we cannot tell**." in text and "cannot tell under bootstrap seed 1" in text


def test_two_tests_per_comparison_and_a_margin_of_at_least_one_layer():
    """A difference inside the margin that excludes 0 is "a small difference within the margin"
    (both tests pass); the margin is one layer of the model, pre-registered (lens overlap at 18
    layers: ±1/18, so a ±0.053 interval agrees), or a paper spread floored at one layer."""
    paper = reference.paper_table1()
    summary = _difficulty_summary()
    small = findings.difficulty_finding(
        summary, paper=paper, between=_between([("hellaswag", "gsm8k", 0.03, 0.01, 0.05)])
    )
    assert "m, from HellaSwag→GSM8K alone: **we agree: a small difference within the margin**." in small
    spread = findings.paper_spread(paper, "lens overlap", "task")
    assert spread < 1 / 18
    overlap = _between([("hellaswag", "gsm8k", 0.0, -0.053, 0.053)]).with_columns(rule=pl.lit("lens overlap"))
    shallow = findings.difficulty_finding(summary, paper=paper, between=overlap.with_columns(n_layers=pl.lit(18)))
    deep = findings.difficulty_finding(summary, paper=paper, between=overlap.with_columns(n_layers=pl.lit(30)))
    assert "alone: **we agree**." in shallow and f"±{1 / 18:.2f}" in shallow
    assert "alone: **we cannot tell**." in deep  # 1/30 < 0.053: one layer is too narrow for the interval
    # the pre-registered margin is one layer (1/30); the paper's largest spread (cosine ~0.18) is an
    # alternative, which calls the same step a small difference
    step = _between([("hellaswag", "gsm8k", 0.10, 0.08, 0.12)]).with_columns(n_layers=pl.lit(30))
    one_layer = findings.difficulty_finding(summary, paper=paper, between=step)
    paper_max = findings.difficulty_finding(summary, paper=paper, between=step, how="paper max")
    assert "alone: **we disagree**." in one_layer and "±0.03: one layer of the model, pre-registered" in one_layer
    assert "alone: **we agree: a small difference within the margin**." in paper_max
    assert "the paper max spread, at least one layer" in paper_max


def test_the_robustness_rule_judges_the_papers_cells_and_ours_by_one_artefact_test():
    """(c) an ED in the first layers is an artefact on either side: the paper's lens-KL ED 1 of 28
    and our lens-KL ED 2 of 30 alike; ours is then degenerate and decides nothing."""
    from effdepth_core.measurement import depth as stats

    assert stats.artefact(1, 28) and stats.artefact(2, 30) and stats.artefact(3, 30)
    assert stats.artefact(4, 30) is None and stats.artefact(3, 18) is None  # max(2, ⌈0.1 L⌉): 3 of 30, 2 of 18
    assert stats.degenerate(2, 1, 3, 30) == stats.artefact(2, 30)  # a narrow interval does not save it
    paper = reference.paper_table1()
    clean = findings.clean_paper(paper)
    assert paper.height - clean.height == 1 and not clean.filter(ed=1).height  # the one early cell of Table 1
    # our cell flagged by the same function leaves its comparison uncounted: no verdict rests on it
    summary = _difficulty_summary().with_columns(
        pl.when(pl.col("task") == "hellaswag").then(pl.lit(stats.artefact(2, 30))).otherwise(None).alias("degenerate")
    )
    between = _between(
        [("hellaswag", "gsm8k", 0.3, 0.25, 0.35)], {("hellaswag", "gsm8k"): "m hellaswag: degenerate (it fires …)"}
    )
    text = findings.difficulty_finding(summary, paper=paper, between=between)
    assert "m: **we cannot tell**." in text and "Not counted: cosine HellaSwag→GSM8K" in text


def test_robust_names_the_first_check_that_differs():
    from effdepth_core.measurement import depth as stats

    assert stats.robust([("", "agree"), ("at x 1", "agree")]) == ("agree", None)
    verdict, why = stats.robust([("", "agree"), ("at x 1", "agree"), ("under bootstrap seed 2", "disagree")])
    assert verdict == "cannot tell" and why == "agree at the book's settings, disagree under bootstrap seed 2"


def test_the_cosine_rule_moves_with_its_zero_level():
    """A hand-checked curve: the mean cosine crosses 0 at layer 2→3 and +0.02 at layer 4→5 only."""
    import numpy as np

    from effdepth_core.measurement import depth as stats
    from effdepth_core.measurement.probes.cosine import COSINE_PARTS, SPEC

    rule = SPEC.rules[0]
    curve = np.array([0.05, -0.05, -0.01, 0.01, 0.015, 0.03, 0.04])
    curves = {name: curve for name in COSINE_PARTS}
    assert rule.find(curves, object()) == 2  # the last l with c[l] < 0 <= c[l+1]
    assert rule.find(curves, stats.with_setting(object(), "cosine_zero", 0.02)) == 4
    assert rule.find(curves, stats.with_setting(object(), "cosine_zero", -0.03)) == 1  # c + 0.03 crosses at 1 → 2
    settings = type("S", (), {})()
    variants = stats.variants(rule, settings, seed=5)
    assert variants[0] == ("", settings, 5) and ("under bootstrap seed 7", settings, 7) in variants
    assert {what for what, _, _ in variants} >= {"at cosine zero −0.03", "at cosine zero 0.03"}


def _within(ed: tuple[float, float, float], ratio: tuple[float, float, float]) -> pl.DataFrame:
    rows = []
    for rule in ("cosine", "lens KL", "lens overlap"):
        for measure, (p, lo, hi) in (("ed", ed), ("ratio", ratio)):
            rows.append(
                {
                    "rule": rule,
                    "task": "all",
                    "measure": measure,
                    "point": p,
                    "low": lo,
                    "high": hi,
                    "n": None,
                    "excluded": None,
                    "defined": 1.0,
                    "small": "q-0.5b",
                    "big": "q-1.5b",
                }
            )
    return pl.DataFrame(rows)


def test_scale_finding_separates_within_and_across_families():
    tasks = ("hellaswag", "gsm8k", "aime24")
    summary = _summary(
        [
            (m, n, t, "cosine", round(0.6 * n), round(0.6 * n) - 1, round(0.6 * n) + 1)
            for m, n in (("q-0.5b", 24), ("q-1.5b", 28))
            for t in tasks
        ]
    )
    paper = reference.paper_table1()
    agree = findings.scale_finding(summary, paper, _within((2.0, 1.0, 3.0), (0.0, -0.02, 0.03)))
    assert "Within one family, q-0.5b → q-1.5b on the same prompts: **we agree**." in agree
    assert "Cosine: depth +2.0 [+1.0, +3.0] layers" in agree
    wider = findings.scale_finding(summary, paper, _within((2.0, -1.0, 5.0), (0.0, -0.2, 0.2)))
    assert "**we cannot tell**" in wider  # the same centres, wider intervals
    shrinks = findings.scale_finding(summary, paper, _within((-3.0, -4.0, -2.0), (-0.2, -0.3, -0.15)))
    assert "**we disagree**" in shrinks
    across = pl.DataFrame(
        {
            "rule": ["cosine"],
            "n_models": [4],
            "rho": [0.8],
            "p": [0.33],
            "min_p": [1 / 12],
            "ratio_min": [0.37],
            "ratio_max": [0.70],
        }
    )
    text = findings.scale_finding(summary, paper, None, across)
    assert "Across all 4 models: **we cannot tell**." in text
    said = "Spearman ρ of mean ED with parameter count: cosine +0.80 — untestable with 4 models"
    assert f"{said} (no p below 0.08 is possible)." in text
    single = findings.scale_finding(summary.filter(model="q-0.5b"), paper)
    assert "**we cannot tell** from q-0.5b alone" in single and "the paper's" in single
    assert "Like for like" not in single  # no model of the paper shares its architecture
    # the like-for-like pair: the paper's Qwen2.5-1.5B-Instruct has cosine EDs 16/20/19 (Table 1)
    twin = _summary([("qwen2.5-coder-1.5b", 28, t, "cosine", 16, 15, 17) for t in ("hellaswag", "gsm8k", "aime24")])
    said = findings.scale_finding(twin, paper)
    assert "**Like for like:** beside the paper's Qwen2.5-1.5B-Instruct (bf16; same architecture and depth)" in said
    assert "within 4 layers of its: cosine 16/16/16 against 16/20/19." in said


def test_long_cot_finding_uses_ours_when_measured_and_says_so_when_not():
    pairs = [{"base": "Qwen/Qwen2.5-Math-1.5B", "long_cot": "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"}]
    paper = reference.paper_table1()
    empty = pl.DataFrame(schema=_difficulty_summary().schema)
    error = "cannot load model 'x': the Hugging Face hub cannot be reached from this machine. Offline aliases: a, b"
    offline = findings_long_cot.long_cot_finding(empty, pairs, {"Qwen/Qwen2.5-Math-1.5B": error}, paper)
    assert "we cannot tell" in offline
    assert "Not measured here (Qwen/Qwen2.5-Math-1.5B): the Hugging Face hub cannot be reached from this" in offline
    assert "Offline aliases" not in offline  # the gist of the error, once
    assert "lens KL ±0/−21*/+1" in offline and "artefact" in offline and "at most 1 layer" in offline
    ours = _summary(
        [
            (m, 28, "gsm8k", "cosine", e, e - 1, e + 1)
            for m, e in (("Qwen/Qwen2.5-Math-1.5B", 16), ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", 19))
        ]
    )
    measured = findings_long_cot.long_cot_finding(ours, pairs, {}, paper)
    assert "Ours, deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B − Qwen/Qwen2.5-Math-1.5B" in measured
    assert "cosine +3" in measured and "we cannot tell" not in measured


def test_table1_groups_columns_and_rows_and_marks_the_comparable_pair():
    ours = _summary(
        [
            ("qwen2.5-coder-1.5b", 28, t, r, 16, 15, 17)
            for t in ("hellaswag", "gsm8k", "aime24")
            for r in ("cosine", "lens KL", "lens overlap")
        ]
    )
    html = tables.table1(ours, reference.paper_table1()).as_raw_html()
    for group in ("cosine", "lens KL", "lens overlap", reference.OURS, reference.PAPER):
        assert group in html
    assert "16 (.61)" in html and "1 (.07)" in html and ".7)" not in html  # two decimals throughout
    assert tables.HIGHLIGHT in html and "like-for-like pair" in html and "artefact of the rule" in html
    assert ">10/10/10<" in html  # n per data set, in the columns' order, in one column
    assert "†" not in html.split("<tfoot")[0]  # no degenerate cell of ours: no dagger in the body
    marked = ours.with_columns(
        pl.when((pl.col("task") == "gsm8k") & (pl.col("rule") == "cosine")).then(pl.lit("x")).alias("degenerate")
    )
    body = tables.table1(marked, reference.paper_table1()).as_raw_html().split("<tfoot")[0]
    assert body.count("†") == 1 and "16 (.61) †" in body  # the one degenerate ED of ours, and only it
    without = tables.table1(ours.filter(model="nobody"), reference.paper_table1()).as_raw_html()
    assert tables.HIGHLIGHT not in without and "like-for-like" not in without  # the pair is not complete


def test_erasure_answer_flags_read_back_as_booleans():
    frame = pl.DataFrame({"layer": [0, 0], "position": [0, 1], "is_answer": [False, True], "value": [0.1, 0.2]})
    spec = plots.themed_spec(plots.alt.Chart(frame).mark_rect().encode(x="position:O", y="layer:O"))
    ((_, text),) = spec["datasets"].items()
    assert [r["is_answer"] for r in csv.DictReader(io.StringIO(text))] == ["false", "true"]  # Vega: "False" is true


def test_the_model_dropdown_filters_every_layer_of_the_lens_chart():
    rows = [
        (m, "gsm8k", layer, metric, 0.1 * layer)
        for m in ("m1", "m2")
        for layer in range(4)
        for metric in ("kl", "overlap")
    ]
    lens = pl.DataFrame(rows, schema=["model", "task", "layer", "metric", "value"], orient="row")
    summary = pl.DataFrame({"model": ["m1", "m2"], "task": ["gsm8k"] * 2, "rule": ["lens KL"] * 2, "ed": [1, 2]})
    spec = plots.lens_curves(lens, summary).to_dict()
    for panel in spec["vconcat"]:
        for layer in panel["layer"]:
            if "data" in layer and layer.get("mark", {}) != {"type": "rule", "strokeDash": [4, 4], "color": "#888"}:
                filters = json.dumps(layer.get("transform", []))
                assert "pick_model" in filters, layer  # each child carries its own data: each is filtered


def test_effdepth_plot_saves_a_chart_and_never_overwrites(tiny_dir, tmp_path, capsys):
    from effdepth_core.cli import main

    run = tmp_path / "run"
    argv = ["run", "--model", str(tiny_dir), "--task", "addition", "--n", "2", "--out", str(run), "--no-progress"]
    assert main(argv) == 0
    svg = tmp_path / "lens.svg"
    assert main(["plot", str(run), "--chart", "logit_lens", "--out", str(svg)]) == 0
    assert svg.read_text().startswith("<svg") and "layer whose input is decoded" in svg.read_text()
    capsys.readouterr()
    assert main(["plot", str(run), "--chart", "logit_lens", "--out", str(svg)]) == 2  # exists: refused
    assert main(["plot", str(run), "--chart", "erasure", "--out", str(tmp_path / "e.png")]) == 2  # not run
    assert "no erasure results" in capsys.readouterr().err
    default = tmp_path / "default.svg"  # no --chart: the first probe's chart (cosine, the first run)
    assert main(["plot", str(run), "--out", str(default)]) == 0
    assert "cos" in default.read_text().lower() and "layer whose input is decoded" not in default.read_text()


def test_effdepth_plot_handles_odd_runs_and_outputs(tiny_dir, tmp_path, capsys, monkeypatch):
    from effdepth_core.cli import main

    run = tmp_path / "current"
    argv = ["run", "--model", str(tiny_dir), "--task", "addition", "--n", "1", "--out", str(run), "--no-progress"]
    assert main([*argv, "--probes", "skip", "--skip-variants", "current"]) == 0
    assert main(["plot", str(run), "--chart", "skip", "--out", str(tmp_path / "s.svg")]) == 0  # the all-token skips
    assert main(["plot", str(run), "--chart", "skip-output", "--out", "/proc/effdepth.svg"]) == 2  # not writable
    monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["plot", str(run), "--chart", "skip-output", "--out", "~/home.svg"]) == 0
    assert (tmp_path / "home.svg").is_file()
    (run / "skip.parquet").write_bytes(b"PAR1 damaged")
    capsys.readouterr()
    assert main(["plot", str(run), "--chart", "skip", "--out", str(tmp_path / "t.svg")]) == 2
    assert "damaged" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # an empty name is a mistake, not "every page"
        main(["book", "--print-params", ""])
    assert refused.value.code == 2 and "--print-params: is empty" in capsys.readouterr().err


# --- beyond the paper: the verdicts follow the numbers ---------------------------------------------


def _lenses(differences: list[tuple[float, float, float]], excluded: list[str | None] | None = None) -> pl.DataFrame:
    rows = []
    for index, (p, lo, hi) in enumerate(differences):
        rows.append(
            {
                "model": "m",
                "task": ("gsm8k", "hellaswag")[index % 2],
                "lens_rule": ("KL", "overlap")[index // 2 % 2],
                "point": p,
                "low": lo,
                "high": hi,
                "defined": 1.0,
                "n": 20,
                "excluded": (excluded or [None] * len(differences))[index],
            }
        )
    return pl.DataFrame(rows)


def test_lens_finding_verdict_follows_the_intervals():
    summary = _summary([("m", 30, "gsm8k", "lens KL", 20, 19, 21)])
    assert "**no**" in findings_beyond.lens_finding(summary, None, _lenses([(0, -1, 1), (0.5, -0.5, 1.0)]))
    assert "**yes**" in findings_beyond.lens_finding(summary, None, _lenses([(-8, -9, -7), (6, 5, 7)]))
    said = findings_beyond.lens_finding(summary, None, _lenses([(0, -1, 1), (-8, -9, -7)]))
    assert "**in part**: 1 of 2 usable depths move" in said
    # an interval that straddles the ±1 band decides nothing: the answer is qualified, never mixed
    said = findings_beyond.lens_finding(summary, None, _lenses([(-1, -3, 0.5), (-8, -9, -7)]))
    assert "**yes, where the intervals can tell**: 1 of 2 usable depths move" in said
    assert "1 cannot tell (an interval across ±1 layer, or a robustness check failed)" in said
    said = findings_beyond.lens_finding(summary, None, _lenses([(-1, -3, 0.5), (0, -1, 1)]))
    assert "**no, where the intervals can tell**: 1 of 2 usable depths stay" in said
    said = findings_beyond.lens_finding(summary, None, _lenses([(-1, -3, 0.5), (1, 0.5, 3)]))
    assert "**we cannot tell**: no usable depth provably moves or stays; 2 intervals across ±1 layer at every" in said
    # an ED that moves at the book's threshold but stays at another: the headline names that test, not
    # its interval (the tuned-lens headlines once blamed the intervals for threshold failures)
    robust = _lenses([(-2.0, -3.0, -2.0), (-1.0, -3.0, 0.5)]).with_columns(variant=pl.lit(""))
    shifted = robust.head(1).with_columns(point=pl.lit(0.0), low=pl.lit(-1.0), high=pl.lit(1.0), variant=pl.lit("t"))
    said = findings_beyond.lens_finding(summary, None, pl.concat([robust, shifted]))
    assert "no usable depth provably moves or stays; 1 of 2 usable depths change with the bootstrap seed" in said
    assert "and 1 interval across ±1 layer at every check" in said
    # a degenerate or small cell never counts, and is named
    kept = findings_beyond.lens_finding(
        summary, None, _lenses([(0, -1, 1), (-8, -9, -7)], [None, "m gsm8k: degenerate"])
    )
    assert "**no**" in kept and "Not counted" in kept
    assert "cannot tell" in findings_beyond.lens_finding(summary, None, None)
    fit = pl.DataFrame(
        {
            "model": ["m"] * 4,
            "layer": [0, 0, 1, 1],
            "metric": ["heldout_kl_logit", "heldout_kl_tuned"] * 2,
            "value": [5.0, 2.0, 1.0, 1.5],
        }
    )
    assert "m at 1 of 2 layers (mean 3.00 → 1.75 nats)" in findings_beyond.lens_finding(
        summary, fit, _lenses([(0, -1, 1)])
    )


def test_early_exit_costs_read_the_layer_after_the_counted_ed():
    from types import SimpleNamespace

    from effdepth_book.sections.beyond.evidence import early_exit_costs
    from effdepth_book.study import RunRecord, Study

    rows = []
    for e in range(10):  # L = 4; exit after ED 1 reads layer 2 against the full model's layer 4
        for layer, nll, agree in ((2, 3.0 + 0.1 * e, 0.75), (4, 1.0, 1.0), (1, 9.0, 0.1)):
            rows += [(e, layer, "answer_nll", nll, 2 + e % 3), (e, layer, "agreement", agree, 10)]
    frame = pl.DataFrame(rows, schema=["example", "layer", "metric", "value", "n_tokens"], orient="row")
    result = SimpleNamespace(per_example={"early_exit": frame}, curves={}, summary={"n_layers": 4})
    study = Study([RunRecord("m", "GSM8K", None, ["early_exit"], result=result)])
    summary = _summary([("m", 4, "GSM8K", "lens overlap", 1, 1, 1)])
    costs = early_exit_costs(study, summary)
    row = costs.row(0, named=True)
    tokens = [2 + e % 3 for e in range(10)]
    expected = sum((2.0 + 0.1 * e) * t for e, t in enumerate(tokens)) / sum(tokens)
    assert row["cost"] == pytest.approx(expected, rel=1e-12) and row["kept"] == pytest.approx(0.75)
    assert row["saved"] == 0.5 and row["cost_low"] > 0 and row["positive"] and row["counted"]
    said = findings_beyond.early_exit_finding(costs)
    assert "**the layers after ED are not idle**: exiting there raises the answer NLL in its one counted run" in said
    assert "saves 50%, 75% [75%, 75%] of tokens keep their final top-1" in said
    assert "cannot tell" in findings_beyond.early_exit_finding(costs.head(0))


def test_early_exit_is_judged_at_every_threshold_of_its_rule():
    """(a) of the robustness rule for early exit: at overlap thresholds 0.35–0.5 the ED run's own
    curve puts ED at layer 4, and exiting after it costs nothing (layer 5's NLL is the final one's):
    the verdict is cannot tell, naming that threshold, though the book's own exit costs 2 nats. At
    0.2 the curve fires at layer 0, a rule artefact (§10): no depth, and no check."""
    from types import SimpleNamespace

    from effdepth_book.sections.beyond.evidence import early_exit_costs
    from effdepth_book.study import RunRecord, Study

    rows, lens = [], []
    for e in range(10):  # L = 8; the book's ED 3 (overlap 0.32 > 0.3) exits to layer 4, ED 4 to layer 5
        for layer, nll, agree in ((1, 9.0, 0.1), (4, 3.0 + 0.1 * e, 0.75), (5, 1.0, 0.9), (8, 1.0, 1.0)):
            rows += [(e, layer, "answer_nll", nll, 2 + e % 3), (e, layer, "agreement", agree, 10)]
        for layer, overlap in enumerate((0.21, 0.05, 0.1, 0.32, 0.6, 1.0, 1.0, 1.0, 1.0)):
            lens += [(e, layer, "overlap", overlap, 7), (e, layer, "kl", 8.0 - layer, 7)]
    schema = ["example", "layer", "metric", "value", "n_tokens"]
    exits = SimpleNamespace(per_example={"early_exit": pl.DataFrame(rows, schema=schema, orient="row")}, curves={},
                            summary={"n_layers": 8})  # fmt: skip
    curves = SimpleNamespace(per_example={"logit_lens": pl.DataFrame(lens, schema=schema, orient="row")}, curves={},
                             summary={"n_layers": 8})  # fmt: skip
    settings = SimpleNamespace(overlap_threshold=0.3, kl_fraction=0.5)
    study = Study(
        [
            RunRecord("m", "GSM8K", settings, ["logit_lens"], result=curves),
            RunRecord("m", "GSM8K", settings, ["early_exit"], result=exits),
        ]
    )
    summary = _summary([("m", 8, "GSM8K", "lens overlap", 3, 3, 3)])
    row = early_exit_costs(study, summary).row(0, named=True)
    assert row["exit_layer"] == 4 and (row["exit_low"], row["exit_high"]) == (4, 5)  # the artefact at 0.2 left out
    assert row["cost_low"] > 0 and not row["positive"] and row["why"] == "at overlap threshold 0.35"
    said = findings_beyond.early_exit_finding(early_exit_costs(study, summary))
    assert "**we cannot tell** whether the layers after ED matter: in 1 of 1 counted runs" in said
    assert "(m GSM8K logit lens: at overlap threshold 0.35)" in said
    assert "over the threshold range after layer 3–4" in said


def _map(best: list[int], n_big: int = 8, n_prompts: int = 4, baseline: float = 1.0, error=None) -> pl.DataFrame:
    """A measured map whose error is lowest at ``best[m]`` (the same in every test prompt), or is
    ``error(m, b)``."""
    n_small = len(best) - 1
    error = error or (lambda m, b: 0.1 + abs(b - best[m]) / 10)
    rows = []
    for prompt in [None, *range(n_prompts)]:
        rows += [(prompt, m, b, "relative_error", error(m, b)) for m in range(n_small + 1) for b in range(n_big + 1)]
    rows += [(None, m, b, "baseline_error", baseline) for m in range(n_small + 1) for b in range(n_big + 1)]
    rows += [(None, m, b, "self_error", 0.0 if m == b else 0.5) for m in range(n_small + 1) for b in range(n_small + 1)]
    rows += [(None, m, None, "best_big_layer", float(best[m])) for m in range(n_small + 1)]
    rows += [(None, m, None, "equal_depth_layer", m * n_big / n_small) for m in range(n_small + 1)]
    rows += [(None, None, None, "n_train_tokens", 9000.0), (None, None, None, "small_width", 896.0)]
    schema = {
        "prompt": pl.Int64,
        "small_layer": pl.Int64,
        "big_layer": pl.Int64,
        "metric": pl.String,
        "value": pl.Float64,
    }
    return pl.DataFrame(rows, schema=schema, orient="row")


def test_map_finding_verdict_follows_the_numbers():
    from effdepth_book.sections.beyond.evidence import map_statistic

    stretched = _map([0, 2, 4, 6, 8])
    said = findings_beyond.map_finding(stretched, "small", "big", map_statistic(stretched))
    assert "**yes**" in said and "(the column bias), for 100% [100%, 100%] of the 3 inner layers" in said
    # chance: equal depth 2, 4, 6 of big layers 0..8, slack 1 layer: 3 of the 9 layers each
    assert "a best layer drawn at random would do so for 33%" in said
    assert "shuffled pairs give 1.00–1.00" in said and "at most 0.0e+00 on the diagonal beyond layer 0" in said
    squashed = _map([0, 8, 8, 8, 8])
    assert "**no**" in findings_beyond.map_finding(squashed, "small", "big", map_statistic(squashed))
    blind = _map([0, 2, 4, 6, 8], baseline=0.1)  # the shuffled maps are as good: nothing is measured
    assert "no better than maps fitted on shuffled token pairs" in findings_beyond.map_finding(
        blind, "small", "big", map_statistic(blind)
    )
    assert "cannot tell" in findings_beyond.map_finding(
        pl.DataFrame({"metric": []}, schema={"metric": pl.String}), "a", "b"
    )
    shrunk = stretched.with_columns(  # a self-map off the identity (a ridge, a broken solver): the fit is in doubt
        pl.when(
            (pl.col("metric") == "self_error")
            & (pl.col("small_layer") == pl.col("big_layer"))
            & (pl.col("small_layer") > 0)
        )
        .then(0.1)
        .otherwise(pl.col("value"))
        .alias("value")
    )
    said = findings_beyond.map_finding(shrunk, "small", "big", map_statistic(shrunk))
    assert "**we cannot tell**: mapped onto itself the small model does not give the identity" in said
    assert "at most 1.0e-01 on the diagonal beyond layer 0: not the identity" in said
    embeddings = stretched.with_columns(  # layer 0 alone off the identity: unseen tokens' embeddings, said as such
        pl.when((pl.col("metric") == "self_error") & (pl.col("small_layer") == 0) & (pl.col("big_layer") == 0))
        .then(0.04)
        .otherwise(pl.col("value"))
        .alias("value")
    )
    said = findings_beyond.map_finding(embeddings, "small", "big", map_statistic(embeddings))
    assert "**yes**" in said and "at layer 0, the token embeddings, 0.04" in said


def test_the_map_verdict_names_its_interval_and_holds_under_other_seeds():
    """An interval between ⅓ and ⅔ is said as such (it once said "straddles both thresholds" of
    [52 %, 70 %]); a verdict that another bootstrap seed turns is cannot tell, naming the seed."""
    from effdepth_book.sections.beyond.evidence import map_statistic

    stretched = _map([0, 2, 4, 6, 8])
    statistic = map_statistic(stretched)
    middle = {**statistic, "low": 0.40, "high": 0.60, "centred_low": 0.52, "centred_high": 0.70}
    said = findings_beyond.map_finding(stretched, "small", "big", middle)
    assert (
        "**we cannot tell**: both shares' intervals (raw [40%, 60%], column bias removed [52%, 70%]) lie neither "
        "above ⅔ of the layers (yes) nor below ⅓ (no)" in said
    )
    # the documented rule (method.md §7b): the raw share says no, the centred one nothing — cannot tell
    split = {**middle, "share": 0.24, "low": 0.22, "high": 0.26}
    said = findings_beyond.map_finding(stretched, "small", "big", split)
    assert "**we cannot tell**: the two shares decide differently — raw 24% [22%, 26%] says no" in said
    assert "**yes**" in findings_beyond.map_finding(stretched, "small", "big", statistic, [statistic, statistic])
    other = {**statistic, "centred_low": 0.6}
    said = findings_beyond.map_finding(stretched, "small", "big", statistic, [statistic, other])
    assert "**we cannot tell**: the verdict changes with the bootstrap seed (yes at this seed, we cannot tell" in said


def test_a_column_bias_alone_cannot_decide_the_map():
    """The diagonal is there (a slope of 0.01 per layer away from 2m), but the last big layers are
    easier to predict from any small layer (0.06 per layer lower): every raw best layer is the last
    one ("no"); removing each big layer's mean error finds the diagonal ("yes"). The two shares
    decide differently, so by the documented rule (method.md §7b) the verdict is cannot tell, each
    share named."""
    from effdepth_book.sections.beyond.evidence import map_statistic

    biased = _map([0, 2, 4, 6, 8], error=lambda m, b: 0.6 + abs(b - 2 * m) / 100 - 0.06 * b)
    statistic = map_statistic(biased)
    assert statistic["share"] == 0.0 and statistic["centred_share"] == 1.0  # raw: all at 8, 2 from m=3's 6
    assert statistic["easiest_big_layer"] == 8
    said = findings_beyond.map_finding(biased, "small", "big", statistic)
    assert "**we cannot tell**: the two shares decide differently — raw 0% [0%, 0%] says no, column bias " in said
    assert "removed 100% [100%, 100%] says yes (method.md §7b: cannot tell)" in said
    assert "Without that correction the share is 0% [0%, 0%]" in said


def test_beyond_charts_build_from_probe_frames():
    summary = _summary([("m", 30, t, r, 20, 19, 21) for t in ("gsm8k",) for r in ("lens KL", "tuned KL")])
    fit = pl.DataFrame(
        {"model": ["m"] * 2, "layer": [0, 0], "metric": ["heldout_kl_logit", "heldout_kl_tuned"], "value": [5.0, 2.0]}
    )
    for chart in (
        beyond_charts.lens_ed_comparison(summary),
        beyond_charts.lens_fit_curves(fit),
        beyond_charts.map_heatmap(_map([0, 2, 4, 6, 8])),
    ):
        spec = plots.themed_spec(chart)
        assert spec["datasets"], spec
    assert isinstance(beyond_charts.pruning_curves(pl.DataFrame()), plots.Note)


def _prune_study(after: list[float], angular: list[float], influence: list[float], tokens: list[int], ed: int = 3):
    """A study of one pruning run on L = 6 layers with lens-overlap ED 3 (past the first layers, so not
    an artefact): per prompt, the answer NLL increase of removing layer 4 (the block after ED), layer 3
    (least angular distance) and layer 5 (block influence's pick, the same layer as block 5); layer 0
    costs 9 nats (layers 1 and 2 are not cut). Clean NLL 1.0 everywhere."""
    from types import SimpleNamespace

    from effdepth_book.study import RunRecord, Study
    from effdepth_core.measurement.probes import prune_summary

    rows = []
    for e, t in enumerate(tokens):
        rows.append((e, "none", 0, None, "", "answer_nll", 1.0, t))
        for start, extra in ((0, 9.0), (3, angular[e]), (4, after[e]), (5, influence[e])):
            rows.append((e, "block", 1, start, str(start), "answer_nll", 1.0 + extra, t))
            rows.append((e, "block", 1, start, str(start), "angular_distance", 0.1 if start == 3 else 0.5, 7))
        rows.append((e, "shortgpt", 1, None, "5", "answer_nll", 1.0 + influence[e], t))
    schema = {"example": pl.Int64, "rule": pl.String, "k": pl.Int64, "start": pl.Int64, "removed": pl.String,
              "metric": pl.String, "value": pl.Float64, "n_tokens": pl.Int64}  # fmt: skip
    rows += [(*r[:5], "answer_accuracy", 0.5, r[7]) for r in rows if r[5] == "answer_nll"]
    per_example = pl.DataFrame(rows, schema=schema, orient="row")
    result = SimpleNamespace(
        per_example={"prune": per_example},
        curves={"prune": prune_summary(per_example)},
        summary={"n_layers": 6, "n_examples": len(tokens), "logit_lens_overlap": {"ed": ed}},
    )
    return Study([RunRecord("m", "GSM8K", None, ["prune", "logit_lens"], result=result)])


def test_pruning_costs_against_hand_computed_means():
    from effdepth_book.sections.beyond.evidence import pruning_costs

    tokens = [3, 5, 2, 4, 6, 1, 3, 2, 5, 4]
    after = [0.4 + 0.02 * e for e in range(10)]
    angular = [2.0] * 10
    influence = [1.0 + 0.01 * e for e in range(10)]
    costs = pruning_costs(_prune_study(after, angular, influence, tokens)).filter(variant="")
    row = costs.row(0, named=True)
    weighted = lambda values: sum(v * t for v, t in zip(values, tokens, strict=True)) / sum(tokens)  # noqa: E731
    assert row["removed"] == "4" and row["best_alternative"] == "block influence"
    assert row["percentile"] == 0 and row["blocks"] == 4  # the cheapest of the 4 single-layer blocks cut
    assert row["delta_nll"] == pytest.approx(weighted(after), rel=1e-12)  # float64 sums of ten terms
    assert row["difference"] == pytest.approx(weighted(after) - weighted(influence), rel=1e-12)
    assert row["ratio"] == pytest.approx(weighted(after) / weighted(influence), rel=1e-12)
    assert row["low"] <= row["difference"] <= row["high"] < 0 and row["verdict"] == "cheaper" and row["counted"]
    assert not row["holds_final"]
    # layer 2 on some prompts costs more than layer 3, on others less: the interval reaches across zero
    mixed = [0.0, 2.0] * 5
    row = pruning_costs(_prune_study(mixed, angular, [1.0] * 10, [1] * 10)).filter(variant="").row(0, named=True)
    assert row["low"] < 0 < row["high"] and row["verdict"] == "unclear"
    few = pruning_costs(_prune_study(after[:4], angular[:4], influence[:4], tokens[:4]))
    assert not few["counted"].any()
    costly = pruning_costs(_prune_study([3.0] * 10, angular, influence, tokens)).filter(variant="")
    assert costly["percentile"][0] == 0.5  # angular distance's (2 nats) and influence's (~1) blocks cost less
    # an ED in the first layers (1 of 6: an artefact) places no block: nothing is shown as counted
    assert not pruning_costs(_prune_study(after, angular, influence, tokens, ed=1)).height


def test_pruning_is_judged_at_every_threshold_of_its_ed_rule():
    """(a) of the robustness rule for pruning, on L = 8: the book's ED 4 (overlap 0.32 > 0.3) cuts
    layer 5 (0.5 nats, cheaper than block influence's layer 6 at 1 nat); at overlap thresholds 0.2
    and 0.25 the ED run's curve puts ED at 3, whose block, layer 4, costs 2 nats (costlier): the
    budget is unclear, naming the threshold."""
    from types import SimpleNamespace

    from effdepth_book.sections.beyond.evidence import pruning_costs
    from effdepth_book.study import RunRecord, Study
    from effdepth_core.measurement.probes import prune_summary

    cost = {1: 2.0, 4: 2.0, 5: 0.5, 6: 1.0}  # angular distance picks layer 1, block influence layer 6
    rows = []
    for e in range(10):
        rows.append((e, "none", 0, None, "", "answer_nll", 1.0, 1))
        for start in range(8):
            rows.append((e, "block", 1, start, str(start), "answer_nll", 1.0 + cost.get(start, 9.0), 1))
            rows.append((e, "block", 1, start, str(start), "angular_distance", 0.1 if start == 1 else 0.5, 7))
        rows.append((e, "shortgpt", 1, None, "6", "answer_nll", 2.0, 1))
    rows += [(*r[:5], "answer_accuracy", 0.5, r[7]) for r in rows if r[5] == "answer_nll"]
    schema = {"example": pl.Int64, "rule": pl.String, "k": pl.Int64, "start": pl.Int64, "removed": pl.String,
              "metric": pl.String, "value": pl.Float64, "n_tokens": pl.Int64}  # fmt: skip
    per_example = pl.DataFrame(rows, schema=schema, orient="row")
    lens = [(e, layer, m, v, 7) for e in range(10) for layer, o in enumerate((0.0, 0.05, 0.1, 0.28, 0.32, 0.6, 1, 1, 1))
            for m, v in (("overlap", o), ("kl", 8.0 - layer))]  # fmt: skip
    frame = pl.DataFrame(lens, schema=["example", "layer", "metric", "value", "n_tokens"], orient="row")
    ed = {"n_layers": 8, "n_examples": 10, "logit_lens_overlap": {"ed": 4}}
    pruned = SimpleNamespace(
        per_example={"prune": per_example}, curves={"prune": prune_summary(per_example)}, summary=ed
    )
    curves = SimpleNamespace(per_example={"logit_lens": frame}, curves={}, summary=ed)
    settings = SimpleNamespace(overlap_threshold=0.3, kl_fraction=0.5)
    alone = Study([RunRecord("m", "GSM8K", None, ["prune"], result=pruned)])
    assert pruning_costs(alone).filter(variant="")["verdict"].to_list() == ["cheaper"]  # no ED curve: own ED only
    both = Study([RunRecord("m", "GSM8K", settings, ["logit_lens"], result=curves), *alone.records])
    row = pruning_costs(both).filter(variant="").row(0, named=True)
    assert row["removed"] == "5" and row["verdict"] == "unclear" and row["why"] == "at overlap threshold 0.2"
    said = findings_beyond.pruning_finding(pruning_costs(both))
    assert "change with the bootstrap seed or the ED's threshold" in said


def test_pruning_finding_verdict_follows_the_intervals():
    from effdepth_book.sections.beyond.evidence import pruning_costs

    tokens = [1] * 10
    cheaper = pruning_costs(_prune_study([0.5] * 10, [2.0] * 10, [1.0] * 10, tokens))
    said = findings_beyond.pruning_finding(cheaper)
    assert "The block after ED: **yes**: cheaper in the one budget." in said
    assert "0.5× [0.5, 0.5] the best alternative's ΔNLL (block influence +1.00 nats)" in said
    costlier = pruning_costs(_prune_study([3.0] * 10, [2.0] * 10, [1.0] * 10, tokens))
    assert "**no**: costlier in 1 of 1 budgets" in findings_beyond.pruning_finding(costlier)
    mixed = pruning_costs(_prune_study([0.0, 2.0] * 5, [2.0] * 10, [1.0] * 10, tokens))
    assert "**we cannot tell**: 1 of 1 budgets have an interval across zero" in findings_beyond.pruning_finding(mixed)
    few = pruning_costs(_prune_study([0.5] * 4, [2.0] * 4, [1.0] * 4, [1] * 4))
    assert "Only runs of fewer than 10 prompts (n = 4)" in findings_beyond.pruning_finding(few)
    assert "cannot tell" in findings_beyond.pruning_finding(pl.DataFrame())


def test_a_page_names_the_probes_that_did_not_run_and_why_instead_of_an_empty_chart():
    from types import SimpleNamespace

    from effdepth_book.pages import Page
    from effdepth_book.study import RunRecord, Study

    ran = SimpleNamespace(per_example={}, curves={}, summary={"n_layers": 4})
    study = Study(
        [
            RunRecord("a", "addition", None, ["skip", "erasure"], result=ran),
            RunRecord("b", "addition", None, ["skip"], result=ran),
            RunRecord("c", "addition", None, ["skip", "erasure"], error="out of memory"),
        ]
    )
    page = SimpleNamespace(section="scale")
    said = Page.not_run(page, study, "erasure")
    assert said == (
        "residual erasure: could not run on c: out of memory; not asked for on b by params/scale.yml "
        "(its comments give the cost that ruled it out on this CPU)."
    )
    assert Page.not_run(page, study, "skip") == "layer skipping: could not run on c: out of memory."
    page.not_run = lambda s, p: Page.not_run(page, s, p)
    note = Page.probe_chart(page, Study([study.records[1]]), "erasure", lambda: pytest.fail("an empty chart was built"))
    assert note.text.startswith("residual erasure: not asked for on b by params/scale.yml")


def test_the_length_control_removes_what_length_predicts():
    """Two data sets whose per-prompt depth follows log length alone (the same line in both): the
    raw difference is the line's rise between their mean log lengths, and the adjusted one is 0.
    Centroids are read off step curves: a prompt whose KL drops at layer s has centroid s."""
    import math
    from types import SimpleNamespace

    import numpy as np

    from effdepth_book.evidence import length_control
    from effdepth_book.study import RunRecord, Study

    n_layers = 12

    def run(tokens: list[int]) -> SimpleNamespace:
        rows = []
        for e, t in enumerate(tokens):
            step = 2 + 2 * math.log2(t / 16)  # depth = 2 + 2·log2(t/16): 16 → 2, 32 → 4, 64 → 6, 128 → 8
            kl = [8.0 if layer <= step else 0.0 for layer in range(n_layers + 1)]
            rows += [(e, layer, m, v, t) for layer, v in enumerate(kl) for m, v in (("kl", v), ("overlap", 0.0))]
        frame = pl.DataFrame(rows, schema=["example", "layer", "metric", "value", "n_tokens"], orient="row")
        return SimpleNamespace(per_example={"logit_lens": frame}, curves={}, summary={"n_layers": n_layers})

    settings = SimpleNamespace(kl_fraction=0.5, overlap_threshold=0.3)
    short, long = [16, 32, 16, 32], [64, 128, 64, 128]
    study = Study([RunRecord("m", "a", settings, ["logit_lens"], result=run(short)),
                   RunRecord("m", "b", settings, ["logit_lens"], result=run(long))])  # fmt: skip
    row = length_control(study, "m", "a", "b", rules=("lens KL",), n_bootstrap=200).row(0, named=True)
    # depths 2, 4 against 6, 8 layers: the ratio (d + 1) / 12 rises by 4 / 12
    assert row["raw"] == pytest.approx(4 / 12, rel=1e-12)
    # slope per unit of ln(tokens): 2 layers per doubling, i.e. 2 / ln 2 layers, / 12 in ratio
    assert row["slope"] == pytest.approx(2 / math.log(2) / 12, rel=1e-12)
    assert row["adjusted"] == pytest.approx(0.0, abs=1e-12) and row["n_first"] == row["n_second"] == 4
    assert np.isclose(row["adjusted_low"], 0, atol=1e-9) or row["adjusted_low"] <= 0 <= row["adjusted_high"]
    said = findings.length_sentence(length_control(study, "m", "a", "b", rules=("lens KL",), n_bootstrap=200))
    assert "lens KL +0.33 [" in said and re.search(r"adjusted [+±−]0\.00 \[", said)  # 0 up to float rounding
