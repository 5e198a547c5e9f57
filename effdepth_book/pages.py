"""The book's pages as library calls. Each section's notebook template builds its page from its
papermill parameters (``page = pages.open_page("scale", globals())``) and then shows one thing per
cell (``page.table1()``, ``page.chart("lens")``): no logic lives in the templates. The intro's
findings (``runner.findings_markdown``) come from the same page objects, reading the cache only."""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from pathlib import Path

import polars as pl

from effdepth_core.measurement import registry

from . import params_schema, plots, reference, sections, tables
from .spec import StudyPlan
from .spec import defaults as shared_defaults
from .specification import Analysis, summarize
from .study import Study, run_study


def parameters(section: str, namespace: Mapping) -> dict:
    """A template's parameters, picked by name from its namespace (``globals()`` in the notebook):
    every key the section's params may set (``params_schema.section_keys``, which a test holds equal
    to the template's parameters cell) and those ``effdepth book`` fills in."""
    keys = params_schema.section_keys(section) | params_schema.FILLED
    return {k: namespace[k] for k in sorted(keys) if k in namespace}


def heading(title: str):
    """The title cell every page shares: the page title as Markdown, glued for the book's heading."""
    from IPython.display import Markdown
    from myst_nb import glue

    glue("page_title", title, display=False)
    return Markdown(f"# {title}")


def markdown(text: str):
    from IPython.display import Markdown

    return Markdown(text)


class Page:
    """What every page has: its parameters, the shared run settings, and cached-only reading."""

    section = ""

    def __init__(self, parameters: Mapping, cached_only: bool = False, root: Path | str = "."):
        self.p = dict(parameters)
        self.cached_only = cached_only
        self.root = Path(root)
        self.defaults = {**shared_defaults(self.p), "progress": False}

    @property
    def results_dir(self) -> Path:
        return self.root / self.p.get("results_dir", "results")

    @cached_property
    def plans(self) -> dict[str, StudyPlan]:
        """The page's studies by name, as ``sections.plans`` gives them to ``effdepth grid`` too: a
        page computes (or reads) exactly the runs the grid plans."""
        return {plan.name: plan for plan in sections.plans(self.section, self.p)}

    def study(self, name: str) -> Study:
        """The study ``name`` of this page (an empty one when its section has none by that name)."""
        plan = self.plans.get(name) or StudyPlan(name, (), ())
        return run_study(
            list(plan.models),
            list(plan.specs),
            defaults=self.defaults,
            results_dir=self.results_dir,
            specs_by_model=plan.specs_by_model or None,
            cached_only=self.cached_only,
            download=plan.download,
        )

    @cached_property
    def runs(self) -> Study:
        """The page's main study (``tasks``: every section plans one)."""
        return self.study("tasks")

    @cached_property
    def summary(self) -> pl.DataFrame:
        """One row per run of ``runs``: its model, task and effective depths."""
        return self.runs.summary()

    @property
    def paper(self) -> pl.DataFrame:
        return reference.paper_table1()

    @property
    def bootstrap_seed(self) -> int:
        """The seed of the findings' bootstrap intervals (a book parameter; the robustness rule also
        checks the next two)."""
        return int(self.p.get("bootstrap_seed") or 0)

    @property
    def analysis(self) -> Analysis:
        """The pre-registered primary analysis (``params/common.yml``: ``analysis``)."""
        return Analysis.from_params({**(self.p.get("analysis") or {}), "seed": self.bootstrap_seed})

    def specification_curve(self) -> pl.DataFrame | None:
        """Every comparison of the page under every specification (``specification``); a section
        whose page decides a question overrides it."""
        return None

    @cached_property
    def specifications(self) -> pl.DataFrame | None:
        curve = self.specification_curve()
        return curve if curve is not None and curve.height else None

    @cached_property
    def specification_summary(self) -> pl.DataFrame | None:
        return None if self.specifications is None else summarize(self.specifications, self.analysis)

    def specification_table(self):
        """Per comparison: the primary verdict, its interval and equivalence bound, the share of the
        other specifications that agree, and robust or the choice that decides it."""
        if self.specification_summary is None:
            return plots.note("No comparison on this page has cells that count (n ≥ 20, not degenerate).")
        return tables.specification_table(self.specification_summary, self.analysis)

    def specification_chart(self):
        if self.specifications is None:
            return None
        return plots.show(plots.specification_curve(self.specifications, self.analysis.margin))

    def findings_markdown(self):
        return markdown(self.findings())

    def not_run(self, study: Study, probe: str) -> str | None:
        """One line naming the models of ``study`` that ``probe`` did not run on, and why (it was not
        asked for there, or it failed); None when it ran on all of them."""
        title = registry.get(probe).title
        failed = {r.model: r.error for r in study.records if probe in r.probes and r.error}
        ran = {r.model for r in study.finished if r.asked(probe)}
        models = list(dict.fromkeys(r.model for r in study.records))
        missing = [m for m in models if m not in ran and m not in failed]
        parts = [f"could not run on {m}: {why}" for m, why in failed.items()]
        if missing:
            parts.append(
                f"not asked for on {', '.join(missing)} by params/{self.section}.yml (its comments give the cost "
                "that ruled it out on this CPU)"
            )
        return f"{title}: {'; '.join(parts)}." if parts else None

    def probe_chart(self, study: Study, probe: str, build):
        """``build()``'s chart of ``probe``, or, where it ran on no model of the page, the line saying
        why (never an empty chart)."""
        if not any(r.asked(probe) for r in study.finished):
            return plots.note(self.not_run(study, probe) or f"{registry.get(probe).title}: no results.")
        return plots.show(build())

    def status(self, models, unavailable):
        return tables.status(models, unavailable) if unavailable else None


def open_page(section: str, namespace: Mapping, cached_only: bool = False, root: Path | str = ".") -> Page:
    """The page of ``section``, its parameters picked by name from ``namespace`` (a template's
    ``globals()``, or a parameter set): it reads the cache and computes what is missing. The page
    knows its section from here; a section's page class names none."""
    cached_only = cached_only or bool(namespace.get("cached_only"))  # `effdepth book --cached-only`
    page = sections.get(section).page(parameters(section, namespace), cached_only=cached_only, root=root)
    page.section = section
    return page
