"""The pre-registered analysis and the specification curve (effdepth_book/specification.py): each
alternative statistic against a hand computation, every specification's interval against the core's
own bootstrap (``depth.difference_draws``), the robustness share and the deciding choice on curves
made by hand, and the precision walk's pre-registered floor."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from effdepth_book import findings, reference, specification
from effdepth_book.precision import Precision
from effdepth_core.measurement import registry
from effdepth_core.measurement.depth import difference_draws, early_layers, interval
from effdepth_core.measurement.probes.shared.lens import centroid_overlap


def _rule(key: str):
    return registry.rules()[key][1]


class _Settings:
    kl_fraction = 0.5
    overlap_threshold = 0.3
    cosine_zero = 0.0


def test_the_observed_layers_overlap_centroid_against_a_hand_computation():
    """ov = [0, 0.5, 0.5, 0.8]: observed gains 0.5 at layer 0 and 0.3 at layer 2 → (0·0.5 + 2·0.3)
    / 0.8 = 0.75; anchored at ov[L] = 1 the last layer gains 0.2 more → (0.6 + 3·0.2) / 1.0 = 1.2."""
    overlap = np.array([0.0, 0.5, 0.5, 0.8])
    assert specification.observed_overlap_centroid(overlap) == pytest.approx(0.75, rel=1e-12)
    assert centroid_overlap(overlap) == pytest.approx(1.2, rel=1e-12)
    rows = specification.observed_overlap_centroid(np.stack([overlap, np.zeros(4)]))
    assert rows[0] == pytest.approx(0.75, rel=1e-12) and math.isnan(rows[1])  # a flat row gains nothing


def test_the_early_layer_window_reads_the_rest_of_the_curve():
    """A lens-KL curve whose maximum is a layer-0 outlier: over all layers the half-maximum (5) is
    crossed at layer 1; without the first layers (L = 10: early_layers 2, so layers 0–2 cut) the
    maximum is 1.2 and half of it is crossed at layer 5. The windowed centroid is the centroid of
    kl[3:] (anchored at 0) shifted by 3, computed here by hand."""
    kl = np.array([10.0, 2.0, 1.5, 1.2, 1.0, 0.5, 0.2, 0.1, 0.05, 0.0])
    rule = _rule("logit_lens_kl")
    start = early_layers(10) + 1
    assert start == 3
    cut = specification.windowed(rule, start)
    assert rule.find({"kl": kl}, _Settings()) == 1
    assert cut.find({"kl": kl}, _Settings()) == 5
    rest = np.append(kl[3:], 0.0)
    weights = np.maximum(rest[:-1] - rest[1:], 0.0)  # [0.2, 0.5, 0.3, 0.1, 0.05, 0.05, 0]
    by_hand = 3 + float(np.arange(weights.size) @ weights / weights.sum())
    assert cut.centroid({"kl": kl}) == pytest.approx(by_hand, rel=1e-12)
    rows = cut.centroid_rows({"kl": np.stack([kl, kl])})
    assert rows == pytest.approx([by_hand, by_hand], rel=1e-12)


def test_specifications_are_distinct_and_the_primary_comes_first():
    primary = specification.Analysis()
    for key in ("cosine", "logit_lens_kl", "logit_lens_overlap"):
        specs = specification.specifications(_rule(key), primary)
        assert all(specs[0][name] == primary.choice(name) for name in specification.CHOICES)
        assert len({tuple(s.values()) for s in specs}) == len(specs)
    cosine = specification.specifications(_rule("cosine"), primary)
    assert {s["statistic"] for s in cosine} == {"primary", "integer ED"}  # its primary is the crossing
    assert {s["anchor"] for s in cosine} == {"output"}  # no centroid: the anchor cannot matter
    assert {s["zero levels"] for s in cosine if s["statistic"] == "primary"} == {7, 31}
    overlap = specification.specifications(_rule("logit_lens_overlap"), primary)
    assert {s["anchor"] for s in overlap if s["statistic"] == "primary"} == {"output", "observed layers"}
    assert {s["anchor"] for s in overlap if s["statistic"] != "primary"} == {"output"}
    # statistic 3 kinds (2 for the anchored centroid) × window 2 × cell 2 × length 2 × margin 3 × seed 4
    assert len(overlap) == (2 + 1 + 1) * 2 * 2 * 2 * 3 * 4


def _lens_frame(n: int, shift: float, seed: int, layers: int = 12) -> pl.DataFrame:
    """Per-example lens curves: KL falling and overlap rising around layer 6 + ``shift`` ± noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for example in range(n):
        centre = 6 + shift + rng.normal(0, 0.7)
        tokens = int(rng.integers(5, 40))
        for layer in range(layers):
            kl = 8 / (1 + math.exp(layer - centre)) + 0.05
            overlap = 1 / (1 + math.exp(centre - layer))
            rows.append((example, layer, "kl", kl, tokens))
            rows.append((example, layer, "overlap", overlap, tokens))
    return pl.DataFrame(rows, schema=["example", "layer", "metric", "value", "n_tokens"], orient="row")


@pytest.mark.parametrize("paired", [False, True])
def test_every_specification_equals_the_cores_bootstrap_of_the_same_rules(paired):
    """The curve's fast path (pivoted once, float weights) against ``depth.difference_draws`` called
    with the specification's rules, cell and seed: the same point and interval for every
    specification (the sums differ only in order: 1e-9 of a difference of order 0.1)."""
    first, second = _lens_frame(30, 1.0, 1), _lens_frame(25, 0.0, 2)
    windowed = _lens_frame(26, 0.4, 3), _lens_frame(24, 0.1, 4)  # the same sides on their texts' first tokens
    primary = specification.Analysis()
    rule = _rule("logit_lens_overlap")
    margins = {"paper median": None, "paper max": None}
    plain = specification.comparison_curve(
        "step", "lens overlap", specification.Side(rule, first, 12), specification.Side(rule, second, 12),
        _Settings(), paired, True, margins, primary, n_bootstrap=200,
    )  # fmt: skip
    specs = [s for s in specification.specifications(rule, primary) if s["margin"] == "one layer"]
    assert plain.height == len([s for s in specs if s["length"] == "all positions"])  # no cut cells: no length specs
    curve = specification.comparison_curve(
        "step", "lens overlap",
        specification.Side(rule, first, 12, {32: specification.Side(rule, windowed[0], 12)}),
        specification.Side(rule, second, 12, {32: specification.Side(rule, windowed[1], 12), 128: None}),
        _Settings(), paired, True, margins, primary, n_bootstrap=200,
    )  # fmt: skip
    assert curve.height == len(specs) and set(curve["length"]) == {"all positions", "first positions"}
    assert set(curve.filter(length="first positions")["positions"]) == {32}  # the window both sides have
    for row in curve.iter_rows(named=True):
        spec = {name: row[name] for name in specification.CHOICES}
        spec["seed"], spec["zero levels"] = int(spec["seed"]), int(spec["zero levels"])
        a, b = (first, second) if spec["length"] == "all positions" else windowed
        if spec["cell"] == "first 20":
            a, b = a.filter(pl.col("example") < 20), b.filter(pl.col("example") < 20)
        point, draws = difference_draws(
            specification.specified_rule(rule, spec, 12), a, b, (12, 12), _Settings(), paired, True, 200,
            spec["seed"], other_rule=specification.specified_rule(rule, spec, 12),
            statistic=specification.statistic_name(rule, spec),
        )  # fmt: skip
        expected = interval(point, draws)
        for key in ("point", "low", "high"):
            assert row[key] == pytest.approx(expected[key], abs=1e-9), (spec, key)


def test_the_one_layer_margin_and_the_papers_spreads():
    """One layer is 1/L in ratio; the paper's spreads come from its Table 1 (artefacts out) and are
    floored at one layer, which no layer statistic resolves below."""
    paper = reference.paper_table1()
    spreads = specification.paper_margins(paper, "lens overlap", "task")
    assert spreads["paper max"] == pytest.approx(findings.paper_spread(paper, "lens overlap", "task"), rel=1e-12)
    assert spreads["paper median"] <= spreads["paper max"]
    assert specification.margin_of("one layer", 28, spreads) == pytest.approx(1 / 28, rel=1e-12)
    assert specification.margin_of("paper max", 18, spreads) == pytest.approx(
        max(spreads["paper max"], 1 / 18), rel=1e-12
    )
    assert specification.margin_of("one layer", 28, spreads, ratio=False) == 1.0
    assert findings.margin_for(paper, "cosine", "task", 30) == pytest.approx(1 / 30, rel=1e-12)
    assert findings.margin_for(paper, "cosine", "task", 30, "paper max") == pytest.approx(
        findings.tolerance_of(findings.paper_spread(paper, "cosine", "task"), 30), rel=1e-12
    )


def test_the_equivalence_bound_is_the_smallest_margin_that_calls_it_equivalent():
    assert specification.equivalence_bound(-0.02, 0.05) == 0.05
    assert specification.equivalence_bound(-0.07, 0.01) == 0.07
    assert specification.equivalence_bound(None, 0.01) is None


def _curve(verdicts: dict[tuple[str, str], str]) -> pl.DataFrame:
    """A hand-made curve of one comparison: (margin, window) → verdict, the primary at one layer and
    all layers; every other choice at its primary value."""
    rows = []
    for (margin, window), verdict in verdicts.items():
        spec = {name: str(values[0]) for name, values in specification.CHOICES.items()}
        spec.update(margin=margin, window=window)
        rows.append({"comparison": "c", "rule": "cosine", **spec,
                     "primary": margin == "one layer" and window == "all layers", "point": 0.05, "low": 0.01,
                     "high": 0.09, "margin_value": 0.04, "layer": 0.04, "verdict": verdict})  # fmt: skip
    return pl.DataFrame(rows, schema=specification._SCHEMA)


def test_a_verdict_is_robust_only_when_enough_others_agree_else_the_deciding_choice_is_named():
    primary = specification.Analysis()
    windows = ("all layers", "without the first layers")
    margins = ("one layer", "paper median", "paper max")
    split = _curve({(m, w): "agree" if m == "paper max" else "cannot tell" for m in margins for w in windows})
    summary = specification.summarize(split, primary)
    row = summary.row(0, named=True)
    assert row["verdict"] == "cannot tell" and row["share_agreeing"] == pytest.approx(3 / 5)
    assert not row["robust"] and row["decided_by"] == "margin (one layer 100%, paper median 100%, paper max 0% agree)"
    assert row["bound"] == pytest.approx(0.09) and row["bound_layers"] == pytest.approx(0.09 / 0.04)
    same = _curve({(m, w): "a small difference within the margin" for m in margins for w in windows})
    same = same.with_columns(
        pl.when(pl.col("primary")).then(pl.lit("agree")).otherwise(pl.col("verdict")).alias("verdict")
    )
    row = specification.summarize(same, primary).row(0, named=True)
    assert row["robust"] and row["share_agreeing"] == 1.0 and row["decided_by"] is None  # one family


def test_the_analysis_is_read_from_params_and_bad_values_are_named():
    assert specification.Analysis.from_params(None) == specification.Analysis()
    chosen = specification.Analysis.from_params({"margin": "paper max", "zero levels": 31})
    assert chosen.margin == "paper max" and chosen.zero_levels == 31
    with pytest.raises(ValueError, match="margin: 'half a layer' is not one of"):
        specification.Analysis.from_params({"margin": "half a layer"})
    with pytest.raises(ValueError, match="unknown analysis key"):
        specification.Analysis.from_params({"margins": "one layer"})


def test_the_walk_settles_on_no_fewer_than_its_pre_registered_floor():
    """With n_at_least 100 a walk whose intervals are narrow from the start still grows, doubling
    (20 → 40 → 80 → 100), and is met only at 100; without it, it stops at 20."""
    floor = Precision(halfwidth=0.5, n_min=20, n_max=100, step=10, n_at_least=100)
    narrow = {"cosine": 0.2}
    steps, n = [20], 20
    while n < floor.floor:
        n = floor.next_n(n, narrow)
        steps.append(n)
    assert steps == [20, 40, 80, 100]
    assert Precision().floor == 20 and Precision().next_n(20, narrow) == 30
    with pytest.raises(Exception, match="n_at_least <= n_max"):
        Precision.from_spec({"n_max": 50, "n_at_least": 100})


def test_where_the_integer_ed_and_the_statistic_part_ways_is_named():
    """Opposite signs are named with both numbers; an integer ED of 0 beside a statistic whose
    interval excludes 0 is named as 'only the statistic moves'; agreeing steps are not named."""
    rows = [
        {"name": "a", "point": 0.045, "low": 0.03, "high": 0.06, "ed_point": -0.033},
        {"name": "b", "point": 0.02, "low": 0.01, "high": 0.03, "ed_point": 0.0},
        {"name": "c", "point": 0.02, "low": -0.01, "high": 0.05, "ed_point": 0.0},  # statistic's interval has 0
        {"name": "d", "point": -0.02, "low": -0.03, "high": -0.01, "ed_point": -0.04},
    ]
    opposite, still = findings.opposite_directions(rows, lambda r: r["name"])
    assert opposite == ["a (statistic +0.045, integer ED −0.033)"]
    assert still == ["b (statistic +0.020)"]
    said = findings.opposite_sentence(opposite, still)
    assert said.startswith("The paper's integer ED and the primary statistic move in opposite directions in a ")
    assert findings.opposite_sentence([], []) is None


def test_a_finding_folds_its_numbers_beneath_the_verdict():
    folded = findings._with_details(["**Q.** Verdict: **we agree**."], ["Number 1.", "Number 2."])
    head, rest = folded.split("<details>", 1)
    assert head.strip() == "**Q.** Verdict: **we agree**."
    assert "Number 1. Number 2." in rest and rest.rstrip().endswith("</details>")
    assert findings._with_details(["Only."], []) == "Only."


def test_the_seeds_count_from_the_books_bootstrap_seed():
    """`effdepth book --findings --bootstrap-seed 4` moves the primary seed and its three neighbours."""
    moved = specification.Analysis.from_params({"seed": 4})
    assert moved.choices()["seed"] == (4, 5, 6, 7)
    specs = specification.specifications(_rule("cosine"), moved)
    assert specs[0]["seed"] == 4 and {s["seed"] for s in specs} == {4, 5, 6, 7}
    with pytest.raises(ValueError, match="seed must be a whole number"):
        specification.Analysis.from_params({"seed": -1})


def test_the_length_control_stands_beside_each_primary_verdict():
    """``summarize`` reads the exact length control's row (every choice primary but ``length``), the
    table says where it changes the verdict, and the intro counts the changes."""
    from effdepth_book import tables
    from effdepth_book.findings import length_phrase

    primary = specification.Analysis()
    rule = _rule("logit_lens_kl")
    sides = [
        specification.Side(
            rule, _lens_frame(40, 2.0, 1), 12, {32: specification.Side(rule, _lens_frame(40, 0, 3), 12)}
        ),
        specification.Side(
            rule, _lens_frame(40, 0.0, 2), 12, {32: specification.Side(rule, _lens_frame(40, 0, 4), 12)}
        ),
    ]
    curve = specification.comparison_curve(
        "step", "lens KL", *sides, _Settings(), False, True, {"paper median": None, "paper max": None}, primary,
        n_bootstrap=300,
    )  # fmt: skip
    row = specification.summarize(curve, primary).row(0, named=True)
    control = curve.filter(
        pl.col("length") == "first positions",
        *[pl.col(n) == str(primary.choice(n)) for n in specification.CHOICES if n != "length"],
    ).row(0, named=True)
    assert (row["length_verdict"], row["length_point"], row["length_low"]) == (
        control["verdict"],
        control["point"],
        control["low"],
    )
    # two layers apart on all positions, none on the first ones: the control changes the verdict
    assert row["verdict"] != row["length_verdict"]
    assert tables._length_cell(row).startswith("first 32 tokens: ") and tables._length_cell(row).endswith(
        "(changes the verdict)"
    )
    assert length_phrase(specification.summarize(curve, primary)) == "; same positions only: 1 of 1 verdicts change"


def test_a_step_reads_the_smallest_window_both_sides_were_cut_at():
    rule, frame = _rule("logit_lens_kl"), _lens_frame(5, 0.0, 1)

    def side(*windows):
        return specification.Side(rule, frame, 12, {w: specification.Side(rule, frame, 12) for w in windows} or None)

    assert specification.common_window(side(32, 128), side(128)) == 128  # GSM8K → AIME24
    assert specification.common_window(side(32), side(32, 128)) == 32  # HellaSwag → GSM8K
    assert specification.common_window(side(32), side()) is None
