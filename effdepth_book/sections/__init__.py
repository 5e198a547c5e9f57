"""The book's sections, one ``SectionSpec`` each (``effdepth_book/sections/<name>/__init__.py``), in one
registry: the command line's ``--section`` choices, the runner, the params schema, the table of
contents, the grid and the intro's findings all read it. A new section is its spec file, its params
file, its template and one line in ``registry.BUILTIN`` (``sections/registry.py``, which no page's
freshness reads: adding a section stales no page)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from effdepth_core.errors import EffdepthError

from ..spec import SHARED, SectionSpec, StudyPlan, defaults
from .registry import BUILTIN

__all__ = ["SHARED", "SectionSpec", "StudyPlan", "defaults", "get", "names", "plans", "register"]

_ADDED: dict[str, SectionSpec] = {}


def register(spec: SectionSpec) -> None:
    """Add a section after the built-in ones (a test's copy, a user's own section)."""
    if spec.name in BUILTIN or spec.name in _ADDED:
        raise EffdepthError(f"a section named {spec.name!r} is already registered")
    _ADDED[spec.name] = spec


def unregister(name: str) -> None:
    _ADDED.pop(name, None)


def names() -> tuple[str, ...]:
    """Every section's name, in the book's order."""
    return (*BUILTIN, *_ADDED)


def get(name: str) -> SectionSpec:
    """The spec of section ``name``; one line naming the sections when there is none."""
    if name in _ADDED:
        return _ADDED[name]
    if name not in BUILTIN:
        raise EffdepthError(f"unknown section {name!r}; sections: {', '.join(names())}")
    return importlib.import_module(BUILTIN[name]).SPEC


def plans(section: str, parameters: Mapping) -> list[StudyPlan]:
    """The studies of one page of ``section`` (its parameter set's resolved ``parameters``)."""
    return get(section).plans(parameters)
