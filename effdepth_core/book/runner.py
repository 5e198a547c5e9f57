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

SECTIONS = ("scale", "difficulty", "long_cot")
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
        notebook = nbformat.read(template, as_version=4)
        for cell in notebook.cells:  # the page title is the first heading (Jupyter Book's page name)
            if cell.cell_type == "markdown" and "{title}" in cell.source:
                cell.source = cell.source.replace("{title}", item.title)
                break
        output = root / "book" / f"{item.page}.ipynb"
        output.parent.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        print(f"effdepth book: {item.section}/{item.name} → {output.relative_to(root)}", flush=True)
        papermill.execute_notebook(
            notebook,
            str(output),
            parameters={**item.parameters, **(extra or {})},
            cwd=str(root),
            kernel_name=kernel_name,
            progress_bar=progress,
            log_output=False,
        )
        executed = nbformat.read(output, as_version=4)
        for cell in executed.cells:  # the injected parameters: folded on the page, one click away
            tags = cell.metadata.get("tags", [])
            if "injected-parameters" in tags and "hide-cell" not in tags:
                cell.metadata["tags"] = [*tags, "hide-cell"]
        nbformat.write(executed, output)
        timings.append((item, time.perf_counter() - started))
    return timings
