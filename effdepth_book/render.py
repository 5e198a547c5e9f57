"""Rendering of the book's charts: one theme sized to the content column, data inlined as typed CSV, and
``show``: notebook output every viewer can draw — the Vega-Lite spec under its version's mimetype (the
book draws it with its one offline copy of Vega, ``effdepth-vega.js``; JupyterLab and VS Code with
theirs) and static SVG and PNG (GitHub, nbviewer, anything without JavaScript). ``save`` writes any
chart as SVG or PNG for a paper. The chart builders are apart (``plots``)."""

from __future__ import annotations

import hashlib
import html
import itertools
import json

import altair as alt

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

CONTENT_WIDTH = 600  # px of plot area that fits the book's content column at 1400 px (legends below)
_counter = itertools.count()  # chart element ids, unique within a page


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


def save(chart: alt.TopLevelMixin, path, scale: float = 2.0, replace: bool = True) -> None:
    """Write ``chart`` in the book's theme as SVG or PNG (by ``path``'s suffix), with no network;
    with ``replace`` False the file is claimed at the moment it is written (``cache.atomic_write``)."""
    from pathlib import Path

    import vl_convert

    path = Path(path)
    spec = _fixed_width(themed_spec(chart))
    from effdepth_core.cache import atomic_write_bytes

    if path.suffix == ".svg":
        data = vl_convert.vegalite_to_svg(spec).encode("utf-8")
    elif path.suffix == ".png":
        data = vl_convert.vegalite_to_png(spec, scale=scale)
    else:
        raise ValueError(f"save charts as .svg or .png, not {path.suffix or 'no suffix'}")
    atomic_write_bytes(path, data, "no chart was written", replace)


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
