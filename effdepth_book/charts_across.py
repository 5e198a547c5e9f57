"""Charts across models and tasks: ED against scale and task, threshold sensitivity, relative-depth
curves, depth scores, the paper's Table 1 beside ours."""

from __future__ import annotations

from collections.abc import Sequence

import altair as alt
import polars as pl

from .chart_parts import (
    DEGENERATE_NOTE,
    METRIC_TITLES,
    NOTE_TITLE,
    RULE_ORDER,
    SOURCE_COLOURS,
    _hollow_when_degenerate,
    _marked,
    _needs_data,
    _picker_params,
    _rounded,
    _rule_scale,
    ratio_with_interval,
)
from .render import (
    CONTENT_WIDTH,
)


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
    chart = alt.layer(*ratio_with_interval(base, "rule:N", rules, "ED rule")).add_params(pick)
    return chart.properties(width=520, height=240, title=alt.Title(DEGENERATE_NOTE, **NOTE_TITLE))


@_needs_data
def depth_score_bars(scores: pl.DataFrame, order: Sequence[str] | None = None) -> alt.Chart:
    """Depth score per difficulty group as a share of the depth: the mean per-prompt score / L with
    its 95 % bootstrap interval over prompts (``scores``: ``evidence.depth_score_intervals``, the
    numbers the findings quote: ``model, task, value, low, high, n``)."""
    wide = _rounded(scores, ("value", "low", "high"), 4)
    x = alt.X("task:N", sort=list(order) if order else None, title=None, axis=alt.Axis(labelAngle=-30))
    bars = (
        alt.Chart(wide)
        .mark_bar(opacity=0.8)
        .encode(
            x=x,
            y=alt.Y("value:Q", title="depth score / L (mean per prompt)", scale=alt.Scale(domain=[0, 1])),
            color=alt.Color("model:N", title="model"),
            xOffset="model:N",
            tooltip=[
                "model:N",
                "task:N",
                alt.Tooltip("value:Q", format=".2f", title="depth score / L"),
                alt.Tooltip("low:Q", format=".2f", title="95 % low"),
                alt.Tooltip("high:Q", format=".2f", title="95 % high"),
                "n:Q",
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


@_needs_data
def differences_against_margin(steps: pl.DataFrame) -> alt.Chart:
    """Each model's difference of the primary statistic's ratio between two data sets with its 95 %
    interval (``steps``: ``model, rule, pair, point, low, high, margin, counted``), one panel per rule,
    against the grey band of its margin (± the pre-registered margin); a difference
    whose cell does not count (n < 20, degenerate) is drawn hollow and grey."""
    frame = _rounded(
        steps.with_columns(
            pl.format("{} · {}", "model", "pair").alias("step"),
            (-pl.col("margin")).alias("margin_low"),
            pl.lit(0.0).alias("zero"),
            pl.when(pl.col("counted")).then(pl.lit("counts")).otherwise(pl.lit("shown, not counted")).alias("cell"),
        ),
        ("point", "low", "high", "margin", "margin_low"),
    )
    y = alt.Y("step:N", title=None, sort=None, axis=alt.Axis(labelLimit=200))  # with 3 panels, fits the column
    base = alt.Chart()
    band = base.mark_bar(color="#ddd", height=12).encode(y=y, x="margin_low:Q", x2="margin:Q")
    zero = base.mark_rule(color="#888").encode(x="zero:Q")
    bars = base.mark_rule().encode(y=y, x=alt.X("low:Q", title="ratio difference (harder − easier)"), x2="high:Q",
                                   color=alt.Color("cell:N", title=None, scale=_CELL))  # fmt: skip
    points = base.mark_point(size=60).encode(
        y=y,
        x="point:Q",
        color=alt.Color("cell:N", scale=_CELL),
        fill=alt.Fill("cell:N", scale=_CELL_FILL, legend=None),
        tooltip=[
            "model:N",
            "rule:N",
            "pair:N",
            alt.Tooltip("point:Q", format="+.3f"),
            alt.Tooltip("low:Q", format="+.3f"),
            alt.Tooltip("high:Q", format="+.3f"),
            alt.Tooltip("margin:Q", format=".3f", title="margin ±"),
            "cell:N",
        ],
    )
    return (
        alt.layer(band, zero, bars, points)
        .properties(width=CONTENT_WIDTH / 3 - 60)
        .facet(column=alt.Column("rule:N", title=None, sort=RULE_ORDER), data=frame)
    )


_CELL = alt.Scale(domain=["counts", "shown, not counted"], range=["#1f4e79", "#aaa"])
_CELL_FILL = alt.Scale(domain=["counts", "shown, not counted"], range=["#1f4e79", "white"])


_VERDICTS = alt.Scale(
    domain=["agree", "a small difference within the margin", "disagree", "cannot tell"],
    range=["#2e7d32", "#66bb6a", "#c62828", "#9e9e9e"],
)


@_needs_data
def specification_curve(curve: pl.DataFrame, margin: str) -> alt.Chart:
    """A specification curve (Simonsohn et al. 2020) per comparison, picked from a menu: each
    specification's difference with its 95 % interval, sorted, coloured by its verdict at the
    primary ``margin`` (the ± band), the primary specification ringed; beneath, the choices each
    specification made."""
    from .specification import CHOICES

    frame = (
        curve.filter(pl.col("margin") == margin, pl.col("point").is_not_null())
        .with_columns(pl.format("{} · {}", "comparison", "rule").alias("panel"))
        .with_columns(pl.col("point").rank("ordinal").over("panel").alias("rank"))
        .with_columns((-pl.col("margin_value")).alias("margin_low"), pl.lit(0.0).alias("zero"))
    )
    frame = _rounded(frame, ("point", "low", "high", "margin_value", "margin_low"))
    panels = frame["panel"].unique(maintain_order=True).to_list()
    pick = alt.param(name="comparison", value=panels[0], bind=alt.binding_select(options=panels, name="comparison: "))
    x = alt.X("rank:O", title=None, axis=alt.Axis(labels=False, ticks=False))
    width = CONTENT_WIDTH - 220  # the choices' labels (at most 200 px) beside the matrix fit the column
    base = alt.Chart(frame).transform_filter(alt.datum.panel == pick)
    band = base.mark_rect(color="#eee").encode(y="margin_low:Q", y2="margin_value:Q")
    zero = base.mark_rule(color="#888").encode(y="zero:Q")
    legend = alt.Legend(orient="bottom", direction="horizontal", columns=2)  # below: the column's width stays
    colour = alt.Color("verdict:N", scale=_VERDICTS, title="verdict", legend=legend)
    whiskers = base.mark_rule().encode(x=x, y=alt.Y("low:Q", title="difference"), y2="high:Q", color=colour)
    points = base.mark_point(filled=True, size=30).encode(
        x=x,
        y="point:Q",
        color=colour,
        tooltip=[
            "comparison:N",
            "rule:N",
            *[f"{c}:N" for c in CHOICES],
            "verdict:N",
            alt.Tooltip("point:Q", format="+.3f"),
            alt.Tooltip("low:Q", format="+.3f"),
            alt.Tooltip("high:Q", format="+.3f"),
        ],
    )
    ring = (
        base.transform_filter(alt.datum.primary)
        .mark_point(size=160, color="black", strokeWidth=2)
        .encode(x=x, y="point:Q")
    )
    top = alt.layer(band, zero, whiskers, points, ring).properties(width=width, height=200)
    choices = frame.unpivot(index=["panel", "rank", "primary"], on=list(CHOICES), variable_name="choice").with_columns(
        pl.format("{}: {}", "choice", "value").alias("made")
    )
    order = [f"{c}: {v}" for c, values in CHOICES.items() for v in values]
    beneath = (
        alt.Chart(choices)
        .transform_filter(alt.datum.panel == pick)
        .mark_tick(thickness=2, size=9)
        .encode(
            x=x,
            y=alt.Y("made:N", title=None, sort=order, axis=alt.Axis(labelLimit=200)),
            color=alt.condition(alt.datum.primary, alt.value("black"), alt.value("#1f4e79")),
        )
        .properties(width=width)
    )
    return alt.vconcat(top, beneath).add_params(pick)
