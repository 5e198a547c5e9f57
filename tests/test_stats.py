"""The book's statistics, checked on hand-made curves: the degenerate-ED definition (curves that are
and are not degenerate), paired and independent ED differences, the permutation test and its
smallest p-value, verdicts from intervals, and the threshold sensitivity of the lens rules."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest

from effdepth_core.measurement import depth as stats
from effdepth_core.measurement import registry

SETTINGS = SimpleNamespace(kl_fraction=0.5, overlap_threshold=0.3)


def _frame(metric: str, curves: list[list[float]]) -> pl.DataFrame:
    """A per-example frame: one curve per example, every example one token."""
    rows = [(e, layer, metric, v, 1) for e, curve in enumerate(curves) for layer, v in enumerate(curve)]
    schema = {"example": pl.Int64, "layer": pl.Int64, "metric": pl.String, "value": pl.Float64, "n_tokens": pl.Int64}
    return pl.DataFrame(rows, schema=schema, orient="row")


KL = registry.rules()["logit_lens_kl"][1]
OVERLAP = registry.rules()["logit_lens_overlap"][1]


def test_an_early_firing_is_degenerate_whatever_the_curve_does_after():
    """One artefact test for our cells and the paper's (which carry no curve): ED ≤ max(2, ⌈L/10⌉).
    A curve that stays below its threshold after an early firing does not rescue it (smollm2's
    HellaSwag lens KL: a layer-0 maximum over a flat curve meets half of it at layer 2)."""
    assert "fires at layer 1" in stats.degenerate(1, None, None, 10)
    assert "fires at layer 0" in stats.degenerate(0, 0, 1, 10)
    assert stats.degenerate(3, None, None, 10) is None  # 2 of 10 is the last early layer
    assert "fires at layer 3" in stats.degenerate(3, 2, 4, 30)  # ⌈30 / 10⌉ = 3
    assert stats.degenerate(None, None, None, 10) is None


def test_an_interval_over_half_the_depth_is_degenerate():
    assert "spans more than half" in stats.degenerate(5, 0, 23, 30)
    assert stats.degenerate(5, 4, 19, 30) is None  # 15 of 30: not more than half


def test_paired_differences_of_one_frame_are_zero_and_independent_ones_cover_a_known_gap():
    curves = [[10, 8, 6, 4, 2, 1, 1, 1, 0], [10, 9, 7, 3, 2, 1, 1, 1, 0], [10, 7, 6, 4, 2, 1, 1, 1, 0]]
    frame = _frame("kl", curves)  # L = 8; pooled KL below 5 first at layer 3
    same = stats.ed_difference(KL, frame, frame, (8, 8), SETTINGS, paired=True, n_bootstrap=200)
    assert same["point"] == 0 and same["low"] == 0 and same["high"] == 0
    later = _frame("kl", [[10, 10, *c[:7]] for c in curves])  # every curve two layers later: ED 5
    gap = stats.ed_difference(KL, later, frame, (8, 8), SETTINGS, paired=False, n_bootstrap=200)
    assert gap["point"] == 2 and gap["low"] <= 2 <= gap["high"] and gap["defined"] == 1.0
    ratio = stats.ed_difference(KL, later, frame, (8, 8), SETTINGS, paired=False, ratio=True, n_bootstrap=200)
    assert ratio["point"] == pytest.approx(2 / 8)


def test_spearman_permutation_p_values_by_hand():
    four = stats.spearman_test([1, 2, 3, 4], [10, 20, 30, 40])
    assert four["rho"] == pytest.approx(1.0) and four["p"] == pytest.approx(2 / 24) and four["min_p"] == 2 / 24
    six = stats.spearman_test([1, 2, 3, 4, 5, 6], [3, 1, 2, 6, 5, 4])
    # rho = 1 - 6·Σd²/(n(n²-1)) with d = (-2, 1, 1, -2, 0, 2): Σd² = 14 → 1 - 84/210 = 0.6
    assert six["rho"] == pytest.approx(0.6) and 0 < six["p"] < 1 and six["min_p"] == pytest.approx(2 / 720)
    assert stats.spearman_test([1, 2], [1, 2])["rho"] is None  # too few to rank
    # ties: levels 0..4 against EDs (3, 3, 5, 5, 5); the most extreme orderings put the two 3s at
    # either end's two positions: 2·2!·3! of 5! = 24/120 orderings reach |rho| max
    tied = stats.spearman_test([0, 1, 2, 3, 4], [3, 3, 5, 5, 5])
    assert tied["min_p"] == pytest.approx(24 / 120) and tied["p"] == pytest.approx(24 / 120)


def test_a_verdict_turns_into_cannot_tell_when_intervals_widen():
    from effdepth_book.findings import SMALL, judge

    assert judge(-0.02, 0.03, 0.05) == "agree"
    assert judge(-0.08, 0.10, 0.05) == "cannot tell"  # the same centre, a wider interval
    assert judge(0.06, 0.20, 0.05) == "disagree"
    assert judge(0.01, 0.04, 0.05) == SMALL  # excludes 0, inside the margin: both tests pass
    assert judge(None, None, 0.05) == "cannot tell"


def test_threshold_sensitivity_of_the_lens_rules_by_hand():
    frame = _frame("kl", [[10, 8, 6, 4, 2, 1, 0]])  # L = 6: ED is the first l in 0..4 with kl < f · 10
    table = stats.threshold_sensitivity(KL, frame, 6, SETTINGS)
    eds = dict(zip(table["threshold"].to_list(), table["ed"].to_list(), strict=True))
    assert eds[0.3] == 4 and eds[0.5] == 3 and eds[0.7] == 2 and eds[0.45] == 3
    assert np.allclose(table["ratio"].to_numpy(), (table["ed"].to_numpy() + 1) / 6)
