"""The reproduction book: parameter sets from ``params/``, papermill execution, the table of contents.

``params/common.yml`` holds what every section shares (the task list, seed, device, results
directory) per profile; ``params/<section>.yml`` adds the section's defaults and its parameter
sets. Each set is executed from ``book/templates/<section>.ipynb`` into
``book/executed/<section>/<name>.ipynb``, a page of the book. ``_toc.yml`` is generated from the
``full`` profile, so the pages and the parameters cannot drift apart.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from effdepth_core.cache import read_regular
from effdepth_core.errors import EffdepthError
from effdepth_core.rundir import is_finished

from . import params_schema, sections
from .evidence import QUANTIZATION_FILE
from .freshness import page_code

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
# the user's guide, in reading order (each listed when its page exists; using/api is generated)
USING_PAGES = (
    "using/cli",
    "using/python",
    "using/notebook",  # an executed notebook (.ipynb), rerun by tests/test_docs.py
    "using/runs",
    "using/safety",
    "using/models",
    "using/tasks",
    "using/book",
    "using/grid",
    "using/speed",
    "using/development",
    "using/api",
)


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
    return params_schema.load(path)


def _profile(data: dict, profile: str, path: Path) -> dict:
    profiles = data.get("profiles") or {}
    if profile not in profiles:
        raise EffdepthError(f"{path} has no profile {profile!r} (it has: {', '.join(profiles) or 'none'})")
    return profiles[profile] or {}


def parameter_sets(
    root: Path, section: str, profile: str = "full", params_file: Path | None = None
) -> list[ParameterSet]:
    """The parameter sets of one section under ``profile``, each with every parameter resolved."""
    sections.get(section)  # one line naming the sections when there is none
    if profile not in PROFILES:
        raise EffdepthError(f"unknown profile {profile!r}; profiles: {', '.join(PROFILES)}")
    common_path = root / "params" / "common.yml"
    path = params_file or root / "params" / f"{section}.yml"
    common_data = _read_yaml(common_path)
    params_schema.check_common(common_data, common_path)
    common = _profile(common_data, profile, common_path)
    data = _read_yaml(path)
    params_schema.check_section(data, path, params_schema.section_keys(section))
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
    titles = {s: _read_yaml(root / "params" / f"{s}.yml").get("title", s) for s in sections.names()}
    parts = []
    for section in sections.names():
        chapters = [{"file": s.page} for s in parameter_sets(root, section, TOC_PROFILE)]
        if (root / "book" / "sections" / f"{section}.md").is_file():  # the section's parameters and notes, once
            chapters.insert(0, {"file": f"sections/{section}"})
        parts.append({"caption": titles[section], "chapters": chapters})
    parts.append({"caption": "About the measurements", "chapters": [{"file": p} for p in ABOUT_PAGES]})
    using = [{"file": p} for p in USING_PAGES if any((root / "book" / f"{p}{s}").is_file() for s in (".md", ".ipynb"))]
    if using:
        parts.append({"caption": "Using effdepth", "chapters": using})
    toc = {"format": "jb-book", "root": INTRO_PAGE, "parts": parts}
    return TOC_HEADER + yaml.safe_dump(toc, sort_keys=False)


def write_generated(path: Path, text: str, mark: str) -> Path:
    """Write a file effdepth generates, atomically, only where it is absent or effdepth's own (it
    begins with ``mark``): never through a link, never over a file someone else wrote."""
    from effdepth_core.cache import atomic_write_bytes, read_regular

    if path.is_symlink():
        raise EffdepthError(f"{path} is a symbolic link; effdepth never writes through links: remove the link")
    if path.exists():
        try:
            own = read_regular(path).decode("utf-8").startswith(mark)
        except (OSError, UnicodeDecodeError, EffdepthError):
            own = False
        if not own:
            raise EffdepthError(
                f"{path} was not written by effdepth (it lacks effdepth's header); move it away to regenerate it"
            )
    atomic_write_bytes(path, text.encode("utf-8"))
    return path


def write_toc(root: Path) -> Path:
    """``_toc.yml``, and the API reference page it lists (both generated from the code and params/)."""
    from .api_reference import API_PAGE, HEADER, api_markdown

    (root / API_PAGE).parent.mkdir(parents=True, exist_ok=True)
    write_generated(root / API_PAGE, api_markdown(), HEADER.split(";")[0])
    return write_generated(root / "_toc.yml", toc_text(root), TOC_HEADER.splitlines()[0])


def page_inputs(root: Path, item: ParameterSet) -> str:
    """A digest of what an executed page is made from: its template, its resolved parameters, the
    finished runs (metadata and summaries; ``rundir.is_finished``: never one still being computed,
    which a clean clone lacks) under its results folder, and the code it runs — the
    definitions of ``effdepth_core`` and ``effdepth_book`` its template's cells and its section's
    spec module reach, name by name (``freshness.page_code``). Stored in the page when it is
    executed; ``effdepth book --check`` recomputes it, so a page is stale only when something that
    could change what it shows changed."""
    digest = hashlib.sha256()
    results = root / str(item.parameters.get("results_dir", "results"))
    template = root / "book" / "templates" / f"{item.section}.ipynb"
    runs = sorted(
        p
        for p in results.rglob("*.json")
        if p.name in ("metadata.json", "effective_depth.json") and is_finished(p.parent)
    )
    files = [template, *runs, *([results / QUANTIZATION_FILE] if item.section == "scale" else [])]  # its control
    digest.update(json.dumps(item.parameters, sort_keys=True, default=str).encode())
    for path in files:
        if path.is_file():
            name = path.relative_to(root).as_posix().encode()
            digest.update(name + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    for name, content in page_code(template):
        digest.update(name.encode() + b"\0" + hashlib.sha256(content).digest())
    return digest.hexdigest()


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
        _check_page(output)
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
        executed.metadata["effdepth"] = {"inputs": page_inputs(root, item)}
        nbformat.write(executed, output)
        timings.append((item, time.perf_counter() - started))
    return timings


def _check_page(output: Path) -> None:
    """An executed page is replaced only where it is effdepth's (papermill's metadata in it)."""
    if output.is_symlink():
        raise EffdepthError(f"{output} is a symbolic link; effdepth never writes through links: remove the link")
    if not output.exists():
        return
    import nbformat

    try:
        own = output.is_file() and "papermill" in nbformat.read(output, as_version=4).metadata
    except Exception:  # nbformat raises several types for a file that is not a notebook
        own = False
    if not own:
        raise EffdepthError(f"{output} is not a page effdepth executed (no papermill metadata); move it away")


def find_set(root: Path, spec: str, profile: str = "full") -> ParameterSet:
    """The parameter set ``SECTION/NAME`` (as ``effdepth book --print-params`` names it)."""
    section, _, name = spec.partition("/")
    if section not in sections.names() or not name:
        raise EffdepthError(
            f"name a parameter set as SECTION/NAME, e.g. scale/smollm2-135m (sections: {', '.join(sections.names())})"
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


def findings_markdown(root: Path, profile: str = "full", bootstrap_seed: int | None = None) -> str:
    """The findings paragraphs of every section from the cached results (no model loads): the same
    page objects the notebooks build (``pages.py``), read with ``cached_only``; ``bootstrap_seed``
    replaces the book's (params/common.yml) for every interval."""
    from .pages import open_page

    def page(item: ParameterSet):
        parameters = (
            item.parameters if bootstrap_seed is None else {**item.parameters, "bootstrap_seed": bootstrap_seed}
        )
        return open_page(item.section, parameters, cached_only=True, root=root)

    from .findings import headline_table

    heads, paragraphs = [], []
    for section in sections.names():
        entries = [(item, page(item)) for item in parameter_sets(root, section, profile)]
        section_heads, section_paragraphs = sections.get(section).intro(entries)
        heads += section_heads
        paragraphs += section_paragraphs
    paragraphs = [headline_table(heads), *paragraphs]
    return FINDINGS_HEADER + "\n\n".join(paragraphs) + "\n"


FINDINGS_HEADER = (
    "<!-- Generated by `effdepth book` from the cached results (effdepth_book.findings); do not edit by hand. -->\n\n"
)


def stale_generated(root: Path, profile: str = "full", pages: bool = True) -> list[str]:
    """Each generated file that differs from what the code, params/ and the committed results
    produce now (``effdepth book --check``): its path and how to regenerate it. With ``pages`` (the
    default; ``--check --no-pages`` leaves them out) the executed pages too: one is stale when its
    stored ``page_inputs`` digest differs (re-executing a page to compare is model-free but slow,
    and its charts carry random ids)."""
    import nbformat

    from .api_reference import API_PAGE, api_markdown

    stale: list[str] = []
    verdicts: dict[Path, Path | None] = {}  # a run folder's first tampered file, hashed once per check
    for section in sections.names() if pages else ():
        if not (root / "params" / f"{section}.yml").is_file():
            continue
        for item in parameter_sets(root, section, profile):
            page = root / "book" / f"{item.page}.ipynb"
            fix = f"effdepth book --section {section} --only {item.name}"
            try:
                stored = nbformat.reads(read_regular(page).decode("utf-8"), as_version=4).metadata.get("effdepth", {})
            except (OSError, EffdepthError, UnicodeDecodeError, ValueError):
                stale.append(f"{page.relative_to(root)} is missing: execute it with `{fix}`")
                continue
            if stored.get("inputs") != page_inputs(root, item):
                stale.append(f"{page.relative_to(root)} is stale: re-execute it with `{fix}`")
                continue
            tampered = _unrecorded_result(root / str(item.parameters.get("results_dir", "results")), verdicts)
            if tampered is not None:
                stale.append(
                    f"{page.relative_to(root)} is stale: it reads {tampered.relative_to(root)}, which differs from "
                    f"what its run recorded; recompute that run (effdepth grid), then `{fix}`"
                )
    for path, text, fix in (
        (root / "_toc.yml", toc_text(root), "effdepth book --toc-only"),
        (root / FINDINGS_PAGE, findings_markdown(root, profile), "effdepth book --findings-only"),
        (root / API_PAGE, api_markdown(), "effdepth book --toc-only"),
    ):
        try:
            current = read_regular(path).decode("utf-8")
        except (OSError, EffdepthError, UnicodeDecodeError):
            current = None
        if current != text:
            what = "missing" if current is None else "stale"
            stale.append(f"{path.relative_to(root)} is {what}: regenerate it with `{fix}`")
    return stale


def _unrecorded_result(results: Path, verdicts: dict[Path, Path | None]) -> Path | None:
    """The first file of a run under ``results`` that a page may read and its run's ``metadata.json``
    does not vouch for: a parquet, the examples or the summary whose sha256 differs from the one
    recorded when it was written, or one no record names. The page's digest (``page_inputs``) holds
    each ``metadata.json``; this extends it to every file the metadata records, so a parquet scaled
    or truncated by hand stales the page. Runs written before sha256 records (format 1) are left out."""
    from effdepth_core.rundir import read_metadata, verified_files

    for meta in sorted(results.rglob("metadata.json")) if results.is_dir() else ():
        folder = meta.parent
        if folder not in verdicts:
            verdicts[folder] = None
            try:
                metadata = read_metadata(folder) or {}
            except EffdepthError:
                metadata = {}
            if int(metadata.get("format", 1)) < 2:
                continue
            records = dict(metadata.get("files") or {})
            for probe in (metadata.get("probes") or {}).values():
                records.update((probe or {}).get("files") or {})
            read = [
                p.name
                for p in folder.iterdir()
                if p.suffix in (".parquet", ".jsonl") or p.name == "effective_depth.json"
            ]
            unknown = sorted(name for name in read if name not in records)
            bad = unknown[0] if unknown else verified_files(folder, records)
            verdicts[folder] = folder / bad if bad is not None else None
        if verdicts[folder] is not None:
            return verdicts[folder]
    return None


def write_findings(root: Path, profile: str = "full") -> Path:
    return write_generated(root / FINDINGS_PAGE, findings_markdown(root, profile), FINDINGS_HEADER.split(";")[0])
