"""``effdepth book --check`` covers every file a page reads: each page's digest holds its runs'
``metadata.json``, and every parquet, examples and summary file of those runs must match the sha256
its metadata recorded (or the page is stale). A parquet scaled by 1.01 or truncated to 50 bytes once
left every page "fresh"."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest

from effdepth_book.runner import _unrecorded_result

RUN = Path(__file__).resolve().parents[1] / "book" / "results" / "gemma3-270m" / "hellaswag-n80-seed0"


@pytest.fixture
def results(tmp_path) -> Path:
    if not (RUN / "metadata.json").is_file():
        pytest.skip("the committed book results are not in this checkout")
    shutil.copytree(RUN, tmp_path / "results" / "gemma3-270m" / RUN.name)
    return tmp_path / "results"


def _tamper(path: Path, how: str) -> None:
    if how == "scaled":
        frame = pl.read_parquet(path)
        floats = [c for c, t in frame.schema.items() if t.is_float()]
        frame.with_columns(pl.col(floats) * 1.01).write_parquet(path)
    elif how == "truncated":
        path.write_bytes(path.read_bytes()[:50])
    elif how == "added":
        shutil.copy(path, path.with_name("extra.parquet"))


def test_untouched_results_are_fresh(results):
    assert _unrecorded_result(results, {}) is None


@pytest.mark.parametrize("how", ["scaled", "truncated", "added"])
def test_a_tampered_parquet_stales_the_page(results, how):
    target = results / "gemma3-270m" / RUN.name / "logit_lens.parquet"
    _tamper(target, how)
    found = _unrecorded_result(results, {})
    assert found == (target.with_name("extra.parquet") if how == "added" else target)
