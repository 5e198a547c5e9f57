"""A probe as another package would ship it: one module with its spec and function, declared in
that package's pyproject under the ``effdepth.probes`` entry-point group (tests/test_plugins.py
fakes the installed entry point). It measures the largest |h_l| per layer and example."""

from __future__ import annotations

import altair as alt
import numpy as np
import polars as pl
import torch

from effdepth_core.measurement.probes.shared.reduce import token_weighted_mean
from effdepth_core.measurement.probes.spec import Chart, Option, ProbeSpec, Rule
from effdepth_core.measurement.replay import clean_run


def residual_max(loaded, examples, context) -> pl.DataFrame:
    rows = []
    for example, item in enumerate(examples):
        ids = loaded.encode(item.prompt)
        for layer, h in enumerate(clean_run(loaded, ids).hidden):
            rows.append((example, layer, "max_abs", float(h.abs().max()), ids.numel()))
    schema = {"example": pl.Int64, "layer": pl.Int64, "metric": pl.String, "value": pl.Float64, "n_tokens": pl.Int64}
    return pl.DataFrame(rows, schema=schema, orient="row")


def first_above(curves, settings) -> int | None:
    values = np.asarray(curves["max_abs"])
    above = np.flatnonzero(values[:-1] > settings.max_fraction * values[-1])
    return int(above[0]) if above.size else None


def chart(frame: pl.DataFrame, model=None, task=None) -> alt.Chart:
    data = token_weighted_mean(frame) if "n_tokens" in frame.columns else frame
    return alt.Chart(data).mark_line().encode(x="layer:Q", y="value:Q")


SPEC = ProbeSpec(
    name="resmax",
    title="residual maximum",
    compute=residual_max,
    options=(Option("max_fraction", 0.5, "share of the final residual's largest value", type=float, minimum=0),),
    aggregate=token_weighted_mean,
    rules=(Rule("resmax", "res max", ("max_abs",), first_above, lambda s: "never above", needs_final_layer=True),),
    charts=(Chart("resmax", chart, "resmax"),),
    reusable=True,
    description="the largest |h_l| per layer",
)
assert torch  # the plugin may use torch like any probe
