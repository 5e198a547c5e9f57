"""Altair charts of the probes, in one theme, sized to the book's content column: the builders
(``charts_probe``, ``charts_across``, sharing ``chart_parts``) and their rendering
(``render``), under one name. Every builder takes the long frames of ``study.Study`` (or what a
probe function returns, labelled with ``model=`` / ``task=``) and returns an Altair chart; a probe's
``Chart`` names its builder here."""

from __future__ import annotations

import altair as alt

from .chart_parts import (
    ANSWER_OUTLINE,
    DEGENERATE_NOTE,
    LENS_SCALE,
    METRIC_TITLES,
    NOTE_TITLE,
    QUANTIZED_NOTE,
    RULE_COLOURS,
    RULE_DOMAIN,
    RULE_ORDER,
    SOURCE_COLOURS,
    SUBLAYERS,
    SYMLOG_TICKS,
    as_plot_frame,
)
from .charts_across import (
    depth_score_bars,
    differences_against_margin,
    ed_against_scale,
    ed_by_task,
    paper_vs_ours,
    relative_depth_curves,
    specification_curve,
    threshold_sensitivity,
)
from .charts_probe import (
    attribution_heatmap,
    completeness_bars,
    contribution_bars,
    erasure_heatmap,
    lens_curves,
    metric_curves,
    output_effect_bars,
    skip_heatmap,
)
from .render import (
    CONTENT_WIDTH,
    FONT,
    PALETTE,
    THEME,
    ChartOutput,
    Note,
    chart_html,
    note,
    save,
    show,
    themed_spec,
    vegalite_mime,
)

__all__ = [
    "ANSWER_OUTLINE",
    "CONTENT_WIDTH",
    "DEGENERATE_NOTE",
    "FONT",
    "LENS_SCALE",
    "METRIC_TITLES",
    "NOTE_TITLE",
    "PALETTE",
    "QUANTIZED_NOTE",
    "RULE_COLOURS",
    "RULE_DOMAIN",
    "RULE_ORDER",
    "SOURCE_COLOURS",
    "SUBLAYERS",
    "SYMLOG_TICKS",
    "THEME",
    "ChartOutput",
    "Note",
    "alt",
    "as_plot_frame",
    "attribution_heatmap",
    "chart_html",
    "completeness_bars",
    "contribution_bars",
    "depth_score_bars",
    "differences_against_margin",
    "ed_against_scale",
    "ed_by_task",
    "erasure_heatmap",
    "lens_curves",
    "metric_curves",
    "note",
    "output_effect_bars",
    "paper_vs_ours",
    "relative_depth_curves",
    "save",
    "show",
    "skip_heatmap",
    "specification_curve",
    "themed_spec",
    "threshold_sensitivity",
    "vegalite_mime",
]
