"""What a book section is: a ``SectionSpec`` (its name, page class, studies, parameters and its part
of the intro's findings), as a probe is its ``ProbeSpec``; and ``StudyPlan``, one study of a page
(models × task specs) that the page's notebook reads and ``effdepth grid`` computes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# page parameters that every run of a page shares (the rest describe the studies)
SHARED = ("seed", "device", "dtype")


@dataclass(frozen=True)
class StudyPlan:
    """One study of a page: ``specs`` on each of ``models`` (``specs_by_model`` overrides per model)."""

    name: str  # "tasks", "causal", "levels", "skip"
    models: tuple[str, ...]
    specs: tuple[dict, ...]
    specs_by_model: dict = field(default_factory=dict)
    download: bool = True


@dataclass(frozen=True)
class SectionSpec:
    """One section of the book. Its files follow from ``name``: ``params/<name>.yml`` (its defaults
    and parameter sets), ``book/templates/<name>.ipynb`` (the notebook whose cells call ``page``),
    ``book/executed/<name>/<set>.ipynb`` (the executed pages).

    Args:
        name: the section's name, as ``--section`` takes it.
        page: its page class (a ``pages.Page``): what the template's cells call.
        plans: the studies of one page from its resolved parameters (``effdepth grid`` computes
            exactly these, the page reads them).
        keys: the parameters its params file may set besides every page's (``params_schema.PAGE_KEYS``);
            a test holds them equal to its template's parameters cell.
        intro: its part of the intro's findings from its pages (``[(parameter set, page), …]``):
            headlines for the findings table and paragraphs below it.
    """

    name: str
    page: type
    plans: Callable[[Mapping], list[StudyPlan]]
    keys: frozenset[str]
    intro: Callable[[list[tuple[Any, Any]]], tuple[list[dict], list[str]]]


def defaults(parameters: Mapping) -> dict:
    """The settings every run of a page shares (plus its precision rule, when the profile sets one)."""
    shared = {k: parameters[k] for k in SHARED if k in parameters}
    if parameters.get("precision") is not None:
        shared["precision"] = parameters["precision"]
    return shared


def models_of(parameters: Mapping) -> tuple[str, ...]:
    return tuple(parameters.get("models") or ())
