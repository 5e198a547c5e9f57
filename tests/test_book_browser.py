"""The built book in a real browser: every chart container holds a drawn chart, no page logs a
script error, and nothing is fetched from the network (Vega is shipped with the site).

Builds the book from the executed notebooks into a temporary directory (seconds), then opens each
page in headless Chromium (Debian's ``chromium``). CI installs Chromium and sets
EFFDEPTH_REQUIRE_BROWSER=1, so there a missing browser fails instead of skipping.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# a browser per page and a papermill rerun: minutes; CI runs them once, at the locked versions
pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")  # Debian's, or GitHub's Chrome
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--allow-file-access-from-files",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # any network fetch fails, and shows as an error
    "--enable-logging=stderr",
    "--v=0",
    "--virtual-time-budget=20000",
    "--dump-dom",
]


def _browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    message = "no Chromium on PATH (apt install chromium); the browser test needs it"
    if os.environ.get("EFFDEPTH_REQUIRE_BROWSER") == "1":
        pytest.fail(message)
    pytest.skip(message)


def _build(book: Path, out: Path) -> Path:
    build = subprocess.run(
        [
            str(Path(sys.executable).with_name("jupyter-book")),
            "build",
            str(book),
            "--path-output",
            str(out),
            "-W",
            "-q",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if build.returncode:
        pytest.fail(f"jupyter-book build failed:\n{build.stdout[-3000:]}\n{build.stderr[-3000:]}")
    return out / "_build" / "html"


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The book as the working tree has it (in CI: with the quick profile's pages)."""
    return _build(ROOT / "book", tmp_path_factory.mktemp("book"))


@pytest.fixture(scope="module")
def published_site(tmp_path_factory) -> Path:
    """The book as published: the committed full-profile pages (git HEAD), whatever the working
    tree holds (CI's quick profile re-executes some pages with one model and tiny n)."""
    copy = tmp_path_factory.mktemp("published")
    shutil.copytree(ROOT / "book", copy / "book", symlinks=False, ignore=shutil.ignore_patterns("_build"))
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "HEAD", "book/executed", "book/_findings.md"], capture_output=True
    )
    if archive.returncode:
        pytest.fail(f"cannot read the committed pages from git: {archive.stderr.decode()[-500:]}")
    subprocess.run(["tar", "-x", "-C", str(copy)], input=archive.stdout, check=True)
    return _build(copy / "book", copy / "out")


def _pages(site: Path) -> list[Path]:
    return sorted(p for p in (site / "executed").rglob("*.html"))


def test_book_has_every_section(site: Path) -> None:
    from effdepth_book.sections import names

    sections = {p.parent.name for p in _pages(site)}
    assert sections == set(names())  # the registry's sections, each with at least one page
    assert (site / "_static" / "effdepth-vega.js").stat().st_size > 500_000  # Vega is shipped, not linked


def test_every_chart_renders_offline(site: Path, tmp_path: Path) -> None:
    browser = _browser()
    pages = _pages(site)
    charts_seen = 0
    for index, page in enumerate(pages):
        profile = tmp_path / f"profile-{index}"  # a fresh user-data-dir per page
        done = subprocess.run(
            [browser, *FLAGS, f"--user-data-dir={profile}", page.as_uri()],
            capture_output=True,
            text=True,
            timeout=180,
        )
        dom, log = done.stdout, done.stderr
        name = page.relative_to(site)
        assert done.returncode == 0, f"{name}: chromium exited {done.returncode}: {log[-2000:]}"
        expected = re.findall(r'class="effdepth-chart" id="([^"]+)"', page.read_text())
        for chart_id in expected:  # vega-embed adds classes to the container, so find it by id
            start = dom.find(f'id="{chart_id}"')
            assert start >= 0, f"{name}: chart container {chart_id} missing from the DOM"
            inner = dom[start : dom.find("<script", start)]
            assert "<svg" in inner or "<canvas" in inner, f"{name}: chart {chart_id} did not render"
            assert 'data-effdepth-rendered="1"' in inner, f"{name}: chart {chart_id} did not finish"
        charts_seen += len(expected)
        errors = [
            line
            for line in log.splitlines()
            if "CONSOLE" in line and re.search(r"Uncaught|Error|error|failed|effdepth:", line)
        ]
        assert not errors, f"{name}: script errors:\n" + "\n".join(errors[:10])
        assert "data-effdepth-errors" not in dom, f"{name}: the page recorded a script error"
    assert charts_seen >= 10, f"only {charts_seen} charts in the whole book"


# --- interaction and layout, checked inside the page ---------------------------------------
# A script injected into a copy of a page waits until every chart is drawn, then records, as JSON
# on <html data-effdepth-check>: each chart's drawn width against its output area's width; for
# each chart with a model dropdown, the number of drawn marks before and after picking another
# model; and how many marks carry the answer-token outline colour.
CHECK_JS = """
(function () {
  function marks(chart) { return chart.querySelectorAll("svg g.role-mark path, svg g.role-mark line").length; }
  function report(result) { document.documentElement.setAttribute("data-effdepth-check", JSON.stringify(result)); }
  async function check() {
    const result = {widths: [], picks: [], outlines: [], degenerate: []};
    for (const chart of document.querySelectorAll(".effdepth-chart")) {
      const svg = chart.querySelector("svg");
      for (const mark of svg.querySelectorAll('[aria-label*="degenerate:"]')) {  // a degenerate ED's point
        result.degenerate.push([chart.id, mark.getAttribute("aria-label"), mark.getAttribute("fill-opacity")]);
      }
      const area = chart.closest(".cell_output") || chart.parentElement;
      result.widths.push([chart.id, svg.getBoundingClientRect().width, area.getBoundingClientRect().width]);
      result.outlines.push([chart.id, svg.querySelectorAll('[stroke="#111111"]').length]);
      const select = chart.querySelector('select[name="pick_model"]');
      if (select && select.options.length > 1) {
        const before = marks(chart);
        select.value = select.options[select.options.length - 1].value;
        select.dispatchEvent(new Event("change", {bubbles: true}));
        select.dispatchEvent(new Event("input", {bubbles: true}));
        await new Promise(function (r) { setTimeout(r, 1500); });
        result.picks.push([chart.id, before, marks(chart)]);
      }
    }
    for (const table of document.querySelectorAll("table.gt_table")) {  // great_tables' tables
      const area = table.closest(".cell_output") || table.parentElement;
      result.widths.push(["table " + (table.closest("div[id]") || {}).id, table.getBoundingClientRect().width,
                          area.getBoundingClientRect().width]);
    }
    result.page = [document.documentElement.scrollWidth, window.innerWidth];  // a horizontal scroll bar?
    report(result);
  }
  function wait(tries) {
    const charts = Array.from(document.querySelectorAll(".effdepth-chart"));
    if (charts.every(function (c) { return c.getAttribute("data-effdepth-rendered") === "1"; })) {
      check();
    } else if (tries > 0) {
      setTimeout(function () { wait(tries - 1); }, 250);
    } else {
      report({error: "charts did not render"});
    }
  }
  window.addEventListener("load", function () { wait(80); });
})();
"""


def _checked(site: Path, page: str, tmp_path: Path) -> dict:
    import json

    original = site / f"{page}.html" if page == "intro" else site / "executed" / f"{page}.html"
    copy = original.with_name(f"{original.stem}-checked.html")
    (site / "_static" / "effdepth-check.js").write_text(CHECK_JS)
    static = "_static" if page == "intro" else "../../_static"
    html = original.read_text().replace("</body>", f'<script src="{static}/effdepth-check.js"></script></body>')
    copy.write_text(html)
    done = subprocess.run(
        [
            _browser(),
            *FLAGS,
            "--window-size=1400,1000",
            f"--user-data-dir={tmp_path / page.replace('/', '-')}",
            copy.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    found = re.search(r'data-effdepth-check="([^"]*)"', done.stdout)
    assert found, f"{page}: the check script did not report: {done.stderr[-1500:]}"
    return json.loads(found.group(1).replace("&quot;", '"'))


def test_charts_fit_the_column_dropdowns_filter_and_answer_tokens_are_outlined(
    published_site: Path, tmp_path: Path
) -> None:
    site = published_site
    import polars as pl

    comparison = _checked(site, "scale/comparison", tmp_path)
    assert "error" not in comparison, comparison
    for chart, drawn, area in comparison["widths"]:
        assert drawn <= area + 1, f"comparison: chart {chart} is {drawn:.0f} px wide in a {area:.0f} px column"
    assert comparison["picks"], "the comparison page has charts with a model dropdown"
    # degenerate EDs (method.md §10) are drawn, hollow, and say why to a screen reader
    assert comparison["degenerate"], "the comparison page draws no degenerate ED (its data has some)"
    for chart, label, opacity in comparison["degenerate"]:
        assert opacity == "0", f"comparison: chart {chart}'s degenerate point {label!r} is filled ({opacity})"
    for chart, before, after in comparison["picks"]:
        assert before != after, f"comparison: picking another model left chart {chart} with {before} marks"
    smollm2 = _checked(site, "scale/smollm2-135m", tmp_path)
    for chart, drawn, area in smollm2["widths"]:
        assert drawn <= area + 1, f"smollm2: {chart} is {drawn:.0f} px wide in a {area:.0f} px column"
    for page in ("beyond/smollm2-135m", "beyond/map"):  # the fourth section's charts fit too
        checked = _checked(site, page, tmp_path)
        assert "error" not in checked, checked
        for chart, drawn, area in checked["widths"]:
            assert drawn <= area + 1, f"{page}: {chart} is {drawn:.0f} px wide in a {area:.0f} px column"
    # no page scrolls sideways at 1,400 px: the intro's table of verdicts, the specification tables
    for page in ("intro", "difficulty/across-models", "scale/comparison"):
        checked = _checked(site, page, tmp_path)
        assert "error" not in checked, checked
        scrolled, window = checked["page"]
        assert scrolled <= window, f"{page}: {scrolled} px of content in a {window} px window (it scrolls sideways)"
        for what, drawn, area in checked["widths"]:
            assert drawn <= area + 1, f"{page}: {what} is {drawn:.0f} px wide in a {area:.0f} px column"
    # the erasure heatmap shows the first prompt: each answer token is outlined once per layer 0..L
    erasure = pl.read_parquet(ROOT / "book/results/smollm2-135m/addition-n2-seed0-digits6/erasure_by_example.parquet")
    first = erasure.filter(example=0)
    expected = first.filter(pl.col("is_answer")).height
    outlined = [count for _, count in smollm2["outlines"] if count]
    assert outlined == [expected], f"answer-token outlines {outlined}, expected [{expected}] (answer tokens × layers)"


def test_the_guides_papermill_command_reruns_a_page_from_the_committed_cache(tmp_path: Path) -> None:
    import nbformat

    guide = (ROOT / "book" / "using" / "book.md").read_text()
    block = guide.split("<!-- papermill-command -->", 1)[1].split("```bash", 1)[1].split("```", 1)[0].strip()
    command = block.replace("smollm2-scale.", f"{tmp_path}/smollm2-scale.")  # outputs outside the checkout
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-c", command.replace(".venv/bin/", f"{bin_dir}/")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    notebook = nbformat.read(tmp_path / "smollm2-scale.ipynb", as_version=4)
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("Model scale: smollm2-135m" in json_text for json_text in map(str, outputs))  # the rendered title
