"""What the chart builders share: the rule and source colours, the marks of degenerate and uncounted
cells, the model/task dropdowns, the lens colours and a readable symlog axis."""

from __future__ import annotations

import functools
from collections.abc import Sequence

import altair as alt
import polars as pl

from effdepth_core.measurement.probes import skip_summary, token_weighted_mean

from .reference import OURS, PAPER, RULE_LABELS
from .render import (
    PALETTE,
    Note,
)

RULE_ORDER = list(RULE_LABELS.values())

# ED rules have colours of their own (Dark2), never used for models or tasks (the theme's PALETTE):
# one colour means one thing across the charts of an output cell
RULE_COLOURS = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#a6761d"]

RULE_DOMAIN = [*RULE_ORDER, "tuned KL", "tuned overlap", "norm"]

DEGENERATE_NOTE = "hollow: a degenerate ED (see the methods page); pale: under 20 prompts; neither counts in a verdict"

NOTE_TITLE = {"fontSize": 11, "fontWeight": "normal", "anchor": "start", "color": "#555555"}  # a chart's key line

ANSWER_OUTLINE = "#111111"  # the answer tokens' outline on erasure maps (no other mark uses it)

SOURCE_COLOURS = {OURS: PALETTE[0], PAPER: "#8c8c8c"}  # the same on every page

METRIC_TITLES = {
    "cos_attn": "cosine of the attention write",
    "cos_mlp": "cosine of the MLP write with h + a (parallel blocks too)",
    "cos_layer": "cosine of the layer write",
    "kl": "lens KL to the final distribution (nats)",
    "overlap": "lens top-5 overlap with the final top-5",
}

SUBLAYERS = {"attn": "attention", "mlp": "MLP", "layer": "whole layer"}

QUANTIZED_NOTE = "quantized GGUF weights, dequantized to float32"


def _picked(layers: Sequence[alt.Chart], pickers, bind: bool = True) -> list[alt.Chart]:
    """Each layer filtered by the dropdowns (each carries its own data); the first holds the
    dropdowns themselves when ``bind`` (once per chart)."""
    filtered = []
    for chart in layers:
        for name, param in pickers:
            chart = chart.transform_filter(alt.datum[name] == param)
        filtered.append(chart)
    if bind and pickers:
        filtered[0] = filtered[0].add_params(*(param for _, param in pickers))
    return filtered


def _rounded(frame: pl.DataFrame, columns: Sequence[str] = ("value",), digits: int = 5) -> pl.DataFrame:
    return frame.with_columns(pl.col(c).round(digits) for c in columns if c in frame.columns)


def _marked(summary: pl.DataFrame) -> pl.DataFrame:
    """ED rows with ``status`` (``degenerate`` or ``usable``) and a ``description`` every mark carries
    (a screen reader's label, and how a test finds the degenerate points)."""
    degenerate = pl.col("degenerate") if "degenerate" in summary.columns else pl.lit(None, dtype=pl.String)
    counts = pl.col("interval_counts").fill_null(True) if "interval_counts" in summary.columns else pl.lit(True)
    return summary.with_columns(
        pl.when(degenerate.is_not_null())
        .then(pl.lit("degenerate"))
        .when(~counts)
        .then(pl.lit("few prompts"))
        .otherwise(pl.lit("usable"))
        .alias("status"),
        pl.when(degenerate.is_not_null()).then(0.0).when(~counts).then(0.35).otherwise(1.0).alias("fill"),
        pl.format(
            "{} {} {}: ED {}{}",
            "model",
            "task",
            "rule",
            "ed",
            pl.when(degenerate.is_not_null()).then(pl.format(" (degenerate: {})", degenerate)).otherwise(pl.lit("")),
        ).alias("description"),
    )


def _hollow_when_degenerate(field: str, scale: alt.Scale, title: str) -> dict:
    """Encodings that draw a degenerate ED's point as a ring in its colour (``field`` on ``scale``
    with ``title``, as the colour channel has them: the two legends merge into one), filled otherwise."""
    return {
        "fillOpacity": alt.FillOpacity("fill:Q", scale=None, legend=None),  # _marked: by the point's status
        "stroke": alt.Stroke(field, scale=scale, title=title),
        "strokeWidth": alt.value(1.5),
        "description": alt.Description("description:N"),
    }


def _rule_scale(frame: pl.DataFrame) -> alt.Scale:
    """The rules' colours, fixed per rule, over the rules ``frame`` holds (no legend entry without marks)."""
    present = set(frame["rule"].to_list())
    domain = [r for r in RULE_DOMAIN if r in present] + sorted(present - set(RULE_DOMAIN))
    colours = dict(zip(RULE_DOMAIN, RULE_COLOURS, strict=False))
    spare = iter(RULE_COLOURS[len(RULE_DOMAIN) :])
    return alt.Scale(domain=domain, range=[colours.get(r) or next(spare, "#888888") for r in domain])


def _pickers(chart: alt.Chart, frame: pl.DataFrame, fields: Sequence[str] = ("model", "task")) -> alt.Chart:
    """Add a dropdown (and a filter) for each of ``fields`` that has more than one value in ``frame``."""
    for name in fields:
        if name not in frame.columns:
            continue
        options = frame[name].unique(maintain_order=True).to_list()
        if len(options) < 2:
            continue
        param = alt.param(
            name=f"pick_{name}", value=options[0], bind=alt.binding_select(options=options, name=f"{name} ")
        )
        chart = chart.add_params(param).transform_filter(alt.datum[name] == param)
    return chart


def as_plot_frame(frame: pl.DataFrame, model: str | None = None, task: str | None = None) -> pl.DataFrame:
    """A probe function's frame made plottable: per-example curves of the correlational probes are
    collapsed (token-weighted mean), per-example skip frames reduced as ``skip_summary`` does, and
    ``model`` / ``task`` columns added where missing (``model`` / ``task`` label them)."""
    if "n_tokens" in frame.columns:
        frame = token_weighted_mean(frame)
    elif "skipped_layer" in frame.columns and "position" in frame.columns and "mean" not in frame.columns:
        frame = skip_summary(frame)
    labels = {"model": model, "task": task}
    return frame.with_columns(
        pl.lit(label or column).alias(column) for column, label in labels.items() if column not in frame.columns
    )


def _needs_data(builder):
    """A builder given an empty frame returns a ``Note`` saying so instead of failing."""

    @functools.wraps(builder)
    def wrapper(frame: pl.DataFrame, *args, **kwargs):
        if frame.is_empty():
            return Note(f"No data for this chart ({builder.__name__.replace('_', ' ')}).")
        return builder(frame, *args, **kwargs)

    return wrapper


def _accepts_probe_frames(builder):
    """Let a chart builder take what the probe functions return, with ``model=`` / ``task=`` labels."""

    @functools.wraps(builder)
    def wrapper(frame: pl.DataFrame, *args, model: str | None = None, task: str | None = None, **kwargs):
        if frame.is_empty():
            return Note(f"No data for this chart ({builder.__name__.replace('_', ' ')}).")
        return builder(as_plot_frame(frame, model, task), *args, **kwargs)

    return wrapper


def _picker_params(frame: pl.DataFrame, fields: Sequence[str]) -> list[tuple[str, alt.Parameter]]:
    """A dropdown for each of ``fields`` with more than one value in ``frame``: (field, param)."""
    out = []
    for name in fields:
        options = frame[name].unique(maintain_order=True).to_list() if name in frame.columns else []
        if len(options) > 1:
            bind = alt.binding_select(options=options, name=f"{name} ")
            out.append((name, alt.param(name=f"pick_{name}", value=options[0], bind=bind)))
    return out


LENS_SCALE = alt.Scale(domain=["logit lens", "tuned lens"], range=[PALETTE[0], PALETTE[1]])


def _lens_scale(lenses: Sequence[str]) -> alt.Scale:
    """The lens colours of the lenses a chart has (a legend never names a lens that was not run)."""
    pairs = zip(LENS_SCALE.domain, LENS_SCALE.range, strict=True)
    present = [(name, colour) for name, colour in pairs if name in lenses]
    return alt.Scale(domain=[n for n, _ in present], range=[c for _, c in present])


# a symlog axis's own ticks crowd near zero and skip the decades: these, within the data's range
SYMLOG_TICKS = (-5, -2, -1, -0.5, -0.2, 0, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200)


def _symlog(values: pl.Series, title: str) -> alt.Y:
    """A y encoding on a symlog scale spanning the values (0 included), with readable ticks."""
    low, high = min(0.0, float(values.min())), max(0.0, float(values.max()))
    ticks = [t for t in SYMLOG_TICKS if low <= t <= high * 1.05]
    return alt.Y(
        "value:Q",
        title=title,
        scale=alt.Scale(type="symlog", constant=0.1, domain=[low, high], nice=False),
        axis=alt.Axis(values=ticks, format="~g"),
    )


def ratio_with_interval(base: alt.Chart, field: str, scale: alt.Scale, title: str, size: int = 60) -> list[alt.Chart]:
    """The ED ratio of each cell as a point (hollow when degenerate, pale when uncounted) on its
    bootstrap interval's bar, coloured by ``field``: the layers of every ED-by-task chart."""
    points = base.mark_point(filled=True, size=size).encode(
        y=alt.Y("ratio:Q", title="(ED + 1) / L", scale=alt.Scale(domain=[0, 1])),
        **_hollow_when_degenerate(field, scale, title),
        tooltip=[
            "status:N",
            "model:N",
            "task:N",
            field,
            "ed:Q",
            alt.Tooltip("ratio:Q", format=".2f"),
            "ci_low:Q",
            "ci_high:Q",
            "n_examples:Q",
        ],
    )
    bars = base.mark_rule(strokeWidth=2 if size > 60 else 1).encode(y="ratio_low:Q", y2="ratio_high:Q")
    return [bars, points]
