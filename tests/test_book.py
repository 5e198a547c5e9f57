"""The book's machinery: parameter sets, the generated table of contents, templates, study grids,
the paper's reference table, and the chart specs."""

from __future__ import annotations

import base64
import csv
import io
import json
import math
from pathlib import Path

import nbformat
import polars as pl
import pytest

from effdepth_book import plots, reference
from effdepth_book.runner import parameter_sets, toc_text
from effdepth_book.sections import names as section_names
from effdepth_book.study import (
    difficulty_specs,
    difficulty_trend,
    expand_levels,
    run_study,
    task_label,
    task_settings,
)
from effdepth_core.errors import EffdepthError
from effdepth_core.results import RunSettings, run

ROOT = Path(__file__).resolve().parents[1]


def _write(root: Path, name: str, text: str) -> None:
    (root / "params").mkdir(exist_ok=True)
    (root / "params" / name).write_text(text)


def test_parameter_sets_merge_common_section_and_set(tmp_path):
    _write(tmp_path, "common.yml", "profiles:\n  full: {seed: 1, dtype: float32, results_dir: r}\n  quick: {seed: 2}\n")
    _write(
        tmp_path,
        "scale.yml",
        "title: Scale\nprofiles:\n  full:\n    defaults: {dtype: bfloat16, device: cpu}\n"
        "    sets:\n      - {name: a, models: [m1]}\n"
        "      - {name: b.c, models: [m2], dtype: float16, title: Custom}\n",
    )
    first, second = parameter_sets(tmp_path, "scale", "full")
    assert first.parameters == {
        "seed": 1,
        "dtype": "bfloat16",
        "results_dir": "r",
        "device": "cpu",
        "models": ["m1"],
        "profile": "full",
        "title": "Scale: a",
    }
    assert second.parameters["dtype"] == "float16" and second.title == "Custom" and second.parameters["seed"] == 1
    assert second.page == "executed/scale/b_c"  # no dot in a page name
    with pytest.raises(EffdepthError, match="no profile 'quick'"):
        parameter_sets(tmp_path, "scale", "quick")
    with pytest.raises(EffdepthError, match="unknown section"):
        parameter_sets(tmp_path, "nope")
    _write(
        tmp_path,
        "scale.yml",
        "profiles:\n  full:\n    defaults: {tasks: [{task: t0}], causal: {task: c0}}\n    sets:\n"
        "      - {name: a, models: [m1], tasks: [{task: t1}]}\n"
        "      - {name: b, models: [m2, m3], causal: {task: c2}}\n"
        "      - {name: all, models: all}\n",
    )
    gathered = parameter_sets(tmp_path, "scale", "full")[-1].parameters
    assert gathered["models"] == ["m1", "m2", "m3"]
    t0, t1, c0, c2 = ({"task": t} for t in ("t0", "t1", "c0", "c2"))
    assert gathered["tasks_by_model"] == {"m1": [t1], "m2": [t0], "m3": [t0]}
    assert gathered["causal_by_model"] == {"m1": [c0], "m2": [c2], "m3": [c2]}
    _write(tmp_path, "difficulty.yml", "profiles:\n  full:\n    sets:\n      - {models: [m]}\n")
    with pytest.raises(EffdepthError, match="needs a name"):
        parameter_sets(tmp_path, "difficulty", "full")


def test_toc_is_generated_from_params():
    """The committed _toc.yml is exactly what params/ generates (run `effdepth book --toc-only`)."""
    assert (ROOT / "_toc.yml").read_text() == toc_text(ROOT)
    assert (ROOT / "book" / "_toc.yml").resolve() == (ROOT / "_toc.yml").resolve()


@pytest.mark.parametrize("section", section_names())
def test_templates_are_clean_and_take_every_parameter(section):
    notebook = nbformat.read(ROOT / "book" / "templates" / f"{section}.ipynb", as_version=4)
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), "templates carry no outputs"
    ids = [c.get("id") for c in notebook.cells]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    assert not twice, f'cells {twice} share an id (a copied cell keeps its id: delete the copy\'s "id" field)'
    assert f'pages.open_page("{section}"' in "".join(c.source for c in code)  # the template names its section
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    namespace: dict = {}
    exec(tagged[0].source, namespace)  # the defaults must be valid Python
    for profile in ("quick", "full"):
        for item in parameter_sets(ROOT, section, profile):
            unknown = set(item.parameters) - set(namespace)
            assert not unknown, f"{section}/{item.name} ({profile}) passes {unknown}, not in the template"
    # the title is rendered from the `title` parameter (glued for the book), never a literal placeholder
    heading = next(c for c in notebook.cells if c.cell_type == "markdown")
    assert heading.source.startswith("# {glue:text}`page_title`")
    assert any("pages.heading(title)" in c.source for c in code)  # the shared title cell, one function
    assert not any("{title}" in c.source for c in notebook.cells if c.cell_type == "markdown")
    # every other code cell is a library call: one line, no control flow, no logic of its own
    for cell in code:
        if cell is tagged[0] or "pages.heading(title)" in cell.source:
            continue
        lines = [line for line in cell.source.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("page."), cell.source


def test_task_specs():
    assert task_label({"task": "math", "level": 3}) == "MATH level 3"
    assert task_label({"task": "addition", "digits": 4}) == "addition 4 digits"
    assert task_label({"task": "gsm8k", "label": "GSM"}) == "GSM"
    settings = task_settings("m", {"task": "math", "level": 2, "n": 3}, {"seed": 4, "n": 10})
    assert (settings.model, settings.task, settings.level, settings.n, settings.seed) == ("m", "math", 2, 3, 4)
    with pytest.raises(EffdepthError, match="unknown task-spec key"):
        task_settings("m", {"task": "gsm8k", "levle": 2})
    assert expand_levels({"task": "math", "levels": [1, 2], "n": 3}, "levels", "level") == [
        {"task": "math", "n": 3, "level": 1},
        {"task": "math", "n": 3, "level": 2},
    ]
    specs = difficulty_specs({"levels": [1], "n": 2}, {"task": "addition", "digits": [2, 3]}, {"skip_parts": "layer"})
    assert [task_label(s) for s in specs] == ["MATH level 1", "addition 2 digits", "addition 3 digits"]
    assert all(s["probes"] == ["cosine", "logit_lens", "skip"] and s["skip_parts"] == "layer" for s in specs)


def test_difficulty_trend_spearman_by_hand():
    frame = pl.DataFrame(
        {
            "model": ["a"] * 3 + ["b"] * 3 + ["c"] * 2 + ["d"] * 3,
            "task": ["easy", "mid", "hard", "easy", "mid", "hard", "easy", "hard", "easy", "mid", "hard"],
            "value": [0.1, 0.5, 0.9, 0.9, 0.2, 0.1, 0.3, 0.4, 0.7, 0.7, 0.7],
        }
    )
    trend = {r["model"]: r for r in difficulty_trend(frame, ["easy", "mid", "hard"], "value").iter_rows(named=True)}
    assert trend["a"]["spearman"] == pytest.approx(1.0)
    assert trend["b"]["spearman"] == pytest.approx(-1.0)
    assert trend["c"]["spearman"] is None and trend["c"]["levels"] == 2  # too few levels to say
    assert trend["d"]["spearman"] is None  # constant: no ranking


def test_paper_table_matches_spec():
    table = reference.paper_table1()
    assert table.height == 12 * 9
    spec = (ROOT.parent / "shared" / "docs" / "SPEC.md") if (ROOT.parent / "shared").is_dir() else None
    row = table.filter(model="Qwen2.5-32B", rule="lens KL", task="aime24").row(0, named=True)
    assert (row["ed"], row["n_layers"]) == (59, 64) and row["ratio"] == pytest.approx(60 / 64)
    row = table.filter(model="DeepSeek-R1-Distill-Qwen-1.5B", rule="lens KL", task="gsm8k").row(0, named=True)
    assert row["ed"] == 1  # the paper's outlier, kept as published
    if spec is not None:  # every "ED .ratio" cell of SPEC's table, parsed independently
        for line in spec.read_text().splitlines():
            if not line.startswith("| ") or "(" not in line or line.startswith("| model"):
                continue
            cells = [c.strip() for c in line.strip("|").split("|")]
            name, _ = cells[0].split(" (")
            name = name.replace("DS-R1-Qwen", "DeepSeek-R1-Distill-Qwen")
            ours = table.filter(model=name).sort("rule", "task")
            expected = {}
            for i, cell in enumerate(cells[1:]):
                rule, task = reference.RULES[i // 3], reference.TASKS[i % 3]
                ed, ratio = cell.split()
                expected[(rule, task)] = (int(ed), float(ratio))
            for r in ours.iter_rows(named=True):
                ed, ratio = expected[(r["rule"], r["task"])]
                assert r["ed"] == ed and round(r["ratio"], 2) == pytest.approx(ratio, abs=0.006)


def test_pair_deltas_by_hand():
    table = reference.paper_table1()
    pairs = [{"base": "Qwen/Qwen2.5-Math-1.5B", "long_cot": "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"}]
    deltas = reference.pair_deltas(table, pairs)
    assert deltas.height == 9
    kl = deltas.filter(rule="lens KL", task="gsm8k").row(0, named=True)
    assert (kl["ed_base"], kl["ed_long_cot"], kl["delta"]) == (22, 1, -21)
    assert reference.pair_deltas(table, [{"base": "x/none", "long_cot": "y/none"}]).height == 0


def test_chart_data_is_typed_csv_that_reads_back():
    frame = pl.DataFrame({"layer": [0, 1, 2], "task": ["a,b", 'q"x', None], "value": [0.5, None, -1.25]})
    chart = plots.alt.Chart(frame).mark_point().encode(x="layer:Q", y="value:Q", color="task:N")
    spec = plots.themed_spec(chart)
    ((name, text),) = spec["datasets"].items()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["task"] for r in rows] == ["a,b", 'q"x', ""]
    assert [r["value"] for r in rows] == ["0.5", "", "-1.25"]
    assert spec["data"] == {
        "name": name,
        "format": {"type": "csv", "parse": {"layer": "number", "task": "string", "value": "number"}},
    }
    assert spec["config"]["font"] == plots.FONT
    html = plots.chart_html(spec, "effdepth-chart-test")
    assert "</script" not in html.split("<script", 1)[1].split("</script>")[0]  # no early end tag
    payload = html.split(".push([", 1)[1].rsplit("]);", 1)[0]
    element_id, spec_text = payload.split(",", 1)
    assert json.loads(spec_text) == spec and element_id.strip('"') == "effdepth-chart-test"
    bundle = plots.show(chart)._repr_mimebundle_()
    version = spec["$schema"].rsplit("/v", 1)[1].split(".")[0]
    assert f"application/vnd.vegalite.v{version}+json" in bundle  # the mimetype of the spec's own version
    assert (
        bundle["image/svg+xml"].lstrip().startswith("<svg") and base64.b64decode(bundle["image/png"])[:4] == b"\x89PNG"
    )
    assert bundle["text/plain"].startswith("chart")  # never an object dump


def _curves() -> pl.DataFrame:
    rows = []
    for model, n_layers in (("m1", 4), ("m2", 6)):
        for task in ("gsm8k", "aime24"):
            for layer in range(n_layers):
                for metric in ("cos_attn", "cos_mlp", "cos_layer", "rel_attn", "rel_mlp", "rel_layer", "kl", "overlap"):
                    rows.append((model, task, n_layers, layer, metric, math.sin(layer + len(metric))))
    frame = pl.DataFrame(rows, schema=["model", "task", "n_layers", "layer", "metric", "value"], orient="row")
    return frame.with_columns((pl.col("layer") / pl.col("n_layers")).alias("rel_depth"))


def test_chart_builders_make_valid_specs_with_pickers():
    curves = _curves()
    summary = pl.DataFrame(
        {
            "model": ["m1", "m2"],
            "task": ["gsm8k"] * 2,
            "rule": ["lens KL"] * 2,
            "ed": [2, 4],
            "ratio": [0.75, 5 / 6],
            "ratio_low": [0.5, 0.5],
            "ratio_high": [1.0, 1.0],
            "ci_low": [1, 2],
            "ci_high": [3, 5],
            "n_layers": [4, 6],
            "n_params": [10**6, 3 * 10**6],
            "n_examples": [2, 2],
        }
    )
    specs = {
        "bars": plots.themed_spec(
            plots.contribution_bars(
                curves.filter(pl.col("metric").str.starts_with("cos") | pl.col("metric").str.starts_with("rel"))
            )
        ),
        "lens": plots.themed_spec(plots.lens_curves(curves.filter(pl.col("metric").is_in(["kl", "overlap"])), summary)),
        "scale": plots.themed_spec(plots.ed_against_scale(summary, "n_params")),
        "relative": plots.themed_spec(plots.relative_depth_curves(curves, ["cos_layer", "kl"])),
        "by_task": plots.themed_spec(plots.ed_by_task(summary, ["gsm8k"])),
    }
    text = json.dumps(specs["bars"])
    assert '"pick_model"' in text and '"pick_task"' in text  # two models and two tasks: two dropdowns
    assert '"pick_model"' in json.dumps(specs["lens"]) and '"pick_task"' in json.dumps(specs["relative"])
    for spec in specs.values():
        assert spec["$schema"].startswith("https://vega.github.io/schema/vega-lite/v")
        assert all(isinstance(v, str) for v in spec["datasets"].values())  # data inline, as CSV


def test_run_study_reads_the_cache_and_reports_unloadable_models(tiny_dir, tmp_path, monkeypatch):
    spec = {"task": "addition", "digits": 2, "n": 2}
    defaults = {"seed": 0, "progress": False}
    first = run_study([str(tiny_dir)], [spec], defaults=defaults, results_dir=tmp_path, n_bootstrap=50)
    direct = run(
        RunSettings(model=str(tiny_dir), task="addition", digits=2, n=2, progress=False, head_dtype="float32"),
        out_dir=first.records[0].result.out_dir,  # the book's run (its lens pinned to float32), read directly
        n_bootstrap=50,
    )
    summary = first.summary()
    for rule, label in (("cosine", "cosine"), ("logit_lens_kl", "lens KL"), ("logit_lens_overlap", "lens overlap")):
        row = summary.filter(rule=label).row(0, named=True)
        assert row["ed"] == direct.summary[rule]["ed"] and row["task"] == "addition 2 digits"
    import effdepth_book.study as study_module

    def no_loading(*args, **kwargs):
        raise AssertionError("a cached study must not load the model")

    monkeypatch.setattr(study_module, "load_model", no_loading)
    again = run_study([str(tiny_dir)], [spec], defaults=defaults, results_dir=tmp_path, n_bootstrap=50)
    assert again.summary().equals(summary)
    # read only: a cell not computed yet, before a cached one of the same model, leaves that one read
    absent = {"task": "addition", "digits": 3, "n": 2}
    partly = run_study(
        [str(tiny_dir)], [absent, spec], defaults=defaults, results_dir=tmp_path, n_bootstrap=50, cached_only=True
    )
    assert "not computed yet" in partly.records[0].error and partly.records[1].result is not None
    assert partly.summary().equals(summary)
    frame = again.frame("cosine")
    assert set(frame["model"]) == {str(tiny_dir)} and frame["rel_depth"].max() <= 1.0
    monkeypatch.undo()
    skipped = run_study(["some-org/not-a-model"], [spec], defaults=defaults, results_dir=tmp_path, download=False)
    assert "not downloaded" in skipped.unavailable()["some-org/not-a-model"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    missing = run_study(["some-org/not-a-model"], [spec], defaults=defaults, results_dir=tmp_path)
    assert "some-org/not-a-model" in missing.unavailable() and missing.summary().height == 0
    assert not (tmp_path / "some-org_not-a-model").exists()  # a run that cannot load leaves nothing


def test_a_cached_only_study_says_why_a_hub_model_is_missing(tmp_path, monkeypatch):
    """The intro's findings read the cache only: a hub model that is not downloaded is named as such,
    with a precision rule or without one, and a missing run of an offline model as not computed."""
    from effdepth_book import study

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    specs = [{"task": "gsm8k", "precision": {"n_min": 20, "n_max": 40}}, {"task": "hellaswag", "n": 2}]
    hub = study.run_study(["example-org/not-downloaded-model"], specs, results_dir=tmp_path, cached_only=True)
    assert [r.error for r in hub.records] == ["a hub model that is not downloaded here (needs internet)"] * 2
    local = study.run_study(["smollm2-135m"], specs, results_dir=tmp_path, cached_only=True)
    assert all(r.error.startswith("not computed yet") for r in local.records)


def _copied_packages(tmp_path, monkeypatch) -> dict[str, Path]:
    """Both packages copied, and the page digest reading the copies (edited by the test, not the checkout)."""
    import shutil

    from effdepth_book import freshness

    copies = {name: tmp_path / name for name in freshness.PACKAGES}
    for name, root in freshness.PACKAGES.items():
        shutil.copytree(root, copies[name], ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(freshness, "PACKAGES", copies)
    return copies


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path.name}: {old!r}"
    path.write_text(text.replace(old, new, 1))


def test_a_page_is_stale_only_when_code_it_runs_changes(tmp_path, monkeypatch):
    """The page digest follows what the template's cells call, definition by definition: editing a
    module no page runs, a definition no page reaches (a new function in errors.py or depth.py), a
    probe's module (it counts by its revision), adding a probe or adding a section leaves every page
    fresh; editing a function a page calls (the statistics, the sections' functions) stales it."""
    from effdepth_book import runner

    copies = _copied_packages(tmp_path, monkeypatch)
    package = copies["effdepth_core"]
    item = parameter_sets(ROOT, "scale", "full")[0]
    fresh = runner.page_inputs(ROOT, item)
    (package / "cli.py").write_text((package / "cli.py").read_text() + "\n\ndef unrelated():\n    return 1\n")
    probes = package / "measurement" / "probes"
    (probes / "norm.py").write_text((probes / "norm.py").read_text() + "\n# same revision\n")
    (probes / "mine.py").write_text("SPEC = None  # a new probe's module\n")
    registry = package / "measurement" / "registry.py"
    registry.write_text(registry.read_text() + "\n# its registry line\n")
    sections = copies["effdepth_book"] / "sections" / "registry.py"  # a new section's registry line
    sections.write_text(sections.read_text().replace("}\n", '    "mine": "effdepth_book.sections.mine",\n}\n'))
    assert "mine" in sections.read_text()
    assert runner.page_inputs(ROOT, item) == fresh
    _edit(package / "measurement" / "depth.py", "def primary_statistic(", "def primary_statistic(  # changed\n    ")
    assert runner.page_inputs(ROOT, item) != fresh
    names = [name for name, _ in runner.page_code(ROOT / "book" / "templates" / "scale.ipynb")]
    modules = {name.split("::")[0] for name in names}
    assert "effdepth_core/measurement/depth.py::primary_statistic" in names and "effdepth_book/findings.py" in modules
    # the section's spec module, which the registry imports by name, and what only it calls
    assert {"effdepth_book/sections/scale/__init__.py", "effdepth_book/evidence.py"} <= modules
    assert "effdepth_book/sections/beyond/__init__.py" not in modules
    assert "effdepth_core/cli.py" not in modules and "effdepth_core/measurement/probes/cosine.py" not in modules
    assert "probe:cosine" in names
    stale = runner.page_inputs(ROOT, item)
    (copies["effdepth_book"] / "grid.py").write_text((copies["effdepth_book"] / "grid.py").read_text() + "\n# grid\n")
    findings = copies["effdepth_book"] / "findings.py"
    _edit(findings, "\ndef ", "\ndef _a_new_helper():\n    return 1\n\n\ndef ")
    assert runner.page_inputs(ROOT, item) == stale  # grid.py (no page runs it), a definition nothing calls
    assert "effdepth_book/findings.py::_deciding" in names
    _edit(findings, "def _deciding(", "def _deciding(  # changed\n    ")
    assert runner.page_inputs(ROOT, item) != stale  # the book's own modules count as the core's do
    stale = runner.page_inputs(ROOT, item)
    init = copies["effdepth_book"] / "sections" / "__init__.py"  # get(), plans(): what a page runs
    _edit(init, "def get(", "def get(  # changed\n    ")
    assert runner.page_inputs(ROOT, item) != stale


def test_a_run_still_being_computed_is_in_no_pages_digest(tmp_path):
    """A page reads finished runs only, so its digest holds those only: a run between two probes (the
    grid computing it, a clean clone without it) leaves the page fresh; finishing it stales the page;
    the map's run, which has no ED summary, counts once nothing is pending."""
    import dataclasses
    import shutil

    from effdepth_book import runner

    (tmp_path / "book" / "templates").mkdir(parents=True)
    shutil.copy(ROOT / "book" / "templates" / "scale.ipynb", tmp_path / "book" / "templates")
    item = parameter_sets(ROOT, "scale", "full")[0]
    item = dataclasses.replace(item, parameters={**item.parameters, "results_dir": "results"})
    finished = ROOT / "book" / "results" / "smollm2-135m" / "addition-n100-seed0-digits2"
    shutil.copytree(finished, tmp_path / "results" / "a" / "one")
    fresh = runner.page_inputs(tmp_path, item)
    under_way = tmp_path / "results" / "a" / "two"
    shutil.copytree(finished, under_way)
    metadata = json.loads((finished / "metadata.json").read_text())
    between = {**metadata, "files": {k: v for k, v in metadata["files"].items() if k != "effective_depth.json"}}
    between["probes"] = {"cosine": metadata["probes"]["cosine"]}  # the lens not yet computed
    (under_way / "effective_depth.json").unlink()
    (under_way / "metadata.json").write_text(json.dumps(between))
    assert runner.page_inputs(tmp_path, item) == fresh
    (under_way / "metadata.json").write_text(json.dumps({**metadata, "pending": {"logit_lens": ["x.parquet"]}}))
    assert runner.page_inputs(tmp_path, item) == fresh  # its last probe's files written, not yet recorded
    (under_way / "metadata.json").write_text(json.dumps(metadata))
    shutil.copy(finished / "effective_depth.json", under_way)
    done = runner.page_inputs(tmp_path, item)
    assert done != fresh
    (under_way / "metadata.json").write_text(json.dumps({**between, "probes": {"map": {"files": {}}}}))
    assert runner.page_inputs(tmp_path, item) not in (fresh, done)  # a finished map run: no summary to wait for


def test_an_edit_stales_exactly_the_pages_that_run_it(tmp_path, monkeypatch):
    """Stale means the output could change: a new function in errors.py (or any edit no page's cells
    reach) leaves every page fresh; an edit of a depth statistic stales the pages that read it and
    only those — the permutation test (``spearman_test``) is read by the scale and difficulty pages'
    trend findings, not by the beyond or long-CoT pages."""
    from effdepth_book import runner

    copies = _copied_packages(tmp_path, monkeypatch)
    package = copies["effdepth_core"]
    items = {
        section: parameter_sets(ROOT, section, "full")[0] for section in ("scale", "difficulty", "beyond", "long_cot")
    }
    fresh = {section: runner.page_inputs(ROOT, item) for section, item in items.items()}
    errors = package / "errors.py"
    errors.write_text(errors.read_text() + '\n\ndef unused_helper() -> str:\n    return "nothing calls this"\n')
    assert {section: runner.page_inputs(ROOT, item) for section, item in items.items()} == fresh
    _edit(package / "measurement" / "depth.py", "def spearman_test(", "def spearman_test(  # changed\n    ")
    now = {section: runner.page_inputs(ROOT, item) for section, item in items.items()}
    assert {section for section in items if now[section] != fresh[section]} == {"scale", "difficulty"}
    _edit(errors, "class EffdepthError(", "class EffdepthError(  # changed\n    ")  # a class every page may raise
    assert all(runner.page_inputs(ROOT, item) != now[section] for section, item in items.items())


def test_the_section_registry_holds_names_only():
    """The digest may leave ``sections/registry.py`` out only while it is a name → module mapping:
    a function or any other statement there would be code no page's freshness follows."""
    import ast

    from effdepth_book.sections import registry

    tree = ast.parse(Path(registry.__file__).read_text())
    docstring, assignment = tree.body  # nothing else
    assert isinstance(docstring, ast.Expr) and isinstance(assignment, ast.Assign)
    assert [t.id for t in assignment.targets] == ["BUILTIN"] and isinstance(assignment.value, ast.Dict)
    assert all(isinstance(node, ast.Constant) for node in (*assignment.value.keys, *assignment.value.values))


@pytest.mark.slow  # ~25 s: two pages' findings from the committed runs
def test_a_new_section_is_its_spec_its_params_and_its_template(tmp_path):
    """A section added in process — a copy of "beyond" under another name: its spec (with its own
    page class), its params file, its template, one ``register`` call — reaches the schema, the
    table of contents, the grid's cells, the page and the intro's findings with no other edit."""
    import dataclasses
    import shutil

    from effdepth_book import grid, pages, params_schema, runner, sections
    from effdepth_book.sections import beyond

    root = tmp_path / "checkout"
    shutil.copytree(ROOT / "params", root / "params")
    (root / "params" / "copy.yml").write_text((ROOT / "params" / "beyond.yml").read_text())
    template = root / "book" / "templates" / "copy.ipynb"
    template.parent.mkdir(parents=True)
    text = (ROOT / "book" / "templates" / "beyond.ipynb").read_text()
    template.write_text(text.replace('\\"beyond\\"', '\\"copy\\"'))  # the section's name in its first cell
    (root / "book" / "results").symlink_to(ROOT / "book" / "results")  # the committed runs, read only
    page_class = type("CopyPage", (beyond.BeyondPage,), {})

    def intro(entries):  # beyond's, marked so that the intro shows it came from the copy
        heads, paragraphs = beyond.intro(entries)
        return heads, [*paragraphs, f"copy: {len(entries)} page(s)"]

    sections.register(dataclasses.replace(beyond.SPEC, name="copy", page=page_class, intro=intro))
    try:
        assert sections.names()[-1] == "copy"
        assert params_schema.template_keys(template) == params_schema.section_keys("copy")
        copies, originals = (runner.parameter_sets(root, s, "full") for s in ("copy", "beyond"))
        assert [c.parameters for c in copies] == [o.parameters for o in originals]
        assert [c.page for c in copies] == [o.page.replace("beyond/", "copy/") for o in originals]
        assert all(f"file: {c.page}" in runner.toc_text(root) for c in copies)
        cells = {str(c.key) for c in grid.cells(root, "full", ["copy"])}
        assert cells and cells == {str(c.key) for c in grid.cells(root, "full", ["beyond"])}
        item = next(c for c in copies if c.name == "smollm2-135m")
        page = pages.open_page("copy", item.parameters, cached_only=True, root=root)
        assert type(page) is page_class and set(page.plans) == {"tasks"}
        original = pages.open_page("beyond", item.parameters, cached_only=True, root=root)
        assert page.findings() == original.findings() and "Nothing was measured" not in page.findings()
        assert page.chart("lens") is not None
        quick = len(runner.parameter_sets(root, "copy", "quick"))
        assert f"copy: {quick} page(s)" in runner.findings_markdown(root, "quick")  # no quick results: fast
    finally:
        sections.unregister("copy")
    with pytest.raises(EffdepthError, match="unknown section 'copy'; sections: scale, long_cot"):
        runner.parameter_sets(root, "copy", "full")
