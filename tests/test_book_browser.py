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

ROOT = Path(__file__).resolve().parents[1]
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
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


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("book")
    build = subprocess.run(
        [
            str(Path(sys.executable).with_name("jupyter-book")),
            "build",
            str(ROOT / "book"),
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


def _pages(site: Path) -> list[Path]:
    return sorted(p for p in (site / "executed").rglob("*.html"))


def test_book_has_every_section(site: Path) -> None:
    sections = {p.parent.name for p in _pages(site)}
    assert sections == {"scale", "difficulty", "long_cot"}
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
