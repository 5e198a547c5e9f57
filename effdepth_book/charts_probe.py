"""Charts of one model's probes (residual contributions, lens curves, skips, erasure, integrated
gradients): each takes the long frames of ``study.Study`` or what a probe function returns."""

from __future__ import annotations

import altair as alt
import polars as pl

from .chart_parts import (
    ANSWER_OUTLINE,
    METRIC_TITLES,
    SUBLAYERS,
    _accepts_probe_frames,
    _picker_params,
    _pickers,
    _rounded,
)
from .render import (
    CONTENT_WIDTH,
    Note,
)


@_accepts_probe_frames
def contribution_bars(
    cosine: pl.DataFrame, width: int = CONTENT_WIDTH, summary: pl.DataFrame | None = None
) -> alt.Chart:
    """Per layer: cosine of each sublayer's write with the residual it reads (top), with the mean of
    the three cosines the ED rule reads (line) and, where ``summary`` gives them (rows of ``rule``
    "cosine" with ``ed``, and ``model``/``task``), its ED (dashed) — and each write's size relative to
    that residual (bottom); dropdowns pick the model and task, the legend highlights a sublayer."""
    from effdepth_core.measurement.probes.cosine import COSINE_PARTS

    frame = cosine.select("model", "task", "layer", "metric", "value").with_columns(
        pl.col("metric").str.split("_").list.get(0).alias("kind"),
        pl.col("metric").str.split("_").list.get(1).replace(SUBLAYERS).alias("sublayer"),
    )
    mean = (
        frame.filter(pl.col("metric").is_in(COSINE_PARTS))
        .group_by("model", "task", "layer", maintain_order=True)
        .agg(pl.col("value").mean())
        .with_columns(pl.lit("mean").alias("kind"), pl.lit("mean of the three (the rule's curve)").alias("sublayer"))
    )
    parts = [frame, mean.with_columns(pl.lit("cos_mean").alias("metric")).select(frame.columns)]
    if summary is not None and {"rule", "ed"} <= set(summary.columns):
        eds = summary.filter(pl.col("rule") == "cosine", pl.col("ed").is_not_null())
        if {"model", "task"} <= set(eds.columns) and eds.height:
            parts.append(
                eds.select("model", "task", pl.col("ed").cast(pl.Int64).alias("layer")).with_columns(
                    pl.lit("ed").alias("metric"),
                    pl.lit(0.0).alias("value"),
                    pl.lit("ed").alias("kind"),
                    pl.lit("ED").alias("sublayer"),
                )
            )
    frame = _rounded(pl.concat(parts, how="vertical_relaxed"))
    pick = alt.selection_point(fields=["sublayer"], bind="legend")
    order = list(SUBLAYERS.values())
    base = (
        alt.Chart()
        .mark_bar()
        .encode(
            x=alt.X("layer:O", title="layer"),
            xOffset=alt.XOffset("sublayer:N", sort=order, scale=alt.Scale(domain=order)),
            color=alt.Color("sublayer:N", sort=order, title="sublayer", scale=alt.Scale(domain=order)),
            opacity=alt.condition(pick, alt.value(1.0), alt.value(0.2)),
            tooltip=["model:N", "task:N", "layer:O", "sublayer:N", alt.Tooltip("value:Q", format=".3f")],
        )
        .properties(width=width, height=170)
    )
    cos = base.transform_filter(alt.datum.kind == "cos").encode(y=alt.Y("value:Q", title="cosine with residual"))
    line = (
        alt.Chart()
        .mark_line(color="#111", point=alt.OverlayMarkDef(color="#111", size=12))
        .encode(
            x=alt.X("layer:O"),
            y=alt.Y("value:Q"),
            tooltip=["model:N", "task:N", "layer:O", alt.Tooltip("value:Q", format=".3f", title="mean cosine")],
        )
        .transform_filter(alt.datum.kind == "mean")
    )
    ed = (
        alt.Chart()
        .mark_rule(color="#111", strokeDash=[3, 3])
        .encode(x=alt.X("layer:O"), tooltip=[alt.Tooltip("layer:O", title="ED (cosine rule)")])
        .transform_filter(alt.datum.kind == "ed")
    )
    rel = base.transform_filter(alt.datum.kind == "rel").encode(  # log: layer 0 writes ~10× more than the rest
        y=alt.Y(
            "value:Q",
            title="‖write‖ / ‖residual‖ (log)",
            scale=alt.Scale(type="symlog", constant=0.1),
            axis=alt.Axis(values=[0, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50], format="~g"),  # symlog ticks land at 0, 5, 10
        )
    )
    top = alt.layer(cos.add_params(pick), line, ed)
    return _pickers(alt.vconcat(top, rel, data=frame), frame)


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


@_accepts_probe_frames
def lens_curves(
    lens: pl.DataFrame,
    summary: pl.DataFrame | None = None,
    overlap_threshold: float = 0.3,
    bands: pl.DataFrame | None = None,
    kl_fraction: float = 0.5,
) -> alt.VConcatChart:
    """Logit-lens KL to the final distribution (top) and top-5 overlap (bottom) per layer, one line
    per task; the ED layer of each rule is marked (``summary``: rows with ``rule`` — a label such as
    "lens KL" or a rule key such as ``logit_lens_kl``, as ``effective_depth`` and ``depth_table``
    give them — and ``ed``; ``model`` and ``task`` default to the curves' own). A dropdown picks
    the model (every layer of the chart is filtered, the ED marks too); click a legend entry to
    highlight a task. ``bands`` (``depth.curve_bands``: ``low, high, n`` per layer) shade each
    curve's 95 % bootstrap band over prompts, and the legend names each task with its n. Dashed
    lines show what each rule reads: the overlap threshold, and per task ``kl_fraction`` of the
    curve's largest KL (the KL rule's ED is the first layer after which KL stays below it)."""
    frame = _rounded(lens.select("model", "task", "layer", "metric", "value"))
    if bands is not None and bands.height:
        named = bands.select("model", "task", "n").unique(["model", "task"], maintain_order=True)
        named = named.with_columns(pl.format("{} (n = {})", "task", "n").alias("shown"))

        def relabel(f: pl.DataFrame) -> pl.DataFrame:  # "GSM8K" → "GSM8K (n = 20)", in every layer alike
            shown = f.join(named.select("model", "task", "shown"), on=["model", "task"], how="left")
            return shown.with_columns(pl.coalesce("shown", "task").alias("task")).drop("shown")

        frame, bands = relabel(frame), _rounded(relabel(bands), ("value", "low", "high"))
        if summary is not None and {"model", "task"} <= set(summary.columns):
            summary = relabel(summary)
    if summary is not None:
        from effdepth_core.measurement import registry

        labels = {key: rule.label for key, (_, rule) in registry.rules().items()}
        summary = summary.with_columns(pl.col("rule").replace(labels))
        for column in ("model", "task"):
            if column not in summary.columns:
                summary = summary.with_columns(pl.lit(frame[column][0]).alias(column))
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
        if bands is not None and bands.height:
            layers.insert(
                0,
                filtered(
                    alt.Chart(bands.filter(pl.col("metric") == metric))
                    .mark_area(opacity=0.18)
                    .encode(
                        x="layer:Q",
                        y="low:Q",
                        y2="high:Q",
                        color=alt.Color("task:N", title="task"),
                        opacity=alt.condition(pick, alt.value(0.18), alt.value(0.03)),
                    )
                ),
            )
        if metric == "overlap":
            layers.append(alt.Chart().mark_rule(strokeDash=[4, 4], color="#888").encode(y=alt.datum(overlap_threshold)))
        else:  # the KL rule's line: kl_fraction of each curve's largest KL
            cut = (
                frame.filter(pl.col("metric") == "kl")
                .group_by("model", "task", maintain_order=True)
                .agg((pl.col("value").max() * kl_fraction).round(4).alias("cut"))
            )
            layers.append(
                filtered(
                    alt.Chart(cut)
                    .mark_rule(strokeDash=[4, 4])
                    .encode(
                        y="cut:Q",
                        color="task:N",
                        opacity=alt.condition(pick, alt.value(0.7), alt.value(0.1)),
                        tooltip=["task:N", alt.Tooltip("cut:Q", title=f"{kl_fraction:g} × max KL")],
                    )
                )
            )
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
    """Max change of the output distribution (L2, or KL with ``output_metric="kl"``) when one layer /
    sublayer is skipped, with the mean over prompts as a tick."""
    kl = skip.filter(pl.col("metric") == "output_kl").height > 0
    frame = _rounded(
        skip.filter(pl.col("metric") == ("output_kl" if kl else "output_effect"), pl.col("variant") == variant).select(
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
            y=alt.Y("value:Q", title="max KL(clean ‖ skipped), nats" if kl else "max ‖Δ output probabilities‖₂"),
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
    kl = "metric" in erasure.columns and erasure.filter(pl.col("metric") == "erasure_kl").height > 0
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
        .properties(
            width=CONTENT_WIDTH,
            height=340,
            title=f"residual erasure: {'KL(ȳ ‖ y), nats,' if kl else '‖y − ȳ‖₂'} on the answer",
        )
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
