"""Charts beyond the paper: logit lens beside tuned lens, the tuned lens's fit, pruning, early
exit, the cross-model map."""

from __future__ import annotations

import altair as alt
import polars as pl

from ...chart_parts import (
    DEGENERATE_NOTE,
    NOTE_TITLE,
    _lens_scale,
    _marked,
    _needs_data,
    _picked,
    _picker_params,
    _pickers,
    _rounded,
    _symlog,
    ratio_with_interval,
)
from ...render import (
    CONTENT_WIDTH,
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
    chart = alt.layer(*ratio_with_interval(base, "lens:N", lens_scale, "lens", size=70), data=frame)
    chart = chart.properties(width=270, height=200)
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
    """Per exit layer: the share of tokens whose top-1 is already the final one (top), the answer NLL
    when exiting there, and its cost per layer saved ((NLL(l) − NLL(L)) / (L − l), bottom), per lens;
    the dotted line marks exiting right after ED."""
    frame = exits.with_columns(pl.format("{} lens", "lens").alias("lens")).select(
        "model", "task", "lens", "layer", "metric", "value"
    )
    nll = frame.filter(metric="answer_nll")
    run = ["model", "task", "lens"]
    final = nll.filter(pl.col("layer") == pl.col("layer").max().over(run)).select(
        *run, pl.col("layer").alias("depth"), pl.col("value").alias("final")
    )
    per_layer = (
        nll.join(final, on=run)
        .filter(pl.col("layer") < pl.col("depth"))
        .select(
            *run,
            "layer",
            pl.lit("cost_per_layer").alias("metric"),
            ((pl.col("value") - pl.col("final")) / (pl.col("depth") - pl.col("layer"))).alias("value"),
        )
    )
    frame = _rounded(pl.concat([frame, per_layer.select(frame.columns)]))
    pickers = _picker_params(frame, ("model", "task"))
    lens_scale = _lens_scale(frame["lens"].unique().to_list())

    def panel(metric: str, title: str, first: bool) -> alt.LayerChart:
        part = frame.filter(metric=metric)
        # the NLL of layer 0 (the embeddings decoded) is ~10x the rest: symlog keeps the later layers readable
        symlog = metric in ("answer_nll", "cost_per_layer")
        y = _symlog(part["value"], f"{title} (symlog)") if symlog else alt.Y("value:Q", title=title)
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
        panel("cost_per_layer", "ΔNLL per layer saved (nats)", False),
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
