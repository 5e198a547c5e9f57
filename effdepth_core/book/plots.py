"""Altair charts of the probes, in one theme, sized to the book's content column.

Every builder takes the long frames of ``study.Study`` (or what a probe function returns, labelled
with ``model=`` / ``task=``) and returns an Altair chart; ``show`` turns one into notebook output
that every viewer can draw: the Vega-Lite spec under its version's mimetype (the book draws it with
its one offline copy of Vega, ``effdepth-vega.js``; JupyterLab and VS Code with theirs) and static
SVG and PNG outputs (GitHub, nbviewer, anything without JavaScript). ``save`` writes any chart as
SVG or PNG for a paper.
"""

from __future__ import annotations

import functools
import hashlib
import html
import itertools
import json
from collections.abc import Sequence

import altair as alt
import polars as pl

from ..probes import skip_summary, token_weighted_mean
from .reference import OURS, PAPER, RULE_LABELS

FONT = "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif"
PALETTE = ["#1f6f8b", "#e07a1f", "#4c9a2a", "#b23a48", "#7a5195", "#8c8c8c"]
THEME = {
    "font": FONT,
    "background": "white",
    "view": {"stroke": "#dddddd"},
    "axis": {"labelFontSize": 11, "titleFontSize": 12, "gridColor": "#eeeeee", "titleFontWeight": "normal"},
    "legend": {"labelFontSize": 11, "titleFontSize": 12, "orient": "bottom", "labelLimit": 0, "columns": 4},
    "header": {"labelFontSize": 12, "titleFontSize": 12},
    "title": {"fontSize": 14, "anchor": "start", "fontWeight": "normal"},
    "range": {"category": PALETTE},
}
RULE_ORDER = list(RULE_LABELS.values())
# ED rules have colours of their own (Dark2), never used for models or tasks (the theme's PALETTE):
# one colour means one thing across the charts of an output cell
RULE_COLOURS = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#a6761d"]
RULE_DOMAIN = [*RULE_ORDER, "tuned KL", "tuned overlap", "norm"]
DEGENERATE_NOTE = "hollow: a degenerate ED (see the methods page); pale: under 20 prompts; neither counts in a verdict"
NOTE_TITLE = {"fontSize": 11, "fontWeight": "normal", "anchor": "start", "color": "#555555"}  # a chart's key line
ANSWER_OUTLINE = "#111111"  # the answer tokens' outline on erasure maps (no other mark uses it)
CONTENT_WIDTH = 600  # px of plot area that fits the book's content column at 1400 px (legends below)
SOURCE_COLOURS = {OURS: PALETTE[0], PAPER: "#8c8c8c"}  # the same on every page
METRIC_TITLES = {
    "cos_attn": "cosine of the attention write",
    "cos_mlp": "cosine of the MLP write",
    "cos_layer": "cosine of the layer write",
    "kl": "lens KL to the final distribution (nats)",
    "overlap": "lens top-5 overlap with the final top-5",
}
SUBLAYERS = {"attn": "attention", "mlp": "MLP", "layer": "whole layer"}
QUANTIZED_NOTE = "quantized GGUF weights, dequantized to float32"
_counter = itertools.count()


def _vega_type(values: list) -> str:
    kinds = {type(v) for v in values if v is not None}
    if kinds and kinds <= {bool}:
        return "boolean"
    if kinds and kinds <= {int, float}:
        return "number"
    return "string"


def _csv_value(value):
    return ("true" if value else "false") if isinstance(value, bool) else value


def _csv_datasets(spec: dict) -> dict:
    """Store the spec's inline datasets as CSV text with explicit column types: the same data in a
    third to a quarter of the JSON records' size (no repeated keys), and no type guessing."""
    import csv
    import io

    formats = {}
    for name, records in spec.get("datasets", {}).items():
        if not records or not isinstance(records, list) or not isinstance(records[0], dict):
            continue
        columns = list(dict.fromkeys(key for record in records for key in record))
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(columns)
        for record in records:  # Vega's CSV parser reads only "false" or "0" as false: write booleans so
            writer.writerow(["" if record.get(c) is None else _csv_value(record[c]) for c in columns])
        spec["datasets"][name] = buffer.getvalue()
        formats[name] = {"type": "csv", "parse": {c: _vega_type([r.get(c) for r in records]) for c in columns}}

    def visit(node):
        if isinstance(node, dict):
            data = node.get("data")
            if isinstance(data, dict) and data.get("name") in formats:
                data["format"] = formats[data["name"]]
            for key, value in node.items():
                if key != "datasets":
                    visit(value)
        elif isinstance(node, list):
            for item in node:
                visit(item)

    visit(spec)
    return spec


def themed_spec(chart: alt.TopLevelMixin) -> dict:
    """The chart's Vega-Lite spec with the effdepth theme (chart-specific config wins) and its data
    inline as typed CSV."""
    with alt.data_transformers.enable("default", max_rows=None):  # data is inlined as compact CSV below
        spec = chart.to_dict()
    spec["config"] = {**THEME, **spec.get("config", {})}
    return _csv_datasets(spec)


def _fixed_width(spec: dict, width: int = CONTENT_WIDTH) -> dict:
    """The spec with container widths made fixed (for static rendering, which has no container)."""
    if isinstance(spec, dict):
        return {k: (width if k == "width" and v == "container" else _fixed_width(v, width)) for k, v in spec.items()}
    if isinstance(spec, list):
        return [_fixed_width(v, width) for v in spec]
    return spec


def save(chart: alt.TopLevelMixin, path, scale: float = 2.0) -> None:
    """Write ``chart`` in the book's theme as SVG or PNG (by ``path``'s suffix), with no network."""
    from pathlib import Path

    import vl_convert

    path = Path(path)
    spec = _fixed_width(themed_spec(chart))
    from ..cache import atomic_write_bytes

    if path.suffix == ".svg":
        data = vl_convert.vegalite_to_svg(spec).encode("utf-8")
    elif path.suffix == ".png":
        data = vl_convert.vegalite_to_png(spec, scale=scale)
    else:
        raise ValueError(f"save charts as .svg or .png, not {path.suffix or 'no suffix'}")
    atomic_write_bytes(path, data, "no chart was written")


def vegalite_mime(spec: dict) -> str:
    """The Vega-Lite output mimetype of ``spec``'s own version (``…vegalite.v6+json`` for a v6 spec)."""
    schema = str(spec.get("$schema", ""))
    major = schema.rsplit("/v", 1)[-1].split(".")[0] if "/v" in schema else "5"
    return f"application/vnd.vegalite.v{major}+json"


class ChartOutput:
    """Notebook output of one chart, for every viewer: the Vega-Lite spec under the mimetype of its
    version (the book draws it with its one offline copy of Vega through the ``sphinx_vega`` MyST-NB
    renderer; JupyterLab and VS Code draw it where they know that version), and a static SVG and PNG
    as outputs of their own mimetypes (GitHub, nbviewer, and any viewer without Vega)."""

    def __init__(self, chart: alt.TopLevelMixin):
        self.spec = themed_spec(chart)
        text = json.dumps(self.spec, sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha1(text.encode()).hexdigest()[:10]
        self.element_id = f"effdepth-chart-{digest}-{next(_counter)}"

    def description(self) -> str:
        title = self.spec.get("title")
        text = title.get("text") if isinstance(title, dict) else title
        return f"chart: {text}" if text else "chart (interactive where Vega-Lite is drawn; SVG and PNG attached)"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        import base64

        import vl_convert

        static = _fixed_width(self.spec)
        return {
            vegalite_mime(self.spec): static,
            "image/svg+xml": vl_convert.vegalite_to_svg(static),
            "image/png": base64.b64encode(vl_convert.vegalite_to_png(static, scale=1.0)).decode(),
            "text/plain": self.description(),
        }


def chart_html(spec: dict, element_id: str) -> str:
    """The book's HTML for a chart: a container and the script that queues its spec for the page's
    ``effdepth-vega.js`` (the ``sphinx_vega`` renderer writes it for every Vega-Lite output)."""
    payload = json.dumps(spec, sort_keys=True, separators=(",", ":")).replace("</", "<\\/")  # never end the script
    return (
        f'<div class="effdepth-chart" id="{element_id}"></div>\n'
        '<script type="text/javascript">\n'
        f'(window.effdepthCharts = window.effdepthCharts || []).push(["{element_id}", {payload}]);\n'
        "</script>"
    )


def show(chart: alt.TopLevelMixin | Note) -> ChartOutput | Note:
    """Display ``chart`` in a notebook, in the book (offline) and in static viewers (a ``Note``, what
    a builder returns for want of data, passes through)."""
    return chart if isinstance(chart, Note) else ChartOutput(chart)


class Note:
    """A short remark shown in place of a chart that has no data."""

    def __init__(self, text: str):
        self.text = text

    def _repr_html_(self) -> str:
        return f'<p class="effdepth-note"><em>{html.escape(self.text)}</em></p>'


def note(text: str) -> Note:
    return Note(text)


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


# --- one model ---------------------------------------------------------------------------


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


@_accepts_probe_frames
def contribution_bars(cosine: pl.DataFrame, width: int = CONTENT_WIDTH) -> alt.Chart:
    """Per layer: cosine of each sublayer's write with the residual it reads (top) and its size
    relative to that residual (bottom); dropdowns pick the model and task, the legend highlights a
    sublayer."""
    frame = _rounded(
        cosine.select("model", "task", "layer", "metric", "value").with_columns(
            pl.col("metric").str.split("_").list.get(0).alias("kind"),
            pl.col("metric").str.split("_").list.get(1).replace(SUBLAYERS).alias("sublayer"),
        )
    )
    pick = alt.selection_point(fields=["sublayer"], bind="legend")
    base = (
        alt.Chart()
        .mark_bar()
        .encode(
            x=alt.X("layer:O", title="layer"),
            xOffset=alt.XOffset("sublayer:N", sort=list(SUBLAYERS.values())),
            color=alt.Color("sublayer:N", sort=list(SUBLAYERS.values()), title="sublayer"),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.2)),
            tooltip=["model:N", "task:N", "layer:O", "sublayer:N", alt.Tooltip("value:Q", format=".3f")],
        )
        .properties(width=width, height=170)
    )
    cos = base.transform_filter(alt.datum.kind == "cos").encode(y=alt.Y("value:Q", title="cosine with residual"))
    rel = base.transform_filter(alt.datum.kind == "rel").encode(  # log: layer 0 writes ~10× more than the rest
        y=alt.Y(
            "value:Q",
            title="‖write‖ / ‖residual‖ (log)",
            scale=alt.Scale(type="symlog", constant=0.1),
            axis=alt.Axis(values=[0, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50], format="~g"),  # symlog ticks land at 0, 5, 10
        )
    )
    return _pickers(alt.vconcat(cos.add_params(pick), rel, data=frame), frame)


@_accepts_probe_frames
def metric_curves(frame: pl.DataFrame) -> alt.VConcatChart:
    """Any probe's curves: value per layer, one panel per metric, one line per task (a dropdown picks
    the model): the chart a new probe gets without writing one."""
    data = _rounded(frame.select("model", "task", "layer", "metric", "value"))
    pick = alt.selection_point(fields=["task"], bind="legend")
    base = (
        alt.Chart()
        .mark_line(point=True)
        .encode(
            x=alt.X("layer:Q", title="layer"),
            color=alt.Color("task:N", title="task"),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
            tooltip=["model:N", "task:N", "metric:N", "layer:Q", alt.Tooltip("value:Q", format=".3f")],
        )
        .properties(width=CONTENT_WIDTH, height=170)
    )
    metrics = data["metric"].unique(maintain_order=True).to_list()
    panels = [
        base.transform_filter(alt.datum.metric == metric).encode(y=alt.Y("value:Q", title=metric)) for metric in metrics
    ]
    panels[0] = panels[0].add_params(pick)
    return _pickers(alt.vconcat(*panels, data=data), data, ("model",))


def _picker_params(frame: pl.DataFrame, fields: Sequence[str]) -> list[tuple[str, alt.Parameter]]:
    """A dropdown for each of ``fields`` with more than one value in ``frame``: (field, param)."""
    out = []
    for name in fields:
        options = frame[name].unique(maintain_order=True).to_list() if name in frame.columns else []
        if len(options) > 1:
            bind = alt.binding_select(options=options, name=f"{name} ")
            out.append((name, alt.param(name=f"pick_{name}", value=options[0], bind=bind)))
    return out


@_accepts_probe_frames
def lens_curves(
    lens: pl.DataFrame, summary: pl.DataFrame | None = None, overlap_threshold: float = 0.3
) -> alt.VConcatChart:
    """Logit-lens KL to the final distribution (top) and top-5 overlap (bottom) per layer, one line
    per task; the ED layer of each rule is marked. A dropdown picks the model (every layer of the
    chart is filtered, the ED marks too); click a legend entry to highlight a task."""
    frame = _rounded(lens.select("model", "task", "layer", "metric", "value"))
    pick = alt.selection_point(fields=["task"], bind="legend")
    models = _picker_params(frame, ("model",))

    def filtered(chart: alt.Chart) -> alt.Chart:  # each child carries its own data: filter each one
        for name, param in models:
            chart = chart.transform_filter(alt.datum[name] == param)
        return chart

    def panel(metric: str, title: str, rule: str, first: bool) -> alt.LayerChart:
        line = filtered(
            alt.Chart(frame.filter(pl.col("metric") == metric))
            .mark_line(point=True)
            .encode(
                x=alt.X("layer:Q", title="layer whose input is decoded"),
                y=alt.Y("value:Q", title=title),
                color=alt.Color("task:N", title="task"),
                opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
                tooltip=["model:N", "task:N", "layer:Q", alt.Tooltip("value:Q", format=".3f")],
            )
        )
        if first:  # one legend selection and one model dropdown, shared by both panels
            line = line.add_params(pick, *(param for _, param in models))
        layers = [line]
        if metric == "overlap":
            layers.append(alt.Chart().mark_rule(strokeDash=[4, 4], color="#888").encode(y=alt.datum(overlap_threshold)))
        if summary is not None:
            eds = summary.filter(pl.col("rule") == rule, pl.col("ed").is_not_null()).select("model", "task", "ed")
            if eds.height:
                layers.append(
                    filtered(
                        alt.Chart(eds)
                        .mark_rule(strokeDash=[2, 3])
                        .encode(
                            x="ed:Q",
                            color="task:N",
                            opacity=alt.condition(pick, alt.value(0.9), alt.value(0.1)),
                            tooltip=["task:N", alt.Tooltip("ed:Q", title=f"ED ({rule})")],
                        )
                    )
                )
        return alt.layer(*layers).properties(width=CONTENT_WIDTH, height=170)

    return alt.vconcat(
        panel("kl", METRIC_TITLES["kl"], "lens KL", True),
        panel("overlap", METRIC_TITLES["overlap"], "lens overlap", False),
    )


@_accepts_probe_frames
def skip_heatmap(skip: pl.DataFrame, variant: str = "future") -> alt.Chart:
    """Max relative change of each later layer's contribution when one layer is skipped (method.md §3);
    a dropdown picks what is skipped (whole layer, attention, MLP)."""
    frame = _rounded(
        skip.filter(pl.col("metric") == "layer_effect", pl.col("variant") == variant).select(
            "model", "skipped_layer", "layer", "part", "value"
        )
    ).with_columns(pl.col("part").replace(SUBLAYERS))
    parts = [p for p in reversed(SUBLAYERS.values()) if p in set(frame["part"].to_list())]  # whole layer first
    if not parts:
        return Note(f"No {variant}-token skip effects to draw.")
    part = alt.param(name="part", value=parts[0], bind=alt.binding_select(options=parts, name="skipped "))
    # a few cells (the layers right after the skipped one) can be 10–40× the rest: the colour scale
    # ends at the 95th percentile and clamps the larger ones, so one cell cannot wash out the map
    cap = float(frame["value"].quantile(0.95)) or float(frame["value"].max()) or 1.0
    chart = (
        alt.Chart(frame)
        .transform_filter(alt.datum.part == part)
        .mark_rect()
        .encode(
            x=alt.X("layer:O", title="layer measured"),
            y=alt.Y("skipped_layer:O", title="layer skipped"),
            color=alt.Color(
                "value:Q",
                title=f"relative change (clipped at {cap:.2f}: brightest)",
                scale=alt.Scale(scheme="viridis", domain=[0, cap], clamp=True),
                legend=alt.Legend(titleLimit=0, gradientLength=240),
            ),
            tooltip=["part:N", "skipped_layer:O", "layer:O", alt.Tooltip("value:Q", format=".3f")],
        )
        .add_params(part)
        .properties(width=380, height=380, title=f"skip effect on later layers ({variant} tokens)")
    )
    return _pickers(chart, frame, ("model",))


@_accepts_probe_frames
def output_effect_bars(skip: pl.DataFrame, variant: str = "future") -> alt.Chart:
    """Max change of the output distribution (L2) when one layer / sublayer is skipped, with the
    mean over prompts as a tick."""
    frame = _rounded(
        skip.filter(pl.col("metric") == "output_effect", pl.col("variant") == variant).select(
            "model", "skipped_layer", "part", "value", "mean"
        ),
        ("value", "mean"),
    ).with_columns(pl.col("part").replace(SUBLAYERS))
    pick = alt.selection_point(fields=["part"], bind="legend")
    bars = (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=alt.X("skipped_layer:O", title="layer skipped"),
            xOffset=alt.XOffset("part:N", sort=list(SUBLAYERS.values())),
            y=alt.Y("value:Q", title="max ‖Δ output probabilities‖₂"),
            color=alt.Color("part:N", sort=list(SUBLAYERS.values()), title="skipped"),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.2)),
            tooltip=[
                "part:N",
                "skipped_layer:O",
                alt.Tooltip("value:Q", title="max", format=".3f"),
                alt.Tooltip("mean:Q", title="mean over prompts", format=".3f"),
            ],
        )
    )
    chart = bars.add_params(pick).properties(
        width=CONTENT_WIDTH, height=200, title=f"skip effect on the output ({variant} tokens)"
    )
    return _pickers(chart, frame, ("model",))


def _token_labels(frame: pl.DataFrame) -> pl.DataFrame:
    """``position`` → a readable label "12 ␣token" (unique per position)."""
    return frame.with_columns(
        pl.format(
            "{} {}",
            pl.col("position").cast(pl.String).str.zfill(3),
            pl.col("token").str.replace_all(" ", "␣").str.replace_all("\n", "⏎"),
        ).alias("token_label")
    )


@_accepts_probe_frames
def erasure_heatmap(erasure: pl.DataFrame) -> alt.Chart:
    """Max change of the answer-token distributions when h_l[t] is replaced by its mean (method.md §4);
    answer tokens are outlined; dropdowns pick the model and the prompt."""
    frame = _token_labels(_rounded(erasure)).select("model", "example", "layer", "token_label", "is_answer", "value")
    chart = (
        alt.Chart(frame)
        .mark_rect()
        .encode(
            x=alt.X(
                "token_label:O", title="token position (answer tokens last, outlined)", axis=alt.Axis(labelAngle=-60)
            ),
            y=alt.Y("layer:O", title="layer l (h_l erased)", sort="descending"),
            color=alt.Color("value:Q", title="effect", scale=alt.Scale(scheme="viridis", domainMin=0)),
            stroke=alt.condition(alt.datum.is_answer, alt.value(ANSWER_OUTLINE), alt.value(None)),
            tooltip=["layer:O", "token_label:N", "is_answer:N", alt.Tooltip("value:Q", format=".3f")],
        )
        .properties(width=CONTENT_WIDTH, height=340, title="residual erasure: ‖y − ȳ‖₂ on the answer")
    )
    return _pickers(chart, frame, ("model", "example"))


@_accepts_probe_frames
def attribution_heatmap(igrad: pl.DataFrame, tokens: pl.DataFrame | None = None) -> alt.Chart:
    """Integrated-gradient attribution of the answer probability to each layer's output at each
    token (method.md §5); ``tokens`` (model, example, position, token) labels the x axis, e.g. the
    erasure frame; dropdowns pick the model and the prompt."""
    keys = ["model", "example", "position"]
    frame = igrad.filter(pl.col("metric") == "attribution").select(*keys, "layer", "value")
    if tokens is not None:
        labels = tokens.select(*keys, "token").unique(keys)
        frame = frame.join(labels, on=keys, how="left").with_columns(pl.col("token").fill_null(""))
    else:
        frame = frame.with_columns(pl.lit("").alias("token"))
    frame = _token_labels(_rounded(frame, digits=6)).select("model", "example", "layer", "token_label", "value")
    limit = float(frame["value"].abs().max() or 1.0)
    chart = (
        alt.Chart(frame)
        .mark_rect()
        .encode(
            x=alt.X("token_label:O", title="token", axis=alt.Axis(labelAngle=-60)),
            y=alt.Y("layer:O", title="layer (output of)", sort="descending"),
            color=alt.Color(  # positive (red) at the top of the colour bar
                "value:Q", title="attribution", scale=alt.Scale(scheme="redblue", domain=[-limit, limit], reverse=True)
            ),
            tooltip=["layer:O", "token_label:N", alt.Tooltip("value:Q", format=".4f")],
        )
        .properties(width=CONTENT_WIDTH, height=340, title="integrated gradients")
    )
    return _pickers(chart, frame, ("model", "example"))


@_accepts_probe_frames
def completeness_bars(igrad: pl.DataFrame) -> alt.Chart:
    """Per layer and prompt: Σ attributions − (target(h) − target(b)), relative to the target change."""
    wide = (
        igrad.filter(pl.col("position").is_null())
        .pivot(on="metric", index=["model", "example", "layer"], values="value")
        .with_columns((pl.col("completeness_gap") / pl.col("target_delta").abs()).alias("relative_gap"))
    )
    chart = (
        alt.Chart(_rounded(wide, ("relative_gap", "target_delta", "attribution_sum"), 6))
        .mark_bar()
        .encode(
            x=alt.X("layer:O"),
            xOffset="example:N",
            y=alt.Y("relative_gap:Q", title="completeness gap / |target change|"),
            color=alt.Color("example:N", title="prompt"),
            tooltip=["model:N", "example:N", "layer:O", "target_delta:Q", "attribution_sum:Q", "relative_gap:Q"],
        )
        .properties(width=CONTENT_WIDTH, height=150, title="integrated-gradient completeness check")
    )
    return _pickers(chart, wide, ("model",))


# --- across models -----------------------------------------------------------------------


@_needs_data
def ed_against_scale(summary: pl.DataFrame, x: str = "n_layers") -> alt.Chart:
    """ED ratio with its bootstrap interval against depth (``n_layers``) or size (``n_params``),
    one panel per task; click a legend entry to highlight a rule."""
    frame = _marked(summary.filter(pl.col("ratio").is_not_null())).with_columns(
        (pl.col("n_params") / 1e6).round(1).alias("params_m")
    )
    x_field = {
        "n_layers": alt.X("n_layers:Q", title="layers L", scale=alt.Scale(zero=False)),
        "n_params": alt.X(
            "params_m:Q",
            title="parameters (millions, log)",
            scale=alt.Scale(type="log"),
            axis=alt.Axis(values=[100, 300, 1000, 3000], format="~s"),
        ),
    }[x]
    pick = alt.selection_point(fields=["rule"], bind="legend")
    rules = _rule_scale(frame)  # the colour and the ring of a degenerate point share it
    base = alt.Chart(frame).encode(
        x=x_field,
        color=alt.Color("rule:N", scale=rules, title="ED rule", legend=alt.Legend(columns=1)),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
    )
    points = base.mark_point(filled=True, size=70).encode(
        y=alt.Y("ratio:Q", title="(ED + 1) / L", scale=alt.Scale(domain=[0, 1])),
        shape=alt.Shape("model:N", title="model", legend=alt.Legend(columns=2)),  # two legends side by side fit
        **_hollow_when_degenerate("rule:N", rules, "ED rule"),
        tooltip=[
            "model:N",
            "task:N",
            "rule:N",
            "n_layers:Q",
            "params_m:Q",
            "ed:Q",
            alt.Tooltip("ratio:Q", format=".2f"),
            "ci_low:Q",
            "ci_high:Q",
        ],
    )
    bars = base.mark_rule().encode(y="ratio_low:Q", y2="ratio_high:Q")
    return (
        alt.layer(bars, points, data=frame)
        .properties(width=140, height=200)
        .facet(column=alt.Column("task:N", title=None, sort=frame["task"].unique(maintain_order=True).to_list()))
        .add_params(pick)
        .properties(title=alt.Title(DEGENERATE_NOTE, **NOTE_TITLE))
    )


@_needs_data
def threshold_sensitivity(table: pl.DataFrame) -> alt.Chart:
    """ED ratio of each thresholded rule as its threshold varies (``Study.sensitivity``), one line per
    task, one panel per rule, the paper's threshold dotted: a gap between tasks that changes with the
    threshold belongs to the threshold, not the task. A dropdown picks the model."""
    paper = {"kl_fraction": 0.5, "overlap_threshold": 0.3, "cosine_zero": 0.0}  # each rule's own setting
    axis_titles = {"cosine_zero": "level the cosine must fall below", "kl_fraction": "KL fraction of its maximum",
                   "overlap_threshold": "top-5 overlap threshold"}  # fmt: skip
    frame = _rounded(table.filter(pl.col("ratio").is_not_null()), ("ratio", "threshold"), 4)
    pickers = _picker_params(frame, ("model",))
    panels = []
    for index, (rule, part) in enumerate(frame.group_by("rule", maintain_order=True)):
        setting = part["setting"][0]
        line = (
            alt.Chart(part)
            .mark_line(point=True)
            .encode(
                x=alt.X("threshold:Q", title=axis_titles.get(setting, setting), scale=alt.Scale(zero=False)),
                y=alt.Y("ratio:Q", title=f"{rule[0]}: (ED + 1) / L", scale=alt.Scale(domain=[0, 1])),
                color=alt.Color("task:N", title="task"),
                tooltip=["model:N", "task:N", "threshold:Q", "ed:Q", alt.Tooltip("ratio:Q", format=".2f")],
            )
        )
        mark = (
            alt.Chart(pl.DataFrame({"threshold": [paper[setting]]}))
            .mark_rule(strokeDash=[4, 4], color="#888")
            .encode(x="threshold:Q")
        )
        for name, param in pickers:
            line = line.transform_filter(alt.datum[name] == param)
        if index == 0 and pickers:
            line = line.add_params(*(param for _, param in pickers))
        panels.append(alt.layer(line, mark).properties(width=(CONTENT_WIDTH - 40) // 2, height=200))
    return alt.concat(*panels, columns=2)  # two panels a row: the tuned-lens rules go below the logit lens's


@_needs_data
def relative_depth_curves(curves: pl.DataFrame, metrics: Sequence[str]) -> alt.Chart:
    """Curves of several models on relative depth (layer / L), one panel per metric; a dropdown picks
    the task, the legend highlights a model."""
    frame = _rounded(
        curves.filter(pl.col("metric").is_in(list(metrics)))
        .select("model", "task", "metric", "layer", "rel_depth", "value")
        .with_columns(pl.col("metric").replace(METRIC_TITLES).alias("panel")),
        ("value", "rel_depth"),
        4,
    )
    pick = alt.selection_point(fields=["model"], bind="legend")

    def panel(metric: str, first: bool) -> alt.Chart:
        chart = (
            alt.Chart(frame.filter(pl.col("metric") == metric))
            .mark_line(point=alt.OverlayMarkDef(size=15))
            .encode(
                x=alt.X("rel_depth:Q", title="relative depth (layer / L)", scale=alt.Scale(domain=[0, 1])),
                y=alt.Y("value:Q", title=METRIC_TITLES.get(metric, metric)),
                color=alt.Color("model:N", title="model"),
                opacity=alt.condition(pick, alt.value(1.0), alt.value(0.1)),
                tooltip=["model:N", "task:N", "layer:Q", alt.Tooltip("value:Q", format=".3f")],
            )
            .properties(width=230, height=150)
        )
        return chart.add_params(pick) if first else chart

    tasks = _picker_params(frame, ("task",))
    panels = []
    for index, metric in enumerate(metrics):
        chart = panel(metric, index == 0)
        for name, param in tasks:  # each panel carries its own data: filter each one
            chart = chart.transform_filter(alt.datum[name] == param)
        if index == 0:
            chart = chart.add_params(*(param for _, param in tasks))
        panels.append(chart)
    return alt.concat(*panels, columns=2)


@_needs_data
def ed_by_task(summary: pl.DataFrame, order: Sequence[str] | None = None) -> alt.Chart:
    """ED ratio per task (difficulty order on x) with bootstrap intervals, one colour per rule."""
    frame = _marked(summary.filter(pl.col("ratio").is_not_null()))
    sort = list(order) if order else None
    pick = alt.selection_point(fields=["rule"], bind="legend")
    rules = _rule_scale(frame)  # the colour and the ring of a degenerate point share it
    base = alt.Chart(frame).encode(
        x=alt.X("task:N", sort=sort, title=None, axis=alt.Axis(labelAngle=-30)),
        xOffset=alt.XOffset("rule:N", sort=RULE_ORDER),
        color=alt.Color("rule:N", scale=rules, title="ED rule"),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.15)),
    )
    points = base.mark_point(filled=True, size=60).encode(
        y=alt.Y("ratio:Q", title="(ED + 1) / L", scale=alt.Scale(domain=[0, 1])),
        **_hollow_when_degenerate("rule:N", rules, "ED rule"),
        tooltip=[
            "status:N",
            "model:N",
            "task:N",
            "rule:N",
            "ed:Q",
            alt.Tooltip("ratio:Q", format=".2f"),
            "ci_low:Q",
            "ci_high:Q",
            "n_examples:Q",
        ],
    )
    bars = base.mark_rule().encode(y="ratio_low:Q", y2="ratio_high:Q")
    chart = alt.layer(bars, points).add_params(pick)
    return chart.properties(width=520, height=240, title=alt.Title(DEGENERATE_NOTE, **NOTE_TITLE))


@_needs_data
def depth_score_bars(scores: pl.DataFrame, order: Sequence[str] | None = None) -> alt.Chart:
    """Depth score per difficulty group as a share of the depth (score / (L − 1)), with the mean ±
    std of the per-prompt scores."""
    std = pl.col("depth_score_std").fill_nan(0).fill_null(0)  # undefined for one example
    wide = scores.pivot(on="metric", index=["model", "task", "n_layers"], values="value").with_columns(
        (pl.col("depth_score") / (pl.col("n_layers") - 1)).alias("relative"),
        ((pl.col("depth_score_mean") - std) / (pl.col("n_layers") - 1)).alias("low"),
        ((pl.col("depth_score_mean") + std) / (pl.col("n_layers") - 1)).alias("high"),
    )
    wide = _rounded(wide, ("depth_score", "depth_score_mean", "depth_score_std", "relative", "low", "high"), 4)
    x = alt.X("task:N", sort=list(order) if order else None, title=None, axis=alt.Axis(labelAngle=-30))
    bars = (
        alt.Chart(wide)
        .mark_bar(opacity=0.8)
        .encode(
            x=x,
            y=alt.Y("relative:Q", title="depth score / (L − 1)", scale=alt.Scale(domain=[0, 1])),
            color=alt.Color("model:N", title="model"),
            xOffset="model:N",
            tooltip=[
                "model:N",
                "task:N",
                alt.Tooltip("depth_score:Q", format=".2f"),
                alt.Tooltip("depth_score_mean:Q", format=".2f"),
                alt.Tooltip("depth_score_std:Q", format=".2f"),
            ],
        )
    )
    spread = alt.Chart(wide).mark_rule(color="black").encode(x=x, xOffset="model:N", y="low:Q", y2="high:Q")
    return alt.layer(bars, spread).properties(width=520, height=220)


@_needs_data
def paper_vs_ours(table: pl.DataFrame) -> alt.Chart:
    """ED ratio per (model, task, rule): the paper's models and ours side by side; a dropdown picks
    the rule."""
    rules = [r for r in RULE_ORDER if r in set(table["rule"].to_list())]
    rule = alt.param(name="rule", value=rules[0], bind=alt.binding_select(options=rules, name="rule "))
    present = [s for s in SOURCE_COLOURS if s in set(table.filter(pl.col("ratio").is_not_null())["source"].to_list())]
    scale = alt.Scale(domain=present, range=[SOURCE_COLOURS[s] for s in present])  # no legend entry without marks
    return (
        alt.Chart(table.filter(pl.col("ratio").is_not_null()))
        .transform_filter(alt.datum.rule == rule)
        .mark_point(filled=True, size=70)
        .encode(
            x=alt.X("ratio:Q", title="(ED + 1) / L", scale=alt.Scale(domain=[0, 1])),
            y=alt.Y("model:N", title=None, sort=alt.EncodingSortField("n_layers")),
            color=alt.Color("source:N", title=None, scale=scale),
            shape=alt.Shape("task:N"),
            tooltip=[
                "source:N",
                "model:N",
                "task:N",
                "rule:N",
                "ed:Q",
                alt.Tooltip("ratio:Q", format=".2f"),
                "n_layers:Q",
            ],
        )
        .add_params(rule)
        .properties(width=CONTENT_WIDTH - 180, height=alt.Step(18))
    )


# --- beyond the paper: tuned lens, pruning, early exit, cross-model map -------------------------

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


@_needs_data
def lens_ed_comparison(summary: pl.DataFrame) -> alt.Chart:
    """ED ratio with its bootstrap interval per task, logit lens beside tuned lens, one panel per
    rule (KL, overlap): is ED a property of the model or of the lens?"""
    labels = {
        "lens KL": ("KL rule", "logit lens"),
        "lens overlap": ("overlap rule", "logit lens"),
        "tuned KL": ("KL rule", "tuned lens"),
        "tuned overlap": ("overlap rule", "tuned lens"),
    }
    frame = _marked(summary.filter(pl.col("rule").is_in(list(labels)), pl.col("ratio").is_not_null())).with_columns(
        pl.col("rule").replace_strict({k: v[0] for k, v in labels.items()}).alias("panel"),
        pl.col("rule").replace_strict({k: v[1] for k, v in labels.items()}).alias("lens"),
    )
    lens_scale = _lens_scale(frame["lens"].unique().to_list())
    base = alt.Chart().encode(
        x=alt.X("task:N", title=None, axis=alt.Axis(labelAngle=0)),
        xOffset=alt.XOffset("lens:N", sort=lens_scale.domain),
        color=alt.Color("lens:N", scale=lens_scale, title="lens"),
    )
    points = base.mark_point(filled=True, size=70).encode(
        y=alt.Y("ratio:Q", title="(ED + 1) / L", scale=alt.Scale(domain=[0, 1])),
        **_hollow_when_degenerate("lens:N", lens_scale, "lens"),
        tooltip=[
            "model:N",
            "task:N",
            "lens:N",
            "status:N",
            "ed:Q",
            alt.Tooltip("ratio:Q", format=".2f"),
            "ci_low:Q",
            "ci_high:Q",
        ],
    )
    bars = base.mark_rule(strokeWidth=2).encode(y="ratio_low:Q", y2="ratio_high:Q")
    chart = alt.layer(bars, points, data=frame).properties(width=270, height=200)
    faceted = chart.facet(column=alt.Column("panel:N", title=None)).properties(
        title=alt.Title(DEGENERATE_NOTE, **NOTE_TITLE)
    )
    return _pickers(faceted, frame, ("model",))


@_needs_data
def lens_fit_curves(fit: pl.DataFrame) -> alt.Chart:
    """Held-out KL(q_l ‖ p) per layer of the logit lens and the tuned lens on the lens corpus's
    held-out texts: the translators are trained enough to trust where the tuned curve is lower."""
    frame = _rounded(
        fit.unique(["model", "layer", "metric"], maintain_order=True).with_columns(
            pl.col("metric")
            .replace_strict({"heldout_kl_logit": "logit lens", "heldout_kl_tuned": "tuned lens"})
            .alias("lens")
        )
    )
    chart = (
        alt.Chart(frame)
        .mark_line(point=True)
        .encode(
            x=alt.X("layer:Q", title="layer whose input is decoded"),
            y=alt.Y("value:Q", title="held-out KL to the final distribution (nats)"),
            color=alt.Color("lens:N", scale=_lens_scale(frame["lens"].unique().to_list()), title="lens"),
            tooltip=["model:N", "layer:Q", "lens:N", alt.Tooltip("value:Q", format=".3f")],
        )
        .properties(width=CONTENT_WIDTH, height=200)
    )
    return _pickers(chart, frame, ("model",))


@_needs_data
def pruning_curves(prune: pl.DataFrame, summary: pl.DataFrame | None = None, rule: str = "lens overlap") -> alt.Chart:
    """ΔNLL of the answer tokens when a block of k consecutive layers starting at a layer is removed
    (one line per k, log scale), with the layer after the ED of ``rule`` on the same model and task
    marked (the dropdowns filter both): does cutting after ED hurt less than cutting elsewhere?"""
    frame = _rounded(
        prune.filter(rule="block", metric="delta_nll")
        .select("model", "task", "k", "start", "removed", "value")
        .with_columns(pl.format("k = {}", "k").alias("block"))
    )
    sizes = sorted(frame["k"].unique().to_list())
    layers = [
        alt.Chart(frame)
        .mark_line(point=alt.OverlayMarkDef(size=20), clip=True)
        .encode(
            x=alt.X("start:Q", title="first removed layer"),
            y=_symlog(frame["value"], "Δ answer NLL (nats, symlog)"),
            color=alt.Color("block:N", sort=[f"k = {k}" for k in sizes], title="layers removed"),
            tooltip=["model:N", "task:N", "removed:N", alt.Tooltip("value:Q", title="Δ NLL", format=".3f")],
        )
    ]
    if summary is not None:
        eds = summary.filter(pl.col("rule") == rule, pl.col("ed").is_not_null()).select(
            "model", "task", (pl.col("ed") + 1).alias("after_ed")
        )
        eds = eds.join(frame.select("model", "task").unique(), on=["model", "task"])  # the pruned tasks only
        if eds.height:
            layers.append(
                alt.Chart(eds)
                .mark_rule(strokeDash=[3, 3], color="#111")
                .encode(x="after_ed:Q", tooltip=["task:N", alt.Tooltip("after_ed:Q", title=f"ED ({rule}) + 1")])
            )
    pickers = _picker_params(frame, ("model", "task"))
    return alt.layer(*_picked(layers, pickers)).properties(width=CONTENT_WIDTH, height=220)


@_needs_data
def early_exit_curves(
    exits: pl.DataFrame, summary: pl.DataFrame | None = None, rule: str = "lens overlap"
) -> alt.Chart:
    """Per exit layer: the share of tokens whose top-1 is already the final one (top) and the answer
    NLL when exiting there (bottom), per lens; the dotted line marks exiting right after ED."""
    frame = _rounded(
        exits.with_columns(pl.format("{} lens", "lens").alias("lens")).select(
            "model", "task", "lens", "layer", "metric", "value"
        )
    )
    pickers = _picker_params(frame, ("model", "task"))
    lens_scale = _lens_scale(frame["lens"].unique().to_list())

    def panel(metric: str, title: str, first: bool) -> alt.LayerChart:
        part = frame.filter(metric=metric)
        # the NLL of layer 0 (the embeddings decoded) is ~10x the rest: symlog keeps the later layers readable
        y = _symlog(part["value"], f"{title} (symlog)") if metric == "answer_nll" else alt.Y("value:Q", title=title)
        line = (
            alt.Chart(part)
            .mark_line(point=alt.OverlayMarkDef(size=20))
            .encode(
                x=alt.X("layer:Q", title="exit layer (layers run)"),
                y=y,
                color=alt.Color("lens:N", scale=lens_scale, title="lens"),
                tooltip=["model:N", "task:N", "lens:N", "layer:Q", alt.Tooltip("value:Q", format=".3f")],
            )
        )
        layers = [line]
        if summary is not None:
            eds = summary.filter(pl.col("rule") == rule, pl.col("ed").is_not_null()).select(
                "model", "task", (pl.col("ed") + 1).alias("exit")
            )
            if eds.height:
                layers.append(alt.Chart(eds).mark_rule(strokeDash=[3, 3], color="#111").encode(x="exit:Q"))
        return alt.layer(*_picked(layers, pickers, first)).properties(width=CONTENT_WIDTH, height=170)

    return alt.vconcat(
        panel("agreement", "tokens whose top-1 is the final top-1", True),
        panel("answer_nll", "answer NLL when exiting here (nats)", False),
    )


@_needs_data
def map_heatmap(mapped: pl.DataFrame, small: str = "small model", big: str = "big model") -> alt.Chart:
    """Held-out relative error of the affine map from each small-model layer (y) to each big-model
    layer (x), the best big layer per small layer circled, and the equal-relative-depth diagonal;
    beside it the same maps fitted on shuffled token pairs (the baseline) and the small model mapped
    onto itself (the check). The colour scale spans the map's informative range (its 2nd to 90th
    percentile; larger errors, such as the embedding rows, clamp to the lightest colour)."""
    if "prompt" in mapped.columns:
        mapped = mapped.filter(pl.col("prompt").is_null())
    errors = _rounded(mapped.filter(metric="relative_error").select("small_layer", "big_layer", "value"), digits=4)
    low, high = float(errors["value"].quantile(0.02)), float(errors["value"].quantile(0.9))
    scale = alt.Scale(scheme="viridis", reverse=True, domain=[low, high], clamp=True)
    best = mapped.filter(metric="best_big_layer").select(
        "small_layer", pl.col("value").cast(pl.Int64).alias("big_layer")
    )
    equal = mapped.filter(metric="equal_depth_layer").select("small_layer", pl.col("value").alias("big_layer"))

    def heat(frame: pl.DataFrame, title: str, x_title: str, colour: alt.Scale, legend: str) -> alt.Chart:
        return (
            alt.Chart(frame)
            .mark_rect()
            .encode(
                x=alt.X("big_layer:O", title=x_title),
                y=alt.Y("small_layer:O", title=f"{small} layer m", sort="descending"),
                color=alt.Color("value:Q", title=legend, scale=colour, legend=alt.Legend(titleLimit=0)),
                tooltip=["small_layer:O", "big_layer:O", alt.Tooltip("value:Q", title="error", format=".3f")],
            )
            .properties(title=title)
        )

    circles = (
        alt.Chart(best)
        .mark_point(shape="circle", color="white", size=60, strokeWidth=2)
        .encode(x="big_layer:O", y=alt.Y("small_layer:O", sort="descending"))
    )
    diagonal = (
        alt.Chart(equal.with_columns(pl.col("big_layer").round(0).cast(pl.Int64)))
        .mark_line(color="#e07a1f", strokeDash=[4, 3], strokeWidth=2)
        .encode(x="big_layer:O", y=alt.Y("small_layer:O", sort="descending"), order="small_layer:Q")
    )
    legend = f"relative error ({low:.2f}–{high:.2f}; beyond clamps)"
    panels = [
        alt.layer(heat(errors, f"{small} → {big}", f"{big} layer l", scale, legend), diagonal, circles).properties(
            width=CONTENT_WIDTH - 60, height=380
        )
    ]
    baseline = _rounded(mapped.filter(metric="baseline_error").select("small_layer", "big_layer", "value"), digits=4)
    if baseline.height:
        panels.append(
            heat(baseline, "shuffled token pairs (baseline)", f"{big} layer l", scale, legend).properties(
                width=(CONTENT_WIDTH - 60) // 2, height=190
            )
        )
    own = _rounded(mapped.filter(metric="self_error").select("small_layer", "big_layer", "value"), digits=4)
    if own.height:
        own_scale = alt.Scale(scheme="greys", reverse=True, domain=[0, max(float(own["value"].max()), 1e-9)])
        panels.append(
            heat(own, f"{small} → itself (check)", f"{small} layer", own_scale, "relative error, self-map").properties(
                width=(CONTENT_WIDTH - 60) // 2, height=190
            )
        )
    if len(panels) == 1:
        return panels[0]
    return alt.vconcat(panels[0], alt.hconcat(*panels[1:]).resolve_scale(color="independent")).resolve_scale(
        color="independent"
    )
