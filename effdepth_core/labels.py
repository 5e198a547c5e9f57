"""Formats shown to people, defined once: the "ED (ratio) [interval]" cell and its legend (probe
and rule names come from the probe registry). Import-light (no torch), so the command line starts fast."""

from __future__ import annotations

from collections.abc import Mapping

CELL_LEGEND = "each cell: ED (ratio (ED+1)/L) [95 % bootstrap interval of ED over prompts]"
DEPTH_LEGEND = (
    "each 'depth' cell: the rule's continuous statistic in layers (a lens rule's centroid, else its crossing "
    "between layers averaged over its thresholds; method.md §12) (ratio (depth+1)/L) [95 % bootstrap interval]"
)


def format_ed(ed: int | None, ratio: float | None, ci_low: int | None = None, ci_high: int | None = None) -> str:
    """``"20 (0.70) [16–20]"``: ED, its ratio with two decimals, and the bootstrap interval when known;
    ``"—"`` when the rule found no layer."""
    if ed is None or ratio is None:
        return "—"
    text = f"{ed} ({ratio:.2f})"
    if ci_low is not None and ci_high is not None:
        text += f" [{ci_low}–{ci_high}]"
    return text


def format_depth(entry: Mapping | None) -> str:
    """A rule's continuous statistic as a cell: ``"19.4 (0.68) [18.9–20.1]"`` (one decimal: it
    moves between layers), ``"—"`` where the summary has none."""
    if not entry or entry.get("depth") is None or entry.get("depth_ratio") is None:
        return "—"
    text = f"{entry['depth']:.1f} ({entry['depth_ratio']:.2f})"
    if entry.get("depth_low") is not None and entry.get("depth_high") is not None:
        text += f" [{entry['depth_low']:.1f}–{entry['depth_high']:.1f}]"
    return text


def format_rule(entry: Mapping | None) -> str:
    """One rule's entry of ``effective_depth.json`` as a cell (``undefined`` when ED is null)."""
    if not entry:
        return "—"
    if entry.get("ed") is None:
        return "undefined"
    return format_ed(entry["ed"], entry["ratio"], entry.get("ci_low"), entry.get("ci_high"))
