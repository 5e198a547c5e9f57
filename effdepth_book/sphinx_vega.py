"""Sphinx extension: ship Vega, Vega-Lite and Vega-Embed once per site, so that charts render
with no network; and the MyST-NB renderer that draws every Vega-Lite output with them.

It writes ``_static/effdepth-vega.js`` (the libraries bundled by ``vl-convert-python``, plus the
code that renders every chart container) and adds it to every page. Enable it in
``book/_config.yml``: ``sphinx: extra_extensions: [effdepth_book.sphinx_vega]``. The
renderer (``VegaLiteRenderer``, registered under MyST-NB's ``myst_nb.mime_renderers`` entry-point
group in pyproject.toml) turns a notebook's Vega-Lite output (any version) into a chart container
for the HTML book, ahead of the static SVG and PNG outputs the same cell carries for other viewers.
"""

from __future__ import annotations

from pathlib import Path

BUNDLE_NAME = "effdepth-vega.js"
# Runs after the libraries: renders charts queued before it loaded, and any pushed later.
_RENDERER = """
window.vegaEmbed = vegaEmbed; window.vega = vega; window.vegaLite = vegaLite;
window.addEventListener("error", function (event) {  // lets a headless browser test see script errors
  const root = document.documentElement;
  root.setAttribute("data-effdepth-errors", (root.getAttribute("data-effdepth-errors") || "") + event.message + "; ");
});
function effdepthRender(item) {
  const element = document.getElementById(item[0]);
  if (!element) { console.error("effdepth: no chart container " + item[0]); return; }
  vegaEmbed(element, item[1], {renderer: "svg", actions: {export: true, source: false, compiled: false, editor: false}})
    .then(function () {
      element.querySelectorAll(".effdepth-fallback").forEach(function (image) { image.remove(); });
      element.setAttribute("data-effdepth-rendered", "1");
    })
    .catch(function (error) {
      console.error("effdepth: chart " + item[0] + " failed: " + error);
      document.documentElement.setAttribute("data-effdepth-errors", "chart " + item[0] + ": " + error);
      element.textContent = "This chart could not be drawn: " + error;
    });
}
const effdepthQueued = window.effdepthCharts || [];
window.effdepthCharts = {push: effdepthRender};
function effdepthRenderQueued() { effdepthQueued.forEach(effdepthRender); }
if (document.readyState === "loading") {
  document.addEventListener("DOMContentLoaded", effdepthRenderQueued);
} else {
  effdepthRenderQueued();
}
"""


VEGALITE_MIMES = tuple(f"application/vnd.vegalite.v{major}+json" for major in (4, 5, 6))


class VegaLiteRenderer:
    """MyST-NB mime renderer: a Vega-Lite output becomes the book's chart container (HTML builds);
    other builders keep the cell's static SVG or PNG."""

    mime_priority_overrides = tuple(("html", mime, 1) for mime in VEGALITE_MIMES)

    @staticmethod
    def handle_mime(renderer, data, inline):
        if inline or data.mime_type not in VEGALITE_MIMES:
            return None
        import hashlib
        import json

        from docutils import nodes

        from .plots import chart_html

        spec = data.content if isinstance(data.content, dict) else json.loads(data.content)
        text = json.dumps(spec, sort_keys=True)
        element_id = (
            f"effdepth-chart-{hashlib.sha1(text.encode()).hexdigest()[:10]}-{data.cell_index}-{data.output_index}"
        )
        return [nodes.raw("", chart_html(spec, element_id), format="html", classes=["output", "effdepth-vegalite"])]


def bundle() -> str:
    """The JavaScript of ``effdepth-vega.js`` (Vega-Lite version matched to Altair's)."""
    import altair as alt
    import vl_convert

    version = ".".join(alt.SCHEMA_VERSION.lstrip("v").split(".")[:2])
    if version not in vl_convert.get_vegalite_versions():
        version = None  # vl-convert's newest; Vega-Lite reads older specs
    code = vl_convert.javascript_bundle(_RENDERER, vl_version=version)
    # its top-level names (`_`, `n`, …) would clash with other scripts' globals: give it a scope
    return "(function () {\n" + code + "\n})();\n"


def _write_bundle(app, exception) -> None:
    if exception is not None or app.builder.format != "html":
        return
    static = Path(app.outdir) / "_static"
    static.mkdir(parents=True, exist_ok=True)
    from effdepth_core.cache import atomic_write_bytes

    atomic_write_bytes(static / BUNDLE_NAME, bundle().encode("utf-8"), "the rest of the build is intact")


def _dedupe_scripts(app, pagename, templatename, context, doctree) -> None:
    """Drop repeated inline scripts: Jupyter Book 1 registers sphinx-thebe's and togglebutton's
    twice, and a second ``const THEBE_JS_URL`` is a script error on every page."""
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for script in scripts:
        name = getattr(script, "filename", script) or ""  # None and "" both mean an inline script
        key = (str(name), repr(sorted(getattr(script, "attributes", {}).items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def setup(app) -> dict:
    app.add_js_file(BUNDLE_NAME)
    app.connect("build-finished", _write_bundle)
    app.connect("html-page-context", _dedupe_scripts, priority=900)  # after the extensions that add them
    return {"parallel_read_safe": True, "parallel_write_safe": True}
