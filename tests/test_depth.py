"""ED rules on hand-made curves, and bootstrap intervals."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from effdepth_core.probes import effective_depth
from effdepth_core.probes.cosine import ed_cosine
from effdepth_core.probes.shared.lens import ed_kl, ed_overlap


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
