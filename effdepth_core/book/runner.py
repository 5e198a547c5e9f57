"""The reproduction book: parameter sets from ``params/``, papermill execution, the table of contents.

``params/common.yml`` holds what every section shares (the task list, seed, device, results
directory) per profile; ``params/<section>.yml`` adds the section's defaults and its parameter
sets. Each set is executed from ``book/templates/<section>.ipynb`` into
``book/executed/<section>/<name>.ipynb``, a page of the book. ``_toc.yml`` is generated from the
``full`` profile, so the pages and the parameters cannot drift apart.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..errors import EffdepthError

SECTIONS = ("scale", "difficulty", "long_cot", "beyond")
PROFILES = ("quick", "full")
TOC_PROFILE = "full"
TOC_HEADER = (
    "# Table of contents of the reproduction book (paths relative to book/).\n"
    "# Generated from params/ by `effdepth book --toc-only`; edit params/, not this file.\n"
    "# `jupyter-book build book/` reads it through the link book/_toc.yml.\n"
)
# pages written by hand, around the generated ones
INTRO_PAGE = "intro"
ABOUT_PAGES = ("methods",)


@dataclass(frozen=True)
class ParameterSet:
    """One page of the book: a section's template executed with ``parameters``."""

    section: str
    name: str
    title: str
    parameters: dict

    @property
    def page(self) -> str:
        """The page's path in the book, without suffix (as ``_toc.yml`` names it)."""
        return f"executed/{self.section}/{self.name.replace('.', '_')}"  # a dot would read as a suffix


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        raise EffdepthError(f"missing parameter file {path}; run from the effdepth checkout (or pass --root)")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise EffdepthError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise EffdepthError(f"{path} must hold a mapping at the top level")
    return data


def _profile(data: dict, profile: str, path: Path) -> dict:
    profiles = data.get("profiles") or {}
    if profile not in profiles:
        raise EffdepthError(f"{path} has no profile {profile!r} (it has: {', '.join(profiles) or 'none'})")
    return profiles[profile] or {}


def parameter_sets(
    root: Path, section: str, profile: str = "full", params_file: Path | None = None
) -> list[ParameterSet]:
    """The parameter sets of one section under ``profile``, each with every parameter resolved."""
    if section not in SECTIONS:
        raise EffdepthError(f"unknown section {section!r}; sections: {', '.join(SECTIONS)}")
    if profile not in PROFILES:
        raise EffdepthError(f"unknown profile {profile!r}; profiles: {', '.join(PROFILES)}")
    common_path = root / "params" / "common.yml"
    path = params_file or root / "params" / f"{section}.yml"
    common = _profile(_read_yaml(common_path), profile, common_path)
    data = _read_yaml(path)
    own = _profile(data, profile, path)
    defaults = {**common, **(own.get("defaults") or {})}
    sets = []
    for entry in own.get("sets") or []:
        if "name" not in entry:
            raise EffdepthError(f"{path}: every parameter set needs a name (got {entry})")
        parameters = {**defaults, **{k: v for k, v in entry.items() if k not in ("name", "title")}}
        parameters["profile"] = profile
        title = entry.get("title") or f"{data.get('title', section)}: {entry['name']}"
        parameters["title"] = title
        sets.append(ParameterSet(section, str(entry["name"]), title, parameters))
    if not sets:
        raise EffdepthError(f"{path} defines no parameter sets for profile {profile!r}")
    return [_gather(item, sets) for item in sets]


def _gather(item: ParameterSet, sets: list[ParameterSet]) -> ParameterSet:
    """A set with ``models: all`` (a comparison page) takes the models of the section's other sets,
    each with the tasks and causal spec its own set gives it (``tasks_by_model``,
    ``causal_by_model``), so every page reads the same cached runs."""
    if item.parameters.get("models") != "all":
        return item
    others = [s for s in sets if s.parameters.get("models") != "all"]
    models = list(dict.fromkeys(m for s in others for m in s.parameters.get("models", [])))
    parameters = dict(item.parameters, models=models)
    for key in ("tasks", "causal"):
        if key in item.parameters:
            by_model = {m: s.parameters[key] for s in others for m in s.parameters.get("models", [])}
            parameters[f"{key}_by_model"] = {m: v if key == "tasks" else [v] for m, v in by_model.items()}
    if "tasks_by_model" in parameters:  # each model's runs keep its own page's precision rule
        rules = {m: s.parameters.get("precision") for s in others for m in s.parameters.get("models", [])}
        parameters["tasks_by_model"] = {
            m: [{"precision": rules[m], **spec} for spec in specs] if rules.get(m) is not None else specs
            for m, specs in parameters["tasks_by_model"].items()
        }
    return ParameterSet(item.section, item.name, item.title, parameters)


def toc_text(root: Path) -> str:
    """``_toc.yml`` for the pages of the full profile, sections in the paper's order."""
    titles = {s: _read_yaml(root / "params" / f"{s}.yml").get("title", s) for s in SECTIONS}
    parts = []
    for section in SECTIONS:
        chapters = [{"file": s.page} for s in parameter_sets(root, section, TOC_PROFILE)]
        parts.append({"caption": titles[section], "chapters": chapters})
    parts.append({"caption": "About the measurements", "chapters": [{"file": p} for p in ABOUT_PAGES]})
    toc = {"format": "jb-book", "root": INTRO_PAGE, "parts": parts}
    return TOC_HEADER + yaml.safe_dump(toc, sort_keys=False)


def write_toc(root: Path) -> Path:
    path = root / "_toc.yml"
    path.write_text(toc_text(root))
    return path


def execute(
    root: Path,
    sets: Sequence[ParameterSet],
    kernel_name: str = "python3",
    progress: bool = True,
    extra: Mapping | None = None,
) -> list[tuple[ParameterSet, float]]:
    """Execute each set's template with papermill into the book; returns (set, seconds) pairs.

    The notebooks run with the checkout as working directory, so results paths in params/ are
    relative to it and no machine's absolute path ends up in a page.
    """
    import nbformat
    import papermill

    timings = []
    for item in sets:
        template = root / "book" / "templates" / f"{item.section}.ipynb"
        if not template.is_file():
            raise EffdepthError(f"missing notebook template {template}")
        notebook = nbformat.read(template, as_version=4)  # the page renders its title from `title`
        output = root / "book" / f"{item.page}.ipynb"
        output.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        print(f"effdepth book: {item.section}/{item.name} → {output.relative_to(root)}", flush=True)
        try:
            papermill.execute_notebook(
                notebook,
                str(output),
                parameters={**item.parameters, **(extra or {})},
                cwd=str(root),
                kernel_name=kernel_name,
                progress_bar=progress,
                log_output=False,
            )
        except papermill.PapermillExecutionError as exc:
            raise EffdepthError(
                f"page {item.section}/{item.name} failed in cell {exc.exec_count}: {exc.ename}: {exc.evalue} "
                f"(the notebook with the traceback: {output.relative_to(root)})"
            ) from exc
        executed = nbformat.read(output, as_version=4)
        injected = [c for c in executed.cells if "injected-parameters" in c.metadata.get("tags", [])]
        for cell in injected:  # the injected parameters: folded on the page, one click away, under the title
            cell.metadata["tags"] = [*cell.metadata["tags"], "hide-cell"]
            executed.cells.remove(cell)
            heading = next((i for i, c in enumerate(executed.cells) if c.cell_type == "markdown"), -1)
            executed.cells.insert(heading + 1, cell)
        nbformat.write(executed, output)
        timings.append((item, time.perf_counter() - started))
    return timings


def find_set(root: Path, spec: str, profile: str = "full") -> ParameterSet:
    """The parameter set ``SECTION/NAME`` (as ``effdepth book --print-params`` names it)."""
    section, _, name = spec.partition("/")
    if section not in SECTIONS or not name:
        raise EffdepthError(
            f"name a parameter set as SECTION/NAME, e.g. scale/smollm2-135m (sections: {', '.join(SECTIONS)})"
        )
    sets = parameter_sets(root, section, profile)
    for item in sets:
        if item.name == name:
            return item
    raise EffdepthError(f"no parameter set {name!r} in {section} ({profile}); sets: {', '.join(s.name for s in sets)}")


def parameters_yaml(item: ParameterSet) -> str:
    """The set's resolved parameters as YAML, for ``papermill -f``."""
    header = (
        f"# {item.section}/{item.name}: papermill book/templates/{item.section}.ipynb OUT.ipynb --cwd . -f THIS.yml\n"
    )
    return header + yaml.safe_dump(item.parameters, sort_keys=False, allow_unicode=True)


FINDINGS_PAGE = "book/_findings.md"


def findings_markdown(root: Path, profile: str = "full") -> str:
    """The three findings paragraphs from the cached results of every section (no model loads)."""
    import polars as pl

    from .findings import difficulty_finding, long_cot_finding, scale_finding
    from .reference import paper_table1
    from .study import difficulty_specs, run_study, task_label

    def study(item: ParameterSet, key: str = "tasks"):
        p = item.parameters
        return run_study(
            p.get("models") or [],
            p.get(key) or [],
            defaults={
                "seed": p.get("seed", 0),
                "device": p.get("device", "auto"),
                "dtype": p.get("dtype", "auto"),
                "progress": False,
            },
            results_dir=root / p["results_dir"],
            specs_by_model=p.get(f"{key}_by_model"),
            cached_only=True,
            n_bootstrap=1000,
        )

    paper = paper_table1()
    scale_sets = parameter_sets(root, "scale", profile)
    widest = max(scale_sets, key=lambda s: len(s.parameters.get("models") or []))
    paragraphs = [scale_finding(study(widest).summary(), paper)]
    pairs, summaries, unavailable = [], [], {}
    for item in parameter_sets(root, "long_cot", profile):
        these = item.parameters.get("pairs") or []
        models = list(dict.fromkeys(m for pair in these for m in (pair["base"], pair["long_cot"])))
        result = study(ParameterSet(item.section, item.name, item.title, {**item.parameters, "models": models}))
        pairs += [p for p in these if p not in pairs]
        summaries.append(result.summary())
        unavailable.update(result.unavailable())
    if pairs:
        names = {m.rsplit("/", 1)[-1] for pair in pairs for m in pair.values()}
        paper_pairs = paper.filter(paper["model"].is_in(sorted(names)))
        paragraphs.append(long_cot_finding(pl.concat(summaries), pairs, unavailable, paper_pairs))
    for item in parameter_sets(root, "difficulty", profile):
        p = item.parameters
        specs = difficulty_specs(p.get("math"), p.get("arithmetic"), p.get("skip"))
        levels = [task_label(spec) for spec in specs]
        groups = {
            "MATH level": [t for t in levels if t.startswith("MATH")],
            "operand length": [t for t in levels if not t.startswith("MATH")],
        }
        by_level = study(ParameterSet(item.section, item.name, item.title, {**p, "tasks": specs}))
        summary = pl.concat([study(item).summary(), by_level.summary()])
        order = [task_label(t) for t in p.get("tasks") or []]
        paragraphs.append(difficulty_finding(summary, order, paper, groups))
    paragraphs += _beyond_paragraphs(root, profile, study)
    header = (
        "<!-- Generated by `effdepth book` from the cached results (effdepth_core.book.findings); "
        "do not edit by hand. -->\n\n"
    )
    return header + "\n\n".join(paragraphs) + "\n"


def _beyond_paragraphs(root: Path, profile: str, study) -> list[str]:
    """The fourth section's findings over all its pages: lens, pruning and early exit across models,
    then the cross-model map."""
    import polars as pl

    from .findings import beyond_finding, map_finding
    from .study import map_study, pruning_comparison

    def joined(frames: list) -> pl.DataFrame:
        frames = [f for f in frames if f.height]
        return pl.concat(frames, how="diagonal_relaxed") if frames else pl.DataFrame()

    parts: dict[str, list] = {"summary": [], "fit": [], "comparison": [], "exits": []}
    maps = []
    for item in parameter_sets(root, "beyond", profile):
        p = item.parameters
        if p.get("pair"):
            defaults = {"seed": p.get("seed", 0), "device": p.get("device", "auto"), "dtype": p.get("dtype", "auto")}
            mapped = map_study(p["pair"], defaults, root / p["results_dir"], cached_only=True)
            maps.append(map_finding(mapped, p["pair"]["small"], p["pair"]["big"]))
        if p.get("models"):
            result = study(item)
            parts["summary"].append(result.summary())
            parts["fit"].append(result.frame("tuned_lens_fit"))
            parts["comparison"].append(pruning_comparison(result))
            parts["exits"].append(result.frame("early_exit"))
    if not (parts["summary"] or maps):
        return []
    frames = [joined(parts[k]) for k in ("summary", "fit", "comparison", "exits")]
    text = beyond_finding(*frames) if frames[0].height else ""
    return [p for p in ("**Beyond the paper.** " + text if text else "", *maps) if p]


def write_findings(root: Path, profile: str = "full") -> Path:
    path = root / FINDINGS_PAGE
    path.write_text(findings_markdown(root, profile), encoding="utf-8")
    return path
