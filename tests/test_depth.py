"""ED rules on hand-made curves, and bootstrap intervals."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest

from effdepth_core.measurement.depth import depth_table
from effdepth_core.measurement.probes import effective_depth
from effdepth_core.measurement.probes.cosine import ed_cosine
from effdepth_core.measurement.probes.shared.lens import ed_kl, ed_overlap


def test_cosine_takes_the_last_negative_to_nonnegative_crossing():
    #             0     1     2     3    4     5    6
    c = np.array([0.1, -0.2, 0.0, -0.3, -0.1, 0.2, 0.3])
    assert ed_cosine(c) == 4  # crossings at 1→2 and 4→5: the last one
    assert ed_cosine(np.array([0.1, 0.2, -0.1, -0.2])) is None  # never returns to >= 0
    assert ed_cosine(np.array([-0.5, -0.2, 0.0])) == 1  # exactly 0 counts as non-negative


def test_cosine_crossing_into_the_last_layer_counts_but_not_beyond():
    assert ed_cosine(np.array([0.1, 0.1, -0.1, 0.2])) == 2  # l = L-2 is allowed
    assert ed_cosine(np.array([0.1])) is None


def test_kl_first_layer_below_half_max():
    kl = np.array([8.0, 3.9, 5.0, 1.0, 0.0])
    assert ed_kl(kl) == 1  # falls below half the max already at layer 1
    assert ed_kl(np.array([8.0, 6.0, 5.0, 4.5, 1.0])) is None  # only the last layer (excluded) is below
    assert ed_kl(np.array([8.0, 6.0, 5.0, 4.5, 1.0]), fraction=0.6) == 3
    assert ed_kl(np.array([4.0, 4.0, 2.0, 0.0])) is None  # exactly half is not below


def test_overlap_first_layer_above_threshold():
    assert ed_overlap(np.array([0.0, 0.2, 0.3, 0.4, 1.0])) == 3  # 0.3 is not above 0.3
    assert ed_overlap(np.array([0.0, 0.1, 0.2, 1.0])) is None
    assert ed_overlap(np.array([0.0, 0.1, 0.2, 1.0]), threshold=0.15) == 2


def _frame(curves: dict[str, list[float]]) -> pl.DataFrame:
    rows = [(layer, metric, v) for metric, values in curves.items() for layer, v in enumerate(values)]
    return pl.DataFrame(rows, schema=["layer", "metric", "value"], orient="row")


def test_effective_depth_ratio_and_undefined_reason():
    n_layers = 5
    cosine = _frame(
        {
            "cos_attn": [0.1, -0.2, -0.1, 0.3, 0.2],
            "cos_mlp": [0.1, -0.2, -0.1, 0.3, 0.2],
            "cos_layer": [0.1, -0.2, -0.1, 0.3, 0.2],
        }
    )
    lens = _frame({"kl": [9.0, 8.0, 4.0, 1.0, 0.5, 0.0], "overlap": [0.0, 0.1, 0.2, 0.25, 0.3, 1.0]})
    result = effective_depth(cosine, lens, n_layers)
    assert (result["cosine"].ed, result["cosine"].ratio) == (2, 3 / 5)
    assert (result["logit_lens_kl"].ed, result["logit_lens_kl"].ratio) == (2, 3 / 5)
    overlap = result["logit_lens_overlap"]
    assert overlap.ed is None and overlap.ratio is None and "0.3" in overlap.reason
    assert overlap.to_json()["ed"] is None and "reason" in overlap.to_json()


def _per_example(values_by_example: list[list[float]], metric: str, tokens: list[int]) -> pl.DataFrame:
    rows = [
        (ex, layer, metric, v, tokens[ex])
        for ex, values in enumerate(values_by_example)
        for layer, v in enumerate(values)
    ]
    return pl.DataFrame(rows, schema=["example", "layer", "metric", "value", "n_tokens"], orient="row")


def test_token_weighting_and_bootstrap_interval():
    # example 0 (1 token): KL falls early; example 1 (3 tokens): late. Token weighting favours 1.
    kl = _per_example([[8.0, 1.0, 1.0, 1.0, 0.0], [8.0, 8.0, 8.0, 1.0, 0.0]], "kl", [1, 3])
    overlap = _per_example([[0.0, 0.5, 0.5, 0.5, 1.0], [0.0, 0.0, 0.0, 0.5, 1.0]], "overlap", [1, 3])
    lens = pl.concat([kl, overlap])
    result = effective_depth(None, lens, n_layers=4, n_bootstrap=400, seed=3)
    # pooled KL = [8, 6.25, 6.25, 1]: below 4 first at layer 3 → outside 0..L-2 → undefined
    assert result["logit_lens_kl"].ed is None
    # pooled overlap = [0, .125, .125, .5]: first > .3 at layer 3, also outside 0..L-2
    assert result["logit_lens_overlap"].ed is None
    # resamples that draw example 0 twice find ED = 1 for both rules
    assert result["logit_lens_kl"].ci_low == 1 and 0 < result["logit_lens_kl"].undefined_fraction < 1
    again = effective_depth(None, lens, n_layers=4, n_bootstrap=400, seed=3)
    assert again["logit_lens_kl"] == result["logit_lens_kl"]  # deterministic for a seed


def test_bootstrap_brackets_the_point_estimate():
    rng = np.random.default_rng(0)
    curves = [list(np.linspace(10, 0, 11) + rng.normal(0, 0.5, 11)) for _ in range(12)]
    lens = pl.concat([_per_example(curves, "kl", [5] * 12), _per_example([[0.0] * 11] * 12, "overlap", [5] * 12)])
    kl = effective_depth(None, lens, n_layers=10, n_bootstrap=300)["logit_lens_kl"]
    assert kl.ed is not None and kl.ci_low <= kl.ed <= kl.ci_high
    pooled = np.mean(curves, axis=0)[:10]
    assert kl.ed == int(np.flatnonzero(pooled[:-1] < 0.5 * pooled.max())[0])


def test_curve_with_missing_layers_is_rejected():
    with pytest.raises(ValueError, match="expected 5"):
        effective_depth(None, _frame({"kl": [1.0, 0.5], "overlap": [0.0, 1.0]}), n_layers=5)


# --- the continuous statistics (method.md §12): hand-computed curves ------------------------------


def test_lens_centroids_by_hand():
    from effdepth_core.measurement.probes.shared.lens import centroid_kl, centroid_overlap

    # a step: all 8 nats removed by layer 2 (h_2 → h_3); kl[5] = 0 is implied
    assert centroid_kl(np.array([8.0, 8.0, 8.0, 0.0, 0.0])) == 2.0
    # a ramp 4, 3, 2, 1 → 0: one nat removed by each of layers 0..3
    assert centroid_kl(np.array([4.0, 3.0, 2.0, 1.0])) == 1.5
    # only removals weigh: layer 0 removes 1, layer 1's rise (1 → 3) weighs 0, layer 2 removes 3
    assert centroid_kl(np.array([2.0, 1.0, 3.0, 0.0])) == pytest.approx((0 * 1 + 2 * 3) / 4)
    # overlap gained at layer 1 (0 → .5) and at layer 3 (.5 → ov[4] = 1)
    assert centroid_overlap(np.array([0.0, 0.0, 0.5, 0.5])) == 2.0
    assert centroid_kl(np.zeros(4)) is None  # nothing is ever removed: no depth


def test_crossings_read_between_layers_by_hand():
    from effdepth_core.measurement.probes.cosine import crossing_cosine
    from effdepth_core.measurement.probes.shared.lens import crossing_kl, crossing_overlap

    # KL threshold 0.5 × 8 = 4, reached between kl[1] = 6 and kl[2] = 2 half the way: 1 + (6 − 4) / (6 − 2)
    assert crossing_kl(np.array([8.0, 6.0, 2.0, 1.0, 0.5])) == 1.5
    assert crossing_kl(np.array([3.9, 8.0, 1.0])) == 0.0  # layer 0 is already below: 0
    # overlap 0.3 between 0.1 (layer 1) and 0.5 (layer 2): 1 + 0.2 / 0.4
    assert crossing_overlap(np.array([0.0, 0.1, 0.5, 0.9, 1.0])) == pytest.approx(1.5)
    # the last crossing from −0.1 (layer 4) to 0.2 (layer 5): 4 + 0.1 / 0.3
    c = np.array([0.1, -0.2, 0.0, -0.3, -0.1, 0.2, 0.3])
    assert crossing_cosine(c) == pytest.approx(4 + 1 / 3)
    assert crossing_cosine(np.array([0.1, 0.2, -0.1, -0.2])) is None


def test_the_crossing_is_averaged_over_the_rule_threshold_range():
    from types import SimpleNamespace

    from effdepth_core.measurement import registry
    from effdepth_core.measurement.depth import averaged_crossing

    rule = next(r for r in registry.get("logit_lens").rules if r.key == "logit_lens_overlap")
    # an overlap hovering at 0.3 before it rises: each threshold's crossing by hand
    ov = np.array([0.29, 0.31, 0.29, 0.31, 0.9, 1.0])
    expected = []
    for t in rule.thresholds[1]:
        first = next(i for i in range(len(ov) - 1) if ov[i] > t)
        expected.append(0.0 if first == 0 else first - 1 + (t - ov[first - 1]) / (ov[first] - ov[first - 1]))
    settings = SimpleNamespace(overlap_threshold=0.3)
    assert averaged_crossing(rule, {"overlap": ov}, settings) == pytest.approx(np.mean(expected))
    assert 1.8 < np.mean(expected) < 2.0  # between the thresholds that fire at layer 0–1 and at 4


def test_the_statistics_move_continuously_where_the_integer_ed_jumps():
    from types import SimpleNamespace

    from effdepth_core.measurement import registry
    from effdepth_core.measurement.depth import statistic_of

    rule = next(r for r in registry.get("logit_lens").rules if r.key == "logit_lens_kl")
    settings = SimpleNamespace(kl_fraction=0.5)
    values = {}
    for delta in (-1e-6, 1e-6):  # layer 3 just under, then just over, half the maximum (5)
        kl = np.array([10.0, 8.0, 6.0, 5.0 + delta, 2.0, 1.0])
        values[delta] = {s: statistic_of(rule, {"kl": kl}, SimpleNamespace(**vars(settings)), s) for s in
                         ("ed", "crossing", "centroid")}  # fmt: skip
    low, high = values[-1e-6], values[1e-6]
    assert (low["ed"], high["ed"]) == (3.0, 4.0)  # the paper's ED jumps a whole layer
    assert abs(high["crossing"] - low["crossing"]) < 1e-4  # the averaged crossing moves by ~δ
    assert abs(high["centroid"] - low["centroid"]) < 1e-5  # so does the centroid


def test_effective_depth_gives_the_primary_statistic_with_its_interval():
    rng = np.random.default_rng(1)
    curves = [list(np.linspace(10, 0, 11) ** 1.5 / 10 + rng.normal(0, 0.3, 11)) for _ in range(15)]
    tokens = list(rng.integers(3, 9, 15))
    overlap = [list(np.clip(np.linspace(0, 1, 11) + rng.normal(0, 0.05, 11), 0, 1)) for _ in range(15)]
    lens = pl.concat([_per_example(curves, "kl", tokens), _per_example(overlap, "overlap", tokens)])
    result = effective_depth(None, lens, n_layers=10, n_bootstrap=300)
    kl = result["logit_lens_kl"]
    pooled = (np.array(curves) * np.array(tokens)[:, None]).sum(0) / sum(tokens)
    removed = np.maximum(np.append(pooled[:10], 0.0)[:-1] - np.append(pooled[:10], 0.0)[1:], 0)
    assert kl.statistic == "centroid"
    assert kl.depth == pytest.approx((np.arange(10) * removed).sum() / removed.sum())
    assert kl.depth_ratio == pytest.approx((kl.depth + 1) / 10)
    assert kl.depth_low < kl.depth < kl.depth_high and kl.depth_high - kl.depth_low < 3
    table = depth_table(result)
    assert table.filter(pl.col("rule") == "logit_lens_kl")["depth"].item() == kl.depth


def test_the_two_tests_of_a_comparison_by_hand():
    from effdepth_core.measurement.depth import compare, margin

    assert margin(0.02, 28) == 1 / 28 and margin(0.1, 28) == 0.1  # never under one layer of the deeper model
    assert compare(-0.01, 0.02, 0.05).verdict == "agree"
    small = compare(0.01, 0.03, 0.05)
    assert small.different and small.equivalent and small.verdict == "a small difference within the margin"
    assert compare(0.06, 0.10, 0.05).verdict == compare(-0.3, -0.06, 0.05).verdict == "disagree"
    unsettled = compare(0.02, 0.08, 0.05)
    assert unsettled.verdict == "cannot tell" and "excludes 0" in unsettled.reason
    wide = compare(-0.08, 0.02, 0.05)
    assert wide.verdict == "cannot tell" and "includes 0" in wide.reason and not wide.different
    assert compare(None, None, 0.05).verdict == compare(0.1, float("nan"), 0.05).verdict == "cannot tell"
    for low, high, width in ((0.2, -0.2, 0.05), (-0.01, 0.01, -0.05), (0.0, 0.1, float("inf"))):
        with pytest.raises(ValueError):  # a reversed interval or an impossible margin is a caller's bug
            compare(low, high, width)
    with pytest.raises(ValueError):
        margin(0.05, 0)


def test_a_difference_of_centroids_paired_and_independent():
    from effdepth_core.measurement import registry
    from effdepth_core.measurement.depth import difference_draws

    rule = next(r for r in registry.get("logit_lens").rules if r.key == "logit_lens_kl")
    settings = SimpleNamespace(kl_fraction=0.5)
    rng = np.random.default_rng(2)
    early = [list(np.r_[8.0, 8.0, rng.uniform(0, 0.5, 6)]) for _ in range(10)]  # removed at layer 1
    late = [list(np.r_[8.0, 8.0, 8.0, rng.uniform(0, 0.5, 5)]) for _ in range(10)]  # one layer later
    first, second = _per_example(early, "kl", [4] * 10), _per_example(late, "kl", [4] * 10)
    point, draws = difference_draws(rule, first, first, (8, 8), settings, paired=True, statistic="centroid")
    assert point == 0.0 and np.all(draws == 0.0)  # a frame against itself, resampled together
    point, draws = difference_draws(rule, second, first, (8, 8), settings, paired=False, statistic="centroid")
    # the 8 nats leave one layer later; the small tails (< 0.5 nats of 8) move the centroid little
    assert 0.8 < point < 1.2 and np.all((draws > 0.7) & (draws < 1.3))
    ratio, _ = difference_draws(rule, second, first, (8, 8), settings, paired=False, statistic="centroid", ratio=True)
    assert ratio == pytest.approx(point / 8)


def test_the_norm_crossing_and_nonfinite_curves_by_hand():
    from effdepth_core.measurement.probes.norm import crossing_norm
    from effdepth_core.measurement.probes.shared.lens import crossing_overlap

    # final norm 10: half of it (5) is passed between layer 1 (4) and layer 2 (8): 1 + 1/4
    assert crossing_norm(np.array([1.0, 4.0, 8.0, 9.0, 10.0]), 0.5) == 1.25
    assert crossing_norm(np.array([6.0, 7.0, 10.0]), 0.5) == 0.0  # layer 0 already past it
    from effdepth_core.measurement import registry
    from effdepth_core.measurement.depth import statistic_of

    rule = next(r for r in registry.get("logit_lens").rules if r.key == "logit_lens_overlap")
    curve = np.array([0.0, np.nan, 0.5, 1.0])
    assert np.isnan(crossing_overlap(curve))  # the raw function propagates NaN …
    assert (
        statistic_of(rule, {"overlap": curve}, SimpleNamespace(overlap_threshold=0.3), "crossing") is None
    )  # … never reported


def test_the_table_shows_the_continuous_statistic_and_validation_guards_it():
    from effdepth_core.display import format_table, summary_problem
    from effdepth_core.labels import format_depth

    entry = {"ed": 20, "ratio": 21 / 30, "ci_low": 19, "ci_high": 21, "statistic": "centroid", "depth": 19.44,
             "depth_ratio": 20.44 / 30, "depth_low": 18.91, "depth_high": 20.12}  # fmt: skip
    assert format_depth(entry) == "19.4 (0.68) [18.9–20.1]"
    assert format_depth({"ed": None}) == "—"
    summary = {"model": "m", "task": "gsm8k", "n_layers": 30, "n_examples": 10, "logit_lens_kl": entry}
    assert summary_problem(summary) is None
    table = format_table([summary])
    assert "lens KL depth" in table and "19.4 (0.68) [18.9–20.1]" in table and "'depth' cell" in table
    # a statistic where the ED is undefined is checked too (the case it exists for)
    for bad in ({"depth": "abc"}, {"depth": 99.0, "depth_ratio": 100 / 30}, {"depth_ratio": 0.5},
                {"depth_low": 21.0, "depth_high": 18.0}, {"statistic": "mean"}, {"ratio": float("nan")},
                {"depth": None}, {"reason": {"a": 1}}):  # fmt: skip
        broken = {**summary, "logit_lens_kl": {**entry, "ed": None, "ratio": None, "ci_low": None, "ci_high": None,
                                               **bad}}  # fmt: skip
        assert summary_problem(broken) is not None, bad
    for key, value in (("n_asked", float("nan")), ("level", float("inf")), ("n_layers", 10**400), ("digits", "6")):
        assert summary_problem({**summary, key: value}) is not None, key  # never a number JSON cannot hold


def test_the_table_for_programs_keeps_numbers_as_numbers():
    import csv
    import io
    import json

    from effdepth_core.display import format_table

    entry = {"ed": 20, "ratio": 21 / 30, "ci_low": 19, "ci_high": 21, "statistic": "centroid", "depth": 19.44,
             "depth_ratio": 20.44 / 30, "depth_low": 18.91, "depth_high": 20.12}  # fmt: skip
    undefined = {"ed": None, "ratio": None, "reason": "KL never falls below 0.5 of its maximum"}
    runs = [
        {"model": "m", "task": "gsm8k", "n_layers": 30, "n_examples": 10, "n_asked": 12, "logit_lens_kl": entry},
        {"model": "m", "task": "hellaswag", "n_layers": 30, "n_examples": 5, "logit_lens_kl": undefined},
    ]
    records = json.loads(format_table(runs, "json"))
    assert records[0]["L"] == 30 and records[0]["n"] == 10 and records[0]["asked"] == 12
    assert records[0]["logit_lens_kl"]["ed"] == 20 and records[0]["logit_lens_kl"]["depth_low"] == 18.91
    assert records[1]["logit_lens_kl"]["ed"] is None and "never falls" in records[1]["logit_lens_kl"]["reason"]
    rows = list(csv.DictReader(io.StringIO(format_table(runs, "csv"))))
    assert float(rows[0]["logit_lens_kl_depth"]) == 19.44 and int(rows[0]["logit_lens_kl_ci_high"]) == 21
    assert rows[1]["logit_lens_kl_ed"] == "" and rows[1]["asked"] == "5"  # n asked defaults to n kept
    runs[0]["cells"] = {"skip": "all: 10.1"}  # a probe without rules: its text cell, null where a run has none
    records = json.loads(format_table(runs, "json"))
    assert records[0]["skip"] == "all: 10.1" and records[1]["skip"] is None
    assert list(csv.DictReader(io.StringIO(format_table(runs, "csv"))))[1]["skip"] == ""


def test_the_per_prompt_statistic_reads_each_prompts_own_curve():
    """Per prompt, the centroid of its own KL curve (not the pooled one), NaN where it is undefined:
    a step at layer 2 (8 nats removed by h_2 → h_3), a ramp (1.5, as in the hand-computed case) and a
    flat zero curve (nothing removed)."""
    from effdepth_core.measurement import registry
    from effdepth_core.measurement.depth import per_prompt

    rule = next(r for r in registry.get("logit_lens").rules if r.key == "logit_lens_kl")
    frame = _per_example([[8.0, 8.0, 8.0, 0.0], [4.0, 3.0, 2.0, 1.0], [0.0] * 4], "kl", [3, 5, 2])
    values, tokens = per_prompt(rule, frame, 4, SimpleNamespace(kl_fraction=0.5), "centroid")
    assert values[0] == 2.0 and values[1] == 1.5 and np.isnan(values[2])
    assert tokens.tolist() == [3, 5, 2]


def _curve_rows(rng: np.random.Generator, metric: str, n_layers: int) -> np.ndarray:
    """[row, layer] curves of one metric, random and hand-made edge rows (flat, already past the
    threshold at layer 0, crossing only into the last layer, ties at a threshold)."""
    rows = rng.normal(size=(300, n_layers))
    if metric == "kl":
        rows = np.abs(rows) * rng.choice([0.01, 1.0, 50.0], size=(300, 1))
    elif metric in ("overlap", "norm"):
        rows = np.sort(rng.uniform(size=(300, n_layers)), axis=1) * rng.choice([0.5, 1.0], size=(300, 1))
    else:  # the cosines hover about 0 so that each threshold of the range crosses somewhere
        rows = rows * 0.05
    n = max(n_layers, 3)  # the hand-made rows are cut to the curve's length
    edges = np.stack([
        np.zeros(n),
        np.full(n, 0.3),
        np.linspace(-1, 1, n),
        np.r_[np.full(n - 1, -0.1), 0.4],
        np.r_[0.9, np.full(n - 1, 0.1)],
        np.r_[np.full(n - 2, -0.1), 0.0, 0.2],  # a cosine reaching exactly 0: >= counts it
        np.r_[2.0, np.full(n - 1, 1.0)],  # a KL exactly at half its maximum: < does not
        np.r_[0.25, np.nan, np.full(n - 2, 0.9)],  # a NaN: the one-curve rules' own reading
        np.r_[np.full(n - 1, 0.1), np.inf],
    ])[:, :n_layers]  # fmt: skip
    return np.vstack([rows, edges])


@pytest.mark.parametrize("depth", [12, 1])
@pytest.mark.parametrize("key", ["cosine", "logit_lens_kl", "logit_lens_overlap", "residual_norm"])
def test_the_bootstraps_row_paths_equal_each_rules_own_functions_row_by_row(key, depth):
    """``statistic_rows`` (the bootstrap's path) through a rule's ``find_rows``/``crossing_rows``/
    ``centroid_rows`` equals ``statistic_of`` row by row, exactly: the row forms do the same float operations in the
    same order, so any difference is a bug, not rounding."""
    from effdepth_core.measurement import registry
    from effdepth_core.measurement.depth import statistic_of, statistic_rows
    from effdepth_core.settings import RunSettings

    _, rule = registry.rules()[key]
    assert rule.find_rows is not None and rule.crossing_rows is not None
    statistics = ("ed", "crossing", "centroid") if rule.centroid is not None else ("ed", "crossing")
    assert (rule.centroid_rows is not None) == (rule.centroid is not None)
    rng = np.random.default_rng(7)
    n_layers = depth + 1 if rule.needs_final_layer else depth  # a one-layer model's curves too
    curves = {metric: _curve_rows(rng, metric, n_layers) for metric in rule.metrics}
    settings = RunSettings(model="m", task="t")
    n_rows = len(next(iter(curves.values())))
    for statistic in statistics:
        fast = statistic_rows(rule, curves, settings, statistic)
        slow = [statistic_of(rule, {m: c[i] for m, c in curves.items()}, settings, statistic) for i in range(n_rows)]
        slow = np.array([np.nan if v is None else v for v in slow])
        np.testing.assert_array_equal(fast, slow, err_msg=f"{key} {statistic}")
        assert np.isnan(slow).any() and ((~np.isnan(slow)).sum() > 100 or depth == 1), "both branches exercised"


def test_tables_mark_a_rule_artefact_and_a_degenerate_interval_and_say_why():
    """Issue 47: a lens-KL ED of 1 [1–4] of 30 layers (in the first layers: ED ≤ max(2, ⌈0.1·30⌉) = 3)
    and an ED of 13 [1–20] of 28 layers (its interval, 19 layers, over L/2 = 14) were shown unmarked;
    docs/method.md §10 calls both degenerate. Each is now marked † in every table with one line why;
    a sound cell (20 [19–21] of 30) and one whose interval is exactly L/2 wide stay unmarked."""
    import csv
    import io
    import json

    from effdepth_core.display import format_table

    artefact = {"ed": 1, "ratio": 2 / 30, "ci_low": 1, "ci_high": 4}
    wide = {"ed": 13, "ratio": 14 / 28, "ci_low": 1, "ci_high": 20}
    sound = {"ed": 20, "ratio": 21 / 30, "ci_low": 19, "ci_high": 21}
    runs = [
        {"model": "a", "task": "gsm8k", "n_layers": 30, "n_examples": 10, "logit_lens_kl": artefact, "cosine": sound},
        {"model": "b", "task": "mine", "n_layers": 28, "n_examples": 2, "logit_lens_kl": wide,
         "cosine": {"ed": 20, "ratio": 21 / 28, "ci_low": 6, "ci_high": 20}},  # 14 = L/2 of 28: not over it
    ]  # fmt: skip
    text = format_table(runs)
    assert "1 (0.07) [1–4] †" in text and "13 (0.50) [1–20] †" in text
    assert "20 (0.70) [19–21] †" not in text and "20 (0.75) [6–20] †" not in text and "20 (0.75) [6–20]" in text
    notes = text.split("docs/method.md §10", 1)[1].splitlines()[1:]
    assert notes == [
        "  a / gsm8k / lens KL: it fires at layer 1, in the first layers (0–3 of 30)",
        "  b / mine / lens KL: its interval [1–20] spans more than half the 28 layers",
    ]
    markdown = format_table(runs, "markdown")
    assert "| 1 (0.07) [1–4] † |" in markdown and "- b / mine / lens KL: its interval [1–20] spans" in markdown
    records = json.loads(format_table(runs, "json"))
    assert records[0]["logit_lens_kl"]["degenerate"].startswith("it fires at layer 1")
    assert records[0]["cosine"]["degenerate"] is None and records[1]["cosine"]["degenerate"] is None
    assert "spans more than half" in records[1]["logit_lens_kl"]["degenerate"]
    rows = list(csv.DictReader(io.StringIO(format_table(runs, "csv"))))
    assert rows[0]["logit_lens_kl_degenerate"].startswith("it fires") and rows[0]["cosine_degenerate"] == ""
    statistic = {**sound, "statistic": "crossing", "depth": 2.4, "depth_ratio": 3.4 / 30, "depth_low": 1.0,
                 "depth_high": 3.0}  # fmt: skip  # a sound ED beside a statistic in the first layers
    text = format_table([{**runs[0], "cosine": statistic}])
    assert "2.4 (0.11) [1.0–3.0] †" in text and "a / gsm8k / cosine depth: it fires at layer 2.4" in text


def test_the_narrow_table_fits_a_terminal_and_wide_keeps_every_column():
    """README's run (smollm2-135m, gsm8k, three rules with their statistics) printed a ~230-column
    table; the default (narrow) one fits 100 columns, and ``wide`` keeps every column as before."""
    from effdepth_core.display import format_table

    def entry(ed, low, high, depth):
        statistic = {"statistic": "centroid", "depth": depth, "depth_ratio": (depth + 1) / 30}
        interval = {"depth_low": depth - 0.7, "depth_high": depth + 0.7}
        return {"ed": ed, "ratio": (ed + 1) / 30, "ci_low": low, "ci_high": high, **statistic, **interval}

    summary = {"model": "smollm2-135m", "task": "gsm8k", "n_layers": 30, "n_examples": 10, "n_asked": 10,
               "cosine": entry(20, 20, 20, 19.2), "logit_lens_kl": entry(19, 16, 20, 13.3),
               "logit_lens_overlap": entry(23, 23, 23, 23.0)}  # fmt: skip
    narrow = format_table([summary], wide=False).split("\n\n")[0].splitlines()
    wide = format_table([summary]).split("\n\n")[0].splitlines()
    assert max(map(len, narrow)) <= 100 < max(map(len, wide))
    assert narrow[0].split() == ["model", "task", "L", "n", "cosine", "lens", "KL", "lens", "overlap"]
    assert "lens KL depth" in wide[0] and "asked" in wide[0] and "19 (0.67) [16–20]" in narrow[2]
    asked = format_table([{**summary, "n_asked": 12}], wide=False).splitlines()[0]
    assert "asked" in asked  # shown where it says something: prompts were dropped
