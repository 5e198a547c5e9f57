"""The book's findings text and tables are generated from the numbers: change the numbers and the
words change; the chart bugs readers met stay fixed."""

from __future__ import annotations

import csv
import io
import json

import polars as pl

from effdepth_core.book import findings, plots, reference, tables


def _summary(rows: list[tuple]) -> pl.DataFrame:
    """(model, L, task, rule, ed, ci_low, ci_high) → a Study.summary()-like frame."""
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
                "reason": None,
                "n_layers": n_layers,
                "n_params": n_layers * 10**6,
                "n_examples": 10,
            }
        )
    return pl.DataFrame(out)


def _difficulty(eds: tuple[int, int, int], width: int = 0) -> pl.DataFrame:
    tasks = ("hellaswag", "gsm8k", "aime24")
    return _summary([("m", 30, t, "cosine", e, e - width, e + width) for t, e in zip(tasks, eds, strict=True)])


def test_difficulty_finding_follows_the_numbers():
    flat = findings.difficulty_finding(_difficulty((20, 20, 21), width=1))
    rising = findings.difficulty_finding(_difficulty((12, 20, 26)))
    assert "consistent — **we agree**" in flat and "we disagree" not in flat
    assert "rises with difficulty — **we disagree**" in rising
    assert "HellaSwag 12 (0.43) [12–12] → GSM8K 20 (0.70) [20–20] → AIME24 26 (0.90) [26–26]" in rising
    # the tolerance is the paper's own spread across data sets plus the sampling slack
    paper = reference.paper_table1()
    tolerance = findings.paper_spread(paper, "cosine", "task") + findings.SAMPLING_SLACK
    assert 0.1 < tolerance < 0.25
    assert "**we agree**" in findings.difficulty_finding(_difficulty((17, 20, 21)), paper=paper)
    # a lens-KL ED of 2 is the rule's artefact: named, left out of the verdict
    kl = _summary(
        [("m", 30, t, "lens KL", e, e, e) for t, e in zip(("hellaswag", "gsm8k", "aime24"), (2, 20, 21), strict=True)]
    )
    text = findings.difficulty_finding(kl)
    assert "artefact" in text and "HellaSwag (2)" in text and "**we agree**" in text


def test_scale_finding_follows_the_numbers():
    tasks = ("hellaswag", "gsm8k", "aime24")
    stable = _summary(
        [
            (m, n, t, "cosine", round(0.6 * n), round(0.6 * n) - 2, round(0.6 * n) + 2)
            for m, n in (("a", 20), ("b", 40))
            for t in tasks
        ]
    )
    apart = _summary([(m, n, t, "cosine", e, e, e) for m, n, e in (("a", 20, 5), ("b", 40, 35)) for t in tasks])
    paper = reference.paper_table1()
    assert "**we agree** on a stable ratio" in findings.scale_finding(stable, paper)
    text = findings.scale_finding(apart, paper)
    assert "**we disagree** on a stable ratio" in text and "a 0.30, b 0.90" in text and "grows with size" in text
    single = findings.scale_finding(stable.filter(model="a"), paper)
    assert "Cannot tell" in single and "inside the paper's 0.43–0.75" in single
    partly = findings.scale_finding(apart.filter(model="b").with_columns(ratio=pl.Series([0.5, 0.7, 0.9])), paper)
    assert "partly inside" in partly


def test_long_cot_finding_uses_ours_when_measured_and_says_so_when_not():
    pairs = [{"base": "Qwen/Qwen2.5-Math-1.5B", "long_cot": "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"}]
    paper = reference.paper_table1()
    empty = pl.DataFrame(schema=_difficulty((1, 1, 1)).schema)
    error = "cannot load model 'x': the Hugging Face hub cannot be reached from this machine. Offline aliases: a, b"
    offline = findings.long_cot_finding(empty, pairs, {"Qwen/Qwen2.5-Math-1.5B": error}, paper)
    assert "we cannot tell" in offline and "the Hugging Face hub cannot be reached from this machine)" in offline
    assert "Offline aliases" not in offline  # the gist of the error, once
    assert "lens KL ±0/−21*/+1" in offline and "artefact" in offline and "at most 1 layer" in offline
    ours = _summary(
        [
            (m, 28, "gsm8k", "cosine", e, e - 1, e + 1)
            for m, e in (("Qwen/Qwen2.5-Math-1.5B", 16), ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", 19))
        ]
    )
    measured = findings.long_cot_finding(ours, pairs, {}, paper)
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
    assert "16 (0.61)" in html and "1 (0.07)" in html and "0.7)" not in html  # two decimals throughout
    assert tables.HIGHLIGHT in html and "like-for-like pair" in html and "artefact of the rule" in html
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
    assert main(["plot", str(run), "--chart", "lens", "--out", str(svg)]) == 0
    assert svg.read_text().startswith("<svg") and "layer whose input is decoded" in svg.read_text()
    capsys.readouterr()
    assert main(["plot", str(run), "--chart", "lens", "--out", str(svg)]) == 2  # exists: refused
    assert main(["plot", str(run), "--chart", "erasure", "--out", str(tmp_path / "e.png")]) == 2  # not run
    assert "no erasure results" in capsys.readouterr().err


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
    assert main(["book", "--print-params", ""]) == 2  # an empty name is a mistake, not "every page"


# --- beyond the paper: the verdicts follow the numbers ---------------------------------------------


def _lens_summary(tuned_shift: int) -> pl.DataFrame:
    rows = []
    for task in ("gsm8k", "hellaswag"):
        rows += [("m", 30, task, "lens KL", 20, 19, 21), ("m", 30, task, "lens overlap", 22, 21, 23)]
        rows += [
            ("m", 30, task, "tuned KL", 20 + tuned_shift, 19 + tuned_shift, 21 + tuned_shift),
            ("m", 30, task, "tuned overlap", 22 + tuned_shift, 21 + tuned_shift, 23 + tuned_shift),
        ]
    return _summary(rows)


def test_lens_finding_verdict_follows_the_numbers():
    assert "**no**" in findings.lens_finding(_lens_summary(0))
    assert "**yes**: no tuned-lens ED agrees with the logit lens's (4 earlier)" in findings.lens_finding(
        _lens_summary(-8)
    )
    assert "(4 later)" in findings.lens_finding(_lens_summary(+6))
    mixed = _lens_summary(0).with_columns(
        pl.when((pl.col("rule") == "tuned KL") & (pl.col("task") == "gsm8k"))
        .then(5)
        .otherwise(pl.col("ed"))
        .alias("ed")
    )
    mixed = mixed.with_columns(
        ((pl.col("ed") + 1) / 30).alias("ratio"), pl.col("ed").alias("ci_low"), pl.col("ed").alias("ci_high")
    )
    assert "**unclear**" in findings.lens_finding(mixed)
    assert "cannot tell" in findings.lens_finding(_summary([("m", 30, "gsm8k", "lens KL", 20, 19, 21)]))
    fit = pl.DataFrame(
        {
            "model": ["m"] * 4,
            "layer": [0, 0, 1, 1],
            "metric": ["heldout_kl_logit", "heldout_kl_tuned"] * 2,
            "value": [5.0, 2.0, 1.0, 1.5],
        }
    )
    assert "1 of 2 layers (mean 3.00 → 1.75 nats)" in findings.lens_finding(_lens_summary(0), fit)


def _comparison(after: float, angular: float, influence: float) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "model": ["m"] * 3,
            "task": ["gsm8k"] * 3,
            "k": [8] * 3,
            "choice": ["after ED (lens overlap)", "angular distance", "block influence"],
            "removed": ["21,22", "3,4", "9"],
            "delta_nll": [after, angular, influence],
            "answer_accuracy": [0.5, 0.5, 0.5],
        }
    )


def test_pruning_finding_verdict_follows_the_numbers():
    assert "block influence: **yes**" in findings.pruning_finding(_comparison(0.1, 0.5, 0.9))
    said = findings.pruning_finding(_comparison(0.9, 0.5, 0.1))
    assert "block influence: **no**" in said and "block influence +0.10" in said
    tie = _comparison(0.5, 0.5, 0.9).with_columns(pl.Series("removed", ["3,4", "3,4", "9"]))
    assert "**a tie**" in findings.pruning_finding(tie)
    assert "cannot tell" in findings.pruning_finding(pl.DataFrame())
    other_rule = _comparison(0.1, 0.5, 0.9).with_columns(pl.col("choice").str.replace("lens overlap", "lens KL"))
    assert "cannot tell" in findings.pruning_finding(other_rule)  # one ED rule decides, never the best of several


def test_early_exit_finding_reads_the_layer_after_ed():
    summary = _summary([("m", 4, "gsm8k", "lens overlap", 1, 1, 1)])
    exits = pl.DataFrame(
        {
            "model": ["m"] * 6,
            "task": ["gsm8k"] * 6,
            "lens": ["logit"] * 6,
            "layer": [2, 2, 4, 4, 1, 1],
            "metric": ["agreement", "answer_nll", "agreement", "answer_nll", "agreement", "answer_nll"],
            "value": [0.75, 3.0, 1.0, 1.0, 0.1, 9.0],
        }
    )
    said = findings.early_exit_finding(exits, summary)
    assert "exit after layer 1 of 4, saving 50% of the layers): 75% of tokens keep their top-1" in said
    assert "answer NLL 1.00 → 3.00" in said


def _map(best: list[int], n_big: int = 8) -> pl.DataFrame:
    n_small = len(best) - 1
    rows = [(m, b, "relative_error", 0.1 + abs(b - best[m]) / 10) for m in range(n_small + 1) for b in range(n_big + 1)]
    rows += [(m, None, "best_big_layer", float(best[m])) for m in range(n_small + 1)]
    rows += [(m, None, "equal_depth_layer", m * n_big / n_small) for m in range(n_small + 1)]
    schema = {"small_layer": pl.Int64, "big_layer": pl.Int64, "metric": pl.String, "value": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row")


def test_map_finding_verdict_follows_the_numbers():
    stretched = findings.map_finding(_map([0, 2, 4, 6, 8]), "small", "big")
    assert "For 3 of the 3 inner layers" in stretched and "Verdict: **yes**" in stretched
    squashed = findings.map_finding(_map([0, 8, 8, 8, 8]), "small", "big")
    assert "Verdict: **no**" in squashed
    assert "cannot tell" in findings.map_finding(pl.DataFrame({"metric": []}, schema={"metric": pl.String}), "a", "b")


def test_beyond_charts_build_from_probe_frames():
    summary = _lens_summary(-3)
    fit = pl.DataFrame(
        {"model": ["m"] * 2, "layer": [0, 0], "metric": ["heldout_kl_logit", "heldout_kl_tuned"], "value": [5.0, 2.0]}
    )
    for chart in (
        plots.lens_ed_comparison(summary),
        plots.lens_fit_curves(fit),
        plots.map_heatmap(_map([0, 2, 4, 6, 8])),
    ):
        spec = plots.themed_spec(chart)
        assert spec["datasets"], spec
    assert isinstance(plots.pruning_curves(pl.DataFrame()), plots.Note)


def test_lens_finding_leaves_out_the_logit_lens_kl_artefact():
    rows = [("m", 30, "hellaswag", "lens KL", 2, 2, 2), ("m", 30, "hellaswag", "tuned KL", 15, 14, 16)]
    rows += [("m", 30, "hellaswag", "lens overlap", 24, 24, 24), ("m", 30, "hellaswag", "tuned overlap", 23, 22, 24)]
    said = findings.lens_finding(_summary(rows))
    assert "(the logit lens's KL artefact, left out)" in said and "Verdict: **no**" in said
    only_artefact = findings.lens_finding(_summary(rows[:2]))
    assert "**cannot tell**" in only_artefact
