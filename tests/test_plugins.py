"""A probe from another package (tests/plugin_probe.py, declared through a faked ``effdepth.probes``
entry point) appears everywhere a built-in one does: ``effdepth run --probes`` and ``--help`` with its
own flag, the cache key, ``effdepth table``, ``effdepth plot`` and the book's summary."""

from __future__ import annotations

import importlib.metadata
import json

import pytest

from effdepth_core.cli import main
from effdepth_core.errors import EffdepthError
from effdepth_core.measurement import registry
from effdepth_core.settings import RunSettings


@pytest.fixture
def plugin(monkeypatch):
    point = importlib.metadata.EntryPoint(name="resmax", value="plugin_probe:SPEC", group=registry.ENTRY_POINT_GROUP)
    real = importlib.metadata.entry_points

    def entry_points(**selection):
        if selection.get("group") == registry.ENTRY_POINT_GROUP:
            return importlib.metadata.EntryPoints([point])
        return real(**selection)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    registry.reload()
    yield
    monkeypatch.undo()
    registry.reload()


def test_a_plugin_probe_goes_through_run_table_plot_and_the_book(plugin, tiny_dir, tmp_path, capsys):
    assert "resmax" in registry.names()
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    help_text = capsys.readouterr().out
    assert "resmax" in help_text and "--max-fraction" in help_text
    assert RunSettings("m", "gsm8k", max_fraction=0.25).key() != RunSettings("m", "gsm8k").key()
    assert RunSettings("m", "gsm8k", max_fraction=0.5).key() == RunSettings("m", "gsm8k").key()
    out = tmp_path / "runs" / "resmax"
    argv = ["run", "--model", str(tiny_dir), "--task", "addition", "--n", "2", "--out", str(out), "--no-progress"]
    assert main([*argv, "--probes", "cosine,resmax", "--max-fraction", "0.25"]) == 0
    printed = capsys.readouterr().out
    assert "res max" in printed.splitlines()[0]  # its ED column in the end-of-run table
    summary = json.loads((out / "effective_depth.json").read_text())
    assert "resmax" in summary and summary["resmax"]["ed"] is not None
    assert json.loads((out / "metadata.json").read_text())["key_fields"]["max_fraction"] == 0.25
    assert main(["table", str(tmp_path / "runs")]) == 0
    assert "res max" in capsys.readouterr().out
    assert main(["plot", str(out), "--chart", "resmax", "--out", str(tmp_path / "resmax.svg")]) == 0
    assert (tmp_path / "resmax.svg").read_text().lstrip().startswith("<svg")
    from effdepth_book.study import RunRecord, Study
    from effdepth_core.results import run

    settings = RunSettings(str(tiny_dir), "addition", n=2, max_fraction=0.25, progress=False)
    record = RunRecord("tiny", "addition", settings, ["cosine", "resmax"], result=run(settings, "cosine,resmax", out))
    rows = Study([record]).summary()  # the book's summary of a run (read from the cache here)
    assert set(rows["rule"]) == {"cosine", "res max"}


def test_a_broken_plugin_is_left_out_with_a_warning(monkeypatch):
    point = importlib.metadata.EntryPoint(name="broken", value="no_such_module:SPEC", group=registry.ENTRY_POINT_GROUP)
    real = importlib.metadata.entry_points
    monkeypatch.setattr(
        importlib.metadata,
        "entry_points",
        lambda **s: (
            importlib.metadata.EntryPoints([point]) if s.get("group") == registry.ENTRY_POINT_GROUP else real(**s)
        ),
    )
    registry.reload()
    try:
        assert "broken" in registry.names()  # before loading: its name is valid
        with pytest.warns(UserWarning, match="the probe plugin 'broken'"):
            specs = registry.specs()
        assert "broken" not in specs and "cosine" in specs
        assert registry.names() == tuple(specs)  # once loaded, names and get agree
        with pytest.raises(EffdepthError, match=r"the probe plugin 'broken' was left out .*ModuleNotFoundError"):
            registry.get("broken")
    finally:
        monkeypatch.undo()
        registry.reload()
